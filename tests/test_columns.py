"""Columnar batches (pincollate/_columns.py): a dict of arrays, as Ray Data hands one, into one buffer."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch

import pincollate
from pincollate import (
    AsList,
    CollateError,
    ColumnCollate,
    Concat,
    Jagged,
    MMCollate,
    Pad,
    PerSample,
    RaggedFieldWarning,
    Stack,
)
from samples import assert_one_buffer, assert_same


def _objects(*values):
    column = np.empty(len(values), dtype=object)
    column[:] = list(values)
    return column


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False  # what an object store hands out
    return array


DENSE = {
    "float32": np.arange(12, dtype=np.float32).reshape(4, 3),
    "float64": np.linspace(0, 1, 4),
    "int64": np.arange(4, dtype=np.int64),
    "int8": np.arange(4, dtype=np.int8),
    "uint8-image": np.arange(4 * 3 * 2 * 2, dtype=np.uint8).reshape(4, 3, 2, 2),
    "bool": np.array([True, False, True, True]),
    "float16": np.arange(4, dtype=np.float16),
    "complex64": np.arange(4, dtype=np.complex64),
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_a_dense_column_is_one_tensor_with_its_values(name):
    column = _read_only(DENSE[name].copy())
    batch = ColumnCollate(pin_memory=False)({"x": column, "y": np.arange(4)})
    assert torch.equal(batch["x"], torch.from_numpy(column.copy()))
    assert batch["x"].dtype == torch.from_numpy(column.copy()).dtype
    assert batch.layout is not None
    assert_one_buffer(batch)


def test_strings_stay_lists_of_str_and_ints_of_an_object_column_stack():
    batch = ColumnCollate(pin_memory=False)(
        {"u": np.array(["a", "bb"]), "o": _objects("x", "yy"), "n": _objects(1, 2), "x": np.zeros((2, 2))}
    )
    assert batch["u"] == ["a", "bb"] and batch["o"] == ["x", "yy"]
    assert batch["n"].tolist() == [1, 2]
    assert all(type(s) is str for s in batch["u"])


def test_datetime_columns_are_refused_naming_the_column():
    with pytest.raises(CollateError, match="datetime64") as info:
        ColumnCollate(pin_memory=False)({"t": np.array(["2026-01-01", "2026-01-02"], dtype="datetime64[D]")})
    assert info.value.path == ("t",)


def _ragged():
    return _read_only(_objects(np.array([1, 2, 3]), np.array([4]), np.array([5, 6])))


@pytest.mark.parametrize(
    "policy, check",
    [
        (
            Pad(),
            lambda b: b["ids"].tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]] and b["ids_lengths"].tolist() == [3, 1, 2],
        ),
        (Concat(), lambda b: b["ids"].tolist() == [1, 2, 3, 4, 5, 6] and b["ids_offsets"].tolist() == [0, 3, 4, 6]),
        (Jagged(), lambda b: [t.tolist() for t in b["ids"].unbind()] == [[1, 2, 3], [4], [5, 6]]),
        (AsList(), lambda b: [t.tolist() for t in b["ids"]] == [[1, 2, 3], [4], [5, 6]]),
        (None, lambda b: [t.tolist() for t in b["ids"]] == [[1, 2, 3], [4], [5, 6]]),
    ],
    ids=["pad", "concat", "jagged", "aslist", "none"],
)
def test_a_ragged_column_takes_the_policies_of_samples(policy, check):
    collate = ColumnCollate(pin_memory=False, fields={"ids": policy} if policy else None)
    with pytest.warns(RaggedFieldWarning, match=r"\['ids'\]") if policy is None else contextlib.nullcontext():
        batch = collate({"ids": _ragged(), "label": np.arange(3)})
    assert check(batch)
    assert_one_buffer(batch)


def test_ragged_rows_name_the_row_and_column_of_a_bad_value():
    with pytest.raises(CollateError) as info:
        ColumnCollate(pin_memory=False, fields={"ids": Pad()})({"ids": _objects(np.arange(2), "oops")})
    assert info.value.sample == 1 and info.value.path == ("ids",)


def test_a_rename_and_policy_extras_are_columns_of_the_batch():
    collate = ColumnCollate(
        pin_memory=False, fields={"ids": Pad(mask_key="attention_mask")}, rename={"label": "labels"}
    )
    batch = collate({"ids": _ragged(), "label": np.arange(3)})
    assert list(batch) == ["ids", "ids_lengths", "attention_mask", "labels"]


def test_columns_of_different_lengths_are_an_error():
    with pytest.raises(CollateError, match="rows") as info:
        ColumnCollate(pin_memory=False)({"a": np.arange(3), "b": np.arange(2)})
    assert info.value.path == ("b",)


def test_pack_then_unpack_gives_the_batch_back_as_one_writable_buffer():
    collate = ColumnCollate(pin_memory=False, fields={"ids": Pad()})
    columns = {"image": np.ones((3, 2, 2), np.float32), "ids": _ragged(), "name": np.array(["a", "b", "c"])}
    expected = collate(columns)
    row = collate.pack(columns)
    assert set(row) == {"pincollate_buffer", "pincollate_layout"} and len(row["pincollate_buffer"]) == 1
    for key in row:
        _read_only(row[key])
    batch = collate.unpack(row)
    assert batch.layout == expected.layout and batch["name"] == ["a", "b", "c"]
    for key in ("image", "ids", "ids_lengths", "ids_mask"):
        assert torch.equal(batch[key], expected[key])
    batch["image"] += 1  # the user's copy, not the store's read-only memory
    assert_one_buffer(batch)


def test_unpack_takes_one_packed_batch_at_a_time():
    collate = ColumnCollate(pin_memory=False)
    row = collate.pack({"x": np.arange(3)})
    two = {key: np.concatenate([value, value]) for key, value in row.items()}
    with pytest.raises(CollateError, match="batch_size=1"):
        collate.unpack(two)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bfloat16", "float8"])
@pytest.mark.parametrize("policy", [None, Pad(), AsList()], ids=["dense", "pad", "aslist"])
def test_a_tensor_column_of_a_dtype_numpy_lacks_is_collated(dtype, policy):
    column = (torch.arange(6.0).reshape(2, 3) / 4).to(dtype)
    batch = ColumnCollate(pin_memory=False, fields={"x": policy} if policy else None)({"x": column})
    rows = batch["x"] if policy is None or isinstance(policy, Pad) else torch.stack(batch["x"])
    assert rows.dtype == dtype and torch.equal(rows.view(torch.uint8), column.view(torch.uint8))
    assert_one_buffer(batch)


@pytest.mark.parametrize(
    "column", [torch.tensor(1.5), np.array(1.5), torch.tensor(1.5, dtype=torch.bfloat16), np.array("a"), 5]
)
@pytest.mark.parametrize("policy", [None, Pad()], ids=["none", "pad"])
def test_a_value_without_rows_is_refused_naming_the_column(column, policy):
    collate = ColumnCollate(pin_memory=False, fields={"x": policy} if policy else None)
    with pytest.raises(CollateError, match=r"a column must have one row per sample|expected a column") as info:
        collate({"y": np.arange(2), "x": column})
    assert info.value.path == ("x",)


# --- a ragged column planned once --------------------------------------------------------


def _ragged_batches() -> list[dict[str, np.ndarray]]:
    lengths = [[3, 1, 2], [5, 2, 2], [1, 1, 1], [0, 4, 2]]
    return [
        {
            "ids": _read_only(
                _objects(*(_read_only(np.arange(n, dtype=np.int64) + 10 * i) for i, n in enumerate(row)))
            ),
            "label": _read_only(np.arange(3)),
        }
        for row in lengths
    ]


POLICIES = {
    "pad": Pad(mask_key="mask"),
    "pad-left": Pad(side="left", value=-1),
    "concat": Concat(),
    "jagged": Jagged(),
    "aslist": AsList(),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_ragged_column_is_what_the_samples_of_its_rows_give(name):
    # A ragged column's rows are the samples of its policy: the batch is the one MMCollate makes of
    # the rows as samples (its careful walk), in one buffer, read-only arrays copied.
    batches = _ragged_batches()
    collate = ColumnCollate(pin_memory=False, fields={"ids": POLICIES[name]})
    samples = MMCollate(pin_memory=False, fields={"ids": POLICIES[name]}, compile=False)
    for batch in batches:
        rows = [{"ids": ids, "label": label} for ids, label in zip(batch["ids"], batch["label"], strict=True)]
        got, want = collate(batch), samples(rows)
        assert list(got) == list(want)
        for key in want:
            if isinstance(want[key], torch.Tensor) and want[key].is_nested:
                assert [t.tolist() for t in got[key].unbind()] == [t.tolist() for t in want[key].unbind()]
            elif isinstance(want[key], list):
                assert [t.tolist() for t in got[key]] == [t.tolist() for t in want[key]]
            else:
                assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
        assert got.layout is not None
        assert_one_buffer(got)


def test_a_column_of_another_dtype_in_a_later_batch_is_collated_as_its_own():
    collate = ColumnCollate(pin_memory=False, fields={"ids": Pad()})
    collate(_ragged_batches()[0])  # int64 rows
    floats = {"ids": _objects(np.zeros(2, np.float32), np.ones(3, np.float32)), "label": np.arange(2)}
    batch = collate(floats)  # another dtype: its own
    assert batch["ids"].dtype == torch.float32 and batch["ids_lengths"].tolist() == [2, 3]


def test_ragged_reads_token_lists_in_every_batch_so_a_column_keeps_its_structure():
    # ragged= reads token ids as Python lists as sequences, in every batch (lengths that agree
    # too), whatever the numbers' dtype, as MMCollate makes them of the rows as samples.
    batches = [
        {"ids": _objects([1, 2, 3], [4, 5])},
        {"ids": _objects([1.5, 2], [4])},
        {"ids": _objects([7, 8], [8, 9])},
    ]
    collate = ColumnCollate(pin_memory=False, ragged=Pad())
    samples = MMCollate(pin_memory=False, ragged=Pad(), compile=False)
    for batch in batches:
        got, want = collate(batch), samples([{"ids": ids} for ids in batch["ids"]])
        assert list(got) == list(want) == ["ids", "ids_lengths", "ids_mask"]
        for key in want:
            assert_same(got[key], want[key])


def test_rows_of_number_lists_under_stack_stack_as_the_samples_would():
    rows = _objects([1, 2], [3, 4])
    batch = ColumnCollate(pin_memory=False, fields={"x": Stack()})({"x": rows})
    expected = MMCollate(pin_memory=False, fields={"x": Stack()})([{"x": [1, 2]}, {"x": [3, 4]}])
    assert_same(batch["x"], expected["x"])
    assert_one_buffer(batch)


def test_a_value_the_batch_cannot_hold_names_its_row_and_the_next_batch_is_collated():
    # A PerSample() number past int64: the walk names the row; the next batch is collated as before.
    collate = ColumnCollate(pin_memory=False, fields={"x": PerSample()})
    assert collate({"x": _objects([216, 989], [7])})["x"][1][0].item() == 7
    with pytest.raises(CollateError, match=r"sample 1 at \['x'\]\[1\]: int 1180591620717411303424 does not fit int64"):
        collate({"x": _objects([216, 989], [7, 2**70])})
    batch = collate({"x": _objects([1], [2, 3])})
    assert [[t.item() for t in row] for row in batch["x"]] == [[1], [2, 3]]


def test_an_extra_output_that_clashes_with_a_column_is_an_error():
    with pytest.raises(CollateError, match="'ids_lengths' of column 'ids' clashes with the column 'ids_lengths'"):
        ColumnCollate(pin_memory=False, fields={"ids": Pad()})({"ids": _ragged(), "ids_lengths": np.arange(3)})
    # Two columns' extras of one name: the error names both columns.
    both = ColumnCollate(pin_memory=False, fields={"a": Pad(mask_key="m"), "b": Pad(mask_key="m")})
    with pytest.raises(CollateError, match="'m' of column 'b' clashes with the extra output 'm' of column 'a'"):
        both({"a": _ragged(), "b": _ragged()})


def test_a_column_renamed_onto_another_or_onto_an_extra_output_is_an_error():
    # Nothing dropped: each would have put one column over another.
    with pytest.raises(CollateError, match=r"rename gives the columns \['a', 'b'\] one name, 'b'"):
        ColumnCollate(pin_memory=False, rename={"a": "b"})({"a": np.zeros(3), "b": np.ones(3)})
    with pytest.raises(CollateError, match="'ids_lengths' of column 'ids' clashes"):
        ColumnCollate(pin_memory=False, fields={"ids": Pad()}, rename={"n": "ids_lengths"})(
            {"ids": _ragged(), "n": np.arange(3)}
        )


def test_a_batch_that_fails_warns_of_no_ragged_column():
    collate = ColumnCollate(pin_memory=False)
    ragged = _ragged()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here fails the test
        with pytest.raises(CollateError, match="rows"):
            collate({"ids": ragged, "short": np.arange(2)})
    with pytest.warns(RaggedFieldWarning, match=r"\['ids'\] holds values"):
        collate({"ids": ragged, "n": np.arange(3)})


# --- settings that match nothing, None rows ----------------------------------------------


def test_a_policy_or_rename_naming_no_column_is_reported_once():
    collate = ColumnCollate(pin_memory=False, fields={"input_id": Pad()}, rename={"labels": "y"})
    with pytest.warns(UserWarning) as warned:
        collate({"input_ids": np.zeros((2, 3)), "label": np.arange(2)})
    assert sorted(str(w.message) for w in warned) == [
        "pincollate: field pattern 'input_id' matched no key path in this batch",
        "pincollate: rename 'labels' matched no key path in this batch",
    ]
    collate({"input_ids": np.zeros((2, 3)), "label": np.arange(2)})  # once: warnings are errors here


def test_a_none_row_names_missing_none():
    ids = _objects(np.arange(3), None, np.arange(2))
    for fields in (None, {"ids": Pad()}):
        with pytest.raises(CollateError, match=r"sample 1 at \['ids'\]: .*\(pass missing='none' to take None"):
            ColumnCollate(pin_memory=False, fields=fields)({"ids": ids})
    batch = ColumnCollate(pin_memory=False, fields={"ids": Pad()}, missing="none")({"ids": ids})
    assert batch["ids_lengths"].tolist() == [3, 0, 2]


def test_a_plain_arrow_table_without_ray_is_read_as_arrow_converts_it(monkeypatch):
    # A Hugging Face ``datasets`` table in arrow format, say: no Ray in the process.
    pa = pytest.importorskip("pyarrow")
    import sys

    monkeypatch.setitem(sys.modules, "ray.data.block", None)  # import fails as without Ray
    table = pa.table(
        {"label": [1, 2, 3], "flag": [True, False, True], "ids": [[1, 2], [3], [4, 5, 6]], "name": list("abc")}
    )
    collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad()})
    batch = collate(table)
    assert batch["label"].tolist() == [1, 2, 3] and batch["flag"].tolist() == [True, False, True]
    assert batch["ids"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]] and batch["ids_lengths"].tolist() == [2, 1, 3]
    assert batch["name"] == ["a", "b", "c"]
    assert_one_buffer(batch)


@pytest.mark.parametrize("policy", ["none", "pad", "concat", "jagged", "aslist"])
def test_lists_of_numbers_in_an_arrow_table_collate_as_their_numpy_conversion(policy):
    # Token ids as Hugging Face datasets keep them (list<int64>), read from Arrow's buffers in
    # one piece: the same batch as Arrow's numpy conversion (an array per row) gives.
    pa = pytest.importorskip("pyarrow")
    from pincollate._integrations.arrow import arrow_columns
    from pincollate._plan.padding import Joined

    ids = [[1, 2, 3], [], [4], [5, 6], [7, 8, 9, 10]]
    first = pa.table({"ids": ids[:2], "score": [[0.5], [1.5, 2.5]], "label": [0, 1]})
    second = pa.table({"ids": ids[2:], "score": [[3.5], [], [4.5, 5.5]], "label": [2, 3, 4]})
    table = pa.concat_tables([first, second])  # two chunks
    settings = {
        "none": {"ragged": None},
        "pad": {"ragged": Pad()},
        "concat": {"ragged": Concat()},
        "jagged": {"ragged": Jagged()},
        "aslist": {"ragged": AsList()},
    }[policy]
    for batch in (table, table.slice(1, 3), table.slice(2, 3)):  # whole, across chunks, inside one
        assert type(arrow_columns(batch)["ids"]) is Joined
        numpy = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.column_names}
        with contextlib.ExitStack() as stack:
            if policy == "none":
                stack.enter_context(pytest.warns(RaggedFieldWarning))
            ours = ColumnCollate(**settings)(batch)
        with contextlib.ExitStack() as stack:
            if policy == "none":
                stack.enter_context(pytest.warns(RaggedFieldWarning))
            theirs = ColumnCollate(**settings)(numpy)
        assert_same(ours, theirs)
        assert_one_buffer(ours)


def test_a_column_of_number_lists_under_aslist_gives_what_the_careful_walk_gives():
    """Labels per row (a variable number, as a dataset's list column holds them): one 1-D tensor each,
    batch after batch, and a batch the recipe does not describe (an empty list, floats) walked."""
    fields = {"labels": AsList()}
    columns = ColumnCollate(pin_memory=False, fields=fields)
    careful = MMCollate(pin_memory=False, fields=fields, compile=False)
    for labels in ([[1, 2], [3], [4, 5, 6]], [[7], [8, 9], [1]], [[1], [], [2, 3]], [[0.5], [1.5, 2.5], [3.0]]):
        batch = {"labels": labels, "x": [1.0, 2.0, 3.0]}
        out = columns(batch)
        expected = careful([{"labels": row, "x": x} for row, x in zip(labels, batch["x"], strict=True)])
        assert len(out["labels"]) == len(expected["labels"])
        for ours, theirs in zip(out["labels"], expected["labels"], strict=True):
            assert type(ours) is type(theirs)
            if isinstance(theirs, torch.Tensor):
                assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
            else:
                assert ours == theirs


@pytest.mark.parametrize("policy", ["none", "pad", "concat", "jagged", "aslist"])
def test_rows_read_from_arrow_are_walked_whole(policy, monkeypatch):
    # A ragged column, walked: rows read from Arrow stay joined, described
    # from their one tensor and their lengths and copied from it, not taken apart row by row;
    # the batch is the one Arrow's numpy conversion (an array per row) gives.
    pa = pytest.importorskip("pyarrow")
    from pincollate._plan import careful

    settings = {"none": None, "pad": Pad(), "concat": Concat(), "jagged": Jagged(), "aslist": AsList()}[policy]
    table = pa.table({"ids": [[1, 2, 3], [], [4], [5, 6]], "label": [0, 1, 2, 3]})
    numpy = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    described: list[int] = []
    monkeypatch.setattr(careful, "describe_tensors", lambda values: described.append(len(values)) or real(values))
    real = pincollate._types.builtin.describe_tensors
    with contextlib.ExitStack() as stack:
        if settings is None:
            stack.enter_context(pytest.warns(RaggedFieldWarning))
        ours = ColumnCollate(ragged=settings)(table)
    assert described == [1]  # the joined rows' one tensor
    with contextlib.ExitStack() as stack:
        if settings is None:
            stack.enter_context(pytest.warns(RaggedFieldWarning))
        theirs = ColumnCollate(ragged=settings)(numpy)
    assert_same(ours, theirs)
    assert_one_buffer(ours)


# --- columns as Ray, datasets and Arrow hand them over (found by an adversarial round) -----


RAGGED_POLICIES = {
    "pad": Pad(),
    "pad-truncate": Pad(max_length=4, truncate=True),
    "pad-multiple": Pad(multiple_of=8, lengths_key=None),
    "concat": Concat(),
    "jagged": Jagged(),
    "aslist": AsList(),
    "per-sample": PerSample(),
}


def _same_output(got, want) -> None:
    assert list(got) == list(want)
    for key in want:
        assert type(got[key]) is type(want[key]), key
        if isinstance(want[key], torch.Tensor) and want[key].is_nested:
            assert [t.tolist() for t in got[key].unbind()] == [t.tolist() for t in want[key].unbind()]
        elif isinstance(want[key], list):
            assert [t.tolist() for t in got[key]] == [t.tolist() for t in want[key]]
        else:
            assert_same(got[key], want[key])


@pytest.mark.parametrize("name", sorted(RAGGED_POLICIES))
@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
def test_ragged_takes_a_dense_column_whose_rows_share_a_length_as_it_takes_ragged_rows(name, as_tensor):
    # datasets' numpy and torch formats and Ray's conversion hand rows that share a length in one
    # batch as one dense array: ragged= applies to them as to the samples of the rows, so one
    # long-lived collate gives every batch the same keys and the policy's shapes.
    policy = RAGGED_POLICIES[name]
    batches = [
        {"ids": _objects(np.arange(6), np.arange(2)), "label": np.arange(2)},
        {"ids": np.arange(12).reshape(2, 6), "label": np.arange(2)},
        {"ids": np.arange(4).reshape(2, 2), "label": np.arange(2)},
    ]
    collate = ColumnCollate(pin_memory=False, ragged=policy)
    samples = MMCollate(pin_memory=False, ragged=policy, compile=False)
    for batch in batches:
        rows = [
            {"ids": torch.as_tensor(ids), "label": label}
            for ids, label in zip(batch["ids"], batch["label"], strict=True)
        ]
        given = {k: torch.as_tensor(v) if as_tensor and v.dtype != object else v for k, v in batch.items()}
        _same_output(collate(given), samples(rows))


def test_a_dense_column_of_numbers_under_ragged_stays_one_tensor():
    batch = ColumnCollate(pin_memory=False, ragged=Pad())({"label": np.arange(3), "ids": np.ones((3, 2))})
    assert list(batch) == ["label", "ids", "ids_lengths", "ids_mask"] and batch["label"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("column", ["abc", b"abc", {"a": 1, "b": 2}, {1, 2}], ids=["str", "bytes", "dict", "set"])
def test_a_string_mapping_or_set_is_no_column(column):
    with pytest.raises(CollateError, match=r"expected a column \(an array, tensor or sequence of rows\)") as info:
        ColumnCollate(pin_memory=False)({"x": np.arange(3), "y": column})
    assert info.value.path == ("y",)


@pytest.mark.parametrize("policy", [Pad(), Stack(), Concat()], ids=["pad", "stack", "concat"])
@pytest.mark.parametrize("dtype", ["<U2", "S2", object], ids=["unicode", "bytes", "object"])
def test_a_policy_named_for_a_string_column_refuses_it_as_for_samples(policy, dtype):
    column = np.array(["ab", "c"], dtype=dtype)
    with pytest.raises(CollateError, match=r"applies to tensors and lists of items, not to (str|bytes) values"):
        ColumnCollate(pin_memory=False, fields={"s": policy})({"s": column})
    assert ColumnCollate(pin_memory=False, fields={"s": AsList()})({"s": column})["s"] == column.tolist()


def test_a_quantized_or_meta_column_is_refused_naming_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for quantized tensors
        quantized = torch.quantize_per_tensor(torch.zeros(2, 3), 0.1, 0, torch.qint8)
    with pytest.raises(CollateError, match=r"at \['q'\]: quantized tensors are not supported"):
        ColumnCollate(pin_memory=False)({"q": quantized})
    with pytest.raises(CollateError, match=r"at \['m'\]: expected a CPU tensor, got one on meta"):
        ColumnCollate(pin_memory=False)({"m": torch.empty(2, 3, device="meta")})


def test_a_strided_nested_column_is_taken_row_by_row():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype note on strided nested tensors
        column = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(1.0)])
    batch = ColumnCollate(pin_memory=False, fields={"x": Pad()})({"x": column})
    assert batch["x"].tolist() == [[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]] and batch["x_lengths"].tolist() == [3, 1]


def test_an_arrow_table_with_two_columns_of_one_name_is_refused():
    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_arrays([pa.array([[1, 2], [3]]), pa.array([7, None])], names=["x", "x"])
    with pytest.raises(CollateError, match="the table has several columns named 'x'"):
        ColumnCollate(pin_memory=False)(table)


def test_an_arrow_record_batch_is_read_as_its_table():
    pa = pytest.importorskip("pyarrow")
    record = pa.record_batch({"ids": pa.array([[1, 2, 3], [4]]), "label": pa.array([0, 1])})
    collate = ColumnCollate(pin_memory=False, fields={"ids": Pad()})
    _same_output(collate(record), collate(pa.Table.from_batches([record])))


@pytest.mark.parametrize("layout", [b"\x80\x04garbage", "not bytes"], ids=["truncated", "str"])
def test_unpack_of_a_damaged_row_names_what_is_wrong(layout):
    row = ColumnCollate(pin_memory=False).pack({"x": np.arange(3)})
    row[pincollate._integrations.columns.LAYOUT][0] = layout
    with pytest.raises(CollateError, match="the packed batch's layout cannot be read"):
        ColumnCollate(pin_memory=False).unpack(row)


def test_nested_arrow_lists_are_refused_with_what_to_pass_instead():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"x": pa.array([[[1, 2], [3]], [[4]]])})
    with pytest.raises(CollateError, match=r"at \['x'\].*for nested lists, pass each row's items as a list of arrays"):
        ColumnCollate(pin_memory=False, fields={"x": Pad()})(table)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
def test_a_dense_column_under_a_policy_is_planned_from_its_rows_joined(as_tensor, monkeypatch):
    # Not an array per row: one flat tensor of them and their lengths, as Arrow's list columns.
    from pincollate._integrations import columns as columns_module
    from pincollate._plan.padding import Joined

    given = []
    planned = columns_module.ColumnCollate._plan_rows
    monkeypatch.setattr(
        columns_module.ColumnCollate,
        "_plan_rows",
        lambda self, values, path: given.append(values) or planned(self, values, path),
    )
    ids = np.arange(12).reshape(3, 4)
    batch = ColumnCollate(pin_memory=False, fields={"ids": Pad(max_length=6)})(
        {"ids": torch.as_tensor(ids) if as_tensor else _read_only(ids)}
    )
    assert [type(v) for v in given] == [Joined]
    assert batch["ids"].tolist() == [[*row, 0, 0] for row in ids.tolist()] and batch["ids_lengths"].tolist() == [4] * 3
