"""Recycled memory never changes under a holder: the escape routes, each as a user writes it.

Every test keeps something of one batch (a numpy view, a tensor returned beside it, a
fork's copy, a copy in another process, a storage), lets the recycled memory come round
many times, and checks that what is kept still holds the first batch's values.
"""

from __future__ import annotations

import gc
import io
import os
import warnings
from multiprocessing import resource_sharer

import pytest
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset

from pincollate import MMCollate, Pad
from pincollate._memory import ownership as _ownership
from pincollate._memory import receiver as _receiver
from pincollate._memory import ring as _ring

pytestmark = pytest.mark.slow


class Numbered(Dataset):
    """Sample ``i``: ``x`` holds ``i`` in every element, ``size`` of them (a few more if ``vary``)."""

    def __init__(self, count: int, size: int = 512, vary: bool = True):
        self.count, self.size, self.vary = count, size, vary

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((self.size + self.vary * (i % 7),), float(i)), "i": i}


COLLATE = MMCollate(pin_memory=False, fields={"x": Pad()})


def _loader(count: int = 400, collate=COLLATE, **kwargs) -> DataLoader:
    kwargs.setdefault("num_workers", 2)
    if kwargs["num_workers"]:
        kwargs.setdefault("timeout", 60)
    dataset = Numbered(count, kwargs.pop("size", 512), kwargs.pop("vary", True))
    return DataLoader(dataset, batch_size=4, collate_fn=collate, **kwargs)


def _expect(ids: torch.Tensor, width: int) -> torch.Tensor:
    return ids[:, None].float().expand(-1, width)


def _drain(iterator) -> None:
    """Take the rest of the epoch, dropping each batch: every slot is refilled many times."""
    count = 0
    for _ in iterator:
        count += 1
    assert count > 20


# --- 1. a numpy view kept while the batch is sent on ------------------------------------


def _consume(queue, done) -> None:
    batch = queue.get()
    done.put(batch["i"].tolist())


@pytest.mark.parametrize("send", ["queue", "share_memory_"])
def test_a_numpy_view_survives_the_batch_being_sent_on(no_leaks, send):
    iterator = iter(_loader())
    batch = next(iterator)
    assert _receiver.leased(batch["x"])
    ids = batch["i"].clone()
    view = batch["x"][:, :512].numpy()
    if send == "queue":
        context = tmp.get_context("fork")
        queue, done = context.Queue(), context.Queue()
        consumer = context.Process(target=_consume, args=(queue, done))
        consumer.start()
        queue.put(batch)
        assert done.get(timeout=60) == ids.tolist()
        consumer.join(60)
        queue.close(), done.close()
        queue.join_thread(), done.join_thread()
    else:
        batch["x"].share_memory_()
    del batch
    _drain(iterator)
    assert torch.equal(torch.from_numpy(view), _expect(ids, 512))
    del view, iterator
    resource_sharer.stop()  # multiprocessing's fd-passing thread, started by the queue


# --- 2. a tensor returned beside the batch -----------------------------------------------


def _batch_and_a_row(samples):
    batch = COLLATE(samples)
    return batch, batch["x"][0]


def test_a_tensor_returned_beside_the_batch_keeps_its_values(no_leaks):
    iterator = iter(_loader(collate=_batch_and_a_row))
    batch, row = next(iterator)
    assert _receiver.leased(batch["x"])  # the batch itself still crosses as its slot
    first = int(batch["i"][0])
    del batch
    _drain(iterator)
    assert torch.equal(row[:512], torch.full((512,), float(first)))
    del row, iterator


# --- 3. a forked child's copy ---------------------------------------------------------------


def test_a_fork_childs_copy_does_not_change_when_the_parent_drops_its_own(no_leaks):
    iterator = iter(_loader())
    batch = next(iterator)
    ids = batch["i"].clone()
    reader, writer = os.pipe()
    go_read, go_write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        pid = os.fork()
    if pid == 0:  # the child keeps its copy and looks at it once the parent has moved on
        os.read(go_read, 1)
        same = torch.equal(batch["x"][:, :512], _expect(ids, 512))
        os.write(writer, b"1" if same else b"0")
        os._exit(0)
    del batch
    gc.collect()
    _drain(iterator)
    os.write(go_write, b"x")
    assert os.read(reader, 1) == b"1", "the child's copy of the batch changed"
    os.waitpid(pid, 0)
    for fd in (reader, writer, go_read, go_write):
        os.close(fd)
    del iterator


# --- 4. a main-process batch sent to another process -----------------------------------------


def _hold_and_check(queue, go, done) -> None:
    batch = queue.get()
    go.get()
    first = torch.arange(4)  # the loader's first batch
    done.put(torch.equal(batch["i"], first) and torch.equal(batch["x"][:, :1000], _expect(first, 1000)))


def test_a_main_process_batch_sent_to_another_process_is_never_overwritten(no_leaks):
    context = tmp.get_context("fork")
    queue, go, done = context.Queue(), context.Queue(), context.Queue()
    consumer = context.Process(target=_hold_and_check, args=(queue, go, done))
    consumer.start()
    iterator = iter(_loader(200, num_workers=0, size=1 << 16, vary=False))  # 1 MiB batches: recycled
    batch = next(iterator)
    assert batch.buffer.numel() >= 1 << 20
    queue.put(batch)
    del batch
    _drain(iterator)
    go.put(None)
    assert done.get(timeout=60), "the consumer's batch changed"
    consumer.join(60)
    for q in (queue, go, done):
        q.close()
        q.join_thread()
    del iterator
    resource_sharer.stop()


# --- 5. a kept storage -----------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["untyped_storage", "storage"])
def test_a_kept_storage_keeps_the_batch_it_came_from(no_leaks, workers, how):
    iterator = iter(_loader(200, num_workers=workers, size=1 << 16, vary=False))
    batch = next(iterator)
    ids = batch["i"].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        storage = getattr(batch["x"], how)()
    offset, shape = batch["x"].storage_offset(), batch["x"].shape
    del batch
    _drain(iterator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        untyped = storage if how == "untyped_storage" else storage.untyped()
    x = torch.empty(0).set_(untyped, offset, shape)
    assert torch.equal(x[:, :1000], _expect(ids, 1000))
    del storage, untyped, x, iterator


# --- saving inside a worker ------------------------------------------------------------------


def _saved_size(samples):
    batch = COLLATE(samples)
    stream = io.BytesIO()
    torch.save(batch, stream)
    return torch.tensor([len(stream.getvalue()), batch.layout.nbytes, _ring.is_slot(batch.buffer)])


def test_saving_a_batch_inside_a_worker_writes_its_own_bytes(no_leaks):
    sizes = list(DataLoader(Numbered(40, size=100), batch_size=4, collate_fn=_saved_size, num_workers=2, timeout=60))
    for saved, nbytes, in_slot in sizes:
        assert in_slot  # filled into a ring slot of 64 KiB or more
        assert saved < nbytes + 8192, (saved, nbytes)


# --- the rule itself ---------------------------------------------------------------------------


def test_a_lease_alive_at_a_fork_is_retired():
    answers = []
    owner = torch.zeros(4096, dtype=torch.uint8)
    shared = _ownership.grant(owner.numpy()[:1024], answers.append, shared=True)
    plain = _ownership.grant(owner.numpy()[2048:3072], answers.append, shared=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    del shared
    del plain
    assert answers == [False, True]  # shared memory a child may map is never reused


def test_a_storage_that_moved_comes_back_only_once_it_died():
    answers = []
    owner = torch.zeros(4096, dtype=torch.uint8)
    lease = _ownership.grant(owner.numpy()[:1024], answers.append, shared=False)
    array = lease[100:].numpy()
    lease.share_memory_()  # the storage moves; the array still points at the old memory
    assert answers == [] and lease.data_ptr() != owner.data_ptr()
    del lease
    assert answers == []  # the array holds the storage
    del array
    assert answers == [True]


def test_a_worker_slot_retired_by_its_receiver_is_replaced():
    ring = _ring._Ring(1)
    buffer = ring.take(1000)
    address = buffer.data_ptr()
    del buffer
    again = ring.take(1000)
    assert again.data_ptr() == address  # reused: nothing reads it
    ring.state[0] = 2  # the receiver retired it (a fork there while it held a batch)
    del again
    fresh = ring.take(1000)
    assert fresh is not None and ring.slots[0].generation == 1 and ring.state[0] == 0
    del fresh
