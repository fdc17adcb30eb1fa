"""InputMeter and Prefetcher.stats: is the loop waiting for data?

The accounting is checked exactly on a scripted clock; the loops with real sleeps check
the share with margins wide enough for a busy machine (sleeps of tens of ms, shares
compared with 0.3 and 0.7), never a duration.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, default_collate

import pincollate
from pincollate import CollateError, InputMeter, InputStats, MMCollate, Pad, Prefetcher, mm_collate
from pincollate._transfer import meter as meter_module
from pincollate._transfer.meter import Clock, CopyTimes, Counter, Timeline, count_batch
from pincollate._transfer.staging import Ahead

#: A sleep long against Python's own per-batch work, short enough to keep the suite quick.
NAP = 0.03


class _Slow(torch.utils.data.Dataset):
    """Samples that take ``nap`` seconds each to load."""

    def __init__(self, n: int = 12, nap: float = 0.0):
        self.n, self.nap = n, nap

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.nap:
            time.sleep(self.nap)
        return {"x": torch.full((3,), float(i)), "label": i}


def _drain(batches, step: float = 0.0) -> int:
    """Iterate like a training loop whose step takes ``step`` seconds."""
    n = 0
    for _ in batches:
        if step:
            time.sleep(step)
        n += 1
    return n


class FakeClock:
    """``perf_counter`` on a script: the data source and the loop move it on by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(meter_module, "perf_counter", fake)
    return fake


def _scripted(clock: FakeClock, n: int, wait: float, batch_size: int = 4):
    """``n`` batches, each taking ``wait`` seconds of the scripted clock to arrive."""
    for i in range(n):
        clock.now += wait
        yield {"x": torch.zeros(batch_size, 2), "i": torch.full((batch_size,), i)}


# --- the accounting, on a scripted clock --------------------------------------------------


def test_waits_and_work_are_summed_exactly(clock):
    meter = InputMeter(_scripted(clock, 5, wait=3.0))
    for _ in meter:
        clock.now += 1.0  # the step
    stats = meter.epoch
    assert (stats.batches, stats.samples) == (5, 20)
    assert stats.waited_s == pytest.approx(15.0) and stats.busy_s == pytest.approx(5.0)
    assert stats.input_bound == pytest.approx(0.75)
    assert stats.batches_per_s == pytest.approx(0.25) and stats.samples_per_s == pytest.approx(1.0)
    assert stats.batch_bytes == 5 * (4 * 2 * 4 + 4 * 8) and stats.loader_s == pytest.approx(15.0)


def test_starting_the_iteration_is_waiting(clock):
    class Starting:
        def __iter__(self):
            clock.now += 7.0  # workers starting
            return iter([{"x": torch.zeros(2)}])

    meter = InputMeter(Starting())
    for _ in meter:
        clock.now += 1.0
    assert meter.epoch.waited_s == pytest.approx(7.0) and meter.epoch.busy_s == pytest.approx(1.0)


def test_the_figures_read_mid_epoch_are_the_epoch_so_far(clock):
    meter = InputMeter(_scripted(clock, 4, wait=2.0))
    seen = []
    for _ in meter:
        seen.append((meter.epoch.batches, meter.epoch.waited_s, meter.epoch.busy_s))
        clock.now += 1.0
    assert seen == [(1, 2.0, 0.0), (2, 4.0, 1.0), (3, 6.0, 2.0), (4, 8.0, 3.0)]


def test_each_iteration_starts_a_new_epoch_and_the_run_adds_them(clock):
    meter = InputMeter([{"x": torch.zeros(2, 1)}] * 3)
    for wait in (1.0, 3.0):
        for _ in meter:
            clock.now += wait
    assert meter.epoch.batches == 3 and meter.epoch.busy_s == pytest.approx(9.0)
    assert meter.total.batches == 6 and meter.total.samples == 12 and meter.total.busy_s == pytest.approx(12.0)
    meter.reset()
    assert meter.total == InputStats() and meter.epoch == InputStats()


@pytest.mark.parametrize("wrapper", ["meter", "prefetcher", "pinned prefetcher", "transformed prefetcher"])
def test_iterations_that_overlap_each_count_every_batch_they_hand_out(fake_pinned, wrapper):
    # Nested loops over one wrapper, and two iterators alive at once: each iteration starts an
    # epoch, and the run's total counts every batch, including an earlier iteration's later ones.
    batches = [{"x": torch.zeros(4, 2)} for _ in range(3)]
    if wrapper == "meter":
        loop: Any = InputMeter(batches)
        stats = loop
    else:
        loop = Prefetcher(
            batches,
            device="cpu",
            pin_memory=wrapper == "pinned prefetcher",
            transform=(lambda b: b) if wrapper == "transformed prefetcher" else None,
        )
        stats = loop.stats
    handed = 0
    for _ in loop:
        handed += 1
        for _inner in loop:
            handed += 1
            if handed == 6:
                break  # an inner iterator dropped early: what it handed out still counts
    assert handed == 10 and stats.total.batches == 10 and stats.total.samples == 40
    stats.reset()
    first, second = iter(loop), iter(loop)
    for _ in range(2):
        next(first), next(second)
    assert stats.total.batches == 4 and stats.epoch.batches == 2
    assert sum(1 for _ in first) + sum(1 for _ in second) == 2
    assert stats.total.batches == 6


def test_an_iterator_collected_while_its_thread_holds_the_clocks_lock_does_not_wait_for_it():
    # A garbage collection inside a locked call (reading total) may run an abandoned iterator's
    # __del__ on the same thread: its release must not take the lock that thread holds.
    meter = InputMeter([{"x": torch.zeros(2)}] * 3)
    outer = iter(meter)
    next(outer)
    inner = iter(meter)  # the outer iteration is now an earlier one, still open
    next(inner)
    clock = meter._clock
    done = threading.Event()

    def collect_inside_the_lock() -> None:
        with clock.lock:
            outer.close(wait=False)  # what __del__ runs
        done.set()

    thread = threading.Thread(target=collect_inside_the_lock, daemon=True)
    thread.start()
    thread.join(timeout=30)  # a bound for a hang, not a timing
    assert done.is_set()
    assert meter.total.batches == 2  # the released iteration's batch stays counted, folded later
    assert sum(1 for _ in inner) == 2 and meter.total.batches == 4


def test_set_epoch_starts_new_figures_and_numbers_the_summary(clock):
    lines = []
    meter = InputMeter([{"x": torch.zeros(2)}] * 2, summary=lines.append)
    for _ in meter:
        clock.now += 1.0
    meter.set_epoch(7)
    assert meter.epoch == InputStats() and meter.total.batches == 2
    for _ in meter:
        clock.now += 1.0
    for _ in meter:
        pass
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 7", "epoch 8"]
    assert (
        lines[0]
        == "epoch 0: 2 batches, 4 samples in 2.00 s: 1.0 batches/s, 2 samples/s, 8 B/s; input-bound 0% (waited 0.00 s)"
    )


def test_an_early_break_leaves_the_epoch_and_the_next_iteration_starts_afresh(clock):
    meter = InputMeter([{"x": torch.zeros(3)}] * 5)
    for i, _ in enumerate(meter):
        clock.now += 1.0
        if i == 1:
            break
    assert meter.epoch.batches == 2
    assert _drain(meter) == 5 and meter.epoch.batches == 5 and meter.total.batches == 7


def test_an_empty_loader_gives_zero_figures_and_no_division_by_zero():
    meter = InputMeter([], summary=lambda line: None)
    assert _drain(meter) == 0
    stats = meter.epoch
    assert (stats.batches, stats.samples, stats.batches_per_s, stats.samples_per_s) == (0, 0, 0.0, 0.0)
    assert InputStats().input_bound == 0.0 and InputStats().copy_bytes_per_s == 0.0


def test_timeline_marks_from_hooks(clock):
    timeline = Timeline()
    timeline.worked()  # before any epoch: nothing to mark
    timeline.begin()
    for _ in range(3):
        clock.now += 2.0
        timeline.arrived({"x": torch.zeros(8)})
        clock.now += 1.0
        timeline.worked()
        clock.now += 0.5  # logging after the step: work too
        timeline.worked()
    stats = timeline.epoch
    assert (stats.batches, stats.samples) == (3, 24)
    assert stats.waited_s == pytest.approx(6.0) and stats.busy_s == pytest.approx(4.5)
    timeline.arrived(batches=0)
    timeline.count(2)
    assert timeline.epoch.batches == 5 and timeline.total.batches == 5


# --- what is counted ----------------------------------------------------------------------


def test_a_pincollate_batch_counts_its_buffer_and_another_its_tensors():
    samples = [
        {"image": torch.zeros(3, 4, 4, dtype=torch.uint8), "ids": torch.arange(i + 1), "name": "a"} for i in range(4)
    ]
    ours = MMCollate(fields={"ids": Pad()})(samples)
    assert count_batch(ours) == (4, ours.layout.nbytes)
    theirs = default_collate([{k: v for k, v in s.items() if k != "ids"} for s in samples])
    assert count_batch(theirs) == (4, 4 * 48)
    assert count_batch((torch.zeros(6, 2), torch.zeros(6))) == (6, 6 * 8 + 6 * 4)
    assert count_batch({"images": [torch.zeros(3, 2, 2)] * 5, "meta": {"n": 1}}) == (5, 5 * 48)
    assert count_batch("not a batch") == (0, 0)


def test_samples_can_be_counted_by_the_user():
    meter = InputMeter([{"x": torch.zeros(2, 7)}] * 3, samples=lambda batch: batch["x"].shape[1])
    _drain(meter)
    assert meter.epoch.samples == 21
    with pytest.raises(CollateError, match="samples"):
        InputMeter([], samples=3)


def test_a_layout_is_counted_once(monkeypatch):
    # A pincollate batch's bytes are its layout's: its tensors are never walked for them
    # (its samples are read from the batch: a first value).
    calls = []
    original = meter_module._tensor_bytes
    monkeypatch.setattr(meter_module, "_tensor_bytes", lambda *args: calls.append(1) or original(*args))
    count = Counter()
    # A collate of its own: the shared mm_collate may have learnt to place "x" anew for each batch.
    collate = MMCollate(pin_memory=False)
    same = [collate([{"x": torch.zeros(2)}] * 4) for _ in range(3)]
    other = collate([{"x": torch.zeros(50)}] * 4)
    size = same[0].layout.nbytes
    assert [count(b) for b in same] == [(4, size)] * 3
    assert count(other) == (4, other.layout.nbytes)
    assert count(same[0]) == (4, size) and not calls
    assert count({"x": torch.zeros(3)}) == (3, 12) and calls  # not a pincollate batch: its tensors walked


# --- real loops, real sleeps -------------------------------------------------------------


def test_a_loop_with_slow_data_is_input_bound():
    meter = InputMeter(DataLoader(_Slow(nap=NAP), batch_size=2, collate_fn=mm_collate))
    assert _drain(meter) == 6
    assert meter.epoch.input_bound > 0.7, meter.epoch  # ~0.99: the step does nothing


def test_a_loop_with_a_slow_model_is_not_input_bound():
    meter = InputMeter(DataLoader(_Slow(), batch_size=2, collate_fn=mm_collate))
    assert _drain(meter, step=NAP) == 6
    assert meter.epoch.input_bound < 0.3, meter.epoch  # ~0.01: loading takes microseconds


@pytest.mark.parametrize("slow", ["data", "model"])
def test_the_prefetcher_says_the_same(slow):
    loader = DataLoader(_Slow(nap=NAP if slow == "data" else 0.0), batch_size=2, collate_fn=mm_collate)
    prefetcher = Prefetcher(loader, device="cpu")
    assert _drain(prefetcher, step=NAP if slow == "model" else 0.0) == 6
    stats = prefetcher.stats.epoch
    assert (stats.batches, stats.samples) == (6, 12)
    assert stats.input_bound > 0.7 if slow == "data" else stats.input_bound < 0.3, stats


def test_a_slow_transform_is_staging_not_reading():
    def transform(batch):
        time.sleep(NAP)
        return batch

    prefetcher = Prefetcher(DataLoader(_Slow(), batch_size=2, collate_fn=mm_collate), device="cpu", transform=transform)
    _drain(prefetcher)
    stats = prefetcher.stats.epoch
    assert stats.staging_share > 0.7 and stats.input_bound > 0.7, stats


@pytest.mark.slow
def test_workers_that_cannot_keep_up_show_as_input_bound():
    loader = DataLoader(_Slow(n=16, nap=NAP), batch_size=2, collate_fn=mm_collate, num_workers=2, timeout=60)
    meter = InputMeter(loader)
    assert _drain(meter) == 8 and meter.epoch.input_bound > 0.7, meter.epoch


def test_the_staging_thread_figures_travel_with_the_batch():
    # The threaded path the Prefetcher takes on CUDA, driven on CPU: the read is timed on the
    # staging thread, the wait on the consumer's, and a handed-over batch counts as copied.
    clock = Clock()
    sums = clock.begin(4, reads_loader=False)

    size = mm_collate([{"x": torch.zeros(3)}] * 2).layout.nbytes

    def slow_batches():
        for _ in range(4):
            time.sleep(NAP)
            yield mm_collate([{"x": torch.zeros(3)}] * 2)

    ahead = Ahead(
        slow_batches(), 2, lambda b: b, torch.device("cpu"), hand=lambda b: b, metering=(clock, sums, Counter())
    )
    assert _drain(ahead) == 4
    stats = clock.epoch
    assert (stats.batches, stats.samples, stats.batch_bytes, stats.h2d_bytes) == (4, 8, 4 * size, 4 * size)
    assert stats.loader_s > 3 * NAP and stats.input_bound > 0.7, stats


class _Event:
    """A CUDA event's part that CopyTimes uses: done or not, and the time since another."""

    def __init__(self, done: bool, ms: float = 0.0):
        self.done, self.ms = done, ms

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: _Event) -> float:
        return end.ms


def test_the_copies_timed_stand_for_every_copy():
    clock = Clock()
    sums = clock.begin(None, reads_loader=False)
    copies = CopyTimes(clock, sums, every=2)
    assert [copies.due() for _ in range(5)] == [False, True, False, True, False]
    copies.timed(_Event(True), _Event(False, 40.0), 1000)  # still running on the device
    copies.timed(_Event(True), _Event(True, 10.0), 1000)  # done, but read back in order
    assert clock.epoch.copy_s == 0 and len(copies.pending) == 2
    copies.collect(wait=True)  # the epoch's end
    assert not copies.pending
    clock.step_staged(sums, 0.0, 1.0, (4, 4000), 0.0, 0.0, 4000)
    # 2,000 bytes timed in 50 ms: the 4,000 copied took 100 ms at 40 kB/s.
    assert clock.epoch.copy_s == pytest.approx(0.1) and clock.epoch.copy_bytes_per_s == pytest.approx(4e4)


# --- threads ------------------------------------------------------------------------------


def test_figures_read_on_another_thread_are_whole():
    batches = [mm_collate([{"x": torch.zeros(3)}] * 4) for _ in range(64)]
    meter = InputMeter(batches * 50)
    snapshots, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            snapshots.append(meter.epoch)

    reader = threading.Thread(target=read)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a torn read would show
    reader.start()
    try:
        # Until the reader has read often enough while figures change (on a busy machine
        # it may get few turns a pass); bounded, so a reader that never reads still fails.
        for _ in range(200):
            _drain(meter)
            if len(snapshots) > 10:
                break
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert len(snapshots) > 10
    size = batches[0].layout.nbytes
    # Figures of one moment: counts that go together, and the loader's time (the waits, read
    # again after the work is worked out) equal to the waits.
    assert all(
        s.samples == 4 * s.batches and s.batch_bytes == size * s.batches and s.loader_s == s.waited_s for s in snapshots
    )


def test_a_reader_waits_for_a_batch_half_written():
    # The consumer writes a batch's figures between two steps of the sequence number; a
    # reader that finds it odd (a write under way) waits for the even number, so it never
    # sees the batch counted and its samples not (free-threaded Python switches anywhere).
    meter = InputMeter([{"x": torch.zeros(2)}] * 2)
    for _ in meter:
        pass
    sums = meter._clock._current
    sums.seq += 1  # a write begun: one field of the batch written
    sums.batches += 1
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.append(meter.epoch))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not read  # waiting for the write to end
    sums.samples += 2
    sums.seq += 1
    reader.join(60)
    assert [(s.batches, s.samples) for s in read] == [(3, 6)]


def test_a_snapshot_that_overlapped_a_write_is_taken_again():
    # The reader copies the sums field by field; a batch written while it copies (here, as
    # it reads ``batches``) moves the sequence number, and the copy is taken again, whole.
    from pincollate._transfer.meter import _Sums

    class Overlapped(_Sums):
        __slots__ = ("writes",)

        @property  # type: ignore[override]
        def batches(self) -> int:
            value = _Sums.batches.__get__(self)  # type: ignore[attr-defined]
            if self.writes:
                self.writes -= 1
                self.seq += 1  # a whole batch written between two of the reader's reads
                _Sums.batches.__set__(self, value + 1)  # type: ignore[attr-defined]
                self.batch_bytes += 10
                self.seq += 1
                return value + 1  # read after the write: the copy's batch_bytes was read before it
            return value

        @batches.setter
        def batches(self, value: int) -> None:
            _Sums.batches.__set__(self, value)  # type: ignore[attr-defined]

    sums = Overlapped()
    sums.writes = 1
    copy = sums.snapshot()
    assert (copy.batches, copy.batch_bytes) == (1, 10)  # without the check: (1, 0), torn


def test_a_writer_that_fails_leaves_no_reader_waiting():
    # A figure that is not a number raises in the writer; the sequence number still ends even.
    timeline = Timeline()
    timeline.begin()
    with pytest.raises(TypeError):
        timeline.arrived(batches=None)  # type: ignore[arg-type]
    assert timeline.clock._current.seq % 2 == 0
    reader = threading.Thread(target=lambda: timeline.epoch)
    reader.start()
    reader.join(60)
    assert not reader.is_alive()


def test_a_samples_callable_that_returns_no_int_is_named():
    meter = InputMeter([{"x": torch.zeros(2)}], samples=lambda batch: None)
    with pytest.raises(CollateError, match=r"samples=\.\.\.\) must return an int for a batch, got NoneType"):
        next(iter(meter))
    assert meter.epoch.batches == 0  # nothing half counted
    assert InputMeter([[1, 2]], samples=lambda batch: np.int64(len(batch))) is not None


def test_closing_a_metered_iterator_closes_the_source_it_made():
    closed = []

    class Batches:
        def __iter__(self):
            try:
                yield {"x": torch.zeros(2)}
                yield {"x": torch.zeros(2)}
            finally:
                closed.append(True)

    iterator = iter(InputMeter(Batches()))
    next(iterator)
    iterator.close()
    assert closed == [True]
    prefetched = iter(pincollate.Prefetcher([{"x": torch.zeros(2)}], device="cpu"))
    prefetched.close()  # stats on, on the CPU: the metered iterator closes as the unmetered one does


def test_batches_of_the_layout_seen_last_are_counted_without_the_counter(monkeypatch):
    # The metered iterator keeps the last layout's counts: a run of batches of one layout
    # asks the counter (its table lookup) once.
    collate = MMCollate(pin_memory=False)
    batches = [collate([{"x": torch.zeros(3)}] * 4) for _ in range(5)]
    meter = InputMeter(batches)
    asked = []
    real = type(meter._count).__call__
    monkeypatch.setattr(type(meter._count), "__call__", lambda self, batch: asked.append(1) or real(self, batch))
    assert _drain(meter) == 5 and len(asked) == 1
    assert (meter.epoch.samples, meter.epoch.batch_bytes) == (20, 5 * batches[0].layout.nbytes)


def test_alternating_layouts_are_counted_exactly():
    # Two layouts in turn (two workers' batches): the inline check of the last layout misses
    # every time, and the counter's table answers.
    collate = MMCollate(pin_memory=False)
    small = [collate([{"x": torch.zeros(2)}] * 4) for _ in range(3)]
    large = [collate([{"x": torch.zeros(9)}] * 2) for _ in range(3)]
    meter = InputMeter([b for pair in zip(small, large, strict=True) for b in pair])
    assert _drain(meter) == 6
    nbytes = 3 * small[0].layout.nbytes + 3 * large[0].layout.nbytes
    assert (meter.epoch.batches, meter.epoch.samples, meter.epoch.batch_bytes) == (6, 18, nbytes)


def test_two_meters_on_two_threads_keep_their_own_figures():
    meters = [InputMeter([{"x": torch.zeros(k, 1)}] * 500) for k in (2, 3)]
    threads = [threading.Thread(target=_drain, args=(m,)) for m in meters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(m.epoch.batches, m.epoch.samples) for m in meters] == [(500, 1000), (500, 1500)]


# --- what passes through, what is refused -------------------------------------------------


def test_len_attributes_and_set_epoch_pass_through():
    data = list(range(16))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler, collate_fn=mm_collate)
    meter = InputMeter(loader)
    assert len(meter) == 2 and meter.dataset is loader.dataset
    assert meter.sampler is sampler and meter.batch_sampler is loader.batch_sampler
    meter.set_epoch(3)
    assert sampler.epoch == 3
    with pytest.raises(TypeError):
        len(InputMeter(iter([])))


def test_a_plain_iterable_with_its_own_set_epoch_gets_it():
    class Source(list):
        epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

    source = Source([{"x": torch.zeros(1)}])
    InputMeter(source).set_epoch(4)
    assert source.epoch == 4


def test_prefetcher_without_stats_has_none_to_show():
    prefetcher = Prefetcher([{"x": torch.zeros(1)}], device="cpu", stats=False)
    assert _drain(prefetcher) == 1
    with pytest.raises(CollateError, match="stats=False"):
        prefetcher.stats  # noqa: B018
    with pytest.raises(CollateError, match="need stats=True"):
        Prefetcher([], device="cpu", stats=False, progress=True)


def test_prefetcher_set_epoch_starts_new_figures():
    prefetcher = Prefetcher([{"x": torch.zeros(2)}] * 3, device="cpu")
    _drain(prefetcher)
    prefetcher.set_epoch(1)
    assert prefetcher.stats.epoch.batches == 0 and prefetcher.stats.total.batches == 3


def test_summary_must_be_a_bool_or_a_callable():
    with pytest.raises(CollateError, match="summary"):
        InputMeter([], summary="yes")


# --- the bar and the summary ----------------------------------------------------------------


def test_the_progress_bar_shows_the_input_bound_share(capsys):
    pytest.importorskip("tqdm")
    meter = InputMeter(DataLoader(_Slow(nap=NAP), batch_size=2, collate_fn=mm_collate), progress=True)
    _drain(meter)
    err = capsys.readouterr().err
    assert "epoch 0" in err and "6/6" in err and "input-bound" in err


def test_summary_true_prints_one_line_an_epoch(capsys):
    prefetcher = Prefetcher([{"x": torch.zeros(4, 2)}] * 3, device="cpu", summary=True)
    _drain(prefetcher)
    _drain(prefetcher)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1"]
    assert "3 batches, 12 samples in" in lines[0] and "input-bound" in lines[0]


def test_the_stats_reads_as_one_line_and_a_dict():
    stats = InputStats(
        batches=100,
        samples=3200,
        batch_bytes=10**9,
        waited_s=1.0,
        busy_s=3.0,
        loader_s=0.5,
        staging_s=0.5,
        h2d_bytes=10**9,
        copy_s=0.1,
    )
    assert stats.summary() == (
        "100 batches, 3,200 samples in 4.00 s: 25.0 batches/s, 800 samples/s, 250.0 MB/s; "
        "input-bound 25% (waited 1.00 s); staging 50% of producing; 1.0 GB to the device at 10.0 GB/s"
    )
    figures = stats.as_dict("data/")
    assert figures["data/input_bound"] == 0.25 and figures["data/copy_bytes_per_s"] == pytest.approx(1e10)
    assert figures["data/h2d_bytes_per_s"] == pytest.approx(2.5e8) and figures["data/staging_share"] == 0.5


def test_public_names():
    assert pincollate.InputMeter is InputMeter and pincollate.InputStats is InputStats
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        pincollate.NoSuchThing  # noqa: B018


# --- CUDA -----------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_copies_are_counted_and_timed():
    data = [{"x": torch.full((64, 64), float(i)), "i": i} for i in range(64)]
    prefetcher = Prefetcher(DataLoader(data, batch_size=2, collate_fn=mm_collate), device="cuda")
    for batch in prefetcher:
        assert bool((batch["x"][:, 0, 0] == batch["i"].to("cuda", torch.float32)).all())
    stats = prefetcher.stats.epoch
    per_batch = mm_collate(data[:2]).layout.nbytes
    assert stats.batches == 32 and stats.h2d_bytes == 32 * per_batch == stats.batch_bytes
    assert stats.copy_s > 0 and stats.copy_bytes_per_s > 0 and stats.staging_s > 0


# --- found by a round on the transfer layer as users run it -------------------------------


def _sliced(loader):
    """A wrapper that changes each collated batch before the loop sees it: batch i has 2 * (i + 1) rows."""
    for i, batch in enumerate(loader):
        batch["x"] = batch["x"].repeat(i + 1, 1)
        yield batch


@pytest.mark.parametrize("wrap", ["meter", "prefetcher"])
def test_a_batch_changed_after_collating_counts_its_own_samples(wrap):
    loader = DataLoader([{"x": torch.zeros(4)}] * 8, batch_size=2, collate_fn=mm_collate)
    if wrap == "meter":
        meter = InputMeter(_sliced(loader))
        rows = sum(batch["x"].shape[0] for batch in meter)
        epoch = meter.epoch
    else:
        prefetcher = Prefetcher(_sliced(loader), device="cpu")
        rows = sum(batch["x"].shape[0] for batch in prefetcher)
        epoch = prefetcher.stats.epoch
    assert rows == 20 and epoch.samples == 20  # the layout (2 rows) counted every batch as 2 before


class _Encoding(dict):
    pass


@dataclasses.dataclass
class _Inputs:
    name: str
    pixels: torch.Tensor


@pytest.mark.parametrize(
    "make",
    [
        lambda: collections.UserDict({"input_ids": torch.zeros(8, 3)}),  # a Mapping that is no dict (BatchEncoding)
        lambda: {"split": "train", "x": torch.zeros(8, 3)},
        lambda: _Inputs("train", torch.zeros(8, 3)),
        lambda: ("train", torch.zeros(8, 3)),
    ],
    ids=["mapping", "string-first", "dataclass", "tuple-string-first"],
)
def test_samples_are_the_first_tensors_length_past_values_that_give_none(make):
    meter = InputMeter([make(), make()])
    list(meter)
    assert meter.epoch.samples == 16


@pytest.mark.parametrize("wrap", ["meter", "prefetcher"])
def test_an_iteration_whose_loader_fails_to_start_leaves_no_epoch_open(wrap):
    class Unmounted:
        def __iter__(self):
            raise OSError("dataset not mounted yet")

    wrapper = InputMeter(Unmounted()) if wrap == "meter" else Prefetcher(Unmounted(), device="cpu")
    clock = (wrapper if wrap == "meter" else wrapper.stats)._clock
    for _ in range(3):
        with pytest.raises(OSError):
            iter(wrapper)
    with clock.lock:
        clock._settle()
        assert clock._running == []


def test_a_pinning_prefetcher_on_the_cpu_times_its_staging_threads_reads(fake_pinned):
    # Pinned for a CPU consumer (or an accelerator without CUDA streams): the loader is read on
    # the staging thread, so its time is that thread's reads, not the loop's waits.
    def slow():
        for i in range(8):
            time.sleep(0.02)
            yield {"x": torch.full((2, 3), float(i))}

    prefetcher = Prefetcher(slow(), device="cpu", pin_memory=True)
    got = []
    for batch in prefetcher:
        got.append(batch["x"][0, 0].item())
        time.sleep(0.04)  # a slower step: the reads overlap it, and the loop hardly waits
    epoch = prefetcher.stats.epoch
    assert got == [float(i) for i in range(8)] and len(fake_pinned) == 8
    assert epoch.loader_s >= 8 * 0.02 * 0.9, epoch  # each read sleeps 20 ms at least
    assert epoch.staging_s > 0 and epoch.h2d_bytes_per_s == 0, epoch


@pytest.mark.parametrize(
    "make",
    [
        lambda: {"boxes": torch.zeros(0, 4), "image": torch.ones(9, 3)},
        lambda: collections.UserDict({"boxes": torch.zeros(0, 4), "image": torch.ones(9, 3)}),
        lambda: (torch.zeros(0, 4), torch.ones(9, 3)),
        lambda: mm_collate([{"boxes": torch.zeros(0, 4), "image": torch.ones(3)}] * 9),
    ],
    ids=["dict", "mapping", "tuple", "batch"],
)
def test_a_first_tensor_of_no_rows_is_passed_over_in_every_container(make):
    meter = InputMeter([make(), make()])
    list(meter)
    assert meter.epoch.samples == 18


@pytest.mark.parametrize("wrap", ["meter", "prefetcher", "prefetcher_no_stats"])
def test_a_generator_passed_in_goes_on_after_a_break(wrap):
    # A generator is its own iterator: the caller's, as it would be without the wrapper.
    # Closing it when the loop's iterator is dropped lost the rest of the stream.
    def batches():
        for i in range(6):
            yield {"x": torch.full((2,), float(i))}

    source = batches()
    wrapped = {
        "meter": lambda: InputMeter(source),
        "prefetcher": lambda: Prefetcher(source, device="cpu"),
        "prefetcher_no_stats": lambda: Prefetcher(source, device="cpu", stats=False),
    }[wrap]()
    first = next(iter(wrapped))  # the loop's iterator dropped at once, as a `break` drops it
    assert first["x"][0] == 0
    assert [b["x"][0].item() for b in wrapped] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_plain_batch_between_two_of_one_layout_counts_each_as_itself():
    collated = mm_collate([{"img": torch.zeros(3, 8, 8)} for _ in range(4)])
    plain = {"tokens": torch.zeros(2, 5)}
    meter = InputMeter([collated, plain, collated, plain, collated])
    assert _drain(meter) == 5
    assert meter.epoch.batch_bytes == 3 * collated.layout.nbytes + 2 * 40
    assert meter.epoch.samples == 3 * 4 + 2 * 2


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_sparse_and_nested_tensors_are_counted():
    sparse = torch.eye(4).to_sparse()
    nested = torch.nested.as_nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)])
    assert count_batch({"adj": sparse}) == (4, sparse._indices().nbytes + sparse._values().nbytes)
    assert count_batch({"n": nested})[0] == 2
    assert count_batch([sparse, torch.zeros(4)]) == (4, 64 + 16 + 16)  # indices, values, the dense tensor
    # The Prefetcher's stats are on by default: a sparse batch must not stop the loop.
    assert len(list(Prefetcher([{"adj": sparse}], device="cpu"))) == 1


def test_an_attribute_dict_batch_is_counted_and_moved():
    # The attribute-dict idiom: __getattr__ is dict.__getitem__, which raises KeyError.
    class AttrDict(dict):
        __getattr__ = dict.__getitem__

    batch = AttrDict(x=torch.zeros(2, 3))
    meter = InputMeter([batch, batch])
    assert _drain(meter) == 2 and meter.epoch.samples == 4
    assert count_batch(batch) == (2, 24)
    (moved,) = list(Prefetcher([batch], device="cpu"))
    assert torch.equal(moved["x"], batch["x"])
    moved = pincollate.to_device(batch, "cpu")
    assert type(moved) is AttrDict and torch.equal(moved["x"], batch["x"])


def test_set_epoch_reaches_a_distributed_sampler_inside_a_batch_sampler():
    data = list(range(16))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data, batch_sampler=torch.utils.data.BatchSampler(sampler, 4, False))
    for wrapper in (InputMeter(loader), Prefetcher(loader, device="cpu")):
        orders = []
        for epoch in range(3):
            wrapper.set_epoch(epoch)
            orders.append([b.tolist() for b in wrapper])
            assert sampler.epoch == epoch
        assert orders[0] != orders[1] != orders[2]


def test_a_reset_inside_a_loop_counts_from_there_and_says_the_summary():
    lines: list[str] = []
    meter = InputMeter([{"x": torch.zeros(4)}] * 10, summary=lines.append)
    for i, _ in enumerate(meter):
        if i == 2:
            meter.reset()  # after a warm-up
            assert meter.epoch.batches == 0
    assert (meter.epoch.batches, meter.total.batches, meter.epoch.samples) == (7, 7, 28)
    assert len(lines) == 1 and lines[0].startswith("epoch 0: 7 batches")
    assert _drain(meter) == 10
    assert (meter.epoch.batches, meter.total.batches) == (10, 17)


def test_a_reset_inside_a_prefetcher_loop_counts_from_there():
    prefetcher = Prefetcher([{"x": torch.zeros(4)}] * 6, device="cpu", transform=lambda b: b)
    for i, _ in enumerate(prefetcher):
        if i == 1:
            prefetcher.stats.reset()
    assert (prefetcher.stats.epoch.batches, prefetcher.stats.total.batches) == (4, 4)


def test_a_reset_inside_an_inner_loop_keeps_the_outer_loop_counting():
    meter = InputMeter([{"x": torch.zeros(2)}] * 3)
    for outer, _ in enumerate(meter):
        if outer == 0:
            for j, _ in enumerate(meter):  # a nested pass over the same wrapper
                if j == 0:
                    meter.reset()
    # After the reset: the inner loop's 2 later batches, and the outer loop's 2 later batches.
    assert meter.total.batches == 4


def test_a_loop_left_by_break_closes_its_progress_bar(capsys):
    pytest.importorskip("tqdm")
    meter = InputMeter([{"x": torch.zeros(2)}] * 5, progress=True)
    iterator = iter(meter)
    next(iterator)
    bar = meter._clock._bar
    assert bar is not None
    del iterator  # what a `break` does to the loop's iterator
    assert meter._clock._bar is None and bar.disable  # tqdm marks a closed bar disabled


def test_an_empty_epoch_reports_no_input_bound_share():
    lines: list[str] = []
    meter = InputMeter([], summary=lines.append)
    assert _drain(meter) == 0
    assert meter.epoch.batches == 0 and meter.epoch.input_bound == 0.0
    assert lines == [lines[0]] and "the loader gave none" in lines[0] and "input-bound" not in lines[0]


def test_a_batch_that_is_a_list_of_mappings_counts_their_rows():
    # (inputs, targets) samples of dicts collate into a list of two dicts: the batch size is their rows.
    samples = [({"x": torch.zeros(3)}, {"y": torch.tensor(1)})] * 16
    for collate in (default_collate, MMCollate(pin_memory=False)):
        meter = InputMeter(DataLoader(samples, batch_size=8, collate_fn=collate))
        assert _drain(meter) == 2 and meter.epoch.samples == 16


def test_many_resets_inside_a_loop_leave_one_step_to_the_live_sums():
    prefetcher = Prefetcher([{"x": torch.zeros(2)}] * 40, device="cpu", transform=lambda b: b)
    iterator = iter(prefetcher)
    first = iterator._metering[1]
    for i, _ in enumerate(iterator):
        if i > 2:  # the iterator's own sums point straight at the newest once a batch was written there
            assert first.moved is prefetcher.stats._clock._current
        prefetcher.stats.reset()
    assert prefetcher.stats.epoch.batches == 0 and prefetcher.stats.total.batches == 0


def test_an_abandoned_iterators_release_during_a_new_epochs_start_leaves_its_bar(monkeypatch):
    pytest.importorskip("tqdm")
    meter = InputMeter([{"x": torch.zeros(2)}] * 5, progress=True)
    old = iter(meter)
    next(old)
    made = []
    real = meter_module._Sums.__init__

    def init(sums, *args, **kwargs):
        real(sums, *args, **kwargs)
        if not made and args:  # the new epoch's sums: the collector finalizes the last iterator here
            made.append(True)
            old.close(wait=False)

    monkeypatch.setattr(meter_module._Sums, "__init__", init)
    iterator = iter(meter)
    next(iterator)
    assert meter._clock._bar is not None and not meter._clock._bar.disable
