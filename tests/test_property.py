"""Property tests: random nested samples against default_collate, and invariants everywhere."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from pincollate import AsList, CollateError, Concat, Jagged, MMCollate, RaggedFieldWarning
from samples import assert_identical, assert_one_buffer, assert_same, storages

pytest.importorskip("hypothesis", reason="not installed here (a lent GPU's machine has only torch, numpy, pytest)")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

P2 = collections.namedtuple("P2", "a b")


def _listing(collate: MMCollate, batch: list[Any]) -> tuple[Any, list[warnings.WarningMessage]]:
    """``collate(batch)`` and the ``RaggedFieldWarning`` s it gave: a field without a policy
    listed because its values differ in shape (any other warning is an error, as always).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RaggedFieldWarning)
        out = collate(batch)
    return out, caught


@dataclasses.dataclass
class DC:
    a: Any
    b: Any


TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
NUMPY_DTYPES = [np.float32, np.float64, np.int64, np.int16, np.uint8, np.bool_]

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


def leaf_specs(ragged: bool) -> st.SearchStrategy:
    tensor = st.tuples(
        st.just("tensor"), st.sampled_from(TORCH_DTYPES), shapes, st.booleans() if ragged else st.just(False)
    )
    array = st.tuples(st.just("numpy"), st.sampled_from(NUMPY_DTYPES), shapes, st.just(False))
    plain = st.tuples(st.sampled_from(["int", "float", "bool", "str"]), st.none(), st.none(), st.just(False))
    options = [tensor, array, plain]
    if ragged:
        options.append(st.tuples(st.just("none"), st.none(), st.none(), st.just(False)))
    return st.one_of(*options)


def specs(ragged: bool) -> st.SearchStrategy:
    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        keys = st.text("abcdefgh", min_size=1, max_size=3)
        options = [
            st.dictionaries(keys, children, min_size=1, max_size=4).map(lambda d: ("dict", d)),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: ("list", xs)),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: ("tuple", xs)),
            st.tuples(children, children).map(lambda ab: ("namedtuple", ab)),
        ]
        if ragged:
            options.append(st.tuples(children, children).map(lambda ab: ("dataclass", ab)))
        return st.one_of(*options)

    return st.recursive(leaf_specs(ragged), extend, max_leaves=8)


def build(spec: Any, rng: np.random.Generator) -> Any:
    kind = spec[0]
    if kind == "dict":
        return {k: build(v, rng) for k, v in spec[1].items()}
    if kind == "list":
        return [build(v, rng) for v in spec[1]]
    if kind == "tuple":
        return tuple(build(v, rng) for v in spec[1])
    if kind == "namedtuple":
        return P2(*(build(v, rng) for v in spec[1]))
    if kind == "dataclass":
        return DC(*(build(v, rng) for v in spec[1]))
    _, dtype, shape, vary = spec
    if kind == "tensor":
        if vary:
            shape = tuple(int(rng.integers(0, 4)) for _ in shape)
        values = torch.from_numpy(np.asarray(rng.normal(size=shape) * 50))
        if dtype == torch.bool:
            return values > 0
        if dtype.is_complex:
            return values.to(torch.complex64)
        return values.to(dtype)
    if kind == "numpy":
        return np.asarray(rng.normal(size=shape) * 50).astype(dtype)
    if kind == "int":
        return int(rng.integers(-1000, 1000))
    if kind == "float":
        return float(rng.normal())
    if kind == "bool":
        return bool(rng.integers(0, 2))
    if kind == "str":
        return "s" * int(rng.integers(0, 4))
    return None


def _batch(spec, size, seed):
    rng = np.random.default_rng(seed)
    return [build(spec, rng) for _ in range(size)]


SETTINGS = settings(
    max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@SETTINGS
@given(spec=specs(ragged=False), size=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_equal_to_default_collate_where_it_succeeds(spec, size, seed):
    expected = default_collate(_batch(spec, size, seed))
    collate = MMCollate(pin_memory=False)
    for _ in range(3):  # planned, then the cached plan reused
        out = collate(_batch(spec, size, seed))
        assert_same(out, expected)
        assert_one_buffer(out)


def _same_leaf(ours: Any, original: Any) -> None:
    if isinstance(original, torch.Tensor):
        assert torch.equal(ours, original) and ours.dtype == original.dtype
    elif isinstance(original, np.ndarray):
        assert np.array_equal(ours.numpy(), original)
    else:
        assert ours == original or (isinstance(ours, torch.Tensor) and ours.item() == original)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(dtype=st.sampled_from(TORCH_DTYPES), ndim=st.integers(1, 3), size=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_ragged_tensors_round_trip_per_sample(dtype, ndim, size, seed):
    rng = np.random.default_rng(seed)
    spec = ("dict", {"x": ("tensor", dtype, (1,) * ndim, True), "y": ("int", None, None, False)})
    batch = [build(spec, rng) for _ in range(size)]
    out, warned = _listing(MMCollate(pin_memory=False), batch)
    assert len(storages(out)) == 1
    # Listed (the shapes differ) exactly when a warning says so, once.
    assert len(warned) == isinstance(out["x"], list)
    if isinstance(out["x"], list):
        for ours, sample in zip(out["x"], batch, strict=True):
            _same_leaf(ours, sample["x"])
    else:
        for i, sample in enumerate(batch):
            _same_leaf(out["x"][i], sample["x"])
    assert out["y"].tolist() == [s["y"] for s in batch]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=specs(ragged=True), size=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_one_buffer_everywhere(spec, size, seed):
    out, _ = _listing(MMCollate(pin_memory=False), _batch(spec, size, seed))
    assert_one_buffer(out)


# --- mixed leaf types, absent keys, item lists and policies ---------------------------------

MIXED_KINDS = ["tensor", "numpy", "int", "float", "np-scalar", "0d-tensor", "0d-array", "list", "huge-int"]


def _mixed_leaf(kind: str, dtype_index: int, rng: np.random.Generator) -> Any:
    value = float(rng.normal() * 10)
    if kind == "tensor":
        return torch.tensor([value, -value]).to([torch.float32, torch.int64, torch.float64][dtype_index])
    if kind == "numpy":
        return np.asarray([value, -value]).astype([np.float32, np.int64, np.float64][dtype_index])
    if kind == "int":
        return int(value)
    if kind == "float":
        return value
    if kind == "np-scalar":
        return [np.float32, np.int64, np.float64][dtype_index](value)
    if kind == "0d-tensor":
        return torch.tensor(value).to([torch.float32, torch.int64, torch.float64][dtype_index])
    if kind == "list":  # after an array, default_collate takes it as one
        return [[value, -value], [int(value), -int(value)], (value, -value)][dtype_index]
    if kind == "huge-int":
        return [2**63, -(2**63) - 1, 2**70][dtype_index]
    return np.asarray(value).astype([np.float32, np.int64, np.float64][dtype_index])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.tuples(st.sampled_from(MIXED_KINDS), st.integers(0, 2)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_mixed_leaf_columns_equal_default_collate_or_fail_clearly(kinds, seed):
    rng = np.random.default_rng(seed)
    batch = [{"v": _mixed_leaf(kind, d, rng)} for kind, d in kinds]
    try:
        expected = default_collate([dict(s) for s in batch])
    except Exception:
        expected = None
    collate = MMCollate(pin_memory=False)
    try:
        out, _ = _listing(collate, batch)
    except CollateError as error:
        assert error.path == ("v",)
        assert error.sample is not None or "values of one class" in str(error), str(error)  # which sample, where one is
        assert expected is None, f"default_collate took it: {error}"
        return
    if expected is not None:
        assert_same(out, expected)
    assert_one_buffer(out)
    assert_same(collate(batch), out)  # the cached plan (or the part planned anew) agrees


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    present=st.lists(st.sets(st.sampled_from("abc"), min_size=1), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_absent_keys_become_none_and_present_values_are_kept(present, seed):
    rng = np.random.default_rng(seed)
    batch = [{k: torch.from_numpy(rng.normal(size=(2,))).float() for k in sorted(keys)} for keys in present]
    out = MMCollate(pin_memory=False, missing="none")(batch)
    assert set(out) == set().union(*present)
    for key in out:
        for i, sample in enumerate(batch):
            value = out[key][i]
            if key in sample:
                assert torch.equal(value, sample[key])
            else:
                assert value is None
    assert_one_buffer(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
    policy=st.sampled_from(["concat", "jagged", "aslist"]),
)
def test_item_lists_under_policies_keep_every_item_in_order(counts, policy):
    batch = [{"items": [torch.arange(float(n)) + 10 * j for j, n in enumerate(sample)]} for sample in counts]
    chosen = {"concat": Concat(), "jagged": Jagged(), "aslist": AsList()}[policy]
    out = MMCollate(pin_memory=False, fields={"items": chosen})(batch)
    flat = [t for s in batch for t in s["items"]]
    if policy == "aslist":
        assert [len(items) for items in out["items"]] == [len(s["items"]) for s in batch]
        for ours, sample in zip(out["items"], batch, strict=True):
            for a, b in zip(ours, sample["items"], strict=True):
                assert torch.equal(a, b)
    else:
        values = out["items"].values() if policy == "jagged" else out["items"]
        assert torch.equal(values, torch.cat(flat)) if flat else values.numel() == 0
        assert out["items_counts"].tolist() == [len(s["items"]) for s in batch]
        if policy == "concat":
            rows = [sum(len(t) for t in s["items"]) for s in batch]
            assert out["items_offsets"].tolist() == [sum(rows[:i]) for i in range(len(rows) + 1)]
    assert_one_buffer(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=specs(ragged=True), size=st.integers(1, 4), seeds=st.lists(st.integers(0, 2**16), min_size=2, max_size=4))
def test_compiled_plans_equal_the_careful_walk_on_random_trees(spec, size, seeds):
    # One long-lived compiled collate and the careful walk (compile=False) over batches of one
    # random structure, ragged ones included: the same batch, or the same error, every time.
    compiled = MMCollate(pin_memory=False)
    careful = MMCollate(pin_memory=False, compile=False)
    for seed in seeds:
        outs = []
        warned = []
        for collate in (careful, compiled):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RaggedFieldWarning)
                try:
                    outs.append(collate(_batch(spec, size, seed)))
                except CollateError as error:
                    outs.append(str(error))
            warned.append([str(w.message) for w in caught])
        assert warned[0] == warned[1]  # a field listed without a policy: warned once by each, alike
        if isinstance(outs[0], str) or isinstance(outs[1], str):
            assert outs[0] == outs[1]
        else:
            assert_identical(outs[1], outs[0])
