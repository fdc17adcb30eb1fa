"""The workers' shared-memory ring: stress, faults, fallbacks, and what is left afterwards."""

from __future__ import annotations

import collections
import gc
import io
import os
import pickle
import random
import re
import secrets
import signal
import time
import warnings
from multiprocessing import resource_sharer
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from leaks import Snapshot, shut_down, stop_watching
from pincollate import MMCollate, Pad
from pincollate._memory import receiver as _receiver
from pincollate._memory import registration as _registration
from pincollate._memory import ring as _ring
from samples import buffer_of

pytestmark = pytest.mark.slow


class Numbered(Dataset):
    """Sample ``i``: ``x`` is ``i`` repeated a length that varies with ``i``; its id and a tag."""

    def __init__(self, count: int, longest: int = 6000, growing: bool = False, fail_at: int | None = None):
        self.count = count
        self.longest = longest
        self.growing = growing
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.count

    def length(self, i: int) -> int:
        if self.growing:
            return 64 + i * 512
        return 64 + (i * 2654435761) % self.longest

    def __getitem__(self, i: int) -> dict:
        if i == self.fail_at:
            raise ValueError(f"sample {i} is broken")
        return {"x": torch.full((self.length(i),), float(i)), "i": i, "tag": f"s{i}", "pid": os.getpid()}


COLLATE = MMCollate(pin_memory=False, fields={"x": Pad()})


def check(batch, written: bool = False) -> None:
    """The batch holds exactly what its samples said (and the one write, if it was written)."""
    ids = batch["i"]
    assert batch["tag"] == [f"s{i}" for i in ids.tolist()]
    lengths = batch["x_lengths"]
    real = torch.arange(batch["x"].shape[1]) < lengths[:, None]
    expected = torch.where(real, ids[:, None].float(), torch.zeros(()))
    if written:
        expected[0, 0] = -1.0
    assert torch.equal(batch["x"], expected)
    assert torch.equal(batch["x_mask"], real)


class Uniform(Dataset):
    """Sample ``i``: ``x`` is ``i`` six times, and its id: one structure, batch after batch."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((6,), float(i)), "i": i}


def loader(dataset, collate=COLLATE, batch_sampler=None, **kwargs):
    kwargs.setdefault("num_workers", 2)
    if kwargs["num_workers"]:
        kwargs.setdefault("timeout", 60)
    if batch_sampler is None:
        kwargs.setdefault("batch_size", 4)
    return DataLoader(dataset, collate_fn=collate, batch_sampler=batch_sampler, **kwargs)


def varying_batches(count: int, seed: int = 0, largest: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    batches, start = [], 0
    for _ in range(count):
        size = rng.randint(1, largest)
        batches.append(list(range(start, start + size)))
        start += size
    return batches


@pytest.fixture
def clean(no_leaks):
    """The test must leave no ring, file descriptor, /dev/shm file or thread behind."""
    return no_leaks


# --- stress --------------------------------------------------------------------------------


def test_stress_kept_dropped_and_written_batches_never_change(clean):
    # Thousands of batches of varying sizes: the consumer keeps some for random
    # times (a few for the whole run), drops the rest at once and writes into some.
    # Every batch is checked when handed out, while kept, and when dropped.
    rng = random.Random(1)
    sampler = varying_batches(2000, seed=1)
    dataset = Numbered(sum(map(len, sampler)))
    kept: list[tuple[float, object, bool]] = []
    leased = fresh = 0
    for step, batch in enumerate(loader(dataset, batch_sampler=sampler)):
        check(batch)
        if _receiver.leased(batch["x"]):
            leased += 1
        else:
            fresh += 1
        written = rng.random() < 0.1
        if written:
            batch["x"][0, 0] = -1.0
        roll = rng.random()
        if roll < 0.003:
            kept.append((float("inf"), batch, written))
        elif roll < 0.3:
            kept.append((step + rng.randint(1, 40), batch, written))
        for due, old, old_written in kept:
            if due <= step or step % 100 == 0:
                check(old, old_written)
        kept = [entry for entry in kept if entry[0] > step]
        del batch
    for _, old, old_written in kept:
        check(old, old_written)
    # Both paths ran: most batches in slots, some fresh while every slot was kept.
    assert leased > 500 and fresh > 0
    del kept


def test_shared_memory_stays_bounded_by_the_ring(clean):
    # Varying sizes, each batch dropped at once: the slots the main process maps never
    # exceed workers x slots x the largest slot, and no ring holds more than its slots.
    # (What this process maps, not /dev/shm as a whole: another suite may run beside.)
    sampler = varying_batches(600, seed=2)
    dataset = Numbered(sum(map(len, sampler)))
    largest = max(COLLATE.plan([dataset[i] for i in b]).nbytes for b in sampler[:200]) * 2
    peak = 0
    for batch in loader(
        dataset, batch_sampler=sampler, collate=MMCollate(pin_memory=False, fields={"x": Pad()}, worker_slots=4)
    ):
        check(batch)
        mapped = [m.storage.nbytes() for r in _receiver._receivers.values() for m in r.slots.values()]
        peak = max(peak, sum(mapped))
        assert all(len(r.slots) <= 4 for r in _receiver._receivers.values())
        del batch
    assert 0 < peak <= 2 * 4 * (int(largest * 1.25) + (1 << 16))


def test_persistent_workers_keep_their_rings_across_epochs(clean, storages_received):
    data = loader(Numbered(64), persistent_workers=True)
    for _ in range(5):
        for batch in data:
            check(batch)
        del batch
    # Each worker's slots and state array crossed once for all five epochs.
    assert storages_received[0] <= 2 * (8 + 1)
    assert _receiver.open_rings() == 2
    del data


def test_new_workers_each_epoch_leave_no_fds_behind(clean):
    # Non-persistent workers: every epoch brings new rings; the last epoch's are closed
    # once its workers are gone, so descriptors do not grow from epoch to epoch.
    data = loader(Numbered(64))
    before = Snapshot()
    for _ in range(4):
        for batch in data:
            check(batch)
        del batch
        before.settled()


def test_pin_thread_copies_each_batch_once_and_frees_its_slot(
    pretend_accelerator, fake_pinned, clean, storages_received
):
    batches = [b for b in loader(Numbered(160), pin_memory=True)]
    assert len(fake_pinned) == len(batches) == 40
    for batch in batches:
        check(batch)
        assert not _receiver.leased(batch["x"])  # a pinned copy; its slot went back
    assert storages_received[0] < 20
    del batches, batch


# --- faults --------------------------------------------------------------------------------


def test_worker_killed_mid_epoch_leaves_nothing(clean):
    kept = []
    # No loader timeout: with one, torch checks its workers only once the whole timeout
    # has passed (60 s here whenever the dead worker's batch was the next one due);
    # without, it checks them every few seconds and reports the death.
    iterator = iter(loader(Numbered(400), timeout=0))
    try:
        # torch raises RuntimeError, or (a descriptor or message in flight when the worker
        # died) ConnectionResetError or EOFError, with default_collate as with this one.
        with pytest.raises((RuntimeError, ConnectionResetError, EOFError)) as raised:
            for step, batch in enumerate(iterator):
                check(batch)
                kept.append(batch)
                if step == 5:
                    stop_watching(iterator)
                    os.kill(int(batch["pid"][0]), signal.SIGKILL)
    finally:
        shut_down(iterator)  # at once, rather than whenever the GC gets to it
    if raised.type is RuntimeError:
        assert re.search(r"exited unexpectedly|killed by signal", str(raised.value))
    for batch in kept:
        check(batch)  # what was handed out stays valid
    del iterator, kept, batch, raised


def test_dataset_exception_leaves_nothing(clean):
    iterator = iter(loader(Numbered(64, fail_at=30)))
    try:
        with pytest.raises(ValueError, match="sample 30 is broken"):
            for batch in iterator:
                check(batch)
    finally:
        iterator._shutdown_workers()
    del iterator, batch


@pytest.mark.parametrize("batch_first", [True, False])
def test_early_break_leaves_nothing(clean, batch_first):
    iterator = iter(loader(Numbered(400)))
    for step, batch in enumerate(iterator):  # noqa: B007 (the batch is used after the loop)
        if step == 3:
            break
    check(batch)
    if batch_first:
        del batch
        del iterator
    else:
        del iterator
        check(batch)  # valid after its workers are gone
        del batch


# --- fallbacks -----------------------------------------------------------------------------


def test_batches_bigger_than_every_slot(clean, storages_received):
    # Each batch outgrows the slots: a free slot is replaced by a bigger one, and
    # kept batches of the slots it replaced stay valid.
    kept = []
    for step, batch in enumerate(loader(Numbered(160, growing=True))):
        check(batch)
        if step % 3 == 0:
            kept.append(batch)
    for batch in kept:
        check(batch)
    assert storages_received[0] >= 40  # every batch needed a new slot or a fresh buffer
    del kept, batch


def test_file_system_strategy_takes_the_path_without_a_ring():
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        list(loader(Numbered(8)))  # torch connects to its shared-memory manager once per process
        before = Snapshot()
        for batch in loader(Numbered(40)):
            check(batch)
            assert _receiver.open_rings() == 0 and not _receiver.leased(batch["x"])
        del batch
        before.settled()
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)


def test_without_workers_there_is_no_ring(clean):
    for batch in loader(Numbered(40), num_workers=0):
        check(batch)
        assert _receiver.open_rings() == 0 and not _receiver.leased(batch["x"])


def test_no_slots_means_a_fresh_buffer_per_batch(clean, storages_received):
    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, worker_slots=0)
    batches = list(loader(Numbered(40), collate=collate))
    for batch in batches:
        check(batch)
        assert buffer_of(batch).untyped_storage().is_shared()
    assert storages_received[0] == len(batches) == 10
    del batches, batch


def test_pin_slots_without_cuda_changes_nothing(clean):
    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, pin_slots=True)
    for batch in loader(Numbered(40), collate=collate):
        check(batch)
        assert _receiver.leased(batch["x"]) and not _registration.is_registered(batch.buffer)
    del batch


# --- batches leaving the path ----------------------------------------------------------------


def test_batch_sent_on_to_another_process_sends_a_copy_out_of_its_slot(clean):
    iterator = iter(loader(Numbered(400)))
    first = next(iterator)
    assert _receiver.leased(first["x"])
    sent = ForkingPickler.dumps(first)  # what a multiprocessing queue would send
    # The sent copy is in fresh shared memory; the batch kept here stays whole, in its slot.
    assert _receiver.leased(first["x"]) and first.layout is not None
    for batch in iterator:  # the other slots are reused many times over
        check(batch)
    received = pickle.loads(sent)
    check(first)
    check(received)
    saved = pickle.loads(pickle.dumps(batch))
    check(saved)
    stream = io.BytesIO()
    torch.save(batch, stream)  # a leased batch saves its bytes
    stream.seek(0)
    check(torch.load(stream))
    del iterator, first, received, batch, saved, sent, stream
    resource_sharer.stop()  # multiprocessing's fd-passing thread, started by the loads above


def test_a_forked_copy_of_a_batch_does_not_free_its_slot(clean):
    iterator = iter(loader(Numbered(400)))
    first = next(iterator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        pid = os.fork()
    if pid == 0:  # the child drops its copy of the batch
        del first
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    for batch in iterator:
        check(batch)
    check(first)  # its slot was not handed out again
    del iterator, first, batch


def _pickled_in_the_worker(samples):
    batch = COLLATE(samples)
    ForkingPickler.dumps(batch)  # sent somewhere that is not the main process
    return batch


def _changed_in_the_worker(samples):
    batch = COLLATE(samples)
    batch["extra"] = 1  # no longer its layout: crosses tensor by tensor
    return batch


@pytest.mark.parametrize("collate", [_pickled_in_the_worker, _changed_in_the_worker])
def test_a_slot_that_left_another_way_is_never_reused(clean, collate):
    batches = list(loader(Numbered(160), collate=collate))
    assert len(batches) == 40
    for batch in batches:
        check(batch)
        assert not _receiver.leased(batch["x"])
    del batches, batch


def test_a_dropped_lease_gives_its_slot_back():
    from pincollate._batch.batch import carries

    # A worker-like call whose fill failed drops its buffer: the slot is free again.
    ring = _ring._Ring(2)
    buffer = ring.take(1000)
    assert buffer is not None and ring.slots[0].busy and buffer.untyped_storage().nbytes() == 1000
    del buffer
    assert not ring.slots[0].busy and ring.state[0] == 0
    assert ring.take(1000) is not None and ring.take(1000) is not None and ring.take(1000) is None
    assert carries(COLLATE.plan([{"x": torch.ones(2), "i": 0, "tag": "a", "pid": 0}]))


#: How many copies the device may fall behind the host in the late-copy tests. With no bound
#: (a device slower than the loop) every slot ends up held by a pending copy and the worker
#: falls back to fresh, unregistered buffers: the bound belongs to the test, not the product.
#: A worker then holds at most the batch in hand, the loader's two in flight and LAG + 2
#: slots under copies (one not yet let go): fewer than LATE_SLOTS.
LAG = 3
LATE_SLOTS = 12


@pytest.mark.parametrize("hold", [True, False], ids=["held", "control-not-held"])
def test_a_slot_is_never_refilled_under_a_late_copy(clean, lagging_device, monkeypatch, hold):
    """A stand-in device runs each copy late, up to LAG batches behind the loop.

    With the hold, every batch arrives in a registered slot and every copy reads it
    whole. The control turns the hold off: the worker refills slots under their copies
    (one worker, batches of one size: the slot a batch leaves is the next one it fills).
    """
    if not hold:
        monkeypatch.setattr(_registration, "hold_until_copied", lambda source, device: None)
    collate = MMCollate(pin_memory=False, pin_slots=True, worker_slots=LATE_SLOTS)
    pending: collections.deque = collections.deque()
    copied = wrong = 0
    for batch in loader(Uniform(160), collate=collate, num_workers=1):
        assert _registration.is_registered(batch.buffer) and batch.pin_memory() is batch
        moved = batch.to("cuda", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        pending.append((moved, batch["x"].clone(), event))
        del batch
        while len(pending) > LAG or (pending and copied + len(pending) == 40):
            moved, expected, event = pending.popleft()
            event.synchronize()  # the host waits for the oldest copy: the device is at most LAG behind
            wrong += not torch.equal(moved["x"], expected)
            copied += 1
    assert copied == 40
    assert wrong == 0 if hold else wrong > 0
    del moved, expected, event


@pytest.mark.cuda
@pytest.mark.parametrize("hold", [True, False], ids=["held", "control-not-held"])
def test_on_cuda_a_slot_is_never_refilled_under_a_late_copy(clean, monkeypatch, hold):
    """On a device: each copy queued behind 10 ms of compute, at most LAG batches behind the loop.

    The control turns the hold off: the worker refills a slot within about a millisecond
    of its lease's end (one worker, batches of one size: the slot a batch leaves is the
    next one it fills), while the copy that reads it waits behind two more steps of
    compute (the host runs LAG batches ahead), so copies read later batches.
    """
    from pincollate.bench._gpu import spin, spin_cycles

    if not hold:
        monkeypatch.setattr(_registration, "hold_until_copied", lambda source, device: None)
    cycles = spin_cycles(0.01)
    collate = MMCollate(pin_memory=False, pin_slots=True, worker_slots=LATE_SLOTS)
    sums, expected, events = [], [], collections.deque()
    for batch in loader(Uniform(160), collate=collate, num_workers=1):
        assert _registration.is_registered(batch.buffer) and batch.pin_memory() is batch
        expected.append(batch["x"].double().sum())
        spin(cycles)  # the copy queued next starts late: the worker refills meanwhile
        moved = batch.to("cuda", non_blocking=True)
        del batch  # with the hold, the slot stays leased until the copy has run
        sums.append(moved["x"].double().sum())  # read on the device; nothing waits on the host
        events.append(torch.cuda.Event())
        events[-1].record()
        if len(events) > LAG:
            events.popleft().synchronize()  # the bound: the device is at most LAG batches behind
        del moved
    torch.cuda.synchronize()
    _registration.prune()
    wrong = int((torch.stack(sums).cpu() != torch.stack(expected)).sum())
    assert len(sums) == 40
    assert wrong == 0 if hold else wrong > 0


@pytest.mark.cuda
def test_prefetcher_moves_pinned_slots_without_a_pin_copy(clean):
    from pincollate import Prefetcher

    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, pin_slots=True)
    count = 0
    for batch in Prefetcher(loader(Numbered(800), collate=collate), device="cuda"):
        assert batch["x"].is_cuda
        check(batch.to("cpu"))
        count += 1
    assert count == 200
    torch.cuda.synchronize()
    _registration.prune()
    del batch


def test_closing_a_dead_workers_ring_leaves_every_shm_name_of_its_pid_alone(tmp_path):
    # torch names a segment by its creator's pid alone: a name of the dead worker's pid may be
    # another process's, live (another pid namespace sharing /dev/shm, as docker --ipc=host does;
    # a pid used again), read by name under the file_system strategy. Closing used to remove it.
    import multiprocessing as mp

    child = mp.get_context("fork").Process(target=time.sleep, args=(0.2,))
    child.start()
    header = (secrets.randbits(62), child.pid, torch.UntypedStorage._new_shared(64), False)
    receiver = _receiver._Receiver(header)
    child.join()
    theirs = f"/dev/shm/torch_{child.pid}_{secrets.randbits(30)}_0"  # made after the worker died
    with open(theirs, "wb") as f:
        f.write(b"live data")
    try:
        _receiver._receivers[receiver.token] = receiver
        _receiver._close(receiver.token)
        assert receiver.token not in _receiver._receivers and receiver.closed
        with open(theirs, "rb") as f:
            assert f.read() == b"live data"
    finally:
        os.unlink(theirs)


def test_a_layout_crosses_once_then_as_its_key(clean, monkeypatch):
    """Batches of one structure send their layout with the first batch only; ragged ones always."""
    sent = []
    real = _receiver.layout

    def counted(token, key, layout):
        sent.append(((token, key), layout is not None))
        return real(token, key, layout)

    monkeypatch.setattr(_receiver, "layout", counted)
    for batch in loader(Numbered(80), collate=MMCollate(pin_memory=False, fields={"x": Pad()})):
        check(batch)
    assert sent and all(key[1] == 0 and with_layout for key, with_layout in sent)  # Pad: parts differ per batch
    sent.clear()
    batches = list(loader(Uniform(80), collate=MMCollate(pin_memory=False)))
    assert len(batches) == 20 and all(torch.equal(b["x"][:, 0], b["i"].float()) for b in batches)
    walked = [entry for entry in sent if not entry[0][1]]
    keyed = [entry for entry in sent if entry[0][1]]
    # Each worker's first batch is a new structure's, walked: its layout crossed whole, as a ragged one's.
    assert len(walked) == 2 and all(with_layout for _, with_layout in walked)
    # Each worker (its ring's token) sent its plan's layout once; every later batch came as the key alone.
    assert sum(with_layout for _, with_layout in keyed) == len({key for key, _ in keyed}) == 2
    del batches


def test_a_layout_a_worker_keeps_using_stays_known_to_the_receiver():
    """Two collates in one worker: one structure used every other batch while new ones keep crossing.

    The worker refreshes a layout on every use and sends its batches as the key alone; the
    receiver must keep it by the same rule, however many layouts crossed since it first did.
    """
    from pincollate._batch.layout import Layout, TensorSpec

    ring = _ring._Ring(1)
    receiver = _receiver._Receiver((ring.token, ring.pid, ring.state_storage, False))
    _receiver._receivers[ring.token] = receiver
    try:
        steady = Layout(TensorSpec(torch.float32, (4,), 0), 64)
        for n in range(1, 5 * _ring.LAYOUTS_KEPT):
            for layout in (steady, Layout(TensorSpec(torch.uint8, (n,), 0), 64 * n)):
                key, sent = _ring._layout_ref(ring, layout)
                assert _receiver.layout(ring.token, key, sent) is layout
        assert len(ring.layouts) == _ring.LAYOUTS_KEPT and len(receiver.layouts) == 4 * _ring.LAYOUTS_KEPT
    finally:
        _receiver._receivers.pop(ring.token, None)
