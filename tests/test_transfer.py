"""pin() and to_device(): one copy per storage span, leaves rebuilt exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import Batch, MMCollate, mm_collate, to_device
from pincollate._batch.trees import map_tensors, reachable_tensors, tensors
from pincollate._transfer.transfer import pin
from samples import PARITY, RAGGED, Point, assert_same, listing, storages


def _layout(t: torch.Tensor) -> tuple:
    return str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset() * t.dtype.itemsize


@pytest.mark.parametrize("name", ["multimodal-dict", "tuple-samples", "namedtuple", "unequal-lists", "ragged-boxes"])
def test_pin_makes_one_allocation_per_batch_and_keeps_views(fake_pinned, name):
    with listing(name):
        batch = MMCollate(pin_memory=False)((PARITY.get(name) or RAGGED[name])())
    pinned = pin(batch)
    assert len(fake_pinned) == 1 and fake_pinned[0] <= batch_nbytes(batch)
    assert len(storages(pinned)) == 1
    assert_same(pinned, batch)
    before = sorted(_layout(t)[:3] for t in tensors(batch))
    after = sorted(_layout(t)[:3] for t in tensors(pinned))
    assert before == after


def batch_nbytes(batch) -> int:
    return int(batch.buffer.numel())


def test_batch_pin_memory_returns_itself_when_pinned(fake_pinned):
    batch = MMCollate(pin_memory=False)(PARITY["multimodal-dict"]())
    pinned = batch.pin_memory()
    assert type(pinned) is Batch and len(fake_pinned) == 1
    assert storages(pinned) == {pinned.buffer.data_ptr()}
    assert pinned.pin_memory() is pinned and len(fake_pinned) == 1


def test_namedtuple_batch_pins_in_one_copy(fake_pinned):
    batch = MMCollate(pin_memory=False)([Point(1, torch.zeros(3)), Point(2, torch.ones(3))])
    pinned = batch.pin_memory()
    assert isinstance(pinned, Point) and len(fake_pinned) == 1
    assert torch.equal(pinned.y, batch.y)


def test_foreign_batches_pin_one_allocation_per_storage(fake_pinned):
    batch = default_collate(PARITY["multimodal-dict"]())
    pinned = pin(batch)
    assert len(fake_pinned) == len(storages(batch))
    assert_same(pinned, batch)


def test_sparse_spans_fall_back_to_per_leaf_copies(fake_pinned):
    big = torch.arange(1_000_000, dtype=torch.float32)
    tree = {"a": big[:10], "b": big[-10:], "text": "kept"}
    pinned = pin(tree)
    assert sorted(fake_pinned) == [40, 40]
    assert pinned["text"] == "kept"
    assert torch.equal(pinned["a"], big[:10]) and torch.equal(pinned["b"], big[-10:])


def test_strided_and_offset_views_survive_a_move(fake_pinned):
    base = torch.arange(64.0).view(8, 8)
    tree = [base.t(), base[2:5, ::2], base[0]]
    moved = pin(tree)
    assert len(fake_pinned) == 1
    for a, b in zip(moved, tree, strict=True):
        assert a.stride() == b.stride() and torch.equal(a, b)


def test_to_device_same_device_is_a_noop():
    batch = mm_collate(PARITY["multimodal-dict"]())
    moved = to_device(batch, "cpu")
    assert all(a is b for a, b in zip(tensors(moved), tensors(batch), strict=True))


def test_to_device_meta_rebuilds_structure():
    batch = mm_collate(PARITY["multimodal-dict"]())
    moved = to_device(batch, "meta")
    assert type(moved) is Batch
    for a, b in zip(tensors(moved), tensors(batch), strict=True):
        assert a.device.type == "meta" and _layout(a)[:3] == _layout(b)[:3]
    assert moved["caption"] == batch["caption"]


def test_map_tensors_keeps_container_types():
    tree = {"p": Point(torch.zeros(1), [torch.ones(1), "s"]), "n": None}
    out = map_tensors(tree, lambda t: t + 1)
    assert isinstance(out["p"], Point) and out["p"].x.item() == 1 and out["p"].y[1] == "s" and out["n"] is None


def test_jagged_tensors_move_with_their_parts(fake_pinned):
    from pincollate import Jagged, MMCollate

    batch = MMCollate(pin_memory=False, fields={"x": Jagged()})([{"x": torch.arange(3)}, {"x": torch.arange(2)}])
    pinned = pin(batch)
    assert len(fake_pinned) == 1
    assert [t.tolist() for t in pinned["x"].unbind()] == [[0, 1, 2], [0, 1]]


def test_main_process_collate_allocates_pinned_directly(fake_pinned):
    batch = MMCollate(pin_memory="auto")(PARITY["multimodal-dict"]())
    assert len(fake_pinned) == 1
    assert batch.pin_memory() is batch and len(fake_pinned) == 1


def test_batch_to_moves_the_buffer_and_keeps_the_type():
    batch = mm_collate(PARITY["multimodal-dict"]())
    moved = batch.to("meta")
    assert type(moved) is Batch and moved.buffer.device.type == "meta"
    assert all(t.device.type == "meta" for t in tensors(moved)) and moved["caption"] == batch["caption"]


def test_two_storages_at_one_address_move_each_in_one_piece(fake_pinned):
    import numpy as np

    array = np.arange(20, dtype=np.float32)
    tree = {"head": torch.from_numpy(array[:10]), "all": torch.from_numpy(array)}
    pinned = pin(tree)
    assert torch.equal(pinned["head"], tree["head"]) and torch.equal(pinned["all"], tree["all"])
    assert len(fake_pinned) == 2
    moved = to_device(tree, "meta")
    assert moved["all"].shape == (20,) and moved["head"].shape == (10,)


class _Inputs:
    """A model-input object that keeps its tensors as attributes, not in a container."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)


class _Slotted:
    __slots__ = ("mask", "unset")

    def __init__(self, mask):
        self.mask = mask


def test_reachable_tensors_finds_tensors_in_any_object():
    a, b, c, d = torch.zeros(1), torch.ones(2), torch.arange(3), torch.full((2,), 7)
    nested = torch.nested.nested_tensor_from_jagged(torch.arange(5.0), torch.tensor([0, 2, 5]))
    tree = {"inputs": _Inputs(x=a, extra=[{"y": b}]), "mask": _Slotted(c), "set": frozenset({1}), "nt": nested}
    tree["self"] = tree  # a cycle is walked once
    tree["fn"] = lambda: d  # a callable is not data
    found = list(reachable_tensors(tree))
    assert {id(t) for t in found} >= {id(a), id(b), id(c)} and not any(t is d for t in found)
    assert len(found) == 5  # a, b, c, and the nested tensor's values and offsets


def test_a_plain_dict_of_a_batchs_fields_pins_in_one_copy(fake_pinned):
    """Each field has a storage of its own, yet they lie in one buffer: one span, one copy."""
    batch = MMCollate(pin_memory=False)(PARITY["multimodal-dict"]())
    fields = dict(batch)
    pinned = pin(fields)
    assert len(fake_pinned) == 1 and fake_pinned[0] <= batch.buffer.numel()
    assert_same(pinned, fields)


def test_a_field_moved_out_of_its_buffer_pins_on_its_own(fake_pinned):
    batch = MMCollate(pin_memory=False)(PARITY["multimodal-dict"]())
    fields = dict(batch)
    moved = next(t for t in fields.values() if isinstance(t, torch.Tensor) and t.numel())
    moved.share_memory_()  # its bytes now lie in fresh shared memory, outside the buffer
    pinned = pin(fields)
    assert len(fake_pinned) == 2
    assert_same(pinned, fields)


@pytest.mark.parametrize("hop", ["pin", "to_device", "batch.pin_memory", "batch.to"])
def test_each_hop_checks_the_batch_against_its_layout_once(monkeypatch, fake_pinned, hop):
    from pincollate._batch import batch as _batch
    from pincollate._batch import moving as _moving
    from pincollate._transfer import transfer as _transfer

    batch = MMCollate(pin_memory=False)(PARITY["multimodal-dict"]())
    walks = []
    real = _batch.carried

    def counted(b):
        walks.append(1)
        return real(b)

    for module in (_batch, _moving, _transfer):  # wherever the walk is looked up
        monkeypatch.setattr(module, "carried", counted, raising=False)
    moved = {
        "pin": lambda: pin(batch),
        "to_device": lambda: to_device(batch, "cpu", non_blocking=False),
        "batch.pin_memory": batch.pin_memory,
        "batch.to": lambda: batch.to("cpu", copy=True),
    }[hop]()
    assert len(walks) == 1
    assert_same(moved, batch)


def test_tv_tensors_keep_their_type_and_metadata_when_moved_by_span(fake_pinned):
    # torchvision 0.26 has no BoundingBoxes.wrap (0.27 and later do): the module's wrap is used there.
    from torchvision import tv_tensors

    boxes = tv_tensors.BoundingBoxes(torch.rand(3, 4), format="XYXY", canvas_size=(8, 8))
    tree = {"boxes": boxes, "image": tv_tensors.Image(torch.zeros(3, 4, 4))}
    for moved in (pin(tree), to_device(tree, "meta")):
        assert type(moved["boxes"]) is tv_tensors.BoundingBoxes and type(moved["image"]) is tv_tensors.Image
        assert moved["boxes"].format == boxes.format and moved["boxes"].canvas_size == (8, 8)
