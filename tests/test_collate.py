"""mm_collate against default_collate, and what it does where that one gives up."""

from __future__ import annotations

import collections
import pickle
import re
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import pincollate
from pincollate import AsList, Batch, BatchList, CollateError, MMCollate, PerSample, RaggedFieldWarning, mm_collate
from samples import (
    PARITY,
    RAGGED,
    Frozen,
    Point,
    Record,
    UserTensor,
    assert_identical,
    assert_one_buffer,
    assert_same,
    listing,
    storages,
)


@pytest.mark.parametrize("name", sorted(PARITY))
def test_parity_with_default_collate(name):
    batch = PARITY[name]()
    assert_same(mm_collate(batch), default_collate(PARITY[name]()))


@pytest.mark.parametrize("name", sorted(PARITY))
def test_parity_holds_when_the_cached_plan_is_reused(name):
    collate = MMCollate()
    for _ in range(3):
        assert_same(collate(PARITY[name]()), default_collate(PARITY[name]()))


@pytest.mark.parametrize("name", sorted(PARITY) + sorted(RAGGED))
def test_every_tensor_is_a_view_of_one_buffer(name):
    with listing(name):
        out = MMCollate()(PARITY.get(name, RAGGED.get(name))())
    assert_one_buffer(out)


def test_top_level_containers_know_their_buffer():
    batch = mm_collate(PARITY["multimodal-dict"]())
    assert type(batch) is Batch and isinstance(batch, dict)
    assert batch.buffer.dtype == torch.uint8
    assert storages(batch) == {batch.buffer.data_ptr()}
    listed = mm_collate(PARITY["tuple-samples"]())
    assert type(listed) is BatchList and listed.buffer is not None


def test_namedtuple_batches_keep_their_type_and_pickle():
    out = mm_collate([Point(1, torch.zeros(2)), Point(2, torch.ones(2))])
    assert isinstance(out, Point) and out._fields == ("x", "y")
    again = pickle.loads(pickle.dumps(out))
    assert isinstance(again, Point) and hasattr(again, "pin_memory")
    assert torch.equal(again.y, out.y)


class _Doubled(collections.namedtuple("_Doubled", "a b")):
    """A namedtuple whose ``__new__`` changes its values: it must run once per batch, as in default_collate."""

    def __new__(cls, a, b):
        return super().__new__(cls, a * 2, b)


@pytest.mark.parametrize("compile", [True, False])
def test_a_top_level_namedtuple_is_built_once_as_default_collate_builds_it(compile):
    samples = [_Doubled(torch.tensor([1]), 0), _Doubled(torch.tensor([2]), 0)]
    expected = default_collate(samples)
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):  # walked, planned, compiled
        out = collate(samples)
        assert isinstance(out, _Doubled) and torch.equal(out.a, expected.a) and torch.equal(out.b, expected.b)


class _Tagged(dict):
    """A dict whose constructor takes the dict as something else: ``cls(fields)`` holds none of them."""

    def __init__(self, tag, **fields):
        super().__init__(**fields)
        self.tag = tag


class _Keywords(dict):
    """A dict built from keywords only: ``cls(fields)`` puts the whole dict under ``image``."""

    def __init__(self, image=None, label=None):
        super().__init__(image=image, label=label)


class _Varargs(list):
    """A list built from ``*items``: ``cls(items)`` nests them one level deeper."""

    def __init__(self, *items):
        super().__init__(items)


class _Validating(list):
    """A list whose constructor fails on a batch's values (with an error other than TypeError)."""

    def __init__(self, items=()):
        super().__init__(items)
        if any(isinstance(v, torch.Tensor) and v.dim() > 1 for v in self):
            raise RuntimeError("only 1-D values")


@pytest.mark.parametrize(
    "make",
    [
        lambda i: _Tagged("t", image=torch.full((2,), float(i)), label=i),
        lambda i: _Keywords(torch.full((2,), float(i)), i),
        lambda i: {"x": _Tagged("t", a=torch.tensor([i]))},
        lambda i: _Varargs(torch.full((2,), float(i)), i),
        lambda i: {"x": _Varargs(torch.tensor([i]), i)},
        lambda i: _Validating([torch.full((2,), float(i)), i]),
        lambda i: _Varargs({"x": torch.full((2,), float(i))}),  # one item, a container: cls(items) nests it
    ],
    ids=[
        "dict-tag-ctor",
        "dict-keyword-ctor",
        "nested-dict-tag-ctor",
        "list-varargs",
        "nested-list-varargs",
        "list-raising",
        "list-varargs-one-container",
    ],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_container_class_that_cannot_be_built_from_its_fields_keeps_every_field(make, compile):
    # default_collate copies sample 0's container and fills it; a class that cannot be built
    # from a dict (or list) of the fields holding exactly them comes back as a dict (list),
    # never empty, nested one level deeper or holding the fields under another key.
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value.tolist()

    collate = MMCollate(pin_memory=False, compile=compile)
    for j in range(3):  # walked, planned, compiled
        samples = [make(2 * j), make(2 * j + 1)]
        expected = default_collate(samples)
        out = collate(samples)
        assert plain(out) == plain(expected)
        assert type(out) in (type(expected), dict, list, Batch, BatchList)


class _TensorsOnlyDict(dict):
    """A dict whose constructor refuses values other than tensors (and cannot be built empty)."""

    def __init__(self, data):
        if not all(isinstance(v, torch.Tensor) for v in data.values()):
            raise TypeError("values must be tensors")
        super().__init__(data)


def _refused_by_its_constructor():
    """A _TensorsOnlyDict holding a string: made without its constructor, which would refuse it."""
    made = _TensorsOnlyDict.__new__(_TensorsOnlyDict)
    dict.update(made, x="s")
    return made


@pytest.mark.parametrize("compile", [True, False])
def test_whether_a_class_is_built_depends_on_each_batchs_values_not_on_an_earlier_batchs(compile):
    tensors = [{"m": _TensorsOnlyDict({"x": torch.full((2,), float(i))})} for i in range(2)]
    strings = [{"m": _refused_by_its_constructor()} for _ in range(2)]
    collate = MMCollate(pin_memory=False, compile=compile)
    got = [type(collate(batch)["m"]).__name__ for batch in (tensors, tensors, strings, tensors, tensors)]
    assert got == ["_TensorsOnlyDict", "_TensorsOnlyDict", "dict", "_TensorsOnlyDict", "_TensorsOnlyDict"]


def test_slots_are_aligned_for_every_dtype():
    layout = mm_collate.plan(PARITY["multimodal-dict"]())
    assert layout.tensors() and all(
        spec.offset % 64 == 0 for spec in layout.tensors() if spec.shape[0] > 0 and len(spec.shape) > 1
    )
    assert layout.nbytes % 64 == 0


# --- beyond default_collate -----------------------------------------------------------


def test_unequal_shapes_come_back_as_a_list():
    a, b = torch.arange(3.0), torch.arange(5.0)
    with pytest.warns(
        RaggedFieldWarning, match=r"\['x'\] holds values of different shapes, \(3,\) in sample 0 and \(5,\) in sample 1"
    ):
        out = mm_collate([{"x": a}, {"x": b}])
    assert isinstance(out["x"], list)
    assert_same(out["x"], [a, b])


def test_unequal_lists_use_item_semantics():
    a, b, c = (torch.full((2, 2), float(i)) for i in range(3))
    with pytest.warns(RaggedFieldWarning, match=r"\['img'\] holds lists of items that do not stack"):
        out = mm_collate([{"img": [a, b]}, {"img": [c]}])
    assert_same(out["img"], [torch.stack([a, b]), c.unsqueeze(0)])
    assert len(storages(out)) == 1


def test_equal_lists_transpose_like_default_collate():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    out = mm_collate([{"img": [a, b]}, {"img": [c, d]}])
    assert_same(out["img"], [torch.stack([a, c]), torch.stack([b, d])])


@pytest.mark.parametrize(
    "first,second,expected",
    [
        (torch.int32, torch.float32, torch.float32),
        (torch.uint8, torch.int8, torch.int16),
        (torch.bfloat16, torch.float16, torch.float32),
        (torch.bool, torch.int64, torch.int64),
        (torch.float32, torch.complex64, torch.complex64),
    ],
)
def test_mixed_dtypes_promote_like_result_type(first, second, expected):
    x, y = torch.ones(3, dtype=first), torch.ones(3, dtype=second)
    out = mm_collate([{"v": x}, {"v": y}])
    assert out["v"].dtype == expected == torch.result_type(x, y)
    assert torch.equal(out["v"], torch.stack([x.to(expected), y.to(expected)]))


def test_requires_grad_values_are_collated_detached():
    x = torch.ones(2, requires_grad=True)
    out = mm_collate([x, x * 2])
    assert not out.requires_grad
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [2.0, 2.0]]))


def test_dataclasses_keep_type_field_by_field():
    out = mm_collate(RAGGED["dataclass"]())
    assert isinstance(out, Record) and type(out).__mro__[1] is Record
    assert out.image.shape == (3, 3) and out.label.tolist() == [0, 1, 2] and out.name == ["r", "r", "r"]
    frozen = mm_collate(RAGGED["frozen-dataclass"]())
    assert isinstance(frozen, Frozen) and frozen.value.shape == (2, 2)


def test_none_values_are_kept_as_a_list():
    assert mm_collate(RAGGED["nones"]())["x"] == [None, None]


def test_memmap_and_read_only_arrays(tmp_path):
    path = tmp_path / "data.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    mm = np.load(path, mmap_mode="r")
    out = mm_collate([mm, mm])
    assert out.dtype == torch.float32 and out.shape == (2, 3, 4)
    assert torch.equal(out[1], torch.arange(12.0).reshape(3, 4))


def test_ragged_column_after_uniform_batches_is_handled():
    collate = MMCollate()
    for _ in range(3):
        collate([{"x": torch.zeros(2)}, {"x": torch.zeros(2)}])
    with pytest.warns(RaggedFieldWarning, match=r"\['x'\] holds values of different shapes"):
        out = collate([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])
    assert [t.shape[0] for t in out["x"]] == [2, 3]
    assert_same(collate([{"x": torch.ones(2)}, {"x": torch.ones(2)}])["x"], torch.ones(2, 2))


def test_collate_is_picklable_with_its_settings():
    collate = MMCollate(
        pin_memory=False, sequences="items", fields={"x": pincollate.Pad()}, worker_slots=3, pin_slots=True
    )
    again = pickle.loads(pickle.dumps(collate))  # what a spawned worker receives
    assert repr(again) == repr(collate)
    assert (again.worker_slots, again.pin_slots) == (3, True)


def test_default_collate_keeps_user_mapping_types():
    out = mm_collate(PARITY["ordered-mapping"]())
    assert type(out).__name__ == "Meta"


# --- bad input --------------------------------------------------------------------------


class Unsupported:
    pass


def _strided_nested():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype-stage notice
        return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])


def _quantized():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for quantized tensors
        return torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.quint8)


def _self_referencing():
    d: dict = {"x": torch.zeros(1)}
    d["me"] = d
    return [d, d]


BAD = {
    "empty-batch": ([], "empty batch"),
    "not-a-sequence": (42, "expected a sequence of samples"),
    "missing-key": ([{"a": 1, "b": 2}, {"a": 1}], r"sample 1 at root: keys differ from sample 0: missing keys \['b'\]"),
    "extra-key": ([{"a": 1}, {"a": 1, "z": 2}], r"sample 1 at root: .*extra keys \['z'\]"),
    "missing-deep-key": ([{"m": {"a": 1, "b": 2}}, {"m": {"a": 1}}], r"sample 1 at \['m'\]: .*missing keys \['b'\]"),
    "unsupported-type": (
        [{"a": Unsupported()}, {"a": Unsupported()}],
        r"sample 0 at \['a'\]: unsupported type Unsupported",
    ),
    "leaf-type-mismatch": ([{"a": torch.zeros(1)}, {"a": "x"}], r"sample 1 at \['a'\]: expected Tensor, got str"),
    "container-mismatch": ([{"a": {"b": 1}}, {"a": [1]}], r"sample 1 at \['a'\]: expected a mapping, got sequence"),
    "namedtuple-field": ([Point(torch.zeros(1), 1), Point("x", 1)], r"sample 1 at \.x: expected Tensor, got str"),
    "dataclass-field": (
        [Record(torch.zeros(1), 1), Record(torch.zeros(1), "y")],
        r"sample 1 at \.label: expected a number, got str",
    ),
    "string-array": ([np.array(["a"]), np.array(["b"])], r"sample 0 at root: numpy arrays of dtype <U1"),
    "object-array": ([{"o": np.array([object()])}] * 2, r"sample 0 at \['o'\]: numpy arrays of dtype object"),
    "sparse": ([{"s": torch.eye(2).to_sparse()}] * 2, r"sample 0 at \['s'\]: sparse"),
    "nested-tensor": (
        [{"n": torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)}] * 2,
        r"sample 0 at \['n'\]: nested tensors",
    ),
    "meta-device": (
        [{"d": torch.zeros(2)}, {"d": torch.zeros(2, device="meta")}],
        r"sample 1 at \['d'\]: expected a CPU tensor, got one on meta",
    ),
    "self-reference": (_self_referencing(), r"sample 0 at \['me'\]: the sample refers to itself"),
    "number-vs-string": ([1, "a"], r"sample 1 at root: expected a number, got str"),
    "none-beside-tensors": (
        [{"x": torch.zeros(2)}, {"x": None}],
        r"sample 1 at \['x'\]: expected Tensor, got NoneType \(pass missing='none' to take None as an absent value\)",
    ),
    "tensor-beside-none": (
        [{"x": None}, {"x": torch.zeros(2)}],
        r"sample 1 at \['x'\]: expected None, got Tensor \(pass missing='none'",
    ),
    "int-overflow": ([2**70, 1], r"sample 0 at root: int 1180591620717411303424 does not fit int64"),
    # Mixed number types (a bool beside an int; a float beside an int) are planned by their own rule.
    "bool-then-int-overflow": (
        [{"x": True}, {"x": 2**63}],
        r"sample 1 at \['x'\]: int 9223372036854775808 does not fit int64",
    ),
    "float-then-huge-int": ([{"x": 1.5}, {"x": 2**1100}], r"sample 1 at \['x'\]: an int of 1101 bits is too large"),
    "quantized": ([{"q": _quantized()}] * 2, r"sample 0 at \['q'\]: quantized tensors are not supported"),
    "strided-nested-in-dict": (
        [{"n": _strided_nested()}] * 2,
        r"sample 0 at \['n'\]: nested tensors are not supported",
    ),
    "uint16-with-int8": (
        [torch.zeros(2, dtype=torch.uint16), torch.zeros(2, dtype=torch.int8)],
        r"sample 1 at root: cannot stack torch.int8 here with torch.uint16",
    ),
    "none-then-tensor": ([{"x": None}, {"x": torch.zeros(2)}], r"sample 1 at \['x'\]: expected None, got Tensor"),
    "tensor-then-none": ([{"x": torch.zeros(2)}, {"x": None}], r"sample 1 at \['x'\]: expected Tensor, got NoneType"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_names_sample_and_key_path(name):
    batch, pattern = BAD[name]
    with pytest.raises(CollateError, match=pattern):
        mm_collate(batch)


def test_collate_error_is_both_type_and_value_error():
    assert issubclass(CollateError, TypeError) and issubclass(CollateError, ValueError)
    error = CollateError("boom", sample=3, path=("meta", "boxes"))
    assert str(error) == "sample 3 at ['meta']['boxes']: boom"
    assert error.sample == 3 and error.path == ("meta", "boxes")


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"pin_memory": "yes"}, "pin_memory must be"),
        ({"pin_memory": 0}, "pin_memory must be"),  # 0 == False passed a membership test, then read as "auto"
        ({"pin_memory": 1}, "pin_memory must be"),
        ({"sequences": "zip"}, "sequences must be"),
        ({"missing": "drop"}, "missing must be"),
        ({"ragged": "pad"}, "ragged must be a policy"),
        ({"worker_slots": -1}, "worker_slots must be an int >= 0"),
        ({"worker_slots": 2.0}, "worker_slots must be an int >= 0"),
        ({"pin_slots": 1}, "pin_slots must be True or False"),
    ],
)
def test_invalid_settings(kwargs, pattern):
    with pytest.raises(CollateError, match=pattern):
        MMCollate(**kwargs)


# --- one rule per case, where default_collate is silent or gives up ------------------------


class _Celsius(float):
    pass


def test_python_floats_are_float64_stacked_or_not():
    missing = MMCollate(missing="none")([{"x": 0.1}, {}, {"x": 1e300}])["x"]
    assert [None if t is None else t.dtype for t in missing] == [torch.float64, None, torch.float64]
    assert missing[2].item() == 1e300
    listed = MMCollate(fields={"x": pincollate.AsList()})([{"x": 0.1}, {"x": 0.2}])["x"]
    assert [t.dtype for t in listed] == [torch.float64] * 2 and listed[0].item() == 0.1
    assert (
        mm_collate([_Celsius(1.5), _Celsius(2.5)]).dtype == torch.float64 == default_collate([_Celsius(1.5), 2.5]).dtype
    )


def test_absent_namedtuple_and_dataclass_fields_are_none_with_missing_none():
    out = MMCollate(missing="none")([{"p": Point(1, torch.zeros(2))}, {}])
    assert isinstance(out["p"], Point)
    assert out["p"].x[0].item() == 1 and out["p"].x[1] is None
    assert out["p"].y[1] is None and torch.equal(out["p"].y[0], torch.zeros(2))
    records = MMCollate(missing="none")([{"r": Record(torch.zeros(2), 1)}, {"r": None}])
    assert records["r"].label[1] is None and records["r"].label[0].item() == 1


def test_items_of_unequal_and_equal_shapes_follow_item_semantics():
    t2, t3 = torch.zeros(2), torch.ones(3)
    with pytest.warns(RaggedFieldWarning, match="sample 0's items have shapes \\(2,\\) and \\(3,\\)"):
        out = MMCollate(sequences="items")([{"x": [t2, t3]}, {"x": [t2, t2]}])
    assert_same(out["x"], [[t2, t3], torch.stack([t2, t2])])
    assert_one_buffer(out)


def test_a_tensor_subclass_stays_its_class():
    class Tagged(torch.Tensor):
        pass

    values = [torch.zeros(2).as_subclass(Tagged), torch.ones(2).as_subclass(Tagged)]
    out = mm_collate(values)
    assert type(out) is Tagged and type(default_collate(values)) is Tagged


def test_a_collate_error_rebuilt_from_its_message_keeps_sample_and_path():
    original = CollateError("expected Tensor, got str", sample=3, path=("meta", pincollate._errors.Attr("box"), 0))
    message = f"Caught CollateError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  ...\npincollate.CollateError: {original}\n"
    again = CollateError(message)
    assert again.sample == 3 and again.path == ("meta", "box", 0)
    assert CollateError("no path here").path == () and CollateError("no path here").sample is None


def test_reading_a_key_back_is_left_to_the_worker_and_done_one_thread_at_a_time(monkeypatch):
    # CPython 3.11's ast module is not safe for two threads parsing at once (a SystemError in place
    # of the key): the main process never parses its own path, and the parses are serialised.
    seen = []

    def literal_eval(text):
        seen.append(pincollate._errors._LITERALS.locked())
        return real(text)

    real = pincollate._errors.ast.literal_eval
    monkeypatch.setattr(pincollate._errors.ast, "literal_eval", literal_eval)
    CollateError("expected Tensor, got str", sample=3, path=("meta", 0))
    assert seen == []
    original = CollateError("expected Tensor, got str", sample=3, path=("meta", 0))
    again = CollateError(f"Caught CollateError in DataLoader worker process 0.\npincollate.CollateError: {original}\n")
    assert again.path == ("meta", 0) and seen == [True, True]


def test_a_float_column_takes_ints_beyond_int64_as_default_collate():
    samples = [1.0, 2**70]
    assert_same(MMCollate(pin_memory=False)(samples), default_collate(samples))
    with pytest.raises(CollateError, match="does not fit int64") as info:
        MMCollate(pin_memory=False)([1, 2**70])
    assert info.value.sample == 1


def test_uint64_numpy_scalars_become_a_uint64_tensor():
    out = MMCollate(pin_memory=False)([{"n": np.uint64(2**63 + 1)}, {"n": np.uint64(2)}])
    assert out["n"].dtype == torch.uint64 and out["n"].tolist() == [2**63 + 1, 2]


def test_a_read_only_mapping_comes_back_as_default_collate_makes_it():
    import collections.abc as abc

    class ReadOnly(abc.Mapping):
        def __init__(self, **items):
            self._items = dict(items)

        def __getitem__(self, key):
            return self._items[key]

        def __iter__(self):
            return iter(self._items)

        def __len__(self):
            return len(self._items)

    samples = [ReadOnly(a=torch.ones(1)), ReadOnly(a=torch.zeros(1))]
    assert_same(MMCollate(pin_memory=False)(samples), default_collate(samples))


def test_a_truncated_image_names_its_sample_and_key_path():
    import io

    from PIL import Image

    def image(truncated: bool) -> Image.Image:
        stream = io.BytesIO()
        Image.effect_noise((32, 32), 40).convert("RGB").save(stream, "JPEG")
        data = stream.getvalue()
        return Image.open(io.BytesIO(data[: len(data) * 2 // 3] if truncated else data))

    collate = MMCollate(pin_memory=False)
    collate([{"img": image(False)} for _ in range(3)])  # a warm plan
    for fresh in (collate, MMCollate(pin_memory=False)):
        with pytest.raises(CollateError, match="cannot read the image") as info:
            fresh([{"img": image(False)}, {"img": image(False)}, {"img": image(True)}])
        assert info.value.sample == 2 and info.value.path == ("img",)


def test_a_sample_that_refers_to_itself_is_named_the_same_fresh_or_warm():
    # A fresh collate and one that has planned other structures give the careful walk's error.
    fresh = MMCollate(pin_memory=False)
    warm = MMCollate(pin_memory=False)
    warm([{"x": torch.zeros(1), "me": {"x": torch.zeros(1)}}] * 2)
    messages = []
    for collate in (fresh, warm, fresh):
        with pytest.raises(CollateError) as info:
            collate(_self_referencing())
        messages.append(str(info.value))
    assert messages == ["sample 0 at ['me']: the sample refers to itself: this object is also at root"] * 3


@pytest.mark.parametrize(
    "column",
    [
        [np.zeros(2, dtype=np.float32), torch.ones(2).as_subclass(UserTensor)],
        [np.zeros(2), torch.ones(2).as_subclass(UserTensor)],
        [np.zeros(2, dtype=np.float32), torch.nn.Parameter(torch.ones(2))],  # stacks plain
        [np.float32(1.0), torch.ones(()).as_subclass(UserTensor)],
        [1.5, torch.ones(()).as_subclass(UserTensor)],
    ],
    ids=["array-subclass", "float64-array-subclass", "array-parameter", "np-scalar-subclass", "float-subclass"],
)
def test_a_column_mixing_arrays_or_numbers_with_a_subclass_has_default_collates_class(column):
    batch = [{"x": value} for value in column]
    expected = default_collate(batch)
    collate = MMCollate(pin_memory=False)
    for _ in range(2):  # planned, then warm
        out = collate(batch)
        assert_identical(out["x"], expected["x"])
        assert_one_buffer(out)


@pytest.mark.parametrize(
    "column",
    [
        [np.float64(1.0), np.complex64(2 + 5j)],
        [np.float64(1.0), 2 + 5j],
        [np.complex64(2 + 5j), np.float64(1.0)],
        [np.float64(1.5), 2, True],
    ],
    ids=["np-float64-np-complex", "np-float64-complex", "np-complex-np-float64", "np-float64-int-bool"],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_number_column_that_starts_with_numpys_float64_is_numpys_as_in_default_collate(column, compile):
    # numpy's float64 subclasses float, but default_collate takes it as a numpy scalar
    # (torch.as_tensor of the column): a complex number after it keeps its imaginary part.
    batch = [{"x": value} for value in column]
    expected = default_collate(batch)
    collate = MMCollate(pin_memory=False, compile=compile)
    collate([{"x": np.float64(0.5)} for _ in column])
    collate([{"x": np.float64(0.5)} for _ in column])  # planned and compiled for float64 scalars
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's ComplexWarning: an imaginary part dropped
        for _ in range(2):
            assert_identical(collate(batch)["x"], expected["x"])


@pytest.mark.parametrize("later", [np.complex128(2 + 5j), np.complex64(2 + 5j)], ids=["complex128", "complex64"])
def test_a_python_float_column_with_a_complex_number_later_is_complex_where_default_collate_loses_it(later):
    batch = [{"x": 1.0}, {"x": later}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's ComplexWarning
        assert default_collate(batch)["x"].tolist() == [1.0, 2.0]  # the imaginary part dropped
    for compile in (True, False):
        out = MMCollate(pin_memory=False, compile=compile)(batch)["x"]
        assert out.dtype == torch.complex128 and out.tolist() == [1 + 0j, 2 + 5j]


@pytest.mark.parametrize(
    "column",
    [
        [np.array([1, 2]), [3, 4]],
        [np.array([1.5, 2.0], dtype=np.float32), (3, 4)],
        [[3, 4], torch.tensor([1, 2]), np.array([5, 6])],
        [np.array([1, 2]), Point(3, 4)],
        [Point(1, 2), [3, 4], torch.tensor([5, 6]), np.array([7, 8]), (9, 10)],
    ],
    ids=["array-then-list", "array-then-tuple", "list-then-rows", "array-then-namedtuple", "namedtuple-then-rows"],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_column_of_arrays_beside_lists_is_what_default_collate_makes_of_it(column, compile):
    # default_collate makes each value of a column that starts with an array a tensor, lists too,
    # and zips a column that starts with a list by the rows of a tensor or array beside it.
    batch = [{"x": value} for value in column]
    expected = default_collate(batch)
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):
        out = collate(batch)
        assert_identical(out["x"], expected["x"])
        assert_one_buffer(out)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize(
    "first", [[torch.ones(2), 0], (torch.ones(2), 0), [1.0, 2.0]], ids=["list", "tuple", "numbers"]
)
@pytest.mark.parametrize("kind", ["nested", "sparse"])
@pytest.mark.parametrize("compile", [True, False])
def test_a_tensor_the_walk_refuses_after_a_list_is_named_as_when_it_comes_first(first, kind, compile):
    # Zipped by its rows beside sequences, a nested tensor raised torch's internal error and a
    # sparse one was read densely: each is refused as it is alone, naming its sample.
    if kind == "nested":
        value = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
        says = "nested tensors are not supported; pass their components as a list"
    else:
        value = torch.tensor([5.0, 7.0]).to_sparse()
        says = r"sparse or non-strided tensors \(torch.sparse_coo\) are not supported"
    collate = MMCollate(pin_memory=False, compile=compile)
    for batch in ([{"v": first}, {"v": value}], [{"v": value}, {"v": first}]):
        with pytest.raises(CollateError, match=says) as info:
            collate(batch)
        assert info.value.sample == batch.index(next(s for s in batch if s["v"] is value))
        assert info.value.path == ("v",)


@pytest.mark.parametrize(
    "column, sample, says",
    [
        ([torch.tensor(1), 10**30], 1, "int 1000000000000000000000000000000 does not fit int64"),
        ([10**30, torch.tensor(1)], 0, "int 1000000000000000000000000000000 does not fit int64"),
        ([np.True_, 1, 2], 1, "'numpy.bool' object cannot be interpreted as an integer"),
        ([1, 2, torch.ones(2)], 2, "stack expects each tensor to be equal size"),
        ([np.array([1, 2]), [3, 4, 5]], 1, "stack expects each tensor to be equal size"),
    ],
    ids=["huge-int-after-tensor", "huge-int-first", "numpy-bool-beside-int", "vector-after-numbers", "longer-list"],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_mixed_column_that_does_not_convert_names_the_sample(column, sample, says, compile):
    with pytest.raises((RuntimeError, TypeError, ValueError)):  # default_collate refuses it too
        default_collate([{"x": value} for value in column])
    with pytest.raises(CollateError, match=re.escape(says)) as info:
        MMCollate(pin_memory=False, compile=compile)([{"x": value} for value in column])
    assert (info.value.sample, info.value.path) == (sample, ("x",))


def _outcome(collate: MMCollate, batch: list) -> tuple[str, list[str]]:
    """What ``batch`` gives: its error's text (or "ok"), and the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            collate(batch)
            said = "ok"
        except CollateError as error:
            said = str(error)
    return said, [str(w.message) for w in caught]


def test_a_batch_with_two_faults_gets_the_careful_walk_s_error_from_a_compiled_plan():
    # A compiled plan reads number fields after the others, and a field that failed once is
    # planned anew after them: the error is still the first fault in key order, the walk's.
    batches = [
        [{"score": 1}, {"score": 0.5}],
        [{"lab": 1, "n2": 0, "score": 0.5}],
        [{"lab": 2**1023, "n2": True, "score": -(2**63) - 1}],
    ]
    compiled, careful = MMCollate(pin_memory=False), MMCollate(pin_memory=False, compile=False)
    outcomes = [(_outcome(compiled, batch), _outcome(careful, batch)) for batch in batches]
    assert all(ours == theirs for ours, theirs in outcomes)
    assert "['lab']" in outcomes[-1][0][0]
    with pytest.raises(CollateError, match=r"\['lab'\]"):
        compiled.plan(batches[-1])


@pytest.mark.parametrize("faulty", ["x", "n"])
def test_a_failing_batch_warns_of_no_listed_sibling_and_a_later_batch_does(faulty):
    # 'f' newly ragged (a per-sample list, warned of); 'x' items that do not stack, or 'n' an int
    # past int64 (read after the other fields by a compiled plan, before 'x' by the walk): an error.
    # A failed batch warns of nothing, so the field is warned of by the next batch that collates.
    fields = {"x": pincollate.Concat(items="stack")}

    def sample(f: torch.Tensor, x: torch.Tensor, n: int = 1) -> dict:
        return {"n": n, "f": f, "x": x}

    first = [sample(torch.ones(3), torch.tensor([[1, 2]])), sample(torch.ones(3), torch.tensor([[3, 4]]))]
    bad_x = [sample(torch.ones(3), torch.tensor([[1, 2], [3, 4]])), sample(torch.zeros(4), torch.zeros(0, 2))]
    bad_n = [sample(torch.ones(3), torch.tensor([[1, 2]]), 2**70), sample(torch.zeros(4), torch.tensor([[3, 4]]))]
    ragged = [sample(torch.ones(3), torch.tensor([[1, 2]])), sample(torch.zeros(4), torch.tensor([[3, 4]]))]
    compiled = MMCollate(pin_memory=False, fields=fields)
    careful = MMCollate(pin_memory=False, fields=fields, compile=False)
    outcomes = []
    for batch in (first, first, first, bad_x if faulty == "x" else bad_n, ragged, ragged):
        ours, theirs = _outcome(compiled, batch), _outcome(careful, batch)
        assert ours == theirs
        outcomes.append(ours)
    failed, warned, quiet = outcomes[3:]
    assert failed[0] != "ok" and failed[1] == []
    assert warned[0] == "ok" and len(warned[1]) == 1 and "['f'] holds values of different shapes" in warned[1][0]
    assert quiet == ("ok", [])


def test_fields_listed_in_one_batch_are_warned_of_in_key_path_order_whatever_reads_them_first():
    # A compiled plan reads a listed field beside a block of numbers, and a nested one, in its own order.
    samples = [{"b": torch.zeros(i + 1), "a": {"z": torch.zeros(i + 2)}, "c": torch.zeros(2 - i)} for i in range(2)]
    same = [{"b": torch.zeros(1), "a": {"z": torch.zeros(2)}, "c": torch.zeros(2)} for _ in range(2)]
    for compile in (True, False):
        collate = MMCollate(pin_memory=False, compile=compile)
        for _ in range(3):
            assert _outcome(collate, same) == ("ok", [])
        said, messages = _outcome(collate, samples)
        assert said == "ok"
        assert [message.split(" holds")[0] for message in messages] == [
            "pincollate: ['a']['z']",
            "pincollate: ['b']",
            "pincollate: ['c']",
        ]


@pytest.mark.parametrize("compile", [True, False])
def test_a_field_of_tensors_beside_arrays_collates_in_a_worker_as_in_the_main_process(compile, monkeypatch):
    # default_collate, asked for such a column in a DataLoader worker, sums its values' numel() to
    # allocate shared memory and fails on the array: the walk stacks them as it does in the main process.
    samples = [{"odd": torch.ones(3), "i": 0}, {"odd": np.zeros(3, np.float32), "i": 1}]
    main = MMCollate(pin_memory=False, compile=compile)(samples)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # what default_collate asks
    worker = MMCollate(pin_memory=False, compile=compile)(samples)
    assert_identical(worker, main)
    assert worker["odd"].tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("compile", [True, False])
@pytest.mark.parametrize(
    "odd, says",
    [
        (torch.zeros(2, device="meta"), "expected a CPU tensor, got one on meta (a meta tensor has no data)"),
        (torch.zeros(2).to_sparse(), "sparse or non-strided tensors (torch.sparse_coo) are not supported"),
    ],
    ids=["meta", "sparse"],
)
def test_a_refused_tensor_among_numbers_is_named_by_its_own_sample(odd, says, compile):
    samples = [{"z": [0.5, odd]}, {"z": [0.5, 7]}, {"z": [0.5, 7]}]
    with pytest.raises(CollateError) as info:
        MMCollate(pin_memory=False, compile=compile)(samples)
    assert (info.value.sample, info.value.path) == (0, ("z", 1)) and says in str(info.value)


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
@pytest.mark.parametrize(
    ("numbers", "dtype"),
    [([1.5, 2], torch.float64), ([1.5, 2, 3j], torch.complex128), ([2, 1.5], torch.float32), ([True, 2], torch.int64)],
    ids=["float-first", "complex-later", "int-first", "bool-first"],
)
def test_numbers_not_stacked_take_their_columns_dtype(compile, numbers, dtype):
    # One rule for a column of numbers, stacked or not: each value listed by AsList(), kept per
    # sample by PerSample(), or beside absent entries has the dtype the stacked column has.
    stacked = MMCollate(pin_memory=False, compile=compile)([{"f": n} for n in numbers])["f"]
    assert stacked.dtype == dtype
    for fields in ({"f": AsList()}, {"f": PerSample()}):
        collate = MMCollate(fields=fields, pin_memory=False, compile=compile)
        for _ in range(2):  # the walk's batch, then the plan's
            got = collate([{"f": n} for n in numbers])["f"]
            assert [v.dtype for v in got] == [dtype] * len(numbers)
            assert [v.item() for v in got] == stacked.tolist()
    collate = MMCollate(missing="none", pin_memory=False, compile=compile)
    for _ in range(2):
        got = collate([{"f": n, "k": 0} for n in numbers] + [{"k": 0}])["f"]
        assert [v.dtype for v in got[:-1]] == [dtype] * len(numbers) and got[-1] is None


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
def test_a_wrapper_tensor_subclass_is_refused_by_name(compile):
    # A __torch_dispatch__ subclass answers the copy into the buffer itself: a tensor made of two
    # came back as a plain tensor holding one of them, silently.
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    pair = two_tensor.TwoTensor(torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]))
    collate = MMCollate(pin_memory=False, compile=compile)
    collate([{"x": torch.zeros(2)}, {"x": torch.zeros(2)}])  # a plan that stacks plain tensors
    for samples, where in (
        ([{"x": pair}, {"x": pair}], r"sample 0 at \['x'\]"),
        ([{"x": torch.zeros(2)}, {"x": pair}], r"sample 1 at \['x'\]"),
        ([{"x": [torch.zeros(2), pair]}, {"x": [torch.zeros(2)]}], r"sample 0 at \['x'\]\[1\]"),
    ):
        with pytest.raises(CollateError, match=rf"^{where}: TwoTensor is a wrapper tensor subclass"):
            collate(samples)


class _DecodedOnRead(dict):
    """A dict that decodes a list into a tensor each time a value is read (as default_collate reads: by [])."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        return torch.tensor(value) if isinstance(value, list) else value


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
def test_mappings_are_read_by_their_keys_and_items_as_default_collate_reads_them(compile):
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):
        got = collate([_DecodedOnRead(x=[1.0, 2.0], n=1) for _ in range(2)])
        assert type(got) is _DecodedOnRead and torch.equal(got["x"], torch.tensor([[1.0, 2.0], [1.0, 2.0]]))
    collate = MMCollate(pin_memory=False, compile=compile, missing="none")
    for _ in range(3):
        got = collate([_DecodedOnRead(x=[1.0, 2.0]), _DecodedOnRead(y=1)])
        listed = dict.__getitem__(got, "x")  # the output's own class would decode the list on reading it
        assert torch.equal(listed[0], torch.tensor([1.0, 2.0])) and listed[1] is None


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
def test_a_mapping_whose_len_is_not_its_key_count_keeps_its_class(compile):
    # A TensorDict's len() is its batch size (0 here): it came back a dict, and from the second
    # batch on raised "the samples changed while they were collated".
    tensordict = pytest.importorskip("tensordict")
    samples = [
        tensordict.TensorDict({"obs": torch.full((4,), float(i)), "r": torch.tensor(1.0)}, batch_size=[])
        for i in range(3)
    ]
    expected = default_collate(samples)
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):
        got = collate(samples)
        assert type(got) is type(expected) and set(got.keys()) == {"obs", "r"}
        assert torch.equal(got["obs"], expected["obs"]) and torch.equal(got["r"], expected["r"])


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
def test_numbers_past_a_narrow_dtypes_range_are_inf_without_a_warning(compile, recwarn):
    # torch.tensor makes them inf without a word; numpy's cast warned (an error under -W error,
    # raised as one without a sample or key path).
    import warnings

    collate = MMCollate(pin_memory=False, compile=compile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert collate([{"x": 1}, {"x": 1e300}])["x"].tolist() == [1.0, float("inf")]
            got = collate([{"x": np.float16(1.5)}, {"x": 70000}])["x"]
            assert got.dtype == torch.float16 and got.tolist() == [1.5, float("inf")]
            got = collate([{"x": 1, "y": 2.5}, {"x": 1e300, "y": 3}])
            assert got["x"].tolist() == [1.0, float("inf")] and got["x"].dtype == torch.float32
