"""Prefetcher on CPU (what CI runs) and on CUDA (behind the cuda marker)."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from pincollate import CollateError, MMCollate, Normalize, Prefetcher, mm_collate, pinned_footprint
from pincollate._batch.trees import tensors
from samples import TreeDataset, storages
from stand_ins import Stream

SCRIPTS = Path(__file__).parent / "scripts"


def _loader(n=8, **kwargs):
    data = [{"image": torch.full((3, 4, 4), i, dtype=torch.uint8), "label": i} for i in range(n)]
    return DataLoader(data, batch_size=2, collate_fn=mm_collate, **kwargs)


def _pin_threads() -> int:
    return sum(t.name == "pincollate-prefetch" for t in threading.enumerate())


def test_cpu_passthrough_yields_every_batch_in_order():
    batches = list(Prefetcher(_loader(), device="cpu"))
    assert [b["label"].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_len_and_loader_attributes_pass_through():
    loader = _loader()
    prefetcher = Prefetcher(loader, device="cpu")
    assert len(prefetcher) == 4
    assert prefetcher.dataset is loader.dataset
    assert prefetcher.sampler is loader.sampler and prefetcher.batch_sampler is loader.batch_sampler


def test_set_epoch_reaches_the_sampler():
    data = list(range(16))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=1)
    prefetcher = Prefetcher(DataLoader(data, batch_size=4, sampler=sampler, collate_fn=mm_collate), device="cpu")
    prefetcher.set_epoch(0)
    first = [b.tolist() for b in prefetcher]
    prefetcher.set_epoch(1)
    second = [b.tolist() for b in prefetcher]
    assert sampler.epoch == 1 and first != second


def test_empty_loader_yields_nothing():
    assert list(Prefetcher(DataLoader([], batch_size=2, collate_fn=mm_collate), device="cpu")) == []
    assert list(Prefetcher([], device="cpu", pin_memory=False)) == []


def test_each_iter_starts_a_fresh_epoch():
    prefetcher = Prefetcher(_loader(), device="cpu")
    assert len(list(prefetcher)) == len(list(prefetcher)) == 4


def test_transform_runs_on_each_batch():
    norm = Normalize(mean=[0.0] * 3, std=[1.0] * 3)
    batches = list(Prefetcher(_loader(), device="cpu", transform=norm))
    assert batches[1]["image"].dtype == torch.float32
    assert torch.allclose(batches[1]["image"][0], torch.full((3, 4, 4), 2 / 255))


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"depth": 0}, CollateError),
        ({"depth": True}, CollateError),
        ({"pin_memory": "x"}, CollateError),
        ({"pin_memory": 1}, CollateError),  # 1 == True passed a membership test, then read as not True
        ({"pin_memory": 0}, CollateError),
        ({"stats": "no"}, CollateError),
        ({"pinned_limit": -5}, CollateError),
        ({"pinned_limit": "x"}, CollateError),
        ({"transform": 3}, CollateError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        Prefetcher(_loader(), device="cpu", **kwargs)


def _stops_early(batch):
    if batch["label"][0] == 4:
        raise StopIteration  # a transform's bug: it must not read as the loader's end
    return batch


def _batches_before_stop_iteration(**options) -> list[list[int]]:
    """The labels a loop over a Prefetcher whose transform raises StopIteration saw before its error."""
    loader = DataLoader([{"label": i} for i in range(8)], batch_size=2)
    seen = []
    with pytest.raises(RuntimeError, match="the Prefetcher's transform raised StopIteration"):
        for batch in Prefetcher(loader, device="cpu", transform=_stops_early, **options):
            seen.append(batch["label"].tolist())
    return seen


@pytest.mark.parametrize("stats", [True, False])
def test_a_transform_that_raises_stop_iteration_is_an_error_not_the_epochs_end(stats):
    assert _batches_before_stop_iteration(stats=stats) == [[0, 1], [2, 3]]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["held", "break"])
@pytest.mark.parametrize("stats", ["stats", "nostats"])
def test_exiting_while_the_staging_thread_is_inside_torch_exits_cleanly(stats, how):
    # A daemon thread still inside torch when the interpreter finalizes aborted the process
    # ("terminate called without an active exception", exit 134).
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "exit_unfinished.py"), stats, how],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SCRIPTS,
    )
    assert result.returncode == 0 and result.stderr == "", (result.returncode, result.stderr[-2000:])
    assert result.stdout == "exiting with the staging thread inside torch\n"


# --- the pin thread, driven on CPU through the injected pinned allocator ---------------


def test_a_transform_that_raises_stop_iteration_on_the_staging_thread_is_an_error(fake_pinned):
    assert _batches_before_stop_iteration(pin_memory=True) == [[0, 1], [2, 3]]


def test_pin_thread_pins_each_batch_once(fake_pinned):
    loader = DataLoader(TreeDataset("multimodal-dict", repeat=2), batch_size=4, collate_fn=MMCollate(pin_memory=False))
    batches = list(Prefetcher(loader, device="cpu", pin_memory=True))
    assert len(batches) == 2 and len(fake_pinned) == 2
    assert all(len(storages(b)) == 1 for b in batches)
    assert _pin_threads() == 0


class _Exploding(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"bad record {i}")
        return {"x": torch.tensor(i)}


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_errors_surface_with_their_message(fake_pinned, workers):
    loader = DataLoader(
        _Exploding(), batch_size=2, collate_fn=mm_collate, num_workers=workers, timeout=60 if workers else 0
    )
    seen = []
    with pytest.raises(ValueError, match="bad record 5"):
        for batch in Prefetcher(loader, device="cpu", pin_memory=True):
            seen.append(batch["x"].tolist())
    assert seen == [[0, 1], [2, 3]]
    assert _pin_threads() == 0


def test_a_loader_error_ends_the_loaders_workers_while_the_error_is_held(fake_pinned):
    # The error's traceback holds the DataLoader iterator: its workers must not wait for the
    # error to be collected (they did, and a later garbage collection then stalled 10 s).
    import multiprocessing

    before = set(multiprocessing.active_children())
    loader = DataLoader(_Exploding(), batch_size=2, collate_fn=mm_collate, num_workers=2, timeout=60)
    with pytest.raises(ValueError, match="bad record 5") as raised:
        for _ in Prefetcher(loader, device="cpu", pin_memory=True):
            pass
    assert raised.value.__traceback__ is not None  # still held here
    assert set(multiprocessing.active_children()) - before == set()


def test_early_break_and_garbage_collection_release_the_thread(fake_pinned):
    # Only this prefetcher's thread: another test's may still be shutting its workers down.
    before = set(threading.enumerate())
    prefetcher = Prefetcher(_loader(64), device="cpu", pin_memory=True, depth=3)
    for i, _ in enumerate(prefetcher):
        if i == 1:
            ours = [t for t in threading.enumerate() if t.name == "pincollate-prefetch" and t not in before]
            break
    assert len(ours) == 1
    gc.collect()
    ours[0].join(timeout=60)  # a bound for a hang, not a timing: the machine may be busy
    assert not ours[0].is_alive()
    assert len(list(prefetcher)) == 32


@pytest.mark.parametrize("stats", [True, False])
def test_dropping_an_unfinished_iterator_never_waits_for_a_loader_inside_a_slow_batch(fake_pinned, stats):
    # The garbage collector's close runs on the training thread: it must not wait for the pin
    # thread, still inside the loader (a worker's slow batch), to come back.
    release = threading.Event()

    def slow():
        yield mm_collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])
        release.wait(timeout=60)  # the next batch comes only once the test says so
        yield mm_collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])

    class Loader:
        def __iter__(self):
            return slow()

    # What the suite made before is frozen: a full collection of a large heap (after the slow
    # integration tests, seconds on a 2-core machine) is no measure of the close.
    gc.collect()
    gc.freeze()
    try:
        before = set(threading.enumerate())
        iterator = iter(Prefetcher(Loader(), device="cpu", pin_memory=True, stats=stats))
        next(iterator)
        ours = [t for t in threading.enumerate() if t.name == "pincollate-prefetch" and t not in before]
        start = time.perf_counter()
        del iterator
        gc.collect()
        waited = time.perf_counter() - start  # a close that waits blocks until the 10 s join times out
    finally:
        gc.unfreeze()
    release.set()
    for thread in ours:
        thread.join(timeout=60)
    assert waited < 5.0 and not any(thread.is_alive() for thread in ours)


def test_pin_true_without_pinning_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("pinning is available here")
    with pytest.raises(TypeError, match="pin_memory=True"):
        Prefetcher(_loader(), device="cpu", pin_memory=True)


def test_pinned_footprint_reports_zero_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert pinned_footprint() == {"reserved": 0, "active": 0, "peak": 0}


# --- CUDA ------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_batches_are_pinned_and_one_storage():
    loader = DataLoader(
        TreeDataset("multimodal-dict", repeat=4), batch_size=4, collate_fn=mm_collate, num_workers=2, pin_memory=True
    )
    for batch in loader:
        assert all(t.is_pinned() for t in tensors(batch))
        assert len(storages(batch)) == 1


def _dma_per_batch(monkeypatch, per_leaf: bool) -> float:
    """Host-to-device copies per batch through the Prefetcher, counted by torch's profiler."""
    from pincollate._transfer import staging
    from pincollate.bench._gpu import count_h2d
    from pincollate.bench._gpu import per_leaf as leaf_by_leaf

    if per_leaf:  # the control: the staging thread moves each batch one .to() per tensor
        monkeypatch.setattr(staging, "to_device", lambda batch, device, non_blocking=True: leaf_by_leaf(batch, device))
    loader = DataLoader(TreeDataset("multimodal-dict", repeat=4), batch_size=4, collate_fn=mm_collate, pin_memory=True)
    batches: list = []
    copies = count_h2d(lambda: batches.extend(Prefetcher(loader, device="cuda")))
    assert len(batches) == 4
    return copies / len(batches)


@pytest.mark.cuda
def test_cuda_one_host_to_device_memcpy_per_batch(monkeypatch):
    assert _dma_per_batch(monkeypatch, per_leaf=False) == 1


@pytest.mark.cuda
def test_cuda_control_a_copy_per_leaf_is_counted_as_one_per_leaf(monkeypatch):
    # The profiler records one "Memcpy HtoD" per copy the device runs, from any thread: the same
    # count must see every tensor's copy when the staging moves a batch leaf by leaf.
    batch = mm_collate(TreeDataset("multimodal-dict").items[:4])
    leaves = sum(1 for t in tensors(batch) if t.numel())
    assert leaves > 1 and _dma_per_batch(monkeypatch, per_leaf=True) == leaves


@pytest.mark.cuda
def test_cuda_copies_overlap_compute_of_the_same_length():
    from pincollate.bench._gpu import overlap

    # A copy and a compute of the same length per step: overlapped, a step takes one of
    # them (0.5 of the serial step); in turn, both (1.0).
    row = overlap(torch.device("cuda"))
    assert row["ratio"] < 0.75, row


@pytest.mark.cuda
def test_cuda_control_copies_on_the_consumers_stream_fail_the_same_threshold():
    from pincollate.bench._gpu import overlap

    # The control: the Prefetcher's copies queued on the consumer's stream. A stream runs its
    # work in order, so each copy waits for the compute queued before it and each compute for
    # the copy before it: the steps are as long as in turn, and the threshold above must fail.
    # (No CPU stand-in can show this: it is the device's scheduling of two streams.)
    row = overlap(torch.device("cuda"), one_stream=True)
    assert row["ratio"] > 0.75, row


@pytest.mark.cuda
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_cuda_values_survive_allocator_reuse(depth):
    rng = random.Random(depth)
    data = [{"x": torch.full((256, 256), float(i)), "i": i} for i in range(200)]
    loader = DataLoader(data, batch_size=1, collate_fn=mm_collate)
    for batch in Prefetcher(loader, device="cuda", depth=depth):
        work = torch.randn(1024, 1024, device="cuda")
        for _ in range(rng.randint(0, 4)):
            work = work @ work
        del work
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)
        assert bool((batch["x"] == batch["i"].to("cuda", torch.float32)).all())


def _held_back_sums(depth: int = 2, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of each batch taken on the device after the consumer's stream was held back.

    Nothing synchronises with the host until the end, so a batch whose memory the
    allocator gave to a later copy (no ``record_stream``), or that was read before its
    copy landed (no event wait), sums wrong.
    """
    numel = 1 << 18  # 1 MiB of float32 per batch
    data = [{"x": torch.full((numel,), float(i + 1))} for i in range(n)]
    loader = DataLoader(data, batch_size=1, collate_fn=MMCollate(), pin_memory=False)
    sums = []
    for batch in Prefetcher(loader, device="cuda", depth=depth):
        torch.cuda._sleep(20_000_000)  # the step before this read takes a while on the device
        sums.append(batch["x"].sum())
        del batch
    got = torch.stack(sums).cpu()
    return got, torch.tensor([float(i + 1) * numel for i in range(n)])


@pytest.mark.cuda
def test_cuda_batches_stay_intact_while_the_consumer_is_held_back():
    got, expected = _held_back_sums()
    assert torch.equal(got, expected)


@pytest.mark.cuda
def test_cuda_control_without_record_stream_the_same_check_fails(monkeypatch):
    # The control run: with the protection switched off, the check above must see it.
    from pincollate._transfer import staging

    monkeypatch.setattr(staging, "_record_stream", lambda batch, stream: None)
    got, expected = _held_back_sums()
    assert not torch.equal(got, expected)


@pytest.mark.cuda
def test_cuda_control_without_the_event_wait_the_same_check_fails(monkeypatch):
    from pincollate._transfer import staging

    real = staging.to_device

    def late_copy(host, device, non_blocking=True):
        torch.cuda._sleep(50_000_000)  # queued on the side stream before the copy
        return real(host, device, non_blocking)

    monkeypatch.setattr(staging, "to_device", late_copy)
    got, expected = _held_back_sums(n=4)
    assert torch.equal(got, expected)  # with the wait, a late copy is only late
    monkeypatch.setattr(staging.CudaStaging, "hand", lambda self, item: item[0])
    got, expected = _held_back_sums(n=4)
    assert not torch.equal(got, expected)


@pytest.mark.cuda
def test_cuda_registered_slots_arrive_page_locked():
    from pincollate._memory import arena as _arena
    from pincollate._memory import registration as _registration

    data = [{"x": torch.full((1 << 16,), float(i))} for i in range(16)]
    loader = DataLoader(data, batch_size=4, num_workers=2, collate_fn=MMCollate(pin_slots=True), pin_memory=True)
    batches = 0
    for batch in loader:
        assert _registration.is_registered(batch.buffer) and _arena.is_pinned(batch.buffer)
        batches += 1
    assert batches == 4


@pytest.mark.cuda
def test_cuda_pinned_memory_stays_flat_over_ragged_batches(monkeypatch):
    # Ragged 1-32 MiB batches: the cache is trimmed (on the staging thread) and stays bounded.
    from pincollate._transfer import staging

    trims = []
    real = staging.trim_pinned
    monkeypatch.setattr(staging, "trim_pinned", lambda limit: trims.append(real(limit)) or trims[-1])
    rng = random.Random(0)
    data = [{"x": torch.randn(rng.randint(1, 32) << 18)} for _ in range(160)]
    loader = DataLoader(data, batch_size=1, collate_fn=MMCollate(), pin_memory=False)
    prefetcher = Prefetcher(loader, device="cuda", pinned_limit=128 << 20)
    reserved = []
    for i, _ in enumerate(prefetcher):
        if i % 16 == 15:
            reserved.append(pinned_footprint()["reserved"])
    assert len(trims) == 10 and any(trims)
    assert max(reserved) <= 2 * (128 << 20) + (64 << 20)


class _Shrinking(torch.utils.data.Dataset):
    """96 one-sample batches, 16 to a size: buffers in blocks of 64, 32, 16, 8 and 4 ``unit`` bytes, then 1.

    Each size's blocks stay cached once its batches have passed, so without a limit the
    pinned cache ends holding every size (125 units and more); the last trim check comes
    with the last batch, when only 1-unit blocks are in use.
    """

    def __init__(self, unit: int):
        self.blocks = [unit << k for k in (6, 5, 4, 3, 2, 0)]

    def __len__(self) -> int:
        return 16 * len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        nbytes = self.blocks[i // 16] // 2 + 64  # rounded up to the block by the allocator
        return {"x": torch.zeros(nbytes // 4), "label": i}


def _pinned_after_shrinking_batches(unit: int, limit: int | None) -> int:
    """What the pinned cache holds after an epoch of :class:`_Shrinking` batches through the Prefetcher."""
    loader = DataLoader(_Shrinking(unit), batch_size=1, collate_fn=MMCollate(pin_memory=False))
    count = 0
    for batch in Prefetcher(loader, device="cuda", pin_memory=True, pinned_limit=limit):
        count += int(batch["label"].numel())
    assert count == 96
    del batch
    return pinned_footprint()["reserved"]


@pytest.mark.cuda
def test_cuda_pinned_limit_bounds_the_pinned_cache():
    limit = 16 << 20
    assert _pinned_after_shrinking_batches(1 << 20, limit) <= limit


@pytest.mark.cuda
def test_cuda_control_without_a_pinned_limit_the_same_check_fails():
    torch._C._host_emptyCache()  # what earlier tests left cached is not this run's
    assert _pinned_after_shrinking_batches(1 << 20, None) > 16 << 20


# --- the CUDA control flow, on CPU with stand-ins for streams and events ------------------


def _settle(moved: list, count: int) -> None:
    """Wait (bounded) until the staging thread has moved ``count`` batches."""
    deadline = time.monotonic() + 30
    while len(moved) < count and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_cuda_path_copies_depth_batches_ahead_and_waits_on_events(stand_in_cuda, depth):
    consumer, moved = stand_in_cuda
    prefetcher = Prefetcher(_loader(12), device="cuda", depth=depth, pin_memory=False)
    iterator = iter(prefetcher)
    first = next(iterator)
    assert first["label"].tolist() == [0, 1]
    # While the consumer holds batch 0, the next `depth` are staged: with depth=1 too.
    _settle(moved, depth + 1)
    time.sleep(0.2)  # and no more than that
    assert moved == [0, 2, 4, 6][: depth + 1]
    rest = list(iterator)
    assert [b["label"][0].item() for b in rest] == [2, 4, 6, 8, 10]
    assert len(consumer.waited) == 6 and all(e.stream is prefetcher._stream for e in consumer.waited)


def test_the_loader_is_read_on_the_staging_thread(stand_in_cuda):
    # A slow loader costs the training thread nothing while a batch is staged ahead.
    readers = []

    def loader():
        for batch in _loader(6):
            readers.append(threading.current_thread().name)
            yield batch

    assert len(list(Prefetcher(loader(), device="cuda", depth=1, pin_memory=False))) == 3
    assert set(readers) == {"pincollate-prefetch"}


def test_cuda_path_makes_one_stream_per_prefetcher(stand_in_cuda):
    prefetcher = Prefetcher(_loader(4), device="cuda", pin_memory=False)
    for _ in range(3):
        assert len(list(prefetcher)) == 2
    assert Stream.made == 1


def test_cuda_path_transform_runs_before_the_handover(stand_in_cuda):
    calls = []
    prefetcher = Prefetcher(
        _loader(6),
        device="cuda",
        pin_memory=False,
        transform=lambda b: calls.append(threading.current_thread().name) or b,
    )
    iterator = iter(prefetcher)
    next(iterator)
    _settle(calls, 3)
    assert calls == ["pincollate-prefetch"] * 3  # on the side stream, off the training thread
    assert list(Prefetcher([], device="cuda", pin_memory=False)) == []


def test_cuda_path_stats_count_copies_and_time_the_staging_thread(stand_in_cuda):
    consumer, _ = stand_in_cuda
    prefetcher = Prefetcher(_loader(68), device="cuda", pin_memory=False)
    batches = list(prefetcher)
    stats = prefetcher.stats.epoch
    size = batches[0].layout.nbytes
    assert (stats.batches, stats.samples, stats.batch_bytes) == (34, 68, 34 * size)
    assert stats.h2d_bytes == 34 * size and stats.loader_s > 0 and stats.staging_s > 0
    # The second copy and every 16th after it timed (1 ms each here), standing for all 34.
    assert stats.copy_s == pytest.approx(34 * 1e-3) and stats.copy_bytes_per_s == pytest.approx(size / 1e-3)
    assert len(consumer.waited) == 34  # the timing events are not waited on
    without = Prefetcher(_loader(4), device="cuda", pin_memory=False, stats=False)
    assert len(list(without)) == 2


def test_cuda_device_is_resolved_in_the_callers_thread(stand_in_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert Prefetcher(_loader(), device="cuda", pin_memory=False).device == torch.device("cuda", 3)
    assert Prefetcher(_loader(), device="cuda:1", pin_memory=False).device == torch.device("cuda", 1)


def test_pin_thread_sets_the_cuda_device(stand_in_cuda, monkeypatch, fake_pinned):
    chosen = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda device: chosen.append((threading.current_thread().name, device))
    )
    batches = list(Prefetcher(_loader(4), device="cuda:1", pin_memory=True))
    assert len(batches) == 2 and chosen == [("pincollate-prefetch", torch.device("cuda", 1))]


def test_cuda_path_moves_a_changed_batch_in_one_copy_per_storage(stand_in_cuda, monkeypatch):
    # A batch with a key added after collate: its buffer in one copy, the new value in another,
    # as to_device() and Batch.to move it (not one copy per tensor).
    from pincollate._memory import arena as _arena
    from pincollate._transfer import staging
    from pincollate._transfer import transfer as _transfer

    copies = []
    monkeypatch.setattr(staging, "to_device", _transfer.to_device)
    monkeypatch.setattr(_arena, "_copy", lambda source, device, non_blocking: copies.append(source) or source.clone())

    def changed():
        for batch in DataLoader(TreeDataset("multimodal-dict", repeat=4), batch_size=4, collate_fn=mm_collate):
            batch["extra"] = torch.arange(64.0)
            yield batch

    batches = list(Prefetcher(changed(), device="cuda", pin_memory=False))
    assert len(batches) == 4 and all(len(list(tensors(b))) > 4 for b in batches)
    assert len(copies) == 2 * len(batches)


@pytest.mark.parametrize("units", [16, None])
def test_pinned_limit_bounds_a_2_11_host_cache(stand_in_cuda, host_allocator, units):
    # On CPU, with a stand-in of torch 2.11's caching host allocator (its active_bytes never
    # lowered): the cache ends under the limit, and over it without one (the control), as
    # the CUDA tests above check on a device.
    unit = 1 << 14
    limit = None if units is None else units * unit
    reserved = _pinned_after_shrinking_batches(unit, limit)
    if limit is None:
        assert reserved >= 125 * unit and host_allocator.emptied == 0
    else:
        assert reserved <= limit and host_allocator.emptied >= 1


def test_a_transform_error_ends_the_staging_thread_while_the_error_is_held(fake_pinned):
    def broken(batch):
        raise ValueError("a transform's bug")

    kept = None
    try:
        for _ in Prefetcher(_loader(), device="cpu", pin_memory=True, transform=broken):
            pass
    except ValueError as error:
        kept = error  # the traceback holds the iterator
    deadline = time.monotonic() + 10
    while any(t.name == "pincollate-prefetch" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept is not None and not any(t.name == "pincollate-prefetch" for t in threading.enumerate())


def test_pinned_limit_takes_any_int_and_refuses_a_float():
    assert Prefetcher(_loader(), device="cpu", pinned_limit=np.int64(1 << 30)).pinned_limit == 1 << 30
    with pytest.raises(CollateError, match="a whole number of bytes"):
        Prefetcher(_loader(), device="cpu", pinned_limit=2e9)
