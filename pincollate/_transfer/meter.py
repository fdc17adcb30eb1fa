"""Is the loop waiting for data? A clock on the consumer's side of any loader.

A training loop does two things in turn: it waits for its next batch (inside ``next()``)
and it works on the batch it has (the step). :class:`InputMeter` wraps any iterable of
batches and times both, per epoch and over the run. The
:class:`~pincollate.Prefetcher` keeps the same figures (``Prefetcher.stats``) and adds
its staging thread's: reading the loader against pinning and copying, and on CUDA the
bytes copied and the device time of the copies.

Design choices, in short:

1. **A few clock reads and sums per batch, and no lock.** Only the consumer's thread
   writes a batch's figures, between two steps of a sequence number; a reader on
   another thread copies the sums and keeps the copy if the number was even and did
   not move (a seqlock), so a snapshot is whole (batches, samples and seconds of one
   moment) under free-threaded Python too. An uncontended lock per batch measured
   0.5% of a tiny training step (``python -m pincollate.bench --stats-cost``); the
   sequence number costs two additions. What other threads write (the staging
   thread's copy times) and what starts an epoch keep the clock's lock.
2. **A batch's figures travel with it.** The Prefetcher's staging thread times its
   read and its staging and counts the batch, and hands these over with the batch,
   so the figures count when the loop receives the batch, never ``depth`` ahead.
3. **An epoch is one iteration.** Each ``iter()`` starts new epoch sums (and
   ``set_epoch`` does, for a loop that reads the figures before iterating); the
   run's sums add up every epoch.
4. **Counting a batch is cheap or skipped.** A pincollate batch's bytes are its
   layout's; another batch's tensors are summed through the container registry.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from time import perf_counter, sleep
from typing import Any, Generic, TypeVar

import torch

from .._batch.batch import Batch
from .._batch.check import state_of
from .._errors import CollateError
from .._locks import new_lock
from .._types.kinds import kind_of

__all__ = [
    "Clock",
    "CopyTimes",
    "Counter",
    "InputMeter",
    "InputStats",
    "LoaderWrapper",
    "Metered",
    "Metering",
    "Stoppable",
    "Timeline",
    "close_source",
    "count_batch",
    "length_of",
    "pass_epoch",
]

T = TypeVar("T")

#: How often the progress bar's postfix (the input-bound share) is rewritten, in seconds.
_POSTFIX_EVERY = 0.5


@dataclasses.dataclass(frozen=True)
class InputStats:
    """What a loop's input cost it, over one epoch or over the run.

    Attributes:
        batches: batches the loop received.
        samples: samples in them: each batch's first tensor's length, depth first (the
            values of a mapping, a tuple, a list or a dataclass in order, passing over
            those that give none, such as a string; a list inside a mapping counts its
            items), or what ``samples=`` says; 0 where none is found.
        batch_bytes: bytes of the batches' tensors as the loader gave them, before a
            ``Prefetcher``'s transform (a pincollate batch: its buffer's used bytes, as
            collated, alignment included; a sparse COO tensor: its indices and values).
        waited_s: seconds the loop spent waiting for a batch, from asking for it
            (``next()``) to having it; the first includes starting the iteration (a
            ``DataLoader`` starting its workers).
        busy_s: seconds between receiving a batch and asking for the next: the loop's
            own work.
        loader_s: seconds spent reading the loader. In a ``Prefetcher`` on CUDA, on its
            staging thread: with ``DataLoader`` workers, how long their batches took to
            arrive; with ``num_workers=0``, loading and collating in this process.
        staging_s: seconds the ``Prefetcher`` spent in this process staging batches:
            pinning, launching the copy and the transform (running them, without CUDA).
        h2d_bytes: bytes the ``Prefetcher`` copied from the host to the device.
        copy_s: device seconds of those copies, estimated from the copies of every
            16th batch (the second, the 18th, ...) timed with CUDA events (0 without CUDA).

    Example:
        >>> from pincollate import InputStats
        >>> stats = InputStats(batches=10, samples=320, waited_s=3.0, busy_s=1.0)
        >>> stats.input_bound, stats.batches_per_s, stats.samples_per_s
        (0.75, 2.5, 80.0)
    """

    batches: int = 0
    samples: int = 0
    batch_bytes: int = 0
    waited_s: float = 0.0
    busy_s: float = 0.0
    loader_s: float = 0.0
    staging_s: float = 0.0
    h2d_bytes: int = 0
    copy_s: float = 0.0

    @property
    def elapsed_s(self) -> float:
        """Seconds the loop ran: waiting plus working."""
        return self.waited_s + self.busy_s

    @property
    def input_bound(self) -> float:
        """The share of the loop's time spent waiting for data, from 0 to 1.

        Near 0 the loop is compute-bound: faster input would not speed it up. Near 1
        the step waits for every batch: the input pipeline sets the pace. 0 where no
        batch arrived (an empty epoch's start is no wait for data).
        """
        if not self.batches:  # no batch arrived: nothing was waited for
            return 0.0
        return self.waited_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches per second of the loop's time."""
        return self.batches / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples per second of the loop's time."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def batch_bytes_per_s(self) -> float:
        """Bytes of batches per second of the loop's time."""
        return self.batch_bytes / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def h2d_bytes_per_s(self) -> float:
        """Bytes copied to the device per second of the loop's time."""
        return self.h2d_bytes / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def copy_bytes_per_s(self) -> float:
        """The copies' own speed: bytes per device second of copying (pageable memory is slow)."""
        return self.h2d_bytes / self.copy_s if self.copy_s > 0 else 0.0

    @property
    def staging_share(self) -> float:
        """Of the time spent producing batches, the share of this process's staging.

        Against reading the loader: near 1, pinning and copying are the bottleneck
        (``pin_slots``, a smaller batch); near 0, the loader is.
        """
        produced = self.loader_s + self.staging_s
        return self.staging_s / produced if produced > 0 else 0.0

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """The figures by name, for a logger; the Prefetcher's and CUDA's only where measured.

        Example:
            >>> from pincollate import InputStats
            >>> sorted(InputStats(batches=2, waited_s=1.0, busy_s=1.0).as_dict("data/"))
            ['data/batches', 'data/batches_per_s', 'data/busy_s', 'data/input_bound', 'data/waited_s']
        """
        figures: dict[str, float] = {
            "input_bound": self.input_bound,
            "batches": float(self.batches),
            "batches_per_s": self.batches_per_s,
            "waited_s": self.waited_s,
            "busy_s": self.busy_s,
        }
        if self.samples:
            figures["samples_per_s"] = self.samples_per_s
        if self.batch_bytes:
            figures["batch_bytes_per_s"] = self.batch_bytes_per_s
        if self.staging_s:
            figures["staging_share"] = self.staging_share
        if self.h2d_bytes:
            figures["h2d_bytes_per_s"] = self.h2d_bytes_per_s
        if self.copy_s:
            figures["copy_s"] = self.copy_s
            figures["copy_bytes_per_s"] = self.copy_bytes_per_s
        return {prefix + name: value for name, value in figures.items()}

    def summary(self) -> str:
        """One line: the rates, and the share of the time spent waiting for data.

        Example:
            >>> from pincollate import InputStats
            >>> print(InputStats(batches=40, samples=1280, batch_bytes=4_000_000, waited_s=0.5, busy_s=1.5).summary())
            40 batches, 1,280 samples in 2.00 s: 20.0 batches/s, 640 samples/s, 2.0 MB/s; input-bound 25% (waited 0.50 s)
        """
        if not self.batches:
            return f"0 batches in {self.elapsed_s:.2f} s: the loader gave none"
        parts = [f"{self.batches:,} batches"]
        if self.samples:
            parts.append(f"{self.samples:,} samples")
        rates = [f"{self.batches_per_s:.1f} batches/s"]
        if self.samples:
            rates.append(f"{self.samples_per_s:,.0f} samples/s")
        if self.batch_bytes:
            rates.append(f"{_size(self.batch_bytes_per_s)}/s")
        line = f"{', '.join(parts)} in {self.elapsed_s:.2f} s: {', '.join(rates)}; "
        line += f"input-bound {self.input_bound:.0%} (waited {self.waited_s:.2f} s)"
        if self.staging_share >= 0.005:
            line += f"; staging {self.staging_share:.0%} of producing"
        if self.h2d_bytes:
            line += f"; {_size(self.h2d_bytes)} to the device"
            if self.copy_s:
                line += f" at {_size(self.copy_bytes_per_s)}/s"
        return line


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


# --- counting a batch -----------------------------------------------------------------


def _first_length(tree: Any, top: bool, depth: int) -> int:
    """The batch's samples: the first tensor's (or per-sample list's) length, depth first.

    Values that give none (a string, a 0-d tensor, an empty list) are passed over: a
    mapping whose first value is a split name, a ``BatchEncoding``, a dataclass count
    by the tensor after it.
    """
    if isinstance(tree, torch.Tensor):
        # size(0), not shape[0]: a strided nested tensor has no shape.
        return int(tree.size(0)) if tree.dim() else 0
    if depth > 8:
        return 0
    if isinstance(tree, dict):  # a Batch: read on every batch, so without the Mapping ABC's check
        for value in tree.values():
            if type(value) is torch.Tensor and value.dim() and value.size(0):
                return int(value.size(0))
            found = _first_length(value, False, depth + 1)
            if found:
                return found
        return 0
    if isinstance(tree, Mapping):
        values: Iterable[Any] = tree.values()
    elif isinstance(tree, (list, tuple)):
        if not top and not hasattr(tree, "_fields"):
            return len(tree)  # a per-sample list inside the batch
        values = tree
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        values = (getattr(tree, field.name, None) for field in dataclasses.fields(tree))
    else:
        return 0
    for value in values:
        found = _first_length(value, False, depth + 1)
        if found:
            return found
    return 0


def _nbytes(t: torch.Tensor) -> int:
    """A tensor's bytes: its elements' for a strided one; a sparse COO tensor's indices and values."""
    try:
        return int(t.nbytes)
    except (RuntimeError, NotImplementedError):  # "nbytes is not defined for sparse tensors"
        if t.layout is torch.sparse_coo:
            return int(t._indices().nbytes + t._values().nbytes)
        return 0


def _tensor_bytes(tree: Any, depth: int) -> int:
    if isinstance(tree, torch.Tensor):
        return _nbytes(tree)
    if depth > 100:
        return 0
    if type(tree) is dict:
        values: Iterable[Any] = tree.values()
    else:
        kind = kind_of(tree)
        if kind is None:
            return 0
        values = kind.children(tree)
    total = 0
    for value in values:
        # Most batches are dicts of strided tensors: those without a call each.
        if type(value) is torch.Tensor and value.layout is torch.strided:
            total += value.nbytes
        else:
            total += _tensor_bytes(value, depth + 1)
    return total


def count_batch(batch: Any) -> tuple[int, int]:
    """``(samples, bytes)`` of a batch, as :class:`InputStats` counts them.

    Example:
        >>> count_batch({"x": torch.zeros(4, 3), "names": ["a", "b", "c", "d"]})
        (4, 48)
        >>> count_batch([torch.zeros(8, 2, dtype=torch.uint8), torch.arange(8)])
        (8, 80)
    """
    carried = state_of(batch)
    nbytes = carried[0].nbytes if carried is not None else _tensor_bytes(batch, 0)
    return _first_length(batch, True, 0), nbytes


#: Layouts whose counts a counter keeps: one per DataLoader worker, and some to spare.
_LAYOUTS_KEPT = 64


class Counter:
    """A :func:`count_batch` that remembers each pincollate layout's counts.

    A layout fixes every shape of its batch, so its samples and bytes are counted
    once; a batch of a layout seen before costs a lookup. With ``samples`` the samples
    are the callable's, for every batch (``by_layout`` is then false).
    """

    __slots__ = ("by_layout", "known", "samples")

    def __init__(self, samples: Callable[[Any], int] | None = None):
        self.samples = samples
        self.by_layout = samples is None
        self.known: dict[int, tuple[Any, int]] = {}

    def __call__(self, batch: Any) -> tuple[int, int]:
        carried = state_of(batch)
        if self.samples is not None:
            samples = self.samples(batch)
            try:
                return operator.index(samples), count_batch(batch)[1]
            except TypeError:
                raise CollateError(
                    f"InputMeter(samples=...) must return an int for a batch, got {type(samples).__name__}"
                ) from None
        if carried is None:
            return count_batch(batch)
        layout = carried[0]
        known = self.known
        found = known.get(id(layout))
        if found is None or found[0] is not layout:
            if len(known) >= _LAYOUTS_KEPT:
                known.clear()
            found = known[id(layout)] = (layout, layout.nbytes)  # the layout kept alive: its id is not reused
        # The samples read from the batch itself (a first value is one read): a batch changed
        # after collating (a wrapper that slices it) counts its own rows.
        return _first_length(batch, True, 0), found[1]


# --- the sums and the clock -----------------------------------------------------------


class _Sums:
    """One epoch's running sums. The consumer's thread writes a batch's figures between
    two steps of ``seq`` (odd while writing); readers take a :meth:`snapshot`. The rest
    is written and read under the clock's lock.

    The loop's time is one line from ``start``: waits and work in turn, up to ``last``
    (when the last batch was handed over, or the loop asked past the end). So the work
    is what of that line was not waiting, and a batch costs no sum for it.

    ``moved`` is where an iteration's figures go on after :meth:`Clock.reset`: the fresh
    sums that replaced these while their iteration ran. Every writer follows it
    (:meth:`live`), so a reset inside a loop starts the figures there, not stops them.
    """

    __slots__ = (
        "batch_bytes",
        "batches",
        "busy",
        "h2d_bytes",
        "last",
        "loader",
        "moved",
        "open",
        "reads_loader",
        "samples",
        "seq",
        "staging",
        "start",
        "timed_bytes",
        "timed_s",
        "waited",
    )

    def __init__(self, start: float = 0.0, reads_loader: bool = False) -> None:
        self.batches = self.samples = self.batch_bytes = self.h2d_bytes = self.timed_bytes = 0
        self.waited = self.busy = self.loader = self.staging = self.timed_s = 0.0
        self.start = self.last = start
        self.seq = 0
        # The consumer reads the loader itself: its waits are the loader's time, not summed twice.
        self.reads_loader = reads_loader
        #: Whether an iteration may still write these sums (Clock.begin's; finished or closed: not).
        self.open = False
        self.moved: _Sums | None = None

    def live(self) -> _Sums:
        """The sums an iteration that began with these writes now (these, unless reset since)."""
        sums = self
        while sums.moved is not None:
            sums = sums.moved
        # Each sums on the way points at the newest: a writer that kept these walks one step later.
        step = self
        while step.moved is not None and step.moved is not sums:
            step.moved, step = sums, step.moved
        return sums

    def snapshot(self) -> _Sums:
        """A whole copy, taken while the consumer's thread may be writing a batch's figures."""
        while True:
            seq = self.seq
            if not seq & 1:
                copy = _Sums.__new__(_Sums)
                for name in _Sums.__slots__:
                    setattr(copy, name, getattr(self, name))
                if self.seq == seq:
                    return copy
            sleep(0)  # a batch's figures half written: let the writer's thread finish them

    def work(self) -> float:
        """Seconds of the loop's own work: this epoch's line less its waits, plus what was folded in."""
        return self.busy + max(0.0, self.last - self.start - self.waited)

    def fold(self, epoch: _Sums) -> None:
        """Add a finished epoch's sums (its work and its loader time settled) to these, the run's."""
        for name in _FOLDED:
            setattr(self, name, getattr(self, name) + getattr(epoch, name))
        self.busy += epoch.work() - epoch.busy
        if epoch.reads_loader:
            self.loader += epoch.waited

    def stats(self) -> InputStats:
        # The copies timed stand for all of them: their speed, times the bytes copied.
        copy_s = self.timed_s * self.h2d_bytes / self.timed_bytes if self.timed_bytes else 0.0
        return InputStats(
            self.batches,
            self.samples,
            self.batch_bytes,
            self.waited,
            self.work(),
            self.loader + self.waited if self.reads_loader else self.loader,
            self.staging,
            self.h2d_bytes,
            copy_s,
        )


_FOLDED = tuple(
    name for name in _Sums.__slots__ if name not in ("start", "last", "moved", "open", "reads_loader", "seq")
)


class Clock:
    """The sums of the current epoch and of the run, the epoch's number, its bar and its summary.

    Iterators write a batch's figures (:class:`Metered`, :meth:`step_staged`), on the consumer's thread; the
    Prefetcher's staging thread adds copy times with :meth:`add_copies`; any thread
    reads :attr:`epoch` and :attr:`total`.
    """

    def __init__(self, progress: bool = False, summary: bool | Callable[[str], None] = False):
        if progress:
            try:
                import tqdm  # noqa: F401
            except ImportError as error:
                raise ImportError("progress=True needs tqdm: pip install tqdm") from error
        if not (isinstance(summary, bool) or callable(summary)):
            raise CollateError(f"summary=... must be a bool or a callable taking a line, got {summary!r}")
        self.lock = new_lock()
        self.progress = progress
        self.say: Callable[[str], None] | None = print if summary is True else (summary or None)
        self.number = -1
        self._next: int | None = None
        self._current = _Sums()
        self._past = _Sums()
        #: Earlier iterations' sums, still open: an iteration begun while another ran (nested loops
        #: over one wrapper, a validation pass inside an epoch). Counted in the run's total as they
        #: grow, folded into ``_past`` once they finish or close.
        self._running: list[_Sums] = []
        #: Sums whose iteration finished or closed, to fold by the next call that holds the lock.
        self._released: deque[_Sums] = deque()
        self._bar: Any = None
        self._shown = 0.0

    @property
    def epoch(self) -> InputStats:
        with self.lock:
            return self._current.snapshot().stats()

    @property
    def total(self) -> InputStats:
        with self.lock:
            self._settle()
            total = _Sums()
            total.fold(self._past)
            for running in self._running:
                total.fold(running.snapshot())
            total.fold(self._current.snapshot())
            return total.stats()

    def reset(self) -> None:
        """Forget every figure. An iteration still running goes on counting from now, as epoch 0."""
        now = perf_counter()
        with self.lock:
            self._settle()
            current = self._current
            self._current = self._fresh(current, now) if current.open else _Sums()
            self._running = [self._fresh(running, now) for running in self._running]
            self._past = _Sums()
            self.number, self._next = (0 if current.open else -1), None

    @staticmethod
    def _fresh(sums: _Sums, now: float) -> _Sums:
        """New sums, from ``now``, for the open iteration writing ``sums``; its writers follow ``moved`` there."""
        fresh = _Sums(now, sums.reads_loader)
        fresh.open = True
        sums.moved = fresh
        return fresh

    def renumber(self, epoch: int) -> None:
        """``set_epoch(epoch)``: new epoch sums now, and the next iteration is epoch ``epoch``."""
        with self.lock:
            self._settle()
            self._retire(self._current)
            self._current = _Sums()
            self._next = epoch

    def _retire(self, sums: _Sums) -> None:
        """The current sums give way to a new epoch's (under the lock): folded, or kept while open."""
        if sums.open:
            self._running.append(sums)
        else:
            self._past.fold(sums)

    def release(self, sums: _Sums) -> None:
        """An iteration finished or closed: nothing writes ``sums`` any more.

        Never takes the lock: a garbage collector's close (an iterator's ``__del__``) may run on
        a thread that holds it, inside a locked call; the next locked call folds ``sums``. The
        current iteration's bar closes (a loop left by ``break`` leaves none drawn).
        """
        sums = sums.live()
        sums.open = False
        self._released.append(sums)
        bar = self._bar
        if bar is not None and sums is self._current:
            self._bar = None
            # Read without a snapshot: a collector's close may run on the writer's thread between
            # its two steps of the sequence number, where a snapshot would wait for ever.
            elapsed = sums.waited + sums.work()
            if sums.batches and elapsed > 0:
                bar.set_postfix_str(f"input-bound {sums.waited / elapsed:.0%}", refresh=False)
            bar.close()

    def _settle(self) -> None:
        """Fold the released sums of earlier iterations into the run's (under the lock)."""
        while self._released:
            sums = self._released.popleft()
            for i, running in enumerate(self._running):
                if running is sums:
                    del self._running[i]
                    self._past.fold(sums)
                    break

    def begin(self, length: int | None, reads_loader: bool = True) -> _Sums:
        """A new iteration, starting now: new epoch sums (the last epoch's join the run's), and its bar.

        ``reads_loader``: the consumer reads the loader itself (not a staging thread).
        """
        self._close_bar()
        start = perf_counter()
        with self.lock:
            self._settle()
            self._retire(self._current)
            sums = self._current = _Sums(start, reads_loader)
            sums.open = True
            self.number = self._next if self._next is not None else self.number + 1
            self._next = None
        self._shown = start
        if self.progress:
            # Made once these sums are current: a collector's release of the last iteration's
            # (an abandoned iterator) closes only a bar of sums that are still current.
            from tqdm import tqdm

            self._bar = tqdm(total=length, desc=f"epoch {self.number}", unit="batch", file=sys.stderr)
        return sums

    def started(self, sums: _Sums) -> None:
        """The iteration's start is over (the loader's iterator made): that was waiting."""
        now = perf_counter()
        with self.lock:
            sums = sums.live()
            sums.waited += now - sums.start
            sums.last = now

    def step_staged(
        self,
        sums: _Sums,
        asked: float,
        got: float,
        count: tuple[int, int],
        loader: float,
        staging: float,
        h2d: int,
    ) -> None:
        """One Prefetcher batch asked for at ``asked`` and handed over at ``got``, with its staging figures."""
        if sums.moved is not None:
            sums = sums.live()
        sums.seq += 1
        try:
            sums.batches += 1
            sums.waited += got - asked
            sums.samples += count[0]
            sums.batch_bytes += count[1]
            sums.last = got
            sums.loader += loader
            sums.staging += staging
            sums.h2d_bytes += h2d
        finally:  # even where a figure is not a number: readers never wait forever
            sums.seq += 1
        if self._bar is not None:
            self._tick(got)

    def arrive(self, sums: _Sums, at: float, batches: int, count: tuple[int, int]) -> None:
        """A framework's hook: a step received its batch at ``at``; since the last mark it waited."""
        if sums.moved is not None:
            sums = sums.live()
        sums.seq += 1
        try:
            sums.batches += batches
            sums.waited += at - sums.last
            sums.samples += count[0]
            sums.batch_bytes += count[1]
            sums.last = at
        finally:  # even where a figure is not a number: readers never wait forever
            sums.seq += 1

    def _tick(self, got: float) -> None:
        self._bar.update(1)
        if got - self._shown > _POSTFIX_EVERY:
            self._shown = got
            self._bar.set_postfix_str(f"input-bound {self.epoch.input_bound:.0%}", refresh=False)

    def add(self, sums: _Sums, **figures: float) -> None:
        """Any of a batch's sums by name (the framework callbacks' slower path), on the consumer's thread."""
        sums = sums.live()
        sums.seq += 1
        try:
            for name, value in figures.items():
                setattr(sums, name, getattr(sums, name) + value)
        finally:  # even where a figure is not a number: readers never wait forever
            sums.seq += 1

    def mark(self, sums: _Sums, at: float) -> None:
        """The loop's line reaches ``at``: the time since the last mark that was not waiting was work."""
        sums.live().last = at  # one write: whole to any reader

    def add_copies(self, sums: _Sums, seconds: float, nbytes: int) -> None:
        with self.lock:
            sums = sums.live()
            sums.timed_s += seconds
            sums.timed_bytes += nbytes

    def finish(self, sums: _Sums, asked: float) -> None:
        """The loop asked past the epoch's end at ``asked``: the last step's work counts, the bar
        closes, the summary is said."""
        sums = sums.live()
        self.mark(sums, asked)
        self.release(sums)
        self._close_bar()
        if self.say is not None and sums is self._current:
            self.say(f"epoch {self.number}: {self.epoch.summary()}")

    def _close_bar(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.set_postfix_str(f"input-bound {self.epoch.input_bound:.0%}", refresh=False)
            bar.close()


def pass_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the loader's sampler, batch sampler (and the sampler inside it) and
    dataset, where they have it; else on the loader itself.

    A ``DataLoader(batch_sampler=BatchSampler(DistributedSampler(...), ...))`` keeps its
    ``DistributedSampler`` inside the batch sampler: without the call there, every epoch
    would draw the same order.
    """
    seen: set[int] = set()
    found = False
    batch_sampler = getattr(loader, "batch_sampler", None)
    for target in (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(loader, "dataset", None),
    ):
        if target is None or id(target) in seen:
            continue
        seen.add(id(target))
        if callable(getattr(target, "set_epoch", None)):
            target.set_epoch(epoch)
            found = True
    if not found and callable(getattr(loader, "set_epoch", None)):
        loader.set_epoch(epoch)


def length_of(loader: Any) -> int | None:
    """``len(loader)``, or ``None`` for a loader without one (an iterable dataset's ``DataLoader`` raises)."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


#: What an iterator that meters needs: the clock, the epoch's sums, and how to count a batch.
Metering = tuple[Clock, _Sums, Callable[[Any], tuple[int, int]]]


# --- the wrapper ------------------------------------------------------------------------


class LoaderWrapper:
    """What a wrapper of a loader passes through to it: ``len()``, ``dataset``, ``sampler``,
    ``batch_sampler`` and ``set_epoch`` (which also starts the wrapper's new epoch figures).

    Frameworks read these from whatever they iterate (Lightning's epoch loop calls
    ``set_epoch``; progress bars read ``len()``), so a wrapped loader stands where the loader did.
    """

    loader: Any

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler

    def set_epoch(self, epoch: int) -> None:
        """Call ``set_epoch(epoch)`` on the loader's sampler, batch sampler and dataset, where they have it
        (else on the loader), and start new epoch figures."""
        pass_epoch(self.loader, epoch)
        self._renumber(epoch)

    def _renumber(self, epoch: int) -> None:
        """Number the wrapper's next epoch figures ``epoch``."""


class InputMeter(LoaderWrapper, Generic[T]):
    """Iterate any loader, timing how long the loop waits for each batch.

    Wraps a ``DataLoader``, Ray's ``iter_torch_batches``, a torchdata node, a list:
    anything iterable. Per batch it reads the clock twice and adds a few numbers. Read
    :attr:`epoch` (the current or last epoch) and :attr:`total` (the run) at any time,
    from any thread; each is an :class:`InputStats`. ``len()``, ``dataset``,
    ``sampler``, ``batch_sampler`` and ``set_epoch`` pass through to the loader.

    Args:
        loader: any iterable of batches.
        progress: show a tqdm progress bar per epoch with batches/s and the
            input-bound share.
        summary: at the end of each epoch, print one line of figures (``True``), or
            pass it to a callable (``logging.getLogger(...).info``, say).
        samples: how many samples a batch holds, where the default (the first
            tensor's length) does not fit.

    What to do with the figures: ``epoch.input_bound`` near 1 means the step waits for
    data (more ``DataLoader`` workers, ``MMCollate(pin_slots=True)``, a policy that
    pads less, a transform moved to the GPU); near 0, the model sets the pace.

    Example:
        >>> import time
        >>> import torch
        >>> from pincollate import InputMeter
        >>> def slow_batches():
        ...     for i in range(3):
        ...         time.sleep(0.02)
        ...         yield {"x": torch.zeros(4, 2)}
        >>> meter = InputMeter(slow_batches())
        >>> for batch in meter:
        ...     pass
        >>> meter.epoch.batches, meter.epoch.samples, meter.epoch.input_bound > 0.5
        (3, 12, True)
    """

    def __init__(
        self,
        loader: Iterable[T],
        *,
        progress: bool = False,
        summary: bool | Callable[[str], None] = False,
        samples: Callable[[T], int] | None = None,
    ):
        if samples is not None and not callable(samples):
            raise CollateError(f"InputMeter(samples=...) must be a callable taking a batch, got {samples!r}")
        self.loader: Iterable[T] = loader
        self._clock = Clock(progress, summary)
        self._count = Counter(samples)

    @property
    def epoch(self) -> InputStats:
        """The figures of the current epoch (the last one, between epochs)."""
        return self._clock.epoch

    @property
    def total(self) -> InputStats:
        """The figures of every epoch so far together."""
        return self._clock.total

    def reset(self) -> None:
        """Forget every epoch's figures. A loop still running (a reset after its warm-up batches) goes
        on counting from here, as epoch 0, and says its summary at its end."""
        self._clock.reset()

    def __iter__(self) -> Iterator[T]:
        clock = self._clock
        sums = clock.begin(length_of(self.loader))
        try:
            source = iter(self.loader)
        except BaseException:
            clock.release(sums)  # no epoch began: none is left open
            raise
        clock.started(sums)
        return Metered(source, clock, sums, self._count, owned=source is not self.loader)

    def _renumber(self, epoch: int) -> None:
        self._clock.renumber(epoch)


class Stoppable:
    """An iterator over a loader whose ``close`` may wait for a thread still inside the loader."""

    def close(self, wait: bool = True) -> None:
        raise NotImplementedError


def close_source(source: Any, wait: bool) -> None:
    """Close ``source`` where it can be closed. Only an iterator the wrapper made (``iter(loader)``
    that is not the loader itself) is closed: a generator the user passed stays theirs, and a
    loop left by ``break`` goes on where it stopped, as it would without the wrapper.

    ``wait=False`` is the garbage collector's close: it runs on whatever thread dropped the
    last reference (the training loop's, after a ``break``) and must never stall it on a
    thread still inside a slow loader; that thread stops at its next check.
    """
    if isinstance(source, Stoppable):
        source.close(wait=wait)
        return
    close = getattr(source, "close", None)
    if close is not None:
        close()  # a generator's, say: it never waits


class Metered(Stoppable, Iterator[T]):
    """An iterator that times each wait on ``source`` and counts each batch into ``sums``.

    The consumer's per-batch cost is what the meter costs a loop, so the common case is
    inline: two clock reads, one lookup of the batch's layout (a pincollate batch of
    the layout seen last has its counts already), and five sums between two steps of
    the sequence number. ``owned``: ``source`` was made by the wrapper (closed with it; see
    :func:`close_source`).
    """

    __slots__ = ("_by_layout", "_clock", "_count", "_counted", "_done", "_layout", "_owned", "_source", "_sums")

    def __init__(
        self,
        source: Iterator[T],
        clock: Clock,
        sums: _Sums,
        count: Callable[[Any], tuple[int, int]],
        owned: bool = True,
    ):
        self._source = source
        self._owned = owned
        self._clock = clock
        self._sums = sums
        self._count = count
        # A layout fixes its batch's samples and bytes, unless samples are the user's to count.
        self._by_layout = isinstance(count, Counter) and count.by_layout
        self._layout: Any = None
        self._counted = (0, 0)
        self._done = False

    def __next__(self) -> T:
        asked = perf_counter()
        try:
            batch = next(self._source)
        except StopIteration:
            if not self._done:
                self._done = True
                self._clock.finish(self._sums, asked)
            raise
        got = perf_counter()
        # state_of, inline: read only from a batch class (an attribute dict's __getattr__ raises KeyError).
        carried = batch._pincollate if hasattr(type(batch), "_pincollate") else None  # type: ignore[attr-defined]
        if carried is not None and carried[0] is self._layout:
            # The bytes are the layout's; the samples the batch's own (it may have changed after
            # collating): a Batch's first tensor read inline, the rest by the walk.
            nbytes = self._counted[1]
            first = next(iter(batch.values()), None) if type(batch) is Batch else None  # type: ignore[attr-defined]
            samples = first.shape[0] if type(first) is torch.Tensor and first.ndim else 0
            if not samples:  # not a tensor first, or one of no rows (a Concat of nothing): the walk passes over it
                samples = _first_length(batch, True, 0)
        else:
            samples, nbytes = self._counted = self._count(batch)
            # Counted by its layout only where the count came from it: a batch of another kind
            # between two of one layout counts anew the next of that layout.
            self._layout = carried[0] if carried is not None and self._by_layout else None
        sums = self._sums
        if sums.moved is not None:  # the meter was reset during this iteration
            sums = self._sums = sums.live()
        sums.seq += 1
        try:
            sums.batches += 1
            sums.waited += got - asked
            sums.samples += samples
            sums.batch_bytes += nbytes
            sums.last = got
        finally:  # even where a figure is not a number: readers never wait forever
            sums.seq += 1
        if self._clock._bar is not None:
            self._clock._tick(got)
        return batch

    def close(self, wait: bool = True) -> None:
        """Close the source (a Prefetcher's pin thread, a generator) where it can be closed; its figures are whole."""
        if getattr(self, "_owned", False):
            close_source(self._source, wait)
        clock = getattr(self, "_clock", None)
        if clock is not None:
            clock.release(self._sums)

    def __del__(self) -> None:
        self.close(wait=False)


# --- told by a framework's hooks --------------------------------------------------------


class Timeline:
    """The same figures told by a training framework's hooks instead of by iterating.

    :meth:`arrived` when a step receives its batch (the time since the last mark was
    waiting), :meth:`worked` when the loop finished work that is not waiting for data
    (a step, logging, validation: the time since the last mark was work).

    Example:
        >>> timeline = Timeline()
        >>> timeline.begin()
        >>> timeline.arrived({"x": torch.zeros(8, 2)})
        >>> timeline.worked()
        >>> timeline.epoch.batches, timeline.epoch.samples
        (1, 8)
    """

    def __init__(self, samples: Callable[[Any], int] | None = None):
        self.clock = Clock()
        self._count = Counter(samples)
        self._sums: _Sums | None = None

    @property
    def epoch(self) -> InputStats:
        return self.clock.epoch

    @property
    def total(self) -> InputStats:
        return self.clock.total

    def begin(self) -> None:
        """A new epoch: the loop starts waiting for its first batch now."""
        self._sums = self.clock.begin(None)

    def arrived(self, batch: Any = None, batches: int = 1) -> None:
        """The step has its batch (``None``: not shown to the hook); ``batches`` counts it."""
        if self._sums is not None:
            now = perf_counter()
            self.clock.arrive(self._sums, now, batches, (0, 0) if batch is None else self._count(batch))

    def count(self, batches: int) -> None:
        """Batches the step used beyond those :meth:`arrived` counted (gradient accumulation)."""
        if self._sums is not None:
            self.clock.add(self._sums, batches=batches)

    def worked(self) -> None:
        """The loop did its own work since the last mark; it waits for data from now."""
        if self._sums is not None:
            self.clock.mark(self._sums, perf_counter())


class CopyTimes:
    """Device time of the Prefetcher's copies, timed on every ``every``-th batch with CUDA events
    (from the second: the first copy of an epoch may be cold).

    Recorded on the staging thread, read back there once the device has run them, so
    nothing waits for the device until the epoch's end.
    """

    def __init__(self, clock: Clock, sums: _Sums, every: int = 16):
        self.clock = clock
        self.sums = sums
        self.every = every
        self.seen = 0
        self.pending: deque[tuple[Any, Any, int]] = deque()

    def due(self) -> bool:
        """Whether this batch's copy is timed."""
        self.seen += 1
        return self.seen % self.every == 2 % self.every

    def timed(self, begun: Any, copied: Any, nbytes: int) -> None:
        self.pending.append((begun, copied, nbytes))
        self.collect(wait=False)

    def collect(self, wait: bool) -> None:
        seconds, nbytes = 0.0, 0
        pending = self.pending
        while pending and (wait or pending[0][1].query()):
            begun, copied, size = pending.popleft()
            copied.synchronize()
            seconds += begun.elapsed_time(copied) / 1e3
            nbytes += size
        if nbytes:
            self.clock.add_copies(self.sums, seconds, nbytes)
