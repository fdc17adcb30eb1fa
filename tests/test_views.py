"""Views: every tensor of a batch over the buffer, each (on the CPU) with a storage of its own."""

from __future__ import annotations

import gc
import io
import weakref

import numpy as np
import pytest
import torch

from pincollate import AsList, MMCollate
from pincollate._batch.views import ALIGN, Views, carve, numpy_dtype, standin_dtype
from pincollate._memory.ownership import holder


def _buffer(nbytes: int = 4 * ALIGN) -> torch.Tensor:
    return torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int64, torch.bool, torch.uint8, torch.float16, torch.bfloat16, torch.complex64]
)
def test_each_tensor_has_a_storage_over_its_own_bytes(dtype):
    buffer = _buffer()
    views = Views(buffer, [])
    shape = (2, 3)
    t = views.tensor(dtype, shape, ALIGN)
    assert t.dtype == dtype and t.shape == shape and t.is_contiguous()
    assert t.data_ptr() == buffer.data_ptr() + ALIGN
    assert t.untyped_storage().nbytes() == t.nbytes
    expected = buffer[ALIGN : ALIGN + t.nbytes].view(dtype).view(shape)
    assert torch.equal(t.view(torch.uint8), expected.view(torch.uint8))
    with pytest.raises(RuntimeError, match="not resizable"):
        t.resize_(64)  # cannot grow over the next tensor


def test_bfloat16_has_no_numpy_dtype_and_is_carved_as_a_stand_in():
    assert numpy_dtype(torch.bfloat16) is None and numpy_dtype(torch.float32) == np.dtype("float32")
    assert standin_dtype(torch.bfloat16) == np.dtype("uint16") and standin_dtype(torch.float32) is None
    # The stand-in's view back is the carved tensor's own storage, which holds the buffer.
    buffer = _buffer()
    t = Views(buffer, []).tensor(torch.bfloat16, (4,), ALIGN)
    assert holder(t.untyped_storage()) is not None and t.untyped_storage().nbytes() == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_per_sample_lists_items_share_a_storage_over_their_columns_bytes(dtype):
    values = [torch.randn(n, 3).to(dtype) for n in (2, 5, 0, 1)]
    batch = MMCollate(pin_memory=False, fields={"x": AsList()})([{"x": v, "y": torch.ones(4096)} for v in values])
    out = batch["x"]
    storages = {got.untyped_storage().data_ptr() for got in out}
    assert len(storages) == 1  # one storage for the column: each item a view of it
    storage = out[0].untyped_storage()
    assert holder(storage) is not None  # it holds the buffer, as a field's storage does
    # Over the column's bytes (the items, each starting aligned), not the batch's buffer.
    assert sum(v.nbytes for v in values) <= storage.nbytes() < batch.buffer.numel()
    assert batch["y"].untyped_storage().data_ptr() not in storages  # a top-level field keeps its own
    for got, value in zip(out, values, strict=True):
        assert got.dtype == dtype and torch.equal(got, value) and got.is_contiguous()
    stream = io.BytesIO()
    torch.save(out[1], stream)  # one item saves its column's bytes, never the whole buffer
    assert len(stream.getvalue()) < batch.buffer.numel()
    assert torch.equal(torch.load(io.BytesIO(stream.getvalue())), values[1])


def test_a_tensor_with_no_elements_has_an_empty_storage_of_its_own():
    views = Views(_buffer(), [])
    empty = views.tensor(torch.float32, (0, 5), ALIGN)
    assert empty.shape == (0, 5) and empty.untyped_storage().nbytes() == 0
    stream = io.BytesIO()
    # Two dtypes at one offset would be refused by torch.save if they shared an address.
    torch.save({"a": empty, "b": views.tensor(torch.int64, (2,), ALIGN)}, stream)


def test_a_moved_storage_keeps_the_buffer_alive_for_arrays_made_before_the_move():
    buffer = _buffer()
    died = []
    weakref.finalize(buffer.untyped_storage(), died.append, True)
    views = Views(buffer, [])
    t = views.tensor(torch.int64, (4,), 0)
    array = t.numpy()  # reads the buffer's bytes
    t.share_memory_()  # the storage's bytes move to fresh shared memory
    assert t.data_ptr() != array.ctypes.data
    del views, buffer, t
    gc.collect()
    assert not died  # the storage, kept by the array, still holds the buffer
    del array
    gc.collect()
    assert died


def test_on_an_accelerator_the_tensors_are_views_of_one_storage():
    buffer = torch.empty(4 * ALIGN, dtype=torch.uint8, device="meta")
    views = Views(buffer, [])
    t = views.tensor(torch.float32, (2, 3), ALIGN)
    assert t.device.type == "meta" and t.storage_offset() == ALIGN // 4


def test_carve_makes_the_shape_at_the_offset():
    buffer = _buffer()
    source = buffer.numpy()
    t = carve(source, np.dtype("int16"), (2, 2), 2 * ALIGN)
    assert t.data_ptr() == buffer.data_ptr() + 2 * ALIGN and t.shape == (2, 2)


def test_in_pinned_memory_the_tensors_are_views_of_one_storage(fake_pinned):
    """torch's pinned allocator guards a block under a non-blocking copy for its own storage only."""
    from pincollate import MMCollate

    batch = MMCollate(pin_memory=False)([{"x": torch.ones(3), "y": 1}, {"x": torch.zeros(3), "y": 2}])
    assert len({batch["x"].untyped_storage().data_ptr(), batch["y"].untyped_storage().data_ptr()}) == 2
    pinned = batch.pin_memory()
    assert len(fake_pinned) == 1
    storage = pinned.buffer.untyped_storage()
    assert all(t.untyped_storage()._cdata == storage._cdata for t in (pinned["x"], pinned["y"]))


def test_batch_buffer_is_a_tensor_of_its_own_in_pageable_memory():
    from pincollate import mm_collate

    batch = mm_collate([{"x": torch.ones(3)}, {"x": torch.zeros(3)}])
    proxy = batch.buffer
    assert proxy.data_ptr() == batch._pincollate[1].data_ptr()
    proxy.share_memory_()  # moves the proxy's storage only
    assert batch.layout is not None and torch.equal(batch["x"][0], torch.ones(3))


def test_changing_one_item_in_place_leaves_another_saved_for_backward_alone():
    # The items share their column's storage, but each has a version counter of its own:
    # an in-place change of one box does not invalidate another saved for backward.
    values = [torch.randn(n, 4) for n in (2, 3, 1)]
    boxes = MMCollate(pin_memory=False, fields={"boxes": AsList()})([{"boxes": v} for v in values])["boxes"]
    weight = torch.ones(4, requires_grad=True)
    loss = (weight * boxes[0]).sum()
    boxes[1].mul_(2)
    boxes[2].mul_(weight.detach())
    loss.backward()
    assert torch.equal(weight.grad, values[0].sum(0))
    assert torch.equal(boxes[1], values[1] * 2) and torch.equal(boxes[0], values[0])


@pytest.mark.parametrize("compiled", [True, False])
def test_numbers_of_per_sample_lists_are_0d_items_each_with_a_version_counter_of_its_own(compiled):
    # Per-object labels (a list of dicts per sample): each a 0-d tensor over its own aligned
    # bytes of one column, its own version counter, in the plan's function and the recipe's.
    from pincollate import PerSample

    def sample(i, n):
        return {"target": [{"label": 10 * i + j, "box": torch.full((4,), float(j))} for j in range(n)]}

    collate = MMCollate(pin_memory=False, fields={"target": PerSample()}, compile=compiled)
    for counts in ((2, 0, 3), (1, 4, 2), (3, 3, 1)):  # a warm plan too
        batch = [sample(i, n) for i, n in enumerate(counts)]
        out = collate(batch)["target"]
        labels = [obj["label"] for objects in out for obj in objects]
        assert [label.item() for label in labels] == [o["label"] for s in batch for o in s["target"]]
        assert all(label.shape == () and label.dtype == torch.int64 for label in labels)
        places = [label.data_ptr() for label in labels]
        assert all(place % ALIGN == 0 for place in places) and len(set(places)) == len(labels)
        labels[0].add_(100)
        assert labels[0].item() == batch[0]["target"][0]["label"] + 100
        assert all(label._version == 0 for label in labels[1:])
        assert [label.item() for label in labels[1:]] == [o["label"] for s in batch for o in s["target"]][1:]
