"""``PerSample()`` subtrees planned once (_rows): a warm collate against the careful walk, batch after batch."""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from pincollate import CollateError, MMCollate, PerSample
from pincollate._plan import template as template_module
from pincollate._plan.rows import Arrays, Groups, Numbers, PerSampleRecipe, Rows, Tensors, Values, column_for
from samples import assert_identical, assert_same_outcome, careful_walk

pytest.importorskip("hypothesis", reason="not installed here (a lent GPU's machine has only torch, numpy, pytest)")
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

LEAVES = ("int", "float", "bool", "str", "none", "ids", "boxes", "half", "array", "np32", "npint")

#: A subtree's shape: a leaf kind, ("dict", ((key, child), ...)) or ("list", child, as_tuple).
trees = st.recursive(
    st.sampled_from(LEAVES),
    lambda children: st.one_of(
        st.lists(st.tuples(st.sampled_from("abcd"), children), min_size=1, max_size=3, unique_by=lambda kv: kv[0]).map(
            lambda items: ("dict", tuple(items))
        ),
        st.tuples(st.just("list"), children, st.booleans()),
    ),
    max_leaves=6,
)


def _leaf(kind: str, i: int, salt: int) -> Any:
    n = (3 * i + salt) % 4  # ragged, sometimes empty
    return {
        "int": 7 * i - 3 + salt,
        "float": i + 0.5 * salt,
        "bool": (i + salt) % 2 == 0,
        "str": f"s{i}.{salt}",
        "none": None,
        "ids": torch.arange(n) + 10 * i,
        "boxes": torch.full((n, 4), float(i + salt)),
        "half": torch.full((2, n), i, dtype=torch.float16),
        "array": np.full((n, 2), i + 0.25, dtype=np.float32),
        "np32": np.float32(i + 0.5 * salt),
        "npint": np.int16(i - salt),
    }[kind]


def _build(tree: Any, i: int, salt: int) -> Any:
    if isinstance(tree, str):
        return _leaf(tree, i, salt)
    if tree[0] == "dict":
        return {key: _build(child, i + 3, salt) for key, child in tree[1]}
    _, child, as_tuple = tree
    items = [_build(child, i + j, salt) for j in range((i + salt) % 3)]
    return tuple(items) if as_tuple else items


def _careful(batch: list[Any]) -> tuple[str, Any]:
    """What the careful walk gives ``batch`` (no recipe anywhere): the batch, or its error."""
    with mock.patch.object(template_module, "part_recipe", lambda *args: None):
        try:
            return "batch", MMCollate(pin_memory=False, fields={"t": PerSample()})(batch)
        except CollateError as error:
            return "error", str(error)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=trees,
    other=trees,
    batches=st.lists(
        st.tuples(st.lists(st.booleans(), min_size=1, max_size=4), st.integers(0, 5)), min_size=1, max_size=6
    ),
)
def test_a_warm_per_sample_recipe_gives_what_the_careful_walk_gives(first, other, batches):
    # One long-lived collate, its plan made by the first batch; later batches mix samples of
    # two subtree shapes (sample by sample), so columns change kind, dtype, rank and length.
    collate = MMCollate(pin_memory=False, fields={"t": PerSample()})
    for pick, salt in [([False, False, False], 0), *batches]:
        batch = [{"x": i, "t": _build(other if use else first, i, salt)} for i, use in enumerate(pick)]
        kind, expected = _careful(batch)
        if kind == "error":
            try:
                collate(batch)
            except CollateError as error:
                assert str(error) == expected
            else:
                raise AssertionError(f"expected the careful walk's error: {expected}")
        else:
            assert_identical(collate(batch), expected)
    recipes = [op.recipe for _, op, _ in collate._plans.last.op.singles if getattr(op, "recipe", None)]
    event(f"the plan's recipe: {type(recipes[0]).__name__ if recipes else None}")


def test_columns_are_settled_by_kind():
    assert type(column_for([1, 2])) is Numbers and type(column_for([1.5, 2.5])) is Numbers
    assert column_for([1, 2**63]) is None  # beyond int64: the careful walk names it
    assert column_for([1, 2.5]) is None and column_for([True, 1]) is None  # two types
    assert type(column_for([np.float16(1), np.float16(2)])) is Numbers
    assert column_for([np.float16(1), np.float32(2)]) is None
    assert column_for([np.datetime64(1, "s")]) is None  # no dtype in torch: the careful error
    assert type(column_for(["a", None, b"b"])) is Values
    assert type(column_for([torch.zeros(2), torch.zeros(3)])) is Tensors
    assert column_for([torch.zeros(2), torch.zeros(3, dtype=torch.int64)]) is None
    assert type(column_for([np.zeros(2), np.zeros(3)])) is Arrays
    assert column_for([np.zeros(2), np.zeros(3, dtype=np.int64)]) is None
    read_only = np.zeros(2)
    read_only.flags.writeable = False
    assert column_for([read_only]) is None  # torch.from_numpy would warn: the careful walk copies it
    rows = column_for([{"a": 1, "b": [torch.zeros(1)]}, {"a": 2, "b": []}])
    assert type(rows) is Rows and [type(c) for c in rows.columns] == [Numbers, Groups]
    assert column_for([{"a": 1}, {"b": 1}]) is None  # another key set
    assert column_for([[], []]) is None  # no items: nothing says what they are
    assert column_for([[1, "a"]]) is None


def test_a_per_sample_recipe_is_made_once_and_used_for_every_batch():
    collate = MMCollate(pin_memory=False, fields={"t": PerSample()})
    for salt in range(4):
        collate([{"t": _build(("list", ("dict", (("b", "boxes"), ("n", "int"))), False), i, salt)} for i in range(3)])
    (recipe,) = [op.recipe for _, op, _ in collate._plans.last.op.singles if getattr(op, "recipe", None)]
    assert type(recipe) is PerSampleRecipe
    assert collate._plans.planned == 1


class _Targets(torch.utils.data.Dataset):
    """Detection samples whose targets mix every column kind: tensors, arrays, numbers, names, nested lists."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        objects = [
            {"box": torch.full((4,), float(i + j)), "label": 3 * i + j, "points": np.full((j + 1, 2), i, np.float32)}
            for j in range(i % 4)
        ]
        return {
            "image": torch.full((3, 8, 8), i, dtype=torch.uint8),
            "t": {"id": i, "file": f"{i}.jpg", "objects": objects},
        }


@pytest.mark.slow
def test_per_sample_targets_through_workers_match_the_careful_walk():
    collate = MMCollate(fields={"t": PerSample()})
    loader = torch.utils.data.DataLoader(_Targets(), batch_size=6, collate_fn=collate, num_workers=2, timeout=60)
    batches = list(loader)
    assert len(batches) == 4
    for k, batch in enumerate(batches):
        samples = [_Targets()[6 * k + i] for i in range(6)]
        kind, expected = _careful(samples)
        assert kind == "batch"
        assert_identical(batch, expected)
        assert batch.layout is not None  # crossed as its layout, and still carries it


@pytest.mark.parametrize("objects", [False, True], ids=["dict-per-image", "object-lists"])
def test_keys_equal_to_the_planned_ones_but_of_another_type_come_back_as_each_sample_has_them(objects):
    # True == 1 == 1.0 and they hash alike; the careful walk keeps each sample's own key objects.
    def batch(*keys: Any) -> list[dict[str, Any]]:
        targets = [{key: torch.arange(n + 1), "boxes": torch.zeros(n, 4)} for n, key in enumerate(keys)]
        return [{"t": [target] if objects else target} for target in targets]

    collate = MMCollate(pin_memory=False, fields={"t": PerSample()})
    reference = careful_walk(fields={"t": PerSample()})
    for keys in ((1, 1), (True, True), (1.0, 1.0), (1, True), (True, 1), (1, 1)):
        out = assert_same_outcome(collate, reference, batch(*keys))
        rows = [sample[0] if objects else sample for sample in out["t"]]
        assert [type(next(iter(row))) for row in rows] == list(map(type, keys))
