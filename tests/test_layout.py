"""The Layout: structure only, compared and pickled by value, rebuilt over any buffer."""

from __future__ import annotations

import pickle

import pytest
import torch

from pincollate import AsList, Layout, MMCollate
from pincollate._batch.layout import TensorSpec, ValueSpec
from pincollate._batch.specs import MappingSpec
from pincollate._batch.trees import tensors
from pincollate._batch.views import ALIGN, START
from pincollate.bench import methods
from pincollate.datasets import SCENARIOS
from samples import PARITY, assert_identical


def _layout() -> Layout:
    return MMCollate(pin_memory=False).plan(PARITY["multimodal-dict"]())


def test_layouts_of_one_structure_are_equal_and_hash_alike():
    a, b = _layout(), _layout()
    assert a == b and hash(a) == hash(b)
    assert a != MMCollate(pin_memory=False).plan(PARITY["tensors"]())


def test_a_layout_pickles_by_value_and_holds_no_sample_values():
    layout = _layout()
    data = pickle.dumps(layout)
    assert pickle.loads(data) == layout
    assert b"caption 0" not in data  # strings are values, kept beside the buffer
    assert len(data) < 4096


def test_tensor_specs_are_aligned_and_inside_the_buffer():
    layout = _layout()
    specs = layout.tensors()
    assert specs and all(spec.offset % spec.dtype.itemsize == 0 for spec in specs)
    assert all(spec.offset % ALIGN == 0 for spec in specs)  # block fields too
    assert all(spec.offset + spec.nbytes <= layout.nbytes for spec in specs)
    assert layout.nbytes % ALIGN == 0


def test_build_gives_views_of_the_buffer_and_the_values():
    layout = Layout(MappingSpec(None, ["x", "s"], [TensorSpec(torch.float32, (2, 2), 0), ValueSpec(0)]), 64)
    buffer = torch.zeros(64, dtype=torch.uint8)
    out = layout.build(buffer, [["a", "b"]])
    out["x"].fill_(1.0)
    assert buffer.view(torch.float32)[:4].tolist() == [1.0] * 4
    assert out["s"] == ["a", "b"]


def test_build_refuses_a_buffer_too_small_or_not_flat_uint8():
    layout = _layout()
    with pytest.raises(ValueError, match="flat uint8 buffer"):
        layout.build(torch.zeros(layout.nbytes - 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="flat uint8 buffer"):
        layout.build(torch.zeros(layout.nbytes, dtype=torch.float32))


def test_cast_changes_floating_tensors_only_and_places_them_anew():
    layout = _layout()
    half = layout.cast(torch.float16)
    before = {(spec.shape, spec.dtype) for spec in layout.tensors()}
    after = {(spec.shape, spec.dtype) for spec in half.tensors()}
    assert {shape for shape, dtype in after if dtype == torch.float16} == {
        shape for shape, dtype in before if dtype.is_floating_point
    }
    assert {(s, d) for s, d in after if not d.is_floating_point} == {
        (s, d) for s, d in before if not d.is_floating_point
    }
    assert half.nbytes < layout.nbytes
    assert layout.cast(torch.float32).cast(torch.float32) == layout.cast(torch.float32)
    assert (
        MMCollate(pin_memory=False).plan([{"i": torch.zeros(2, dtype=torch.int64)}] * 2).cast(torch.float16).nbytes
        == START + 64
    )


def test_offsets_must_fit_the_dtype():
    with pytest.raises(ValueError, match="not aligned"):
        TensorSpec(torch.float32, (1,), 2)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("size", [None, 7, 3])
def test_every_leaf_of_every_scenario_starts_on_64_bytes(scenario, size):
    # Misaligned device views lose vectorised kernels (and torch.compile clones them).
    cls, batch_size = SCENARIOS[scenario]
    n = size or batch_size
    dataset = cls(length=n)
    collate = methods(scenario)["mm_collate"]  # with the scenario's policies
    for _ in range(2):  # a fresh plan, then the cached one
        batch = collate([dataset[i] for i in range(n)])
        leaves = [t for t in tensors(batch) if t.numel()]  # an empty tensor has no address to align
        assert leaves
        assert all(t.data_ptr() % ALIGN == 0 for t in leaves), [
            (t.dtype, tuple(t.shape), t.data_ptr() % ALIGN) for t in leaves if t.data_ptr() % ALIGN
        ]


@pytest.mark.parametrize("name", sorted(PARITY))
def test_every_leaf_of_every_sample_tree_starts_on_64_bytes(name):
    collate = MMCollate(pin_memory=False)
    for _ in range(2):
        leaves = list(tensors(collate(PARITY[name]())))
        assert all(t.data_ptr() % ALIGN == 0 for t in leaves if t.numel())


def _wide(i: int) -> dict:
    """Plain tensors with a string, a torchvision image and a ragged field among them."""
    from torchvision import tv_tensors

    return {
        "a": torch.full((2,), i),
        "b": torch.full((3,), float(i)),
        "name": f"s{i}",
        "c": torch.full((1,), i, dtype=torch.uint8),
        "img": tv_tensors.Image(torch.full((3, 2, 2), i, dtype=torch.uint8)),
        "d": torch.full((2, 2), i, dtype=torch.int32),
        "e": torch.full((4,), i % 2 == 0),
    }


@pytest.mark.parametrize("ragged", [False, True])
def test_a_mapping_of_many_tensors_is_built_at_once_in_key_order(monkeypatch, ragged):
    # MappingSpec.pairs takes its plain tensors from those the Views made at once (one
    # C-level pass) and builds the rest; the keys keep the samples' order. Without that
    # path every tensor spec would be built on its own (counted here).
    samples = [_wide(i) for i in range(3)]
    if ragged:  # a part among the children: its extras go after its key, built one by one
        for i, sample in enumerate(samples):
            sample["c"] = torch.arange(i + 1, dtype=torch.uint8)
    collate = MMCollate(pin_memory=False, fields={"c": AsList()} if ragged else None)
    first = collate(samples)
    built = []
    real = TensorSpec.build
    monkeypatch.setattr(TensorSpec, "build", lambda self, views: built.append(self) or real(self, views))
    out = collate(samples)
    assert list(out) == list(samples[0])
    assert_identical(out, first)
    assert out["name"] == ["s0", "s1", "s2"] and torch.equal(out["d"][2], torch.full((2, 2), 2, dtype=torch.int32))
    # Without a part the layout builds by its generated code (the wrapped image too); with a
    # per-sample list, the plan's generated function builds the batch itself: no spec builds.
    assert built == []


def test_a_fixed_layouts_tensors_are_made_at_once(monkeypatch):
    # Layout.bulk: a cached plan's fixed tensors are made in one pass when the views are
    # made (carve_many), so neither filling nor building makes one on its own. Bypassed
    # (no bulk), each would be made by TensorSpec._make, counted here.
    made = []
    real = TensorSpec._make
    monkeypatch.setattr(TensorSpec, "_make", lambda self, views: made.append(self) or real(self, views))
    collate = MMCollate(pin_memory=False)
    samples = [{"a": torch.full((3, 4), float(i)), "b": torch.arange(i, i + 7), "c": i} for i in range(4)]
    collate(samples)
    made.clear()
    out = collate(samples)
    # Nothing is made on its own: the output tensors and the copies' regions that are no output
    # tensor (the number block's) are made in the one pass.
    assert made == []
    assert torch.equal(out["b"][3], torch.arange(3, 10)) and out["a"].untyped_storage().nbytes() == out["a"].nbytes


def test_a_layout_without_parts_builds_by_its_specs_once_then_by_generated_code_alike():
    samples = [
        {"img": torch.full((3, 2), i, dtype=torch.uint8), "meta": {"s": "x", "v": [torch.ones(2) * i, i]}}
        for i in range(3)
    ]
    collate = MMCollate(pin_memory=False)
    batch = collate(samples)
    layout = batch.layout
    assert not layout.parts and layout._builder is None  # the plan's function built the batch itself
    # Built once, the specs build it (generating the build would cost more than it saves)...
    by_specs = layout.build(batch.buffer.clone(), batch._pincollate[2])
    assert layout._builder is None
    # ... built again, generated code builds it.
    by_code = layout.build(batch.buffer.clone(), batch._pincollate[2])
    assert layout._builder is not None
    assert_identical(by_code, by_specs)
    assert_identical(by_code, {**batch})


def test_a_layout_built_over_memory_not_made_at_once_walks_its_specs():
    # On a buffer whose tensors are views of its storage (pinned memory, an accelerator;
    # here the meta device), the generated build hands over to the specs.
    batch = MMCollate(pin_memory=False)([{"x": torch.ones(2), "y": 1}] * 2)
    out = batch.layout.build(torch.empty(batch.layout.nbytes, dtype=torch.uint8, device="meta"))
    assert out["x"].device.type == "meta" and out["x"].shape == (2, 2) and out["y"].dtype == torch.int64
