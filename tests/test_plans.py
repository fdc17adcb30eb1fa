"""The plan cache: one plan per structure, reused, and replanned only where it must be."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import MMCollate, Pad
from samples import PARITY, RAGGED, assert_same


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
    layout = MMCollate().plan([_nested(i) for i in range(4)])
    feats = layout.root.children[layout.root.keys.index("feats")]
    blocks = {spec.block for spec in feats.children}
    assert len(blocks) == 1 and None not in blocks
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
    out = collate(ragged)
    assert all(isinstance(out[k], list) for k in keys)
    assert collate._plans.planned == 2
    assert {("k3",), ("k19",)} <= collate._plans.careful


def test_a_first_batch_with_many_ragged_fields_is_planned_once():
    collate = MMCollate()
    samples = [{f"r{j}": torch.zeros(i + 1) for j in range(150)} for i in range(4)]
    out = collate(samples)
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


def test_the_cache_is_bounded():
    collate = MMCollate()
    collate._plans.capacity = 4
    for n in range(1, 10):
        collate([{"x": torch.zeros(n)}] * 2)
    assert len(collate._plans._plans) == 4


def test_ragged_fields_are_parts_after_the_cached_slots():
    collate = MMCollate(fields={"ids": Pad()})
    samples = [{"image": torch.zeros(3, 2, 2), "ids": torch.arange(i + 1)} for i in range(3)]
    layout = collate.plan(samples)
    image = layout.root.children[0]
    assert image.offset == 0 and len(layout.parts) == 1
    part = layout.parts[0]
    assert part.node.offset >= image.nbytes and [name for name, _ in part.extras] == ["ids_lengths", "ids_mask"]
    again = collate.plan([{"image": torch.ones(3, 2, 2), "ids": torch.arange(i + 5)} for i in range(3)])
    assert again.root is layout.root and again.parts[0].node.shape == (3, 7)


def test_one_collate_shared_by_threads_gives_each_its_own_right_batch():
    import threading

    collate = MMCollate(pin_memory=False)
    trees = [PARITY[name] for name in ("multimodal-dict", "tuple-samples", "deep", "namedtuple")] + [
        RAGGED["ragged-boxes"]
    ]
    failures: list[BaseException] = []

    def work(build) -> None:
        try:
            expected = MMCollate(pin_memory=False)(build())
            for _ in range(50):
                assert_same(collate(build()), expected)
        except BaseException as error:  # reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(build,)) for build in trees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[0]
    assert collate._plans.planned <= 2 * len(trees)
