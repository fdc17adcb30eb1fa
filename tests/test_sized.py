"""Sized plans: a plan whose parts are all padded fields makes its batches by one generated function."""

import collections
import contextlib
import dataclasses
import io
import pickle
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import pincollate
from pincollate import MMCollate, Pad
from pincollate._errors import format_path
from pincollate._plan import sized as _sized
from samples import assert_identical


@contextlib.contextmanager
def _inline_only(plan: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Batches run by ``plan``'s function inside: one that goes the longer way fails the test."""

    def longer_way(*args: object) -> None:
        raise AssertionError("a batch the plan's function describes went the longer way")

    with monkeypatch.context() as patch:
        patch.setitem(plan.compiled.run.__globals__, "slow", longer_way)  # type: ignore[attr-defined]
        yield


def _agrees(compiled: MMCollate, careful: MMCollate, batch: list) -> tuple[object, object] | None:
    """``compiled(batch)`` is exactly ``careful(batch)`` (returned, with it), or raises the same error (``None``)."""
    try:
        expected = careful(batch)
    except pincollate.CollateError as error:
        with pytest.raises(pincollate.CollateError) as raised:
            compiled(batch)
        assert str(raised.value) == str(error)
        return None
    out = compiled(batch)
    assert_identical(out, expected)
    return out, expected


POLICIES = {
    "default": Pad(),
    "left": Pad(side="left", value=-1),
    "multiple_of": Pad(multiple_of=8, mask_key=None),
    "max_length": Pad(max_length=12, lengths_key=None),
    "truncate": Pad(max_length=5, truncate=True),
    "no_extras": Pad(lengths_key=None, mask_key=None),
    "dims_last": Pad(dims=[-1]),
}


def _sample(rng: random.Random, i: int, name: str, dtype: torch.dtype) -> dict:
    n = rng.randint(0, 10)
    ids = torch.arange(n * 2 if name == "dims_last" else n).to(dtype) + i
    if name == "dims_last":
        ids = ids.reshape(2, n)  # 2 channels, padded along the last dimension
    return {
        "image": torch.full((3, 2, 2), float(i)),
        "ids": ids,
        "label": i,
        "name": f"s{i}",
    }


def _batches(name: str, dtype: torch.dtype = torch.int64, count: int = 12, size: int = 4) -> list[list[dict]]:
    rng = random.Random(hash((name, str(dtype))) % 1000)
    return [[_sample(rng, k * size + i, name, dtype) for i in range(size)] for k in range(count)]


def _pair(policy: Pad, **settings) -> tuple[MMCollate, MMCollate]:
    compiled = MMCollate(pin_memory=False, fields={"ids": policy}, **settings)
    return compiled, MMCollate(pin_memory=False, fields={"ids": policy}, compile=False, **settings)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        (name, dtype)
        for name in sorted(POLICIES)
        for dtype in (torch.int64, torch.float16, torch.bfloat16, torch.bool)
        if not (name == "left" and dtype == torch.bool)  # -1 does not fit bool: the policy's own error
    ],
)
def test_a_long_lived_sized_plan_gives_what_the_careful_walk_gives(name, dtype):
    compiled, careful = _pair(POLICIES[name])
    kept = []
    for batch in _batches(name, dtype):
        out = compiled(batch)
        assert_identical(out, careful(batch))
        kept.append((out, careful(batch)))
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None, "every part padded: the sized function"
    for out, expected in kept:  # earlier batches are their own: a later one wrote nothing of theirs
        assert_identical(out, expected)


def test_batches_of_the_same_sizes_share_one_layout_and_other_sizes_get_theirs():
    compiled, _ = _pair(Pad())
    lengths = [[1, 3], [2, 3], [3, 1], [1, 4]]
    outs = [compiled([{"ids": torch.arange(n), "label": 0} for n in row]) for row in lengths]
    assert outs[0].layout is outs[1].layout is outs[2].layout  # all padded to 3
    assert outs[3].layout is not outs[0].layout and outs[3]["ids"].shape == (2, 4)
    assert outs[0].layout == compiled.plan([{"ids": torch.arange(n), "label": 0} for n in lengths[0]])
    assert len(compiled._plans.last.sized.kept) == 2


def test_past_the_most_layouts_they_are_made_again(monkeypatch):
    monkeypatch.setattr(_sized, "MOST_LAYOUTS", 3)
    compiled, careful = _pair(Pad(mask_key=None))
    for longest in [*range(1, 9), 2, 1]:
        batch = [{"ids": torch.arange(longest), "label": 1}, {"ids": torch.arange(1), "label": 2}]
        assert_identical(compiled(batch), careful(batch))
        assert len(compiled._plans.last.sized.kept) <= 3


def _ids(*values, **extra) -> list[dict]:
    return [{"ids": value, "label": i, **extra} for i, value in enumerate(values)]


ONE_FACT_OFF = {
    "another dtype": _ids(torch.arange(3, dtype=torch.int32), torch.arange(2, dtype=torch.int32)),
    "mixed dtypes": _ids(torch.arange(3), torch.arange(2, dtype=torch.int32)),
    "another rank": _ids(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64)),
    "a subclass": _ids(torch.nn.Parameter(torch.zeros(3), requires_grad=False), torch.zeros(1)),
    "an array": _ids(np.arange(3), np.arange(5)),
    "a list of ints": _ids([1, 2, 3], [4]),
    "too long": _ids(torch.arange(40), torch.arange(2)),
    "all empty": _ids(torch.arange(0), torch.arange(0)),
}


@pytest.mark.parametrize("case", sorted(ONE_FACT_OFF))
@pytest.mark.parametrize("policy", [Pad(), Pad(max_length=16), Pad(max_length=16, truncate=True)], ids=repr)
def test_a_batch_one_fact_off_gives_what_the_careful_walk_gives(case, policy):
    compiled, careful = _pair(policy)
    warm = _ids(torch.arange(3), torch.arange(1))
    compiled(warm), compiled(warm)  # a sized plan, warm
    assert compiled._plans.last.sized is not None
    batch = ONE_FACT_OFF[case]
    _agrees(compiled, careful, batch)
    assert_identical(compiled(warm), careful(warm))  # and the plan still takes its own batches


def test_a_missing_value_goes_to_the_recipe_and_the_next_batch_is_sized_again():
    compiled, careful = _pair(Pad(), missing="none")
    full = _ids(torch.arange(3), torch.arange(1))
    compiled(full), compiled(full)
    plan = compiled._plans.last
    holes = _ids(torch.arange(2), None)
    assert_identical(compiled(holes), careful(holes))  # an empty row, by the recipe
    assert compiled._plans.last is plan and plan.sized is not None
    assert_identical(compiled(full), careful(full))


def test_a_plan_compiles_its_walking_function_only_when_a_batch_first_needs_it():
    compiled, careful = _pair(Pad(), missing="none")
    full = _ids(torch.arange(3), torch.arange(1))
    compiled(full), compiled(full)
    plan = compiled._plans.last
    assert plan.sized is not None and plan.walking is None  # one function compiled, the batch's own
    holes = _ids(torch.arange(2), None)
    assert_identical(compiled(holes), careful(holes))  # an absent value: padding, by the function itself
    assert plan.walking is None
    other = _ids(torch.arange(2, dtype=torch.int32), None)  # another dtype: not what the function reads
    assert_identical(compiled(other), careful(other))
    walking = plan.walking  # its parts walked: compiled now, once
    assert walking is not None and compiled._plans.last is plan and "walk = Fill(" in walking.source
    assert_identical(compiled(other), careful(other))
    assert plan.walking is walking
    assert_identical(compiled(holes), careful(holes))


def test_a_sized_batch_saves_pickles_and_rebuilds_in_one_piece():
    compiled, careful = _pair(Pad(mask_key="mask"))
    batch = _ids(torch.arange(3), torch.arange(5))
    compiled(batch)
    out = compiled(batch)
    again = pickle.loads(pickle.dumps(out))
    assert_identical(again, careful(batch))
    stream = io.BytesIO()
    torch.save(out, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), careful(batch))
    rebuilt = out.layout.build(out.buffer.clone())
    assert rebuilt["ids"].tolist() == out["ids"].tolist() and rebuilt["mask"].tolist() == out["mask"].tolist()


def test_a_sized_batch_in_pinned_memory_is_built_by_its_layout(fake_pinned):
    compiled = MMCollate(pin_memory=True, fields={"ids": Pad()})
    batch = _ids(torch.arange(3), torch.arange(5))
    for _ in range(3):
        out = compiled(batch)
    assert compiled._plans.last.sized is not None
    assert_identical(out, MMCollate(pin_memory=False, fields={"ids": Pad()}, compile=False)(batch))
    storages = {t.untyped_storage().data_ptr() for t in (out["ids"], out["ids_mask"], out["label"])}
    assert storages == {out.buffer.untyped_storage().data_ptr()}  # views of the pinned buffer's one storage


def test_two_padded_fields_and_a_nested_one_are_read_inline():
    policies = {"a": Pad(), "inner.b": Pad(value=7, mask_key=None)}
    compiled = MMCollate(pin_memory=False, fields=policies)
    careful = MMCollate(pin_memory=False, fields=policies, compile=False)
    rng = random.Random(3)
    for _ in range(6):
        batch = [
            {"a": torch.rand(rng.randint(1, 6)), "inner": {"b": torch.arange(rng.randint(0, 4)), "c": 1.5}}
            for _ in range(3)
        ]
        assert_identical(compiled(batch), careful(batch))
    plan = compiled._plans.last
    assert plan.sized is not None and len(plan.sized.parts) == 2
    assert f"# {format_path(('inner', 'b'))}\n" in plan.compiled.source  # each part's lines start with its key path


def test_a_part_neither_sized_nor_listed_is_walked_by_the_plan_s_function():
    compiled = MMCollate(pin_memory=False, fields={"a": Pad(), "b": pincollate.AsList()})
    careful = MMCollate(pin_memory=False, fields={"a": Pad(), "b": pincollate.AsList()}, compile=False)
    # Each sample's items a list in some samples and a tuple of arrays in others, and a number that is
    # an int in some samples and a 0-d tensor in others: walked (each as its kind makes it), placed
    # after the padded field, whose sizes the function reads.
    for lengths in ((1, 3), (2, 2), (4, 0)):
        batch = [
            {
                "a": torch.arange(n),
                "b": [torch.zeros(n)] if i % 2 else (np.zeros(n, np.float32),),
                "x": i if i % 2 else torch.tensor(i),
                "s": f"{i}",
            }
            for i, n in enumerate(lengths)
        ]
        assert_identical(compiled(batch), careful(batch))
    plan = compiled._plans.last
    assert plan.walks and plan.sized is not None
    assert "walk = Fill(" in plan.compiled.source and plan.walking is None


CONCATS = {
    "tensors": (pincollate.Concat(), False),
    "items": (pincollate.Concat(), True),
    "items, offsets only": (pincollate.Concat(counts_key=None, item_offsets_key=None), True),
    "no extras": (pincollate.Concat(offsets_key=None, counts_key=None, item_offsets_key=None), True),
}


def _patches(rng: random.Random, items: bool, trailing: tuple[int, ...]) -> object:
    if not items:
        return torch.rand(rng.randint(0, 5), *trailing)
    return [torch.rand(rng.randint(0, 4), *trailing) for _ in range(rng.randint(0, 3))]


@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)], ids=str)
@pytest.mark.parametrize("name", sorted(CONCATS))
def test_a_long_lived_concatenating_plan_gives_what_the_careful_walk_gives(name, trailing):
    policy, items = CONCATS[name]
    fields = {"x": policy, "ids": Pad()}  # beside a padded field, as a VLM's patches and token ids
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    rng = random.Random(7)
    kept = []
    for _ in range(12):
        batch = [{"x": _patches(rng, items, trailing), "ids": torch.arange(rng.randint(1, 5))} for _ in range(4)]
        batch[0]["x"] = _patches(random.Random(1), items, trailing) if items else torch.rand(2, *trailing)
        made = _agrees(compiled, careful, batch)  # every item list empty: the policy's own error
        if made is not None:
            kept.append(made)
    assert compiled._plans.last.sized is not None
    for out, expected in kept:
        assert_identical(out, expected)


def test_concatenated_values_of_other_trailing_sizes_get_the_careful_walk_s_result():
    compiled, careful = (
        MMCollate(pin_memory=False, fields={"x": pincollate.Concat()}, compile=c) for c in (True, False)
    )
    warm = [{"x": torch.zeros(2, 3)}, {"x": torch.ones(1, 3)}]
    compiled(warm), compiled(warm)
    for batch in (
        [{"x": torch.zeros(2, 4)}, {"x": torch.ones(1, 4)}],  # another trailing size, one for all: a new layout
        [{"x": torch.zeros(2, 4)}, {"x": torch.ones(1, 3)}],  # two trailing sizes: the careful error
        [{"x": torch.zeros(2, 3, dtype=torch.float64)}, {"x": torch.ones(1, 3)}],
    ):
        _agrees(compiled, careful, batch)
    assert compiled._plans.last.sized is not None


def _rows(*counts: int, trailing=(3,), dtype=torch.float32) -> list[dict]:
    return [{"x": torch.full((n, *trailing), float(i)).to(dtype), "label": i} for i, n in enumerate(counts)]


def _item_rows(*per_sample: tuple[int, ...]) -> list[dict]:
    """Per-sample lists of items, each of ``n`` rows of 3 (sample ``i``'s counts: ``per_sample[i]``)."""
    return [
        {"x": [torch.full((n, 3), float(10 * i + j)) for j, n in enumerate(ns)], "label": i}
        for i, ns in enumerate(per_sample)
    ]


JAGGED_OFF = {
    "another dtype": _rows(2, 1, 3, dtype=torch.float64),
    "another trailing size": _rows(2, 1, 3, trailing=(4,)),
    "two trailing sizes": [{"x": torch.zeros(2, 3), "label": 0}, {"x": torch.zeros(1, 4), "label": 1}, _rows(1)[0]],
    "every value empty": _rows(0, 0, 0),
    "a subclass": [{**sample, "x": torch.nn.Parameter(sample["x"])} for sample in _rows(1, 2, 1)],
}


@pytest.mark.parametrize(
    ("policy", "batches"),
    [
        (pincollate.Jagged(), [_rows(2, 1, 3), _rows(4, 4, 4), _rows(0, 5, 1), _rows(2, 1, 3)]),
        (
            pincollate.Jagged(),
            [_item_rows((1, 2), (0,), (3, 1, 1)), _item_rows((2,), (1, 1), ()), _item_rows((), (), (4,))],
        ),
        (pincollate.Jagged(counts_key=None, item_offsets_key=None), [_rows(1, 2, 3), _rows(3, 2, 1)]),
    ],
    ids=["tensors", "items", "no-extras"],
)
def test_jagged_is_made_by_a_sized_plan_as_the_careful_walk_makes_it(policy, batches, monkeypatch):
    compiled = MMCollate(pin_memory=False, fields={"x": policy})
    careful = MMCollate(pin_memory=False, fields={"x": policy}, compile=False)
    earlier = [_agrees(compiled, careful, batches[0])]
    plan = compiled._plans.last
    assert plan.sized is not None
    assert earlier[0] is not None and earlier[0][0]["x"].is_nested

    with _inline_only(plan, monkeypatch):
        earlier += [_agrees(compiled, careful, batch) for batch in batches[1:]]
    for batch in JAGGED_OFF.values():  # one fact off: the longer way, the same outcome
        _agrees(compiled, careful, batch)
    for agreed in earlier:  # what they gave is unchanged: the nested tensors' lengths too
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
        ours, theirs = agreed[0]["x"], agreed[1]["x"]
        assert (ours._min_seqlen, ours._max_seqlen) == (theirs._min_seqlen, theirs._max_seqlen)


def _images(*counts: int, shape=(3, 2, 2), dtype=torch.float32) -> list[dict]:
    """Whole images per prompt (LLaVA-style), ``counts[i]`` of them for sample ``i``."""
    return [
        {"x": [torch.full(shape, float(10 * i + j)).to(dtype) for j in range(count)], "ids": torch.arange(i + 2)}
        for i, count in enumerate(counts)
    ]


def _with(batch: list[dict], **x) -> list[dict]:
    """``batch`` with sample ``i``'s items replaced where ``x`` names it (``x0``, ``x1``, ...)."""
    return [{**sample, "x": x.get(f"x{i}", sample["x"])} for i, sample in enumerate(batch)]


STACKED_OFF = {
    "an item of another shape": _with(_images(2, 1, 1), x1=[torch.zeros(3, 4, 2)]),
    "another dtype": _images(1, 2, 1, dtype=torch.float64),
    "a tensor, not a list": _with(_images(1, 1, 1), x0=torch.zeros(1, 3, 2, 2)),
    "no items anywhere": _images(0, 0, 0),
    "a subclass item": _with(_images(1, 1, 1), x2=[torch.nn.Parameter(torch.zeros(3, 2, 2))]),
    "a tuple of items": _with(_images(1, 1, 1), x0=(torch.zeros(3, 2, 2),)),
}


@pytest.mark.parametrize(
    "policy",
    [pincollate.Concat(items="stack"), pincollate.Concat(items="stack", counts_key=None, offsets_key=None)],
    ids=["with-extras", "no-extras"],
)
def test_stacked_items_are_placed_by_a_sized_plan_as_the_careful_walk_places_them(policy, monkeypatch):
    compiled = MMCollate(pin_memory=False, fields={"x": policy, "ids": Pad()})
    careful = MMCollate(pin_memory=False, fields={"x": policy, "ids": Pad()}, compile=False)
    earlier = [_agrees(compiled, careful, _images(2, 1, 3))]
    plan = compiled._plans.last
    assert plan.sized is not None

    with _inline_only(plan, monkeypatch):
        earlier += [_agrees(compiled, careful, _images(*counts)) for counts in ((1, 1, 1), (0, 4, 1), (2, 1, 3))]
    for batch in STACKED_OFF.values():  # one fact off: the longer way, the same outcome
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])


def _targets(rng: random.Random, n: int, trailing: tuple[int, ...], dtype: torch.dtype) -> list[dict]:
    values = torch.Generator().manual_seed(rng.randint(0, 2**31))
    return [
        {
            "image": torch.full((3, 4, 4), i, dtype=torch.uint8),
            "boxes": (torch.rand(rng.randint(0, 4), *trailing, generator=values) * 10).to(dtype),
            "labels": torch.arange(rng.randint(0, 3)),
        }
        for i in range(n)
    ]


LISTED = {"boxes": pincollate.AsList(), "labels": pincollate.AsList()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8], ids=str)
@pytest.mark.parametrize("trailing", [(), (4,), (2, 3)], ids=str)
def test_a_long_lived_listed_plan_gives_what_the_careful_walk_gives(trailing, dtype):
    compiled, careful = (MMCollate(pin_memory=False, fields=LISTED, compile=c) for c in (True, False))
    rng = random.Random(11)
    kept = []
    for _ in range(12):
        batch = _targets(rng, 5, trailing, dtype)
        batch[0]["boxes"] = (torch.rand(2, *trailing) * 10).to(dtype)  # a value with rows in every batch
        out, expected = compiled(batch), careful(batch)
        assert_identical(out, expected)
        # The layout whose parts it makes when asked: the one the plan's queued fill places.
        assert out.layout == compiled._plans.last.walked(batch, "plain", 0, False, None).layout
        kept.append((out, expected))
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is None and "unsafe_split_with_sizes" in plan.compiled.source
    for out, expected in kept:
        assert_identical(out, expected)


def test_a_listed_batch_makes_its_layout_s_parts_only_when_asked():
    compiled, careful = (MMCollate(pin_memory=False, fields=LISTED, compile=c) for c in (True, False))
    batch = _targets(random.Random(2), 4, (4,), torch.float32)
    batch[0]["labels"] = torch.arange(2)
    compiled(batch)
    out = compiled(batch)
    layout = out._pincollate[0]
    assert layout._parts is None  # not made yet
    again = pickle.loads(pickle.dumps(out))  # pickling asks
    assert layout._parts is not None
    assert_identical(again, careful(batch))
    assert again.layout == compiled._plans.last.walked(batch, "plain", 0, False, None).layout
    stream = io.BytesIO()
    torch.save(out, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), careful(batch))
    # Items share their column's storage, each with a version counter of its own.
    out["boxes"][0].add_(1)
    assert out["boxes"][1]._version == 0
    assert out["boxes"][0].untyped_storage().data_ptr() == out["boxes"][1].untyped_storage().data_ptr()
    out["boxes"].append(torch.zeros(1, 4))  # changed by its user: moved leaf by leaf, not as its layout
    assert pincollate.Batch.layout.fget(out) is None


ONE_LIST_OFF = {
    "a missing value": [torch.zeros(1, 4), None],
    "a subclass": [torch.nn.Parameter(torch.zeros(1, 4), requires_grad=False), torch.zeros(2, 4)],
    "other trailing sizes": [torch.zeros(1, 4), torch.zeros(2, 5)],
    "another rank": [torch.zeros(1, 4, 1), torch.zeros(2, 4, 1)],
    "another dtype": [torch.zeros(1, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)],
    "all empty": [torch.zeros(0, 4), torch.zeros(0, 4)],
    "no elements a row": [torch.zeros(2, 0), torch.zeros(1, 0)],
    "an array": [np.zeros((1, 4), dtype=np.float32), np.zeros((2, 4), dtype=np.float32)],
}


@pytest.mark.parametrize("case", sorted(ONE_LIST_OFF))
def test_a_list_one_fact_off_gives_what_the_careful_walk_gives(case):
    compiled, careful = (MMCollate(pin_memory=False, fields=LISTED, compile=c) for c in (True, False))
    warm = [
        {"boxes": torch.zeros(1, 4), "labels": torch.arange(1)},
        {"boxes": torch.ones(3, 4), "labels": torch.arange(2)},
    ]
    compiled(warm), compiled(warm)
    assert "unsafe_split_with_sizes" in compiled._plans.last.compiled.source
    batch = [{"boxes": value, "labels": torch.arange(1)} for value in ONE_LIST_OFF[case]]
    _agrees(compiled, careful, batch)
    assert_identical(compiled(warm), careful(warm))


def _optional_images(rng: random.Random, n: int, absent: float = 0.3) -> list[dict]:
    """Prompts with padded ids and an image or ``None`` (a text-only sample), in a list field."""
    return [
        {
            "ids": torch.arange(rng.randint(1, 6)),
            "image": None if rng.random() < absent else torch.full((rng.choice((2, 3)), 3, 2), float(i)),
        }
        for i in range(n)
    ]


OPTIONAL_OFF = {
    "every image absent": [None] * 4,
    "an image of another dtype": [torch.zeros(2, 3, 2, dtype=torch.float64), None, torch.zeros(2, 3, 2), None],
    "an image of another rank": [torch.zeros(3, 2), None, torch.zeros(2, 3, 2), None],
    "images of other trailing sizes": [torch.zeros(2, 3, 3), None, torch.zeros(2, 3, 2), None],
    "an array": [np.zeros((2, 3, 2), dtype=np.float32), None, torch.zeros(2, 3, 2), None],
}


def test_absent_values_of_a_list_are_placed_by_the_plan_s_function_as_the_careful_walk_places_them(monkeypatch):
    fields = {"ids": Pad(), "image": pincollate.AsList()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, missing="none", compile=c) for c in (True, False))
    rng = random.Random(3)
    earlier = [_agrees(compiled, careful, _optional_images(rng, 4))]
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None and "with_absent" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for absent in (0.0, 0.3, 0.6, 0.3, 0.9):
            batch = _optional_images(rng, 4, absent)
            batch[0]["image"] = torch.zeros(2, 3, 2)  # one image at least
            earlier.append(_agrees(compiled, careful, batch))
            assert earlier[-1][0].layout == compiled.plan(batch)  # type: ignore[index]
    assert any(None in agreed[0]["image"] for agreed in earlier)  # type: ignore[index]
    for images in OPTIONAL_OFF.values():  # one fact off: the longer way, the same outcome
        batch = [{**sample, "image": image} for sample, image in zip(_optional_images(rng, 4), images, strict=True)]
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    out, expected = earlier[-1]  # type: ignore[misc]
    assert_identical(pickle.loads(pickle.dumps(out)), expected)  # its layout's parts, made when asked


def test_lists_of_a_dtype_numpy_lacks_are_placed_by_the_plan_s_function(monkeypatch):
    # bfloat16 (a VLM's pixels): the list's region is made over the buffer as its own, not with the others.
    compiled, careful = (MMCollate(pin_memory=False, fields=LISTED, compile=c) for c in (True, False))
    batches = [
        [{"boxes": torch.full((n, 4), float(n), dtype=torch.bfloat16), "labels": torch.arange(n)} for n in counts]
        for counts in ((1, 2), (3, 0), (2, 2), (0, 0), (4, 1))
    ]
    earlier = [_agrees(compiled, careful, batches[0])]
    plan = compiled._plans.last
    assert not plan.walks
    with _inline_only(plan, monkeypatch):
        earlier += [_agrees(compiled, careful, batch) for batch in batches[1:3]]
    earlier.append(_agrees(compiled, careful, batches[3]))  # every value empty: the recipe's
    earlier.append(_agrees(compiled, careful, batches[4]))
    for agreed in earlier:
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
        assert_identical(pickle.loads(pickle.dumps(agreed[0])), agreed[1])


class _Seeded(torch.utils.data.Dataset):
    """24 samples, sample ``i`` made by ``make`` from a generator seeded with ``i``."""

    def __init__(self, make: Any):
        self.make = make

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        return self.make(random.Random(i))


def _through_workers(make: Any, fields: dict) -> list[tuple[Any, Any]]:
    """Each batch of 4 through 2 DataLoader workers, beside the careful walk's batch of the same samples."""
    data = _Seeded(make)
    careful = MMCollate(pin_memory=False, fields=fields, compile=False)
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, num_workers=2, collate_fn=MMCollate(pin_memory=False, fields=fields)
    )
    expected = [careful([data[i] for i in range(k * 4, k * 4 + 4)]) for k in range(6)]
    return list(zip(loader, expected, strict=True))


@pytest.mark.slow
def test_listed_batches_cross_from_workers_as_the_careful_walk_makes_them():
    batches = _through_workers(lambda rng: _targets(rng, 1, (4,), torch.float32)[0], LISTED)
    for k, (out, reference) in enumerate(batches):
        assert_identical(out, reference)
        # Each worker's first batch (batches come from the workers in turn) is walked, one part for
        # the whole batch; its later ones run the compiled plan, its two listed fields the parts.
        assert out.layout is not None and len(out.layout.parts) == (1 if k < 2 else 2)


TOKEN_BATCHES = {
    "ints": [[1, 2, 3], [4]],
    "bools and ints": [[True, 2], [3, 4, 5]],
    "floats": [[0.5, 1.5], [2.5]],
    "an empty list": [[1, 2], []],
    "all empty": [[], []],
    "nested": [[[1, 2]], [[3]]],
    "too large for int64": [[2**63], [1]],
    "a tensor": [torch.arange(3), [1, 2]],
    "too long": [list(range(40)), [1]],
}


@pytest.mark.parametrize("case", sorted(TOKEN_BATCHES))
@pytest.mark.parametrize(
    "policy", [Pad(), Pad(mask_key="attention_mask", lengths_key=None), Pad(max_length=16)], ids=repr
)
def test_token_ids_as_lists_give_what_the_careful_walk_gives(case, policy):
    fields = {"input_ids": policy}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    warm = [{"input_ids": [5, 6, 7], "label": 0}, {"input_ids": [8], "label": 1}]
    compiled(warm), compiled(warm)
    assert compiled._plans.last.sized is not None  # converted and padded inline
    batch = [{"input_ids": ids, "label": i} for i, ids in enumerate(TOKEN_BATCHES[case])]
    _agrees(compiled, careful, batch)
    assert_identical(compiled(warm), careful(warm))


def test_a_listed_batch_in_pinned_memory_is_built_by_its_layout(fake_pinned):
    fields = {"boxes": pincollate.AsList()}
    batch = [{"label": i, "a": torch.rand(2), "b": torch.rand(2), "boxes": torch.rand(i + 1, 4)} for i in range(3)]
    compiled = MMCollate(pin_memory=True, fields=fields)
    for _ in range(3):
        out = compiled(batch)
    assert "unsafe_split_with_sizes" in compiled._plans.last.compiled.source
    assert_identical(out, MMCollate(pin_memory=False, fields=fields, compile=False)(batch))
    storages = {t.untyped_storage().data_ptr() for t in (out["label"], out["a"], *out["boxes"])}
    assert storages == {out.buffer.untyped_storage().data_ptr()}  # views of the pinned buffer's one storage


@dataclasses.dataclass
class _Target:
    boxes: object


def test_lists_inside_a_dataclass_are_placed_by_the_plan_s_function():
    # The dataclass is an expression of its fields in the plan's function: the list is one of its locals.
    fields = {"t.boxes": pincollate.AsList()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    for n in (1, 2, 3):
        batch = [{"t": _Target(torch.rand(i + n, 4)), "label": i} for i in range(2)]
        assert_identical(compiled(batch), careful(batch))
    plan = compiled._plans.last
    assert not plan.walks and "new_dataclass(" in plan.compiled.source


def test_a_concatenation_past_int32_offsets_gets_the_careful_error(monkeypatch):
    compiled, careful = (
        MMCollate(pin_memory=False, fields={"x": pincollate.Concat()}, compile=c) for c in (True, False)
    )
    warm = [{"x": torch.zeros(2, 3)}, {"x": torch.ones(1, 3)}]
    compiled(warm)
    plan = compiled._plans.last
    assert plan.sized is not None
    from pincollate._plan import packing

    monkeypatch.setitem(plan.compiled.run.__globals__, "INT32_MAX", 4)  # the guard, at a size a test can reach
    monkeypatch.setattr(packing, "INT32_MAX", 4)  # and the walk's, where the batch goes next, which names the sample
    big = [{"x": torch.zeros(3, 3)}, {"x": torch.ones(3, 3)}]
    with pytest.raises(pincollate.CollateError, match="int32"):
        compiled(big)
    assert_identical(compiled(warm), careful(warm))


def _detections(rng: random.Random, n: int) -> list[dict]:
    values = torch.Generator().manual_seed(rng.randint(0, 2**31))
    out = []
    for i in range(n):
        count = rng.randint(0, 4)
        target = {"boxes": torch.rand(count, 4, generator=values), "labels": torch.arange(count)}
        out.append({"image": torch.full((3, 4, 4), i, dtype=torch.uint8), "target": target})
    return out


PER_SAMPLE = {"target": pincollate.PerSample()}


def test_per_sample_targets_are_placed_by_the_plan_s_function_as_the_careful_walk_places_them():
    compiled, careful = (MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=c) for c in (True, False))
    rng = random.Random(5)
    kept = []
    for _ in range(12):
        batch = _detections(rng, 5)
        batch[0]["target"] = {"boxes": torch.rand(2, 4), "labels": torch.arange(2)}
        out, expected = compiled(batch), careful(batch)
        assert_identical(out, expected)
        assert out.layout == compiled._plans.last.walked(batch, "plain", 0, False, None).layout
        kept.append((out, expected))
    plan = compiled._plans.last
    assert not plan.walks and "# ['target']['labels']" in plan.compiled.source.replace('"', "'")
    for out, expected in kept:
        assert_identical(out, expected)
    again = pickle.loads(pickle.dumps(kept[-1][0]))  # its layout's parts made when asked
    assert_identical(again, kept[-1][1])


ONE_TARGET_OFF = {
    "another key order": {"labels": torch.arange(1), "boxes": torch.rand(1, 4)},
    "an extra key": {"boxes": torch.rand(1, 4), "labels": torch.arange(1), "area": torch.rand(1)},
    "a missing key": {"boxes": torch.rand(1, 4)},
    "a number": {"boxes": torch.rand(1, 4), "labels": 3},
    "another dtype": {"boxes": torch.rand(1, 4, dtype=torch.float64), "labels": torch.arange(1)},
    "a list": {"boxes": [[0.0, 0.0, 1.0, 1.0]], "labels": torch.arange(1)},
    "an ordered dict": collections.OrderedDict(boxes=torch.rand(1, 4), labels=torch.arange(1)),
    "None": None,
}


@pytest.mark.parametrize("case", sorted(ONE_TARGET_OFF))
def test_a_target_one_fact_off_gives_what_the_careful_walk_gives(case):
    compiled, careful = (MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=c) for c in (True, False))
    warm = _detections(random.Random(1), 3)
    compiled(warm), compiled(warm)
    assert "map(dict, map(zip" in compiled._plans.last.compiled.source
    batch = _detections(random.Random(2), 3)
    batch[1]["target"] = ONE_TARGET_OFF[case]
    _agrees(compiled, careful, batch)
    assert_identical(compiled(warm), careful(warm))


def test_per_sample_targets_in_pinned_memory_are_built_by_the_layout(fake_pinned):
    batch = _detections(random.Random(3), 4)
    batch[0]["target"] = {"boxes": torch.rand(2, 4), "labels": torch.arange(2)}
    compiled = MMCollate(pin_memory=True, fields=PER_SAMPLE)
    for _ in range(3):
        out = compiled(batch)
    assert "map(dict, map(zip" in compiled._plans.last.compiled.source
    assert_identical(out, MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=False)(batch))


def _coco(rng: random.Random, n: int) -> list[dict]:
    values = torch.Generator().manual_seed(rng.randint(0, 2**31))
    out = []
    for i in range(n):
        count = rng.randint(0, 5)
        target = {
            "boxes": torch.rand(count, 4, generator=values),
            "labels": torch.arange(count),
            "image_id": i,
            "scale": 0.5 * i,
            "area": torch.rand(count, generator=values),
            "file": f"{i}.jpg",
        }
        out.append({"image": torch.full((3, 4, 4), i, dtype=torch.uint8), "target": target})
    return out


def test_per_sample_targets_with_numbers_and_strings_are_placed_by_the_plan_s_function():
    compiled, careful = (MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=c) for c in (True, False))
    rng = random.Random(8)
    kept = []
    for _ in range(10):
        batch = _coco(rng, 4)
        out, expected = compiled(batch), careful(batch)
        assert_identical(out, expected)
        assert out.layout == compiled._plans.last.walked(batch, "plain", 0, False, None).layout
        kept.append((out, expected))
    assert "map(dict, map(zip" in compiled._plans.last.compiled.source
    for out, expected in kept:
        assert_identical(out, expected)
    out = kept[-1][0]
    assert out["target"][1]["image_id"].dim() == 0 and out["target"][2]["file"] == "2.jpg"
    stream = io.BytesIO()
    torch.save(out, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), kept[-1][1])


ONE_FIELD_OFF = {
    "a float id": ("image_id", 1.5),
    "an id beyond int64": ("image_id", 2**63),
    "a bool id": ("image_id", True),
    "bytes for a name": ("file", b"1.jpg"),
    "None for a name": ("file", None),
    "a number for a name": ("file", 3),
    "an int scale": ("scale", 1),
}


@pytest.mark.parametrize("case", sorted(ONE_FIELD_OFF))
def test_a_target_field_one_fact_off_gives_what_the_careful_walk_gives(case):
    compiled, careful = (MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=c) for c in (True, False))
    warm = _coco(random.Random(1), 3)
    compiled(warm), compiled(warm)
    assert "map(dict, map(zip" in compiled._plans.last.compiled.source
    batch = _coco(random.Random(2), 3)
    key, value = ONE_FIELD_OFF[case]
    batch[1]["target"][key] = value
    _agrees(compiled, careful, batch)
    assert_identical(compiled(warm), careful(warm))


def test_per_sample_targets_of_strings_alone_are_kept_as_the_careful_walk_keeps_them():
    compiled, careful = (MMCollate(pin_memory=False, fields=PER_SAMPLE, compile=c) for c in (True, False))
    batch = [{"image": torch.zeros(2), "target": {"file": f"{i}.jpg", "crowd": None}} for i in range(3)]
    for _ in range(3):
        out = compiled(batch)
        assert_identical(out, careful(batch))
    assert "map(dict, map(zip" in compiled._plans.last.compiled.source
    assert_identical(pickle.loads(pickle.dumps(out)), careful(batch))


def _arrays(*lengths: int, dtype=np.float32, trailing=(), writeable=True) -> list[dict]:
    values = [
        np.arange(n * int(np.prod(trailing)), dtype=dtype).reshape(n, *trailing) + i for i, n in enumerate(lengths)
    ]
    for value in values:
        value.flags.writeable = writeable
    return _ids(*values)


ARRAYS_OFF = {
    "another numpy dtype": _arrays(3, 1, dtype=np.int16),
    "read-only arrays (an object store's)": _arrays(2, 4, writeable=False),
    "a tensor among the arrays": _ids(np.zeros(3, np.float32), torch.zeros(2)),
    "another rank": _ids(np.zeros((3, 2), np.float32), np.zeros((1, 2), np.float32)),
    "an empty array": _arrays(0, 2),
}


@pytest.mark.parametrize(
    "policy", [Pad(), Pad(max_length=6, mask_key=None), pincollate.Concat()], ids=["pad", "pad-max", "concat"]
)
def test_numpy_arrays_are_read_inline_by_a_sized_plan_as_the_careful_walk_reads_them(policy, monkeypatch):
    # Waveforms from soundfile or librosa: each batch's arrays viewed as tensors by the plan's function.
    compiled, careful = _pair(policy)
    earlier = [_agrees(compiled, careful, _arrays(3, 5))]
    plan = compiled._plans.last
    assert plan.sized is not None

    with _inline_only(plan, monkeypatch):
        earlier += [_agrees(compiled, careful, _arrays(*lengths)) for lengths in ((2, 2), (6, 1), (3, 5))]
    for batch in ARRAYS_OFF.values():  # one fact off: the longer way, the same outcome
        _agrees(compiled, careful, batch)
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])


def test_a_jagged_batch_pickles_and_builds_in_pinned_memory_as_the_careful_walk_makes_it(fake_pinned):
    reference = MMCollate(pin_memory=False, fields={"x": pincollate.Jagged()}, compile=False)
    batch = _rows(2, 1, 3)
    compiled = MMCollate(pin_memory=False, fields={"x": pincollate.Jagged()})
    out = [compiled(batch) for _ in range(2)][-1]
    assert compiled._plans.last.sized is not None
    assert_identical(pickle.loads(pickle.dumps(out)), reference(batch))
    pinned = MMCollate(pin_memory=True, fields={"x": pincollate.Jagged()})
    out = [pinned(batch) for _ in range(2)][-1]
    assert pinned._plans.last.sized is not None
    assert_identical(out, reference(batch))
    assert out["x"].values().untyped_storage().data_ptr() == out.buffer.untyped_storage().data_ptr()


def _scores(*scores: object) -> list[dict]:
    """JSON-like samples: a score that is sometimes an int, sometimes a float."""
    return [{"x": torch.full((2,), float(i)), "score": score, "id": i} for i, score in enumerate(scores)]


#: Batches of the score column, each read inline by the sized plan: the dtype is its key.
MIXED_INLINE = [
    _scores(1, 0.5, 2),  # an int first: the dtype torch infers (the default float dtype)
    _scores(0.25, 3, 1),  # a float first: float64, as default_collate makes it
    _scores(True, 2, 0.5),  # a bool first: torch infers for all of them
    _scores(1, 2, 3),  # ints alone: int64
    _scores(0.5, 1, 2),
]

MIXED_OFF = {
    "an int past int64 first": _scores(2**63, 0.5, 1),
    "an int past int64 after a float": _scores(0.5, 2**70, 1),
    "an int too large for a float": _scores(0.5, 2**1100, 1),
    "a numpy scalar among them": _scores(1, np.float32(0.5), 2),
    "a string among them": _scores(1, "0.5", 2),
    "a tensor among them": _scores(1, torch.tensor(0.5), 2),
    "None among them": _scores(1, None, 2.0),
    "a complex among them": _scores(1, 2.5j, 3),
}


def test_numbers_of_several_types_are_read_by_a_sized_plan_as_the_careful_walk_reads_them(monkeypatch):
    compiled = MMCollate(pin_memory=False)
    careful = MMCollate(pin_memory=False, compile=False)
    earlier = [_agrees(compiled, careful, MIXED_INLINE[0])]
    plan = compiled._plans.last
    assert plan.sized is not None and "dtype_of" in plan.compiled.source

    with _inline_only(plan, monkeypatch):
        earlier += [_agrees(compiled, careful, batch) for batch in MIXED_INLINE[1:]]
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # an int first now infers float64
        try:
            earlier.append(_agrees(compiled, careful, MIXED_INLINE[0]))
        finally:
            torch.set_default_dtype(previous)
    dtypes = [agreed[0]["score"].dtype for agreed in earlier if agreed is not None]
    assert dtypes == [torch.float32, torch.float64, torch.float32, torch.int64, torch.float64, torch.float64]
    for batch in MIXED_OFF.values():  # one fact off: the longer way, the same outcome (or error)
        _agrees(compiled, careful, batch)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # an int first infers a dtype numpy lacks: the longer way
    try:
        assert _agrees(compiled, careful, MIXED_INLINE[0])[0]["score"].dtype == torch.bfloat16  # type: ignore[index]
    finally:
        torch.set_default_dtype(previous)
    assert_identical(compiled(MIXED_INLINE[0]), careful(MIXED_INLINE[0]))
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    again = pickle.loads(pickle.dumps(earlier[0][0]))
    assert_identical(again, earlier[0][1])


#: Padded token ids beside per-sample lists (boxes, labels) and PerSample() dict targets: one function.
MIXED_FIELDS = {
    "ids": Pad(),
    "boxes": pincollate.AsList(),
    "target": pincollate.PerSample(),
    "score": Pad(lengths_key=None, mask_key=None),
}


def _mixed(rng: random.Random, n: int, dtype: torch.dtype = torch.float32) -> list[dict]:
    values = torch.Generator().manual_seed(rng.randint(0, 2**31))
    out = []
    for i in range(n):
        count = rng.randint(0, 4)
        out.append(
            {
                "image": torch.full((3, 2, 2), i, dtype=torch.uint8),
                "ids": torch.arange(rng.randint(1, 9)),
                "boxes": torch.rand(count, 4, generator=values).to(dtype),
                "target": {"labels": torch.arange(count), "id": i, "file": f"{i}.jpg"},
                "score": torch.rand(rng.randint(1, 3), generator=values),
            }
        )
    return out


MIXED_OFF = {
    "boxes of another dtype": {"boxes": torch.zeros(1, 4, dtype=torch.float64)},
    "boxes of another rank": {"boxes": torch.zeros(1, 4, 1)},
    "ids of another dtype": {"ids": torch.arange(3, dtype=torch.int32)},
    "ids as a list": {"ids": [1, 2, 3]},
    "a target key more": {"target": {"labels": torch.arange(1), "id": 0, "file": "a", "x": 1}},
    "a target number of another type": {"target": {"labels": torch.arange(1), "id": 0.5, "file": "a"}},
    "a score of another rank": {"score": torch.zeros(2, 2)},
    "boxes as an array": {"boxes": np.zeros((2, 4), dtype=np.float32)},
}


def test_sized_and_listed_parts_are_made_by_one_function_as_the_careful_walk_makes_them(monkeypatch):
    compiled, careful = (MMCollate(pin_memory=False, fields=MIXED_FIELDS, compile=c) for c in (True, False))
    rng = random.Random(21)
    earlier = [_agrees(compiled, careful, _mixed(rng, 5))]
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None and "unsafe_split_with_sizes" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for _ in range(12):
            batch = _mixed(rng, 5)
            earlier.append(_agrees(compiled, careful, batch))
            out = earlier[-1][0]  # type: ignore[index]
            # The layout whose parts it makes when asked: the one MMCollate.plan gives, rebuilt alike.
            assert out.layout == compiled.plan(batch)
            assert_identical(out.layout.build(out.buffer, out._pincollate[2]), dict(earlier[-1][1]))  # type: ignore[index]
    assert len(plan.sized.kept) > 1  # the padded sizes pick layouts; the lists are placed after them
    for value in MIXED_OFF.values():  # one fact off: the longer way, the same outcome
        batch = _mixed(rng, 5)
        batch[2] = {**batch[2], **value}
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    out, expected = earlier[-1]  # type: ignore[misc]
    assert_identical(pickle.loads(pickle.dumps(out)), expected)  # its layout's parts, made when asked
    stream = io.BytesIO()
    torch.save(out, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), expected)


def test_sized_and_listed_parts_in_pinned_memory_are_built_by_the_layout(fake_pinned):
    batch = _mixed(random.Random(4), 4)
    compiled = MMCollate(pin_memory=True, fields=MIXED_FIELDS)
    for _ in range(3):
        out = compiled(batch)
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None and "unsafe_split_with_sizes" in plan.compiled.source
    assert_identical(out, MMCollate(pin_memory=False, fields=MIXED_FIELDS, compile=False)(batch))
    storages = {t.untyped_storage().data_ptr() for t in (out["ids"], out["image"], *out["boxes"])}
    assert storages == {out.buffer.untyped_storage().data_ptr()}  # views of the pinned buffer's one storage


def _annotations(rng: random.Random, n: int, most: int = 4) -> list[dict]:
    """COCO-style samples: an image and a list of per-object dicts (box, class, crowd flag, area, name)."""
    values = torch.Generator().manual_seed(rng.randint(0, 2**31))
    return [
        {
            "image": torch.full((3, 2, 2), i, dtype=torch.uint8),
            "objects": [
                {
                    "bbox": torch.rand(4, generator=values),
                    "category_id": rng.randint(0, 80),
                    "iscrowd": rng.random() < 0.1,
                    "area": rng.random() * 100,
                    "name": f"{i}-{j}",
                }
                for j in range(rng.randint(0, most))
            ],
        }
        for i in range(n)
    ]


OBJECTS_OFF = {
    "a tuple of objects": lambda objects: tuple(objects),
    "no objects anywhere": None,
    "an object without its area": lambda objects: [{k: v for k, v in o.items() if k != "area"} for o in objects],
    "a box of another dtype": lambda objects: [{**o, "bbox": o["bbox"].double()} for o in objects],
    "a class id as a float": lambda objects: [{**o, "category_id": 1.5} for o in objects],
    "a dict instead of a list": lambda objects: {"bbox": torch.rand(4)},
    "keys in another order": lambda objects: [dict(reversed(list(o.items()))) for o in objects],
}


def test_lists_of_per_object_dicts_are_placed_by_the_plan_s_function_as_the_careful_walk_places_them(monkeypatch):
    fields = {"objects": pincollate.PerSample()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    rng = random.Random(8)
    earlier = [_agrees(compiled, careful, _annotations(rng, 5))]
    plan = compiled._plans.last
    assert not plan.walks and "islice" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for _ in range(12):
            batch = _annotations(rng, 5)
            batch[1]["objects"] = batch[1]["objects"] or _annotations(rng, 1, most=1)[0]["objects"] or []
            earlier.append(_agrees(compiled, careful, batch))
            assert earlier[-1][0].layout == compiled.plan(batch)  # type: ignore[index]
    for change in OBJECTS_OFF.values():  # one fact off: the longer way, the same outcome
        batch = _annotations(rng, 5)
        if change is None:
            for sample in batch:
                sample["objects"] = []
        else:
            batch[2]["objects"] = change(batch[2]["objects"] or _annotations(rng, 1, most=1)[0]["objects"])
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    out, expected = earlier[-1]  # type: ignore[misc]
    assert_identical(pickle.loads(pickle.dumps(out)), expected)  # its layout's parts, made when asked
    stream = io.BytesIO()
    torch.save(out, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), expected)


def test_lists_of_per_object_dicts_beside_padded_ids_in_pinned_memory_are_built_by_the_layout(fake_pinned):
    fields = {"objects": pincollate.PerSample(), "ids": Pad()}
    batch = _annotations(random.Random(6), 4)
    for i, sample in enumerate(batch):
        sample["ids"] = torch.arange(i + 2)
    batch[0]["objects"] = _annotations(random.Random(1), 1, most=1)[0]["objects"] or batch[0]["objects"]
    compiled = MMCollate(pin_memory=True, fields=fields)
    for _ in range(3):
        out = compiled(batch)
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None and "islice" in plan.compiled.source
    assert_identical(out, MMCollate(pin_memory=False, fields=fields, compile=False)(batch))


def _prompts(rng: random.Random, n: int) -> list[dict]:
    """Prompts with padded ids and a list of images each: one to three, of one size or two."""
    out = []
    for i in range(n):
        sizes = [rng.choice((2, 3)) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.6:
            sizes = sizes[:1] * len(sizes)  # a prompt whose images agree: one stack
        out.append(
            {"x": [torch.full((1, s, 2), float(10 * i + j)) for j, s in enumerate(sizes)], "ids": torch.arange(i + 1)}
        )
    return out


ITEMS_OFF = {
    "an item of another dtype": _with(_images(1, 2, 1), x1=[torch.zeros(3, 2, 2, dtype=torch.float64)] * 2),
    "an item of another rank": _with(_images(1, 2, 1), x1=[torch.zeros(3, 2)]),
    "a tensor, not a list": _with(_images(1, 1, 1), x0=torch.zeros(1, 3, 2, 2)),
    "no items anywhere": _images(0, 0, 0),
    "a subclass item": _with(_images(1, 1, 1), x2=[torch.nn.Parameter(torch.zeros(3, 2, 2))]),
    "an empty item": _with(_images(1, 1, 1), x2=[torch.zeros(0, 2, 2)]),
}


def test_lists_of_items_are_placed_by_the_plan_s_function_as_the_careful_walk_places_them(monkeypatch):
    fields = {"x": pincollate.AsList(), "ids": Pad()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    rng = random.Random(12)
    earlier = [_agrees(compiled, careful, _images(2, 1, 3))]
    plan = compiled._plans.last
    assert not plan.walks and plan.sized is not None and "grouped_units" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for batch in [_prompts(rng, 3) for _ in range(12)] + [_with(_images(1, 2, 1), x0=(torch.zeros(3, 2, 2),))]:
            if not any(sample["x"] for sample in batch):
                continue  # no items anywhere: the recipe's
            earlier.append(_agrees(compiled, careful, batch))
            assert earlier[-1][0].layout == compiled.plan(batch)  # type: ignore[index]
    assert any(isinstance(x, list) and x for agreed in earlier for x in agreed[0]["x"])  # type: ignore[index]
    for batch in ITEMS_OFF.values():  # one fact off: the longer way, the same outcome
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    out, expected = earlier[-1]  # type: ignore[misc]
    assert_identical(pickle.loads(pickle.dumps(out)), expected)  # its layout's parts, made when asked


def _tv_targets(rng: random.Random, n: int, tv_tensors: object) -> list[dict]:
    """torchvision v2 detection samples: an image, and a target of boxes (format, canvas size) and masks."""
    out = []
    for i in range(n):
        count = rng.randint(0, 3)
        canvas = rng.choice(((8, 8), (6, 10)))
        boxes = tv_tensors.BoundingBoxes(torch.rand(count, 4) * 6, format="XYXY", canvas_size=canvas)  # type: ignore[attr-defined]
        masks = tv_tensors.Mask(torch.zeros(count, 2, 2, dtype=torch.uint8))  # type: ignore[attr-defined]
        out.append({"image": torch.full((3, 2, 2), i, dtype=torch.uint8), "boxes": boxes, "masks": masks})
    return out


def test_lists_of_tensor_subclasses_keep_their_classes_and_metadata_in_the_plan_s_function(monkeypatch):
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    fields = {"boxes": pincollate.AsList(), "masks": pincollate.AsList()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    rng = random.Random(5)
    earlier = [_agrees(compiled, careful, _tv_targets(rng, 4, tv_tensors))]
    plan = compiled._plans.last
    assert not plan.walks and "wrapped(" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for _ in range(10):
            batch = _tv_targets(rng, 4, tv_tensors)
            batch[0] = _tv_targets(random.Random(0), 1, tv_tensors)[0] | {"boxes": batch[0]["boxes"]}
            earlier.append(_agrees(compiled, careful, batch))
    canvases = {box.canvas_size for agreed in earlier for box in agreed[0]["boxes"]}  # type: ignore[index]
    assert canvases == {(8, 8), (6, 10)}  # each box keeps its own
    off = {
        "a plain tensor among the boxes": torch.zeros(1, 4),
        "masks as boxes": tv_tensors.Mask(torch.zeros(1, 4)),
        "boxes of another dtype": tv_tensors.BoundingBoxes(
            torch.zeros(1, 4, dtype=torch.float64), format="XYXY", canvas_size=(2, 2)
        ),
    }
    for value in off.values():  # one fact off: the longer way, the same outcome
        batch = _tv_targets(rng, 4, tv_tensors)
        batch[1]["boxes"] = value
        _agrees(compiled, careful, batch)
    assert compiled._plans.last is plan  # taken by its guards, not planned again
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    out, expected = earlier[-1]  # type: ignore[misc]
    assert out.layout is not None  # its layout's parts describe its boxes: it moves and pickles in one piece
    assert_identical(pickle.loads(pickle.dumps(out)), expected)


def test_a_list_of_parameters_is_listed_plain_by_the_plan_s_function(monkeypatch):
    # nn.Parameter has no class of its own in a batch (torch.stack gives plain tensors): listed plain.
    fields = {"w": pincollate.AsList()}
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    batches = [
        [{"w": torch.nn.Parameter(torch.full((n, 2), float(n)), requires_grad=False)} for n in counts]
        for counts in ((1, 2), (3, 1), (2, 2))
    ]
    _agrees(compiled, careful, batches[0])
    plan = compiled._plans.last
    assert not plan.walks and "wrapped(" in plan.compiled.source
    with _inline_only(plan, monkeypatch):
        for batch in batches[1:]:
            out, _ = _agrees(compiled, careful, batch)  # type: ignore[misc]
            assert all(type(w) is torch.Tensor for w in out["w"])


def _captions(*lengths: int, dtype: torch.dtype = torch.int64) -> list[dict]:
    """A field without a policy: token ids of these lengths (one tensor where they agree, else a list)."""
    return [{"x": torch.arange(n, dtype=dtype).unsqueeze(1).repeat(1, 2), "label": i} for i, n in enumerate(lengths)]


UNSETTLED_OFF = {
    "another dtype": _captions(2, 3, 1, dtype=torch.int32),
    "another rank": [{"x": torch.zeros(2), "label": 0}, *_captions(2, 3)],
    "a subclass": [{"x": torch.nn.Parameter(torch.zeros(2, 2), requires_grad=False), "label": 0}, *_captions(2, 3)],
    "other trailing sizes": [{"x": torch.zeros(2, 3, dtype=torch.int64), "label": 0}, *_captions(2, 3)],
    "an array": [{"x": np.zeros((2, 2), dtype=np.int64), "label": 0}, *_captions(2, 3)],
    "None": [{"x": None, "label": 0}, *_captions(2, 3)],
}


def test_a_field_without_a_policy_stacks_or_lists_in_the_plan_s_function_as_the_careful_walk_does(monkeypatch):
    compiled, careful = MMCollate(pin_memory=False), MMCollate(pin_memory=False, compile=False)
    with pytest.warns(pincollate.RaggedFieldWarning) as warned:
        earlier = [_agrees(compiled, careful, _captions(2, 2, 2)), _agrees(compiled, careful, _captions(1, 3, 2))]
    assert len(warned) == 2  # each collate warns once, for the batch that lists the field
    plan = compiled._plans.last
    assert not plan.walks and ".listed(" in plan.compiled.source
    with _inline_only(plan, monkeypatch), warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once already
        for lengths in ((2, 2, 2), (4, 1, 1), (3, 3, 3), (0, 0, 1), (1, 1, 1)):
            earlier.append(_agrees(compiled, careful, _captions(*lengths)))
            assert earlier[-1][0].layout == compiled.plan(_captions(*lengths))  # type: ignore[index]
    kinds = [type(agreed[0]["x"]) for agreed in earlier[1:]]  # type: ignore[index]
    assert kinds == [list, torch.Tensor, list, torch.Tensor, list, torch.Tensor]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pincollate.RaggedFieldWarning)
        for batch in UNSETTLED_OFF.values():  # one fact off: the longer way, the same outcome
            _agrees(compiled, careful, batch)
    for agreed in earlier:  # what they gave is unchanged
        assert agreed is not None
        assert_identical(agreed[0], agreed[1])
    for agreed in earlier[-2:]:  # a list and a stack, each described by its layout: in one piece
        assert agreed[0].layout is not None  # type: ignore[index]
        assert_identical(pickle.loads(pickle.dumps(agreed[0])), agreed[1])  # type: ignore[index]


@pytest.mark.parametrize(
    "settings",
    [{"sequences": "items"}, {"fields": {"x": pincollate.Stack()}}, {}],
    ids=["items-no-rule", "stack-rule", "transpose"],
)
def test_items_that_make_one_tensor_or_lists_are_placed_by_the_plan_s_function_as_the_careful_walk_places_them(
    settings, monkeypatch
):
    fields = {**settings.get("fields", {}), "ids": Pad()}
    kwargs = {**settings, "fields": fields}
    compiled, careful = (MMCollate(pin_memory=False, compile=c, **kwargs) for c in (True, False))
    first = _images(2, 2, 2) if "x" in fields else _images(2, 1, 3)  # Stack(): items that stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pincollate.RaggedFieldWarning)
        earlier = [_agrees(compiled, careful, first)]
        plan = compiled._plans.last
        assert not plan.walks and ".arranged(" in plan.compiled.source
        inline = [_images(2, 2, 2), _images(1, 1, 1), _images(3, 3, 3)]  # one tensor (B, k, *shape)
        if "x" not in fields:  # no rule: lists where they differ
            inline += [_images(2, 1, 3), _with(_images(2, 2, 2), x1=[torch.zeros(3, 2, 2), torch.zeros(3, 3, 2)])]
        with _inline_only(plan, monkeypatch):
            for batch in inline:
                if settings == {} and len({len(sample["x"]) for sample in batch}) == 1:
                    continue  # lists of one length are transposed: the walk's
                earlier.append(_agrees(compiled, careful, batch))
        for batch in (_images(2, 1, 3), _images(0, 0, 0), _images(1, 1, 1, dtype=torch.float64), _images(2, 2, 2)):
            _agrees(compiled, careful, batch)  # the longer way (or an error), with the same outcome
    for agreed in earlier:  # what they gave is unchanged
        if agreed is not None:
            assert_identical(agreed[0], agreed[1])
            assert agreed[0].layout is not None  # type: ignore[union-attr]
            assert_identical(pickle.loads(pickle.dumps(agreed[0])), agreed[1])


def _pairs(rng: random.Random, n: int) -> list[tuple]:
    """``(image, target)`` pairs, as torchvision's detection datasets give them."""
    return [(sample["image"], sample["target"]) for sample in _detections(rng, n)]


def _ids_and_boxes(rng: random.Random, n: int) -> list[list]:
    return [[torch.arange(rng.randint(1, 6)), torch.rand(rng.randint(0, 3), 4), i] for i in range(n)]


class _Pair(collections.namedtuple("_Pair", ["image", "target"])):
    pass


_Pair.__module__ = __name__  # pickled by name: a namedtuple made here


def _named_pairs(rng: random.Random, n: int) -> list[_Pair]:
    return [_Pair(image, target) for image, target in _pairs(rng, n)]


@dataclasses.dataclass
class _Sample:
    image: object
    target: object


def _dataclass_pairs(rng: random.Random, n: int) -> list[_Sample]:
    return [_Sample(image, target) for image, target in _pairs(rng, n)]


TUPLE_TOPS = {
    "a dataclass of image, AsList() targets": (
        _dataclass_pairs,
        {"target.boxes": pincollate.AsList(), "target.labels": pincollate.AsList()},
    ),
    "a namedtuple of image, PerSample() target": (_named_pairs, {"target": pincollate.PerSample()}),
    "image, label": (lambda rng, n: [(torch.full((3, 2, 2), float(i)), i) for i in range(n)], {}),
    "image, AsList() targets": (_pairs, {"1.boxes": pincollate.AsList(), "1.labels": pincollate.AsList()}),
    "image, PerSample() targets": (_pairs, {"1": pincollate.PerSample()}),
    "Pad() ids beside AsList() boxes": (
        _ids_and_boxes,
        {"0": Pad(mask_key=None, lengths_key=None), "1": pincollate.AsList()},
    ),
}


@pytest.mark.parametrize("name", sorted(TUPLE_TOPS))
def test_a_tuple_samples_batch_is_built_by_the_plan_s_function_as_the_careful_walk_builds_it(name):
    """A tuple or list sample (an image and its label or target) comes back a BatchList built by the plan's
    function, its per-sample lists placed by it too, batch after batch of one long-lived collate."""
    build, fields = TUPLE_TOPS[name]
    compiled, careful = (MMCollate(pin_memory=False, fields=fields, compile=c) for c in (True, False))
    rng = random.Random(7)
    kept = []
    for _ in range(10):
        batch = build(rng, 5)
        out, expected = _agrees(compiled, careful, batch)  # type: ignore[misc]
        assert type(out) is type(expected) and out.layout is not None  # a BatchList, a namedtuple's carrier
        if compiled._plans.last.layout is None:  # parts: the queued fill places them as the function does
            assert out.layout == compiled._plans.last.walked(batch, "plain", 0, False, None).layout
        kept.append((out, expected))
    plan = compiled._plans.last
    assert not plan.walks and "set_attribute(batch, CARRIED" in plan.compiled.source  # built by the function
    for out, expected in kept:  # earlier batches unchanged by later ones
        assert_identical(out, expected)
    again = pickle.loads(pickle.dumps(kept[-1][0]))
    assert_identical(again, kept[-1][1])
    stream = io.BytesIO()
    torch.save(kept[-1][0], stream)
    stream.seek(0)
    # A user's class is no global torch.load takes by default; the batches of pincollate's own types are.
    assert_identical(torch.load(stream, weights_only=type(kept[-1][0]) is pincollate.BatchList), kept[-1][1])


def test_a_tuple_samples_batch_in_pinned_memory_is_built_by_its_layout(fake_pinned):
    fields = {"1.boxes": pincollate.AsList(), "1.labels": pincollate.AsList()}
    batch = _pairs(random.Random(3), 4)
    compiled = MMCollate(pin_memory=True, fields=fields)
    for _ in range(3):
        out = compiled(batch)
    assert "batch = BatchList([" in compiled._plans.last.compiled.source
    assert_identical(out, MMCollate(pin_memory=False, fields=fields, compile=False)(batch))
    assert type(out) is pincollate.BatchList
    storages = {t.untyped_storage().data_ptr() for t in (out[0], *out[1]["boxes"])}
    assert storages == {out.buffer.untyped_storage().data_ptr()}  # views of the pinned buffer's one storage


@pytest.mark.slow
def test_tuple_samples_with_listed_targets_cross_from_workers_as_the_careful_walk_makes_them():
    for out, reference in _through_workers(lambda rng: _pairs(rng, 1)[0], {"1": pincollate.PerSample()}):
        assert type(out) is pincollate.BatchList
        assert_identical(out, reference)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3), (1, 0, 3), (2, 2, 0)], ids=str)
@pytest.mark.parametrize("count", [1, 2])
def test_items_without_elements_give_what_the_careful_walk_gives(shape, count):
    """Each sample's items stacked as one (B, k, *shape) tensor with no elements, as the walk makes it:
    a long-lived collate that stacked items with elements, then a batch of items without."""
    compiled, careful = (MMCollate(pin_memory=False, sequences="items", compile=c) for c in (True, False))
    full = tuple(n or 3 for n in shape)
    for dims in (full, full, shape, shape, full):
        batch = [{"x": [torch.ones(dims) * i for _ in range(count)], "y": i} for i in range(3)]
        out, _ = _agrees(compiled, careful, batch)  # type: ignore[misc]
        assert out["x"].shape == (3, count, *dims)
    lists = [[torch.zeros(shape)] * count for _ in range(2)]  # each sample a list of items
    for _ in range(3):
        _agrees(compiled, careful, lists)


NUMBER_LIST_KINDS = {
    int: lambda rng, n: [rng.randint(-5, 2**40) for _ in range(n)],
    float: lambda rng, n: [rng.uniform(-1, 1) for _ in range(n)],
    bool: lambda rng, n: [rng.random() < 0.5 for _ in range(n)],
}

NUMBER_LISTS_OFF = {
    "an empty list": lambda: [],
    "an int among floats": lambda: [1.5, 2],
    "a bool among ints": lambda: [1, True],
    "an int past int64": lambda: [2**63],
    "a tuple": lambda: (1, 2),
    "a numpy scalar": lambda: [np.int64(3)],
    "a nested list": lambda: [[1], [2]],
    "a tensor": lambda: torch.tensor([1, 2]),
    "None": lambda: None,
    "a string": lambda: "12",
}


@pytest.mark.parametrize("sequences", ["transpose", "items"])
@pytest.mark.parametrize("kind", sorted(NUMBER_LIST_KINDS, key=str), ids=lambda kind: kind.__name__)
def test_aslist_of_number_lists_is_placed_by_the_plan_s_function_as_the_careful_walk_places_them(kind, sequences):
    """A variable number of labels per sample under AsList(): each sample's numbers one 1-D tensor of
    the dtype the walk gives them, batch after batch of one collate, and a batch one fact off each."""
    fields = {"labels": pincollate.AsList()}
    compiled, careful = (
        MMCollate(pin_memory=False, fields=fields, sequences=sequences, compile=c) for c in (True, False)
    )
    rng = random.Random(11)
    make = NUMBER_LIST_KINDS[kind]

    def batch(n: int = 4) -> list[dict]:
        return [{"labels": make(rng, rng.randint(1, 5)), "x": torch.full((2,), float(i))} for i in range(n)]

    kept = []
    for _ in range(6):
        kept.append((batch(), None))
        kept[-1] = _agrees(compiled, careful, kept[-1][0])  # type: ignore[assignment]
    plan = compiled._plans.last
    assert not plan.walks and "number_items(" in plan.compiled.source
    for off in NUMBER_LISTS_OFF.values():
        bad = batch()
        bad[2]["labels"] = off()
        _agrees(compiled, careful, bad)
        _agrees(compiled, careful, batch())  # the plan still serves the batches it describes
    for out, expected in kept:  # earlier batches unchanged
        assert_identical(out, expected)
    again = pickle.loads(pickle.dumps(kept[-1][0]))
    assert_identical(again, kept[-1][1])


def test_a_batch_its_guards_refuse_still_fills_the_caller_s_buffer():
    # The plan's function takes a buffer of the caller's (``into``, what the bench and a worker's
    # ring hand it); a batch a part's guard refuses (another dtype) goes to the function that walks
    # every part, which fills that same buffer.
    compiled, careful = _pair(Pad())
    compiled(_ids(torch.arange(3), torch.arange(1)))
    plan = compiled._plans.last
    other = _ids(torch.arange(2, dtype=torch.int32), torch.arange(4, dtype=torch.int32))
    into = torch.empty(plan.compiled.run(other, None, 0, False, None).nbytes, dtype=torch.uint8)
    batch = plan.compiled.run(other, "plain", 0, False, None, into)
    assert plan.walking is not None  # the guard refused it
    assert batch.buffer.data_ptr() == into.data_ptr()
    assert_identical(batch, careful(other))
