"""The plan cache: one plan per structure, reused, and replanned only where it must be."""

from __future__ import annotations

import gc
import random
import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from pincollate import AsList, CollateError, Concat, MMCollate, Pad, RaggedFieldWarning, Stack
from pincollate._batch.layout import PartSpec
from pincollate._batch.views import START
from pincollate._plan.careful import Planner
from samples import (
    LEAF_KINDS,
    PARITY,
    RAGGED,
    Box,
    Meta,
    OtherBox,
    OtherPair,
    Pair,
    Quiet,
    Tagged,
    Tagged2,
    assert_identical,
    assert_one_buffer,
    assert_same,
    build_mutating,
    listing,
    mutate,
    random_structure,
)

pytest.importorskip("hypothesis", reason="not installed here (a lent GPU's machine has only torch, numpy, pytest)")
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule


def _nested(i: int) -> dict:
    return {
        "image": torch.full((3, 4, 4), i, dtype=torch.uint8),
        "feats": {f"f{j}": torch.full((2,), float(i + j)) for j in range(6)},
        "crops": [torch.full((2, 2), float(i)) for _ in range(3)],
        "label": i,
        "score": i / 2,
    }


@pytest.mark.parametrize("name", sorted(PARITY) + sorted(RAGGED))
def test_batches_after_the_first_are_not_planned_again(name):
    build = PARITY.get(name) or RAGGED[name]
    collate = MMCollate()
    with listing(name):
        first = collate(build())
    for _ in range(4):
        assert_same(collate(build()), first)
    assert collate._plans.planned == 1


@pytest.mark.parametrize("name", sorted(PARITY) + sorted(RAGGED))
def test_a_smaller_batch_of_one_structure_is_its_own_plan(name):
    # An epoch's last batch is smaller: the cached plan of the full batches must not
    # be applied to it (its ops check each sample, not how many there are).
    build = PARITY.get(name) or RAGGED[name]
    collate, fresh = MMCollate(), MMCollate()
    samples = build()
    with listing(name):
        for size in (len(samples), len(samples), 1, max(1, len(samples) - 1), len(samples), 1):
            assert_same(collate(samples[:size]), fresh(samples[:size]))
    if name in PARITY:
        assert_same(collate(samples[:1]), default_collate(samples[:1]))


def test_the_layout_is_the_same_object_for_every_batch_of_one_structure():
    collate = MMCollate()
    layouts = [collate([_nested(i + k) for i in range(4)]).layout for k in range(5)]
    assert all(layout is layouts[0] for layout in layouts)
    assert collate.plan([_nested(i) for i in range(4)]) == layouts[0]
    assert layouts[0].nbytes == collate([_nested(9)] * 4).layout.nbytes


def test_a_cached_plan_gives_default_collate_values_for_new_samples():
    collate = MMCollate()
    collate([_nested(i) for i in range(4)])
    for k in range(3):
        samples = [_nested(10 * k + i) for i in range(4)]
        assert_same(collate(samples), default_collate([_nested(10 * k + i) for i in range(4)]))
    assert collate._plans.planned == 1


def test_fields_of_one_dtype_and_shape_share_one_block():
    collate = MMCollate()
    samples = [_nested(i) for i in range(4)]
    layout = collate.plan(samples)
    collate(samples)
    feats = layout.root.children[layout.root.keys.index("feats")]
    (holder,) = [single[1] for single in collate._plans.last.op.singles if single[1].path == ("feats",)]
    (block,) = holder.blocks  # one stack fills every field of "feats"
    assert list(block.paths) == [("feats", key) for key in feats.keys]
    offsets = [spec.offset for spec in feats.children]
    # 4 samples of 2 float32 take 32 bytes; each field of the block starts on 64.
    assert offsets == sorted(offsets) and offsets[1] - offsets[0] == 64
    assert all(offset % 64 == 0 for offset in offsets)


def test_a_structure_seen_before_reuses_its_plan():
    collate = MMCollate()
    small = [{"x": torch.zeros(2)}] * 2
    large = [{"x": torch.zeros(5)}] * 2
    for _ in range(3):
        assert collate(small)["x"].shape == (2, 2)
        assert collate(large)["x"].shape == (2, 5)
    assert collate._plans.planned == 2


def test_keys_are_compared_exactly():
    collate = MMCollate()
    assert list(collate([{1: torch.zeros(1)}] * 2)) == [1]
    out = collate([{True: torch.zeros(1)}] * 2)
    assert list(out) == [True] and type(next(iter(out))) is bool


def test_a_field_turning_ragged_is_planned_carefully_from_then_on():
    collate = MMCollate()
    uniform = [{"x": torch.zeros(2), "y": 1}, {"x": torch.zeros(2), "y": 2}]
    ragged = [{"x": torch.zeros(2), "y": 1}, {"x": torch.zeros(3), "y": 2}]
    collate(uniform)
    with pytest.warns(
        RaggedFieldWarning, match=r"\['x'\] holds values of different shapes, \(2,\) in sample 0 and \(3,\)"
    ):
        out = collate(ragged)
    assert [t.shape[0] for t in out["x"]] == [2, 3]
    assert collate._plans.planned == 2
    for _ in range(3):
        collate(ragged)
        assert_same(collate(uniform)["x"], torch.zeros(2, 2))
    assert collate._plans.planned == 2


def test_every_field_turning_ragged_at_once_costs_one_new_plan():
    collate = MMCollate()
    keys = [f"k{j}" for j in range(20)]
    collate([{k: torch.zeros(2) for k in keys}] * 2)
    ragged = [{k: torch.zeros(2) for k in keys}, {k: torch.zeros(3) for k in keys}]
    with pytest.warns(RaggedFieldWarning) as warned:
        out = collate(ragged)
    assert len(warned) == len(keys)  # one per field
    assert all(isinstance(out[k], list) for k in keys)
    assert collate._plans.planned == 2
    assert {("k3",), ("k19",)} <= collate._plans.careful


def test_a_first_batch_with_many_ragged_fields_is_planned_once():
    collate = MMCollate()
    samples = [{f"r{j}": torch.zeros(i + 1) for j in range(150)} for i in range(4)]
    with pytest.warns(RaggedFieldWarning) as warned:
        out = collate(samples)
    assert len(warned) == 150
    assert collate._plans.planned == 1 and len(out) == 150
    collate(samples)
    assert collate._plans.planned == 1


def test_a_batch_that_fails_teaches_the_cache_nothing():
    collate = MMCollate()
    good = [{"x": torch.zeros(2)}] * 2
    collate(good)
    with pytest.raises(TypeError):
        collate([{"x": torch.zeros(2)}, {"x": "oops"}])
    assert collate._plans.careful == set()
    collate(good)
    assert collate._plans.planned == 1


def test_the_cache_is_bounded_and_so_are_the_sources_of_its_plans():
    import linecache

    def ours() -> set[str]:
        return {name for name in linecache.cache if name.startswith("<pincollate")}

    gc.collect()
    before = ours()
    collate = MMCollate()
    collate._plans.capacity = 4
    for n in range(40):  # 40 structures: a key of its own each
        collate([{f"x{n}": torch.zeros(2)}] * 2)
    assert len(collate._plans._plans) == 4
    gc.collect()
    # The dropped plans' generated lines went with their functions (a plan's function and its batch's build).
    assert len(ours() - before) <= 2 * 4


@pytest.mark.parametrize("padded", [False, True])
def test_a_field_whose_shape_changes_from_batch_to_batch_is_planned_once(padded):
    # A bucketed length or a resized image: one shape in a batch, another in the next. The
    # field is planned for each batch (its sizes read) once a second shape comes: one plan,
    # not one plan and one compile per shape. Beside a padded field, which the first plan
    # learns is planned for each batch, too.
    collate = MMCollate(pin_memory=False, fields={"ids": Pad()} if padded else None)
    walk = MMCollate(pin_memory=False, fields={"ids": Pad()} if padded else None, compile=False)
    for n in [3, 5, 7, 3, 9, 11, 5, 13, 2, 8] * 3:
        samples = [{"x": torch.full((n, 4), float(i)), "label": i} for i in range(4)]
        if padded:
            for i, sample in enumerate(samples):
                sample["ids"] = torch.arange(i + n % 3 + 1)
        else:
            assert_identical(collate(samples), default_collate(samples))
        assert_identical(collate(samples), walk(samples))
    assert collate._plans.planned <= 2


def test_ragged_fields_are_parts_after_the_cached_slots():
    collate = MMCollate(fields={"ids": Pad()})
    samples = [{"image": torch.zeros(3, 2, 2), "ids": torch.arange(i + 1)} for i in range(3)]
    layout = collate.plan(samples)
    image = layout.root.children[0]
    assert image.offset == START and len(layout.parts) == 1
    part = layout.parts[0]
    assert part.node.offset >= START + image.nbytes and [name for name, _ in part.extras] == ["ids_lengths", "ids_mask"]
    again = collate.plan([{"image": torch.ones(3, 2, 2), "ids": torch.arange(i + 5)} for i in range(3)])
    assert again.root is layout.root and again.parts[0].node.shape == (3, 7)


def test_one_collate_shared_by_threads_gives_each_its_own_right_batch():
    import threading

    collate = MMCollate(pin_memory=False)
    trees = [PARITY[name] for name in ("multimodal-dict", "tuple-samples", "deep", "namedtuple")] + [
        RAGGED["ragged-boxes"]
    ]
    with listing("ragged-boxes"):  # warned here, in the test's thread, once for the shared collate
        collate(RAGGED["ragged-boxes"]())
        expected = {build: MMCollate(pin_memory=False)(build()) for build in trees}
    failures: list[BaseException] = []

    def work(build) -> None:
        try:
            for _ in range(50):
                assert_same(collate(build()), expected[build])
        except BaseException as error:  # reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(build,)) for build in trees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[0]
    assert collate._plans.planned <= 2 * len(trees)


# --- the guard: a warm plan is used only for a batch it describes exactly -------------------

# Each pair: a batch that warms the cache, then one that differs only in what one per-batch
# check guards. Removing that check makes the second batch reuse the wrong plan; the comment
# names the check (in pincollate/_ops.py).
_f32, _f64 = torch.float32, torch.float64
GUARDED = {
    # StackOp: the exact class of every value (a subclass passes the dtype getter).
    "stack-class": ([{"x": torch.ones(3)}] * 2, [{"x": torch.ones(3).as_subclass(Tagged)}] * 2),
    "stack-class-mixed": ([{"x": torch.ones(3)}] * 2, [{"x": torch.ones(3)}, {"x": torch.ones(3).as_subclass(Tagged)}]),
    # StackOp: the dtype of every value (key == expected).
    "stack-dtype": ([{"x": torch.ones(3)}] * 2, [{"x": torch.ones(3, dtype=_f64)}] * 2),
    "stack-dtype-one-sample": (
        [{"x": torch.ones(3)}] * 2,
        [{"x": torch.ones(3)}, {"x": torch.ones(3, dtype=torch.int64)}],
    ),
    # StackOp: sample 0's shape.
    "stack-shape": ([{"x": torch.ones(3)}] * 2, [{"x": torch.ones(4)}] * 2),
    "stack-shape-same-size": ([{"x": torch.ones(4)}] * 2, [{"x": torch.ones(2, 2)}] * 2),
    # StackOp of Python numbers: the exact class (1.5 must not become 1).
    "numbers-class": ([1, 2], [1.5, 2.5]),
    # BlockOp: the exact class, the dtype and the shape of every field of the block.
    "block-class": (
        [{"a": torch.ones(2), "b": torch.ones(2)}] * 2,
        [{"a": torch.ones(2).as_subclass(Tagged), "b": torch.ones(2)}] * 2,
    ),
    # ... where a value's own __torch_function__ is off (nn.Parameter's way), torch.stack
    # takes it as a plain tensor, as default_collate does; anything but a tensor it refuses.
    "block-quiet-class": (
        [{"a": torch.ones(2), "b": torch.ones(2)}] * 2,
        [{"a": torch.ones(2), "b": torch.ones(2)}, {"a": torch.ones(2).as_subclass(Quiet), "b": torch.ones(2)}],
    ),
    "block-not-a-tensor": (
        [{"a": torch.ones(2), "b": torch.ones(2)}] * 2,
        [{"a": torch.ones(2), "b": torch.ones(2)}, {"a": torch.ones(2).numpy(), "b": torch.ones(2)}],
    ),
    "block-dtype": (
        [{"a": torch.ones(2), "b": torch.ones(2)}] * 2,
        [{"a": torch.ones(2, dtype=_f64), "b": torch.ones(2, dtype=_f64)}] * 2,
    ),
    "block-shape": ([{"a": torch.ones(2), "b": torch.ones(2)}] * 2, [{"a": torch.ones(3), "b": torch.ones(3)}] * 2),
    # NumbersOp: the exact class of every number of the block (float64 must not become int64).
    "number-block-class": ([{"n": 1, "m": 2}] * 2, [{"n": 1.5, "m": 2}] * 2),
    "number-block-int64": ([{"n": 1, "m": 2}] * 2, [{"n": 1, "m": 2}, {"n": 2**70, "m": 2}]),
    # ValueOp: the exact class of every value.
    "value-class": ([{"s": "a"}] * 2, [{"s": b"a"}] * 2),
    # MappingOp: class, size, keys and key types.
    "mapping-class": ([{"x": torch.ones(1)}] * 2, [Meta(x=torch.ones(1))] * 2),
    "mapping-keys": ([{"x": torch.ones(1)}] * 2, [{"y": torch.ones(1)}] * 2),
    "mapping-key-order": ([{"a": torch.ones(1), "b": 1}] * 2, [{"b": 1, "a": torch.ones(1)}] * 2),
    "mapping-key-type": ([{1: torch.ones(1)}] * 2, [{True: torch.ones(1)}] * 2),
    # SequenceOp: class and length.
    "sequence-class": ([Pair(torch.ones(1), 1)] * 2, [OtherPair(torch.ones(1), 1)] * 2),
    "sequence-classes-mixed": ([Pair(torch.ones(1), 1)] * 2, [Pair(torch.ones(1), 1), OtherPair(torch.ones(1), 2)]),
    "sequence-length": ([[torch.ones(1), 1]] * 2, [[torch.ones(1), 1, 2]] * 2),
    # DataclassOp: the class.
    "dataclass-class": ([Box(torch.ones(1), 1)] * 2, [OtherBox(torch.ones(1), 1)] * 2),
}


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_a_warm_plan_is_not_used_for_a_batch_it_does_not_describe(name):
    warm, other = GUARDED[name]
    collate = MMCollate(pin_memory=False)
    for _ in range(2):  # the second call runs the cached plan: warm
        collate(warm)
    kind, expected = _oracle(other, None)
    # Warnings recorded, not raised: outside pytest a warning from torch (an output
    # resized by torch.stack, say) does not stop a wrong plan from being used.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "error":
            with pytest.raises(CollateError, match=re.escape(expected)):
                collate(other)
        else:
            assert_identical(collate(other), expected)
    assert not caught, [str(w.message) for w in caught]
    assert_identical(collate(warm), MMCollate(pin_memory=False)(warm))


def test_subclass_columns_behave_as_default_collate():
    mixed = [{"x": torch.ones(2)}, {"x": torch.ones(2).as_subclass(Tagged)}, {"x": torch.ones(2).as_subclass(Tagged2)}]
    assert type(default_collate(mixed)["x"]) is Tagged2
    for collate in (MMCollate(pin_memory=False), MMCollate(pin_memory=False, fields={"x": Stack()})):
        assert_identical(collate(mixed), default_collate(mixed))
        assert_identical(collate(mixed), default_collate(mixed))  # the cached plan


class _Passing(torch.overrides.TorchFunctionMode):
    """A torch-function mode that runs every call as it is (what a device context is, say)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_warm_block_under_a_torch_function_mode_still_keeps_a_subclass():
    # Under a mode every list "has" a __torch_function__: the block reads each value's class.
    collate = MMCollate(pin_memory=False)
    plain = [{"a": torch.ones(2), "b": torch.ones(2)}] * 2
    collate(plain)
    collate(plain)
    tagged = [{"a": torch.ones(2).as_subclass(Tagged), "b": torch.ones(2)}] * 2
    with _Passing():
        out = collate(tagged)
    assert type(out["a"]) is Tagged and type(out["b"]) is torch.Tensor
    assert_identical(out, default_collate(tagged))


def test_parameters_and_quiet_subclasses_stack_as_plain_tensors_as_default_collate():
    for cls in (torch.nn.Parameter, Quiet):
        samples = [{"a": cls(torch.ones(2) * i), "b": torch.ones(2) * i, "c": cls(torch.zeros(3))} for i in range(3)]
        expected = {key: value.detach() for key, value in default_collate(samples).items()}
        assert all(type(value) is torch.Tensor for value in expected.values())
        collate = MMCollate(pin_memory=False)
        for _ in range(2):  # fresh, then the cached plan
            assert_identical(collate(samples), expected)


def test_tv_tensors_of_two_kinds_in_one_column_name_the_sample():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    samples = [{"m": tv_tensors.Image(torch.zeros(1, 2, 2))}, {"m": tv_tensors.Mask(torch.zeros(1, 2, 2))}]
    with pytest.raises(CollateError) as info:
        MMCollate(pin_memory=False)(samples)
    assert info.value.sample == 1 and info.value.path == ("m",)
    assert "Mask" in str(info.value) and "Image" in str(info.value)


def test_a_warm_plain_plan_keeps_tv_tensor_classes():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    collate = MMCollate(pin_memory=False)
    collate([{"image": torch.zeros(3, 2, 2)}] * 2)
    out = collate([{"image": tv_tensors.Image(torch.zeros(3, 2, 2))}] * 2)
    assert type(out["image"]) is tv_tensors.Image


def test_namedtuples_of_two_classes_with_the_same_fields_collate_as_default_collate():
    samples = [Pair(1, torch.ones(2)), OtherPair(2, torch.ones(2)), Pair(3, torch.ones(2))]
    assert_same(MMCollate(pin_memory=False)(samples), default_collate(samples))
    mixed_in_list = [(1, torch.ones(2)), Pair(2, torch.ones(2))]
    assert_same(MMCollate(pin_memory=False)(mixed_in_list), default_collate(mixed_in_list))


# --- a long-lived collate fed batches whose structure keeps changing ------------------------

POLICIES = {"pad": Pad(), "alist": AsList(), "cat": Concat()}


def _oracle(samples: list[Any], structure: Any | None) -> tuple[str, Any]:
    """default_collate's result where it succeeds (and no policy applies), else a fresh collate's."""
    if structure is None or not _has_policy_key(structure):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return "default_collate", default_collate(samples)
        except Exception:
            pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a policy pattern that matches nothing here
            return "fresh", MMCollate(pin_memory=False, fields=POLICIES)(samples)
    except CollateError as error:
        return "error", str(error)


def _has_policy_key(structure: Any) -> bool:
    if structure[0] in ("dict", "meta"):
        return any(key in POLICIES or _has_policy_key(child) for key, child in structure[1])
    if structure[0] in ("tensor", "ndarray") or structure[0] in LEAF_KINDS:
        return False
    return any(_has_policy_key(child) for child in structure[1])


def _check(collate: MMCollate, structure: Any, n: int, seed: int) -> None:
    samples = build_mutating(structure, n, seed)
    kind, expected = _oracle(build_mutating(structure, n, seed), structure)
    if kind == "error":
        with pytest.raises(CollateError) as info, warnings.catch_warnings():
            warnings.simplefilter("ignore", RaggedFieldWarning)  # a field listed before another one fails
            collate(samples)
        assert str(info.value) == expected
        return
    with warnings.catch_warnings():
        # An unmatched policy pattern, reported once; a field listed without a policy (RaggedFieldWarning).
        warnings.simplefilter("ignore", UserWarning)
        out = collate(samples)
    assert_identical(out, expected)
    assert_one_buffer(out)


def _with_policy_keys(structure: Any, rng: random.Random) -> Any:
    """Sometimes a top-level mapping with a field under a policy beside the structure."""
    if rng.random() < 0.4:
        ids = ("tensor", rng.choice((torch.int64, torch.int32)), (rng.randint(1, 3),), "plain", rng.random() < 0.7)
        key = rng.choice(sorted(POLICIES))
        if key == "cat" and rng.random() < 0.5:
            ids = ("list", (ids,) * rng.randint(1, 2))  # per-sample lists of items
        return ("dict", ((key, ids), ("body", structure)))
    return structure


def test_an_optional_key_only_later_samples_hold_never_makes_the_whole_batch_careful():
    # missing="none": sample 0 lacks "wave", which later samples may hold. A batch with it and a
    # batch without it are two structures (two plans), not a reason to walk every batch for good.
    def batch(k: int, wave: bool) -> list[dict[str, Any]]:
        return [
            {"image": torch.full((3, 4, 4), float(i)), **({"wave": torch.arange(k + i + 1.0)} if wave and i else {})}
            for i in range(4)
        ]

    collate = MMCollate(pin_memory=False, missing="none")
    reference = MMCollate(pin_memory=False, missing="none", compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)
        for k, wave in [(0, True), (1, False), (2, True), (3, False), (4, True), (5, True), (6, False)]:
            samples = batch(k, wave)
            assert_identical(collate(samples), reference(samples))
    assert () not in collate._plans.careful
    assert collate._plans.planned >= 2 and not any(plan.walks for plan in collate._plans._plans.values())
    steady = [{"image": torch.zeros(3, 4, 4), "n": i} for i in range(4)]
    collate(steady), collate(steady)
    assert not collate._plans.last.walks  # another structure after them: compiled, not walked


def test_the_careful_paths_are_a_new_set_when_a_plan_commits():
    # Another thread may be computing a signature over the set it read: a commit never changes it.
    collate = MMCollate(pin_memory=False, ragged=Pad())
    collate([{"ids": torch.arange(i + 1), "n": i} for i in range(4)])
    read = collate._plans.careful
    before = set(read)
    collate([{"tokens": torch.arange(i + 1), "n": i} for i in range(4)])  # another structure: "tokens" learnt
    assert ("tokens",) in collate._plans.careful and collate._plans.careful is not read and read == before


def test_the_field_rules_keep_a_bounded_number_of_lookups():
    from pincollate._plan import patterns

    collate = MMCollate(pin_memory=False, fields={"meta.*": AsList()})
    for i in range(patterns._LOOKUPS_KEPT // 2 + 10):  # two key paths a batch, each new: file names
        collate([{"meta": {f"file{i}": torch.ones(2)}, "x": torch.ones(1)}] * 2)
    assert len(collate._rules._cache) <= patterns._LOOKUPS_KEPT


class LongLivedCollate(RuleBasedStateMachine):
    """One MMCollate, warm, fed random sequences of batches whose structure mutates."""

    def __init__(self) -> None:
        super().__init__()
        self.collate = MMCollate(pin_memory=False, fields=POLICIES)
        self.structure: Any = ("dict", (("a", ("tensor", torch.float32, (2,), "plain", False)),))

    @rule(rng=st.randoms(use_true_random=False))
    def new_structure(self, rng: random.Random) -> None:
        self.structure = _with_policy_keys(random_structure(rng), rng)

    @rule(rng=st.randoms(use_true_random=False))
    def mutate_structure(self, rng: random.Random) -> None:
        self.structure = mutate(self.structure, rng)

    @rule(n=st.integers(1, 4), seed=st.integers(0, 2**16))
    def collate_a_batch(self, n: int, seed: int) -> None:
        _check(self.collate, self.structure, n, seed)

    @rule(n=st.integers(1, 4), seed=st.integers(0, 2**16))
    def collate_twice(self, n: int, seed: int) -> None:
        # The second call runs the cached plan the first one made or found.
        _check(self.collate, self.structure, n, seed)
        _check(self.collate, self.structure, n, seed + 1)


LongLivedCollate.TestCase.settings = settings(
    max_examples=300, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
test_a_long_lived_collate_agrees_with_a_fresh_one = LongLivedCollate.TestCase


def _drop_keys(tree: Any, rng: random.Random, p: float) -> None:
    """Delete keys of the mappings in ``tree`` at random, in place (absent keys for missing="none")."""
    if isinstance(tree, dict):
        for key in list(tree):
            if rng.random() < p:
                del tree[key]
            else:
                _drop_keys(tree[key], rng, p)
    elif isinstance(tree, list):
        for item in tree:
            _drop_keys(item, rng, p)


class LongLivedSparseCollate(LongLivedCollate):
    """The same, with missing="none" and keys absent from random samples, against a careful walk."""

    def __init__(self) -> None:
        super().__init__()
        self.collate = MMCollate(pin_memory=False, fields=POLICIES, missing="none")

    @rule(n=st.integers(1, 4), seed=st.integers(0, 2**16), p=st.sampled_from([0.0, 0.2, 0.5]))
    def collate_a_sparse_batch(self, n: int, seed: int, p: float) -> None:
        samples = build_mutating(self.structure, n, seed)
        _drop_keys(samples, random.Random(seed), p)
        reference = MMCollate(pin_memory=False, fields=POLICIES, missing="none")
        reference._plans.careful.add(())  # the whole batch walked carefully
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a policy pattern that matches nothing here
            try:
                expected = reference(samples)
            except CollateError as error:
                with pytest.raises(CollateError) as ours:
                    self.collate(samples)
                assert str(ours.value) == str(error)
                return
            assert_identical(self.collate(samples), expected)

    def collate_a_batch(self, n: int, seed: int) -> None:  # type: ignore[override]
        self.collate_a_sparse_batch(n, seed, 0.0)

    def collate_twice(self, n: int, seed: int) -> None:  # type: ignore[override]
        self.collate_a_sparse_batch(n, seed, 0.2)
        self.collate_a_sparse_batch(n, seed + 1, 0.2)


LongLivedSparseCollate.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
test_a_long_lived_sparse_collate_agrees_with_a_careful_walk = LongLivedSparseCollate.TestCase


class _MutatingBatches(torch.utils.data.Dataset):
    """Batch ``i`` of one seeded sequence of mutating structures (``batch_size=None`` loaders)."""

    def __init__(self, seed: int, count: int):
        rng = random.Random(seed)
        structure = random_structure(rng)
        self.batches: list[tuple[Any, int, int]] = []
        for i in range(count):
            if rng.random() < 0.3:
                structure = (
                    mutate(structure, rng) if rng.random() < 0.7 else _with_policy_keys(random_structure(rng), rng)
                )
            self.batches.append((structure, rng.randint(1, 4), seed * 1000 + i))

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> list[Any]:
        structure, n, seed = self.batches[i]
        return build_mutating(structure, n, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_a_worker_long_lived_collate_agrees_with_a_fresh_one(seed):
    dataset = _MutatingBatches(seed, 150)
    collate = MMCollate(pin_memory=False, fields=POLICIES)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, collate_fn=_Tolerant(collate))
    iterator = iter(loader)
    try:
        for i, out in enumerate(iterator):
            structure = dataset.batches[i][0]
            kind, expected = _oracle(dataset[i], structure)
            if kind == "error":
                assert out == ("error", expected), f"batch {i}"
            else:
                assert_identical(out, expected, f"batch {i}")
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]


class _Tolerant:
    """A worker-side collate that returns a CollateError's text instead of ending the epoch."""

    def __init__(self, collate: MMCollate):
        self.collate = collate

    def __call__(self, samples: list[Any]) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return self.collate(samples)
        except CollateError as error:
            return ("error", str(error))


# --- missing="none": absent keys keep the plan ---------------------------------------------


def _sparse(i: int, keys: str) -> dict:
    """A sample with some of image, ids, pixels, label, score, meta (by letter: i d p l s m)."""
    sample: dict = {}
    if "i" in keys:
        sample["image"] = torch.full((3, 2, 2), float(i))
    if "d" in keys:
        sample["ids"] = torch.arange(1 + i % 3)
    if "p" in keys:
        sample["pixels"] = [torch.full((2, 4), float(i))] * (1 + i % 2)
    if "l" in keys:
        sample["label"] = i
    if "s" in keys:
        sample["score"] = i / 4
    if "m" in keys:
        sample["meta"] = {"id": i, "crop": torch.ones(2) * i}
    return sample


_SPARSE_BATCHES = [
    ["idplsm", "idplsm", "idplsm"],  # every key: the plan
    ["idlsm", "idplsm", "idplsm"],  # sample 0 without pixels: the union's order is the plan's
    ["idplsm", "idlsm", "idplsm"],  # a text-only sample
    ["idplsm", "idplsm", "idplsm"],
    ["idplsm", "idpsm", "idplsm"],  # a number absent: its fields are planned for each batch from now on
    ["idplsm", "idpls", "idplsm"],  # a nested mapping absent
    ["idplsm", "idplsm", "idplsm"],
    ["dplsm", "idplsm", "idplsm"],  # sample 0 without the image: the union's order differs
    ["idplsm", "idplsm", "idplsm"],
]


def test_absent_keys_give_what_a_careful_walk_gives_and_keep_the_plan(monkeypatch):
    settings = {"missing": "none", "fields": {"ids": Pad(), "pixels": Concat()}}
    collate = MMCollate(pin_memory=False, **settings)
    reference = MMCollate(pin_memory=False, **settings)
    reference._plans.careful.add(())  # the whole batch walked carefully, every time
    walked: list = []
    real = Planner.plan

    def counted(self, values, path, keyed=False):
        walked.append(path)
        return real(self, values, path, keyed)

    monkeypatch.setattr(Planner, "plan", counted)
    for k, keys in enumerate(_SPARSE_BATCHES):
        samples = [_sparse(3 * k + j, key) for j, key in enumerate(keys)]
        walked.clear()
        ours = collate(samples)
        assert () not in walked or k >= 7, (k, walked)  # the root is walked only once the order differs
        assert_identical(ours, reference(samples))
        assert_one_buffer(ours)


def test_a_stack_field_whose_tensors_agree_is_planned_once(monkeypatch):
    collate = MMCollate(pin_memory=False, fields={"x": Stack()})
    good = [{"x": torch.ones(2, 3), "y": 1}, {"x": torch.zeros(2, 3), "y": 2}]
    collate(good)

    def walked(*args: Any) -> None:
        raise AssertionError("the careful planner ran for a field its plan describes")

    with monkeypatch.context() as patch:
        patch.setattr(Planner, "plan", walked)
        assert_identical(collate(good), default_collate(good))
    ragged = [{"x": torch.ones(2, 3), "y": 1}, {"x": torch.ones(3, 3), "y": 2}]
    with pytest.raises(CollateError, match=r"Stack\(\) needs equal shapes") as info:
        collate(ragged)
    assert info.value.sample == 1 and info.value.path == ("x",)
    with monkeypatch.context() as patch:  # the failed batch taught the plan nothing
        patch.setattr(Planner, "plan", walked)
        assert_identical(collate(good), default_collate(good))
    with pytest.raises(CollateError, match="Stack"):  # not tensors: Stack() says so, warm or not
        collate([{"x": "a", "y": 1}, {"x": "b", "y": 2}])


def test_a_new_plan_describes_plain_tensor_columns_at_c_speed_not_value_by_value(monkeypatch):
    # Plain CPU strided tensors are described by one pass over each column; the leaf handler's
    # describe (a Python call per value) only for a column holding anything else.
    from pincollate._types.leaves import lookup

    described = []
    handler = lookup(torch.Tensor)
    real = handler.describe
    monkeypatch.setattr(handler, "describe", lambda *args: described.append(args[1]) or real(*args))
    samples = [{"image": torch.zeros(3, 2, 2), "a": torch.ones(4), "b": torch.ones(4), "label": i} for i in range(4)]
    out = MMCollate(pin_memory=False)(samples)
    assert described == [] and out["a"].shape == (4, 4)
    sparse = [{"x": torch.zeros(2).to_sparse()} for _ in range(2)]  # not plain: described value by value
    with pytest.raises(CollateError, match="sparse"):
        MMCollate(pin_memory=False)(sparse)


def test_the_careful_walk_describes_plain_tensor_and_number_columns_at_c_speed(monkeypatch):
    # compile=False walks every batch: plain tensors and numbers of one Python type are
    # described a column at a time; anything else by its handler, value by value.
    from pincollate._types.leaves import lookup

    described = []
    for cls in (torch.Tensor, int):
        handler = lookup(cls)
        real = handler.describe
        monkeypatch.setattr(handler, "describe", lambda *args, real=real: described.append(args[1]) or real(*args))
    samples = [{"image": torch.zeros(3, 2, 2), "ids": torch.arange(i + 1), "label": i} for i in range(4)]
    collate = MMCollate(pin_memory=False, compile=False, fields={"ids": AsList()})
    for _ in range(2):
        out = collate(samples)
    assert described == [] and out["label"].tolist() == [0, 1, 2, 3] and len(out["ids"]) == 4
    mixed = [{"ids": torch.zeros(2)}, {"ids": torch.nn.Parameter(torch.ones(2))}]  # a subclass: one by one
    assert [t.tolist() for t in collate(mixed)["ids"]] == [[0.0, 0.0], [1.0, 1.0]]
    assert described == [0, 1]


def test_compile_false_generates_no_code(monkeypatch):
    # The careful walk only: the plan of a whole walked batch runs the walk's own node.
    from pincollate._generate import Writer

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("compile=False generated code")

    collate = MMCollate(pin_memory=False, compile=False, fields={"ids": Pad()})
    monkeypatch.setattr(Writer, "compile", refused)
    for n in (2, 3):
        batch = collate([{"ids": torch.arange(k + 1), "label": k} for k in range(n)])
        assert batch["ids_lengths"].tolist() == list(range(1, n + 1))


def test_the_careful_walk_reads_a_plain_columns_class_once_not_each_values_wrap(monkeypatch):
    from pincollate._plan.column import Column

    def per_value(self: Any, i: int) -> Any:
        raise AssertionError("a plain tensor or number column's wrap read value by value")

    monkeypatch.setattr(Column, "_wrap", per_value)
    out = MMCollate(pin_memory=False, compile=False)([{"x": torch.ones(2), "n": i} for i in range(3)])
    assert type(out["x"]) is torch.Tensor and out["n"].tolist() == [0, 1, 2]


# --- a new structure walked first, compiled when it comes again (what users run) ----------------


def _walks(monkeypatch) -> list[int]:
    """Counts the careful walks of whole batches (``Planner.plan`` at the root)."""
    walks: list[int] = []
    plan = Planner.plan

    def counted(self, values, path, keyed=False):
        if path == ():
            walks.append(len(values))
        return plan(self, values, path, keyed)

    monkeypatch.setattr(Planner, "plan", counted)
    return walks


@pytest.mark.walk_first
@pytest.mark.parametrize("name", sorted(PARITY))
def test_a_new_structure_is_walked_once_then_compiled(name, monkeypatch):
    """Its first batch is the careful walk's (no plan made, no code generated), its second the
    compiled plan's, and both are what ``compile=False`` gives."""
    samples = PARITY[name]()
    walks = _walks(monkeypatch)
    collate, reference = MMCollate(pin_memory=False), MMCollate(pin_memory=False, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)
        first = collate(samples)
        assert walks == [len(samples)] and collate._plans.planned == 0 and collate._plans.last is None
        second = collate(samples)
        assert collate._plans.planned == 1 and collate._plans.last is not None
        third = collate(samples)
        if type(collate._plans.last.template) is not PartSpec:  # not a root no plan describes
            assert walks == [len(samples)]  # the whole batch walked once, the first time only
        expected = reference(samples)
    for batch in (first, second, third):
        assert_identical(batch, expected)
    assert collate._plans.planned == 1


@pytest.mark.walk_first
def test_a_ragged_field_does_not_keep_its_structure_walked(monkeypatch):
    """Each batch of a ragged field (its lengths, a token list's length) has a new shape: the
    structure is still the one seen before, so the second batch compiles it and later ones run it."""
    walks = _walks(monkeypatch)
    collate = MMCollate(pin_memory=False, fields={"ids": Pad(), "tokens": Pad()})
    batches = [
        [{"ids": torch.arange(n + i), "tokens": list(range(2 * n + i)), "y": n} for n in (2, 5, 3)] for i in range(6)
    ]
    reference = MMCollate(pin_memory=False, fields={"ids": Pad(), "tokens": Pad()}, compile=False)
    for batch in batches:
        assert_identical(collate(batch), reference(batch))
    assert walks.count(3) == 1 + len(batches)  # the first batch, and the reference's every batch
    assert collate._plans.planned == 1 and not collate._plans.last.walks


@pytest.mark.walk_first
def test_an_epochs_last_smaller_batch_is_walked_until_it_comes_again(monkeypatch):
    walks = _walks(monkeypatch)
    collate = MMCollate(pin_memory=False)
    data = [{"x": torch.full((2,), float(i)), "y": i} for i in range(10)]
    epochs = [[data[0:4], data[4:8], data[8:10]] for _ in range(2)]
    for epoch in epochs:
        for batch in epoch:
            assert_identical(collate(batch), default_collate(batch))
    # Walked: the first batch of size 4 and the first of size 2; compiled: each when it came again.
    assert walks == [4, 2]
    assert collate._plans.planned == 2


@pytest.mark.walk_first
def test_a_layout_asked_for_is_the_one_the_next_batch_gets():
    samples = [{"x": torch.ones(2, 3), "y": 1}, {"x": torch.zeros(2, 3), "y": 2}]
    collate = MMCollate(pin_memory=False)
    for planned in (0, 1, 1):  # walked, then compiled: plan() asks before each, and counts as no batch
        layout = collate.plan(samples)
        assert collate(samples).layout == layout
        assert collate._plans.planned == planned


@pytest.mark.walk_first
def test_a_first_batch_warns_and_fails_as_a_compiled_one_does(monkeypatch):
    """The walk is the compiled plan's reference: a listed field warns once either way, and a bad
    first batch names the sample and key path (and teaches nothing: the next is walked too)."""
    ragged = [{"x": torch.zeros(n)} for n in (1, 2)]
    collate = MMCollate(pin_memory=False)
    with pytest.warns(RaggedFieldWarning):
        collate(ragged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collate(ragged)  # compiled now: the field was warned of once, not again
    bad = [{"x": torch.zeros(2)}, {"x": "text"}]
    fresh = MMCollate(pin_memory=False)
    walks = _walks(monkeypatch)
    for _ in range(2):
        with pytest.raises(CollateError, match=r"sample 1.*\['x'\]|\['x'\].*sample 1"):
            fresh(bad)
    assert fresh._plans.planned == 0 and walks  # walked (again for its error): a failed first sight is no sighting
    good = [{"x": torch.zeros(2)}, {"x": torch.ones(2)}]
    walks.clear()
    fresh(good)
    assert fresh._plans.planned == 0 and walks == [2]  # the structure's first good batch: walked
    fresh(good)
    assert fresh._plans.planned == 1 and walks == [2]  # then planned


@pytest.mark.parametrize(
    "warm, ragged",
    [
        (
            [{"boxes": torch.zeros(3, 4)}, {"boxes": torch.ones(3, 4)}],
            [{"boxes": torch.zeros(3, 4)}, {"boxes": torch.ones(2, 4)}],
        ),
        ([torch.zeros(3), torch.ones(3)], [torch.zeros(3), torch.ones(2)]),
        (  # a block of same-shape fields: one value of one field ragged
            [{"a": torch.zeros(2), "b": torch.ones(2)}] * 3,
            [
                {"a": torch.zeros(2), "b": torch.ones(2)},
                {"a": torch.zeros(2), "b": torch.ones(3)},
                {"a": torch.zeros(2), "b": torch.ones(2)},
            ],
        ),
        ([{"x": np.zeros((2, 2))}] * 2, [{"x": np.zeros((2, 2))}, {"x": np.zeros((3, 2))}]),
    ],
    ids=["field", "top", "block", "numpy"],
)
def test_a_layout_asked_for_a_ragged_batch_of_a_stacked_structure_is_the_collates(warm, ragged):
    """The plan's function only checks sample 0's shape of a stacked column (the copy compares the
    others); asked for the layout alone, it compares them itself."""
    collate = MMCollate(pin_memory=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)
        collate(warm), collate(warm)
        assert not collate._plans.last.walks
        planned = collate.plan(ragged)
        out = collate(ragged)
    if isinstance(out, list) and not hasattr(out, "layout"):  # a top-level list of tensors carries none
        assert type(planned.root) is PartSpec
    else:
        assert planned == out.layout


@pytest.mark.parametrize("parts", [False, True], ids=["whole plan", "plan with a walked part"])
def test_a_layout_asked_for_a_batch_the_collate_refuses_raises_its_error(parts):
    """A value without a tensor's class in a block of 0-d fields passes the block's guards (which read
    sample 0's); its copy refuses it: asked for the layout alone, the plan refuses it too."""

    def sample(i: int, bad: bool = False) -> dict:
        ids = ["oops" if bad else torch.tensor(i), torch.tensor(i)]
        return {"ids": ids, "a": torch.tensor(1, dtype=torch.uint8), "c": [str(i % 2 == 0)]}

    collate = MMCollate(pin_memory=False, fields={"c": AsList()} if parts else None)
    for _ in range(3):
        collate([sample(0), sample(1), sample(2)])
    assert collate._plans.last.walks is parts
    bad = [sample(0), sample(1, bad=True), sample(2)]
    for ask in (collate.plan, collate):
        with pytest.raises(CollateError, match=re.escape("sample 1 at ['ids'][0]: expected Tensor, got str")):
            ask(bad)


@pytest.mark.walk_first
def test_a_tuple_of_another_length_is_another_structure(monkeypatch):
    """A list's length is left out of the structure (token lists), a tuple's is not: each arity walked first."""
    walks = _walks(monkeypatch)
    collate = MMCollate(pin_memory=False)
    pairs = [(torch.ones(2), 1), (torch.zeros(2), 2)]
    triples = [(torch.ones(2), "a", {"m": 1}), (torch.zeros(2), "b", {"m": 2})]
    for batch in (pairs, triples, pairs, triples):
        collate(batch)
    assert walks == [2, 2] and collate._plans.planned == 2


def test_a_layout_asked_for_a_block_whose_value_changes_dtype_is_the_collates():
    """A block's guards read its fields' first values (a value of another dtype past them is left to
    its copy); asked for the layout alone, the copy still decides."""
    collate = MMCollate(pin_memory=False)
    warm = [{"a": torch.tensor(1.0), "b": torch.tensor(2.0)}] * 3
    collate(warm), collate(warm)
    for changed in (torch.tensor(1.0, dtype=torch.float64), np.float32(1.0), np.array(1.0, dtype=np.float32)):
        batch = [{"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, {"a": changed, "b": torch.tensor(2.0)}]
        batch.append(batch[0])
        planned = collate.plan(batch)
        assert planned == collate(batch).layout


def test_a_nested_tensor_past_sample_0_in_a_block_is_named_by_plan_and_collate():
    collate = MMCollate(pin_memory=False)
    warm = [{"a": torch.tensor(1.0), "b": torch.tensor(2.0)}] * 3
    collate(warm), collate(warm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on the strided layout's prototype stage
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    batch = [warm[0], {"a": nested, "b": torch.tensor(2.0)}, warm[0]]
    for ask in (collate.plan, collate):
        with pytest.raises(CollateError, match=re.escape("sample 1 at ['a']")):
            ask(batch)


def test_a_list_of_token_ids_is_read_at_c_speed_for_a_plans_signature(monkeypatch):
    # A sample's list of 1,000 token ids: its signature is the ids' classes read in one pass,
    # not one call per id (about 150 us of a new structure's first batch at 436 ids).
    import pincollate._plan.cache as cache

    calls = []
    real = cache._signature
    monkeypatch.setattr(cache, "_signature", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    sample = {"ids": list(range(1000)), "pair": (1, 2.5, "a"), "label": 3}
    cache._signature(sample, (), set(), False)
    assert len(calls) <= 5
    assert not cache._refers_to_itself(sample)
    calls.clear()
    cache._signature({"ids": [1, {"a": 2}]}, (), set(), False)  # a container among them: looked into
    assert len(calls) == 5


def test_a_token_list_whose_id_class_changes_learns_that_place_only():
    # Same structure (a list's first value stands for it), one place of another class: that
    # place is planned carefully from then on, as the list's children were read one by one.
    collate = MMCollate(pin_memory=False)
    ints = [{"ids": [1, 2, 3], "label": i} for i in range(4)]
    floats = [{"ids": [1, 2.5, 3], "label": i} for i in range(4)]
    for batch in (ints, ints, floats, floats):
        out = collate(batch)
        assert_same(out, default_collate(batch))
    assert ("ids", 1) in collate._plans.careful and ("ids",) not in collate._plans.careful
    assert ("ids", 0) not in collate._plans.careful


def test_the_walk_checks_dicts_of_one_key_set_at_c_speed_and_still_names_a_fault(monkeypatch):
    # A batch of plain dicts with the same keys: no per-sample Python check (a new structure's
    # first batch, and every batch with compile=False); anything else is checked sample by sample.
    import pincollate._plan.containers as containers

    asked = []
    real = containers.kind_of
    monkeypatch.setattr(containers, "kind_of", lambda value: asked.append(1) or real(value))
    samples = [{"b": torch.full((2,), float(i)), "a": i, "c": {"x": i}} for i in range(16)]
    samples[3] = {"c": {"x": 3}, "a": 3, "b": torch.full((2,), 3.0)}  # another key order: the same keys
    collate = MMCollate(pin_memory=False, compile=False)
    assert_same(collate(samples), default_collate(samples))
    assert asked == []
    bad = [*samples[:5], {"a": 5, "b": torch.zeros(2), "d": {"x": 5}}]
    with pytest.raises(CollateError, match=r"sample 5 at root: keys differ .*missing keys \['c'\]; extra keys \['d'\]"):
        collate(bad)
    assert asked


def test_a_token_list_whose_place_turns_into_a_tensor_learns_that_place_only():
    # One place of a list of numbers holding another kind of value: that place is careful,
    # as where the list's children were read one by one, not the whole list.
    collate = MMCollate(pin_memory=False)
    ints = [{"ids": [1, 2, 3]} for _ in range(2)]
    mixed = [{"ids": [1, torch.tensor(2), 3]} for _ in range(2)]
    for batch in (ints, ints, mixed, mixed):
        assert_same(collate(batch), default_collate(batch))
    assert collate._plans.careful == {("ids", 1)}


def test_a_careful_path_deeper_in_another_structure_keeps_a_token_lists_plan():
    # ('m', 0, 'x', 1) learnt from a structure with a dict at m[0] says nothing about a list of
    # numbers at m: its plan is found again, nothing more is learnt.
    collate = MMCollate(pin_memory=False)
    flat = [{"m": [1, 2]} for _ in range(2)]
    nested = [{"m": [{"x": [1, 2]}, 2]} for _ in range(2)]
    changed = [{"m": [{"x": [1, 2.5]}, 2]} for _ in range(2)]
    for batch in (flat, flat, flat, nested, nested, changed, changed):
        collate(batch)
    planned = collate._plans.planned
    for _ in range(3):
        assert_same(collate(flat), default_collate(flat))
    assert collate._plans.planned == planned
    assert collate._plans.careful == {("m", 0, "x", 1)}


def test_a_token_list_with_one_float_and_an_epochs_last_batch_keeps_the_list_compiled():
    # The place that turned float is careful; the list itself is not (walked every batch, it
    # took 4.5x as long).
    def batch(size: int, float_at: int | None = None) -> list[dict]:
        out = []
        for s in range(size):
            ids: list = list(range(40))
            if float_at is not None:
                ids[float_at] = 0.5
            out.append({"ids": ids, "label": s})
        return out

    collate = MMCollate(pin_memory=False)
    for b in (batch(4), batch(4), batch(8), batch(8), batch(8, 4), batch(8, 4), batch(4), batch(4)):
        assert_same(collate(b), default_collate(b))
    assert collate._plans.careful == {("ids", 4)}


def test_an_empty_list_keeps_its_plan_whatever_was_learnt_below_it_elsewhere():
    # ('e', 0) learnt where another structure held tensors of changing shapes at e: a batch whose
    # e is empty finds its plan again, and the list itself is not made careful.
    collate = MMCollate(pin_memory=False)
    empty = [{"e": [], "x": torch.zeros(2)} for _ in range(2)]
    two = [{"e": [torch.zeros(2)], "x": torch.zeros(2)} for _ in range(2)]
    three = [{"e": [torch.zeros(3)], "x": torch.zeros(2)} for _ in range(2)]
    for batch in (empty, empty, two, two, three, three):
        collate(batch)
    planned = collate._plans.planned
    for _ in range(3):
        assert_same(collate(empty), default_collate(empty))
    assert collate._plans.planned == planned
    assert collate._plans.careful == {("e", 0)}


def test_empty_token_lists_after_an_absent_id_keep_the_list_compiled():
    collate = MMCollate(pin_memory=False, missing="none")
    empty = [{"ids": [], "label": 1} for _ in range(2)]
    ids = [{"ids": [1, 2, 3], "label": 1} for _ in range(2)]
    absent = [{"ids": [1, 2, 3], "label": 1}, {"ids": [None, 2, 3], "label": 1}]
    for batch in (empty, empty, ids, ids, absent, absent):
        collate(batch)
    planned = collate._plans.planned
    for batch in (empty, empty, ids, ids):
        collate(batch)
    assert collate._plans.careful == {("ids", 0)} and collate._plans.planned == planned


@pytest.mark.parametrize("keep", [False, True], ids=["churn", "one structure kept warm"])
def test_careful_paths_of_keys_from_the_data_stay_bounded_and_a_cached_plan_keeps_its_own(keep, monkeypatch):
    # A file-name key per batch, ragged under ragged=Pad(): each structure's field is planned for
    # each batch. The cache's careful paths grew by one per key for good, and every new plan copied
    # them all (a 40,000-batch loop went from 0.8 to 1.8 ms a batch).
    from pincollate._plan import cache as _cache

    monkeypatch.setattr(_cache, "CAREFUL_LEAST", 16)
    collate = MMCollate(pin_memory=False, ragged=Pad())
    collate._plans.capacity = 8  # at most 8 plans' paths (one each here) are needed
    reference = MMCollate(pin_memory=False, ragged=Pad(), compile=False)
    warm = [{"warm": torch.ones(1 + j % 3), "y": j} for j in range(4)]
    collate(warm)
    collate(warm)  # planned and compiled
    planned = collate._plans.planned
    for i in range(120):
        samples = [{f"clip_{i // 2:04d}.wav": torch.ones(1 + j % 5) * i, "y": j} for j in range(4)]
        assert_same(collate(samples), reference(samples))
        # Cut back to the cached plans' paths (at most 9) once past max(16, twice those): never past 37.
        assert len(collate._plans.careful) <= 37
        if keep and i % 8 == 0:
            before = collate._plans.planned
            assert_same(collate(warm), reference(warm))
            assert collate._plans.planned == before  # cut back or not, the warm plan is used as it is
    assert collate._plans.planned > planned + 50  # the churn did plan (its structures come twice)
    assert ("warm",) in collate._plans.careful or not keep
