"""The Prefetcher's staging: batches read, pinned, copied and transformed ahead of the consumer.

A background thread (:class:`Ahead`) reads the loader and runs each batch's staging
work, ``depth`` batches ahead; on CUDA (:class:`CudaStaging`) that is a pin where the
loader did not pin, one copy and the transform on the prefetcher's side stream, an
event, and ``record_stream`` for the consumer's stream; the consumer's thread only
waits on the event. Without an accelerator :class:`Passthrough` moves and transforms
synchronously. With a meter (``Prefetcher.stats``) the staging thread times each read
and each staging and counts the batch, and the figures travel with the batch to the
consumer's thread, which adds them to the epoch's sums when it takes the batch. See
:mod:`pincollate._transfer.prefetch` for the design.
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any, Protocol

import torch

from .._batch.trees import reachable_tensors
from .._memory.arena import trim_pinned
from .meter import CopyTimes, Metering, Stoppable, close_source, count_batch
from .transfer import pin, to_device

__all__ = ["Ahead", "CudaStaging", "MeteredPassthrough", "Owner", "Passthrough", "moved"]


class Owner(Protocol):
    """What staging reads of its :class:`~pincollate.Prefetcher`."""

    device: torch.device
    transform: Callable[[Any], Any] | None
    pin: bool
    pinned_limit: int | None
    _stream: Any


_END = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error: BaseException = error


class _Staging:
    """What the staging thread works on. It holds no reference to its iterator, so
    dropping the iterator (an early ``break``) lets ``__del__`` stop the thread.

    ``permits`` bounds what is staged and not yet handed over to ``depth`` batches.
    With ``count`` each queued item is ``(staged, figures)``: the batch's samples and
    bytes, and the seconds of its read and of its staging.
    """

    def __init__(
        self,
        source: Iterator[Any],
        depth: int,
        work: Callable[[Any], Any],
        device: torch.device,
        count: Callable[[Any], tuple[int, int]] | None = None,
        at_end: Callable[[], None] | None = None,
    ):
        self.source: Iterator[Any] | None = source
        self.work: Callable[[Any], Any] = work
        self.queue: queue.Queue[Any] = queue.Queue()
        self.permits = threading.Semaphore(depth)
        self.stop = threading.Event()
        self.device: torch.device = device
        self.count = count
        self.at_end = at_end

    def run(self) -> None:
        # Thread-local: keeps the copies in pin() from competing with the consumer.
        torch.set_num_threads(1)
        if self.device.type == "cuda":
            # Pinned memory and streams belong to a device; a new thread starts on
            # device 0, which would put every DDP rank's staging on GPU 0.
            torch.cuda.set_device(self.device)
        try:
            count = self.count
            while self._permit():
                asked = perf_counter() if count is not None else 0.0
                try:
                    host = next(self.source)  # type: ignore[arg-type]
                except StopIteration:
                    if self.at_end is not None:
                        self.at_end()
                    self.queue.put(_END)
                    return
                if self.stop.is_set():
                    return
                if count is None:
                    self.queue.put(self.work(host))
                    continue
                read = perf_counter()
                staged = self.work(host)
                self.queue.put((staged, (count(host), read - asked, perf_counter() - read)))
        except BaseException as error:  # re-raised in the consumer
            # The error's traceback holds the loader's iterator (and so its worker
            # processes) for as long as the consumer keeps the error: end them now.
            shutdown = getattr(self.source, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self.queue.put(_Failure(error))
        finally:
            # Drop the loader's iterator here, on this thread: a DataLoader
            # iterator shuts its workers down when it is released.
            self.source = None
            _RUNNING.pop(threading.current_thread(), None)

    def _permit(self) -> bool:
        while not self.stop.is_set():
            if self.permits.acquire(timeout=0.1):
                return True
        return False


def transformed(transform: Callable[[Any], Any], batch: Any) -> Any:
    """``transform(batch)``; a ``StopIteration`` it raises is an error, not the end of the epoch.

    Raised from ``__next__`` it would end the loop as if the loader were exhausted, with
    no error (a generator turns it into ``RuntimeError`` for the same reason).
    """
    try:
        return transform(batch)
    except StopIteration as exc:
        raise RuntimeError("the Prefetcher's transform raised StopIteration") from exc


class Ahead(Stoppable, Iterator[Any]):
    """Batches from the loader, each passed through ``work`` on a background thread,
    ``depth`` ahead of the consumer; ``hand`` runs on the consumer's thread.

    With ``metering`` the consumer's waits and the staging thread's figures go to the
    meter's clock; ``at_end`` runs on the staging thread when the loader is exhausted.
    """

    def __init__(
        self,
        source: Iterator[Any],
        depth: int,
        work: Callable[[Any], Any],
        device: torch.device,
        hand: Callable[[Any], Any] | None = None,
        metering: Metering | None = None,
        at_end: Callable[[], None] | None = None,
        copies: bool = True,
    ):
        count = None if metering is None else metering[2]
        self._state = _Staging(source, depth, work, device, count, at_end)
        self._hand = hand
        # Whether a batch's bytes go to the device (the CUDA path's copy; a hand's move).
        self._copies = copies and hand is not None
        self._metering = metering
        self._done = False
        self._thread = threading.Thread(target=self._state.run, name="pincollate-prefetch", daemon=True)
        _RUNNING[self._thread] = self._state
        self._thread.start()

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        state = self._state
        asked = perf_counter()
        item = state.queue.get()
        if item is _END:
            if self._metering is not None:  # before close, which folds the sums of an earlier epoch
                self._metering[0].finish(self._metering[1], asked)
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            error = item.error
            if hasattr(error, "add_note"):
                error.add_note("(raised while pincollate.Prefetcher read the loader on its staging thread)")
            raise error
        state.permits.release()  # the next batch is staged while this one is used
        metering = self._metering
        if metering is not None:
            item, (count, read, staged) = item
        try:
            batch = item if self._hand is None else self._hand(item)
        except BaseException:
            # As a failure on the staging thread does: the iteration ends, its thread with it
            # (not left polling while the caller keeps the error).
            self.close()
            raise
        if metering is None:
            return batch
        got = perf_counter()
        h2d = count[1] if self._copies else 0
        metering[0].step_staged(metering[1], asked, got, count, read, staged, h2d)
        return batch

    def close(self, wait: bool = True) -> None:
        """Stop the thread and release what it holds; safe to call twice.

        With ``wait`` (an explicit close, the end of the loader) this waits, up to 10 s,
        for the thread to let the loader go. The garbage collector's close does not
        wait: it may run on the training thread while the staging thread is still
        inside the loader (a worker's slow batch), and it must not stall that thread.
        The staging thread stops at its next check either way.
        """
        self._done = True
        state = self._state
        state.stop.set()
        while True:
            try:
                state.queue.get_nowait()
            except Exception:  # queue.Empty; at interpreter exit, the module's names may be gone
                break
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._metering is not None:
            self._metering[0].release(self._metering[1])

    def __del__(self) -> None:
        if not self._done:
            self.close(wait=False)


#: Staging threads that may still run, with their state: stopped before the interpreter exits.
#: Each thread's own entry, since the iterator that started it may be gone (a loop's break).
_RUNNING: dict[threading.Thread, _Staging] = {}


@atexit.register
def _stop_running() -> None:
    """Stop every staging thread still running, before the interpreter tears down.

    A daemon thread still inside torch when the interpreter finalizes is stopped where
    it stands, which aborts the process ("terminate called without an active
    exception"): a loop left early (``break``, or ``next(iter(prefetcher))`` in a
    script) just before exit would end the run with a crash. They get two seconds,
    together, to let go.
    """
    running = list(_RUNNING.items())
    for _, state in running:
        state.stop.set()
    deadline = perf_counter() + 2  # two seconds for them all, not each
    for thread, _ in running:
        thread.join(timeout=max(0.0, deadline - perf_counter()))


def moved(owner: Owner, batch: Any) -> Any:
    """A batch moved (off the CPU) and transformed on the consumer's thread: where nothing stages
    it, or after the staging thread pinned it."""
    if owner.device.type != "cpu":
        batch = to_device(batch, owner.device)
    if owner.transform is not None:
        batch = transformed(owner.transform, batch)
    return batch


class Passthrough(Stoppable, Iterator[Any]):
    """No accelerator: move (a no-op on CPU) and transform, synchronously. ``owned``: ``source``
    was made by the Prefetcher (see :func:`~pincollate._transfer.meter.close_source`)."""

    def __init__(self, source: Iterator[Any], owner: Owner, owned: bool = True):
        self._source: Iterator[Any] = source
        self._owner: Owner = owner
        self._owned = owned

    def __next__(self) -> Any:
        return moved(self._owner, next(self._source))

    def close(self, wait: bool = True) -> None:
        if getattr(self, "_owned", False):
            close_source(self._source, wait)

    def __del__(self) -> None:
        self.close(wait=False)


class MeteredPassthrough(Passthrough):
    """:class:`Passthrough` that times the loop's waits: reading the source is the loader's
    time, moving and transforming the staging's. (With nothing to stage, the Prefetcher
    meters its loader as :class:`~pincollate._transfer.meter.Metered` does any.)"""

    def __init__(self, source: Iterator[Any], owner: Owner, metering: Metering, owned: bool = True):
        super().__init__(source, owner, owned)
        self._metering = metering
        self._done = False

    def __next__(self) -> Any:
        clock, sums, count = self._metering
        asked = perf_counter()
        try:
            host = next(self._source)
        except StopIteration:
            if not self._done:
                self._done = True
                clock.finish(sums, asked)
            raise
        read = perf_counter()
        owner = self._owner
        batch = moved(owner, host)
        got = perf_counter()
        counted = count(host)
        h2d = counted[1] if owner.device.type != "cpu" else 0
        clock.step_staged(sums, asked, got, counted, read - asked, got - read, h2d)
        return batch

    def close(self, wait: bool = True) -> None:
        super().close(wait)
        metering = getattr(self, "_metering", None)
        if metering is not None:
            metering[0].release(metering[1])


class CudaStaging:
    """The CUDA work of the staging thread and the hand-over on the consumer's.

    On the staging thread: pin what is not pinned, queue the one copy and the
    transform on the side stream, record an event, and ``record_stream`` every device
    storage the batch reaches for the consumer's stream (captured when iteration
    began), so the caching allocator cannot give the memory to the side stream's next
    batch while the consumer still reads it. On the consumer's thread: wait on the
    event, nothing else. With ``copies``, every 16th copy is timed with CUDA events
    (:class:`~pincollate._transfer.meter.CopyTimes`).
    """

    def __init__(self, owner: Owner, copies: CopyTimes | None = None):
        self.owner: Owner = owner
        self.consumer: Any = torch.cuda.current_stream(owner.device)
        self.count = 0
        self.copies = copies

    def stage(self, host: Any) -> tuple[Any, Any, Any]:
        owner = self.owner
        if owner.pin:
            host = pin(host)  # a batch already pinned (DataLoader's pin thread, a registered slot) as it is
        stream = owner._stream
        copies = self.copies
        timed = copies is not None and copies.due()
        with torch.cuda.device(owner.device), torch.cuda.stream(stream):
            if timed:
                begun = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                begun.record(stream)
            batch = to_device(host, owner.device, non_blocking=True)
            if timed:
                copied = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                copied.record(stream)
                copies.timed(begun, copied, count_batch(host)[1])  # type: ignore[union-attr]
            if owner.transform is not None:
                batch = transformed(owner.transform, batch)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        _record_stream(batch, self.consumer)
        self.count += 1
        if owner.pinned_limit is not None and self.count % 16 == 0:
            # Here, not on the consumer's thread: emptying the cache waits for the device.
            trim_pinned(owner.pinned_limit)
        return batch, event, self.consumer

    def flush(self) -> None:
        """The epoch's last timed copies read back (on the staging thread, at the loader's end)."""
        if self.copies is not None:
            self.copies.collect(wait=True)

    def hand(self, item: tuple[Any, Any, Any]) -> Any:
        batch, event, recorded = item
        consumer = torch.cuda.current_stream(self.owner.device)
        consumer.wait_event(event)
        if consumer != recorded:  # the consumer switched streams mid-epoch
            _record_stream(batch, consumer)
        return batch


def _record_stream(batch: Any, stream: Any) -> None:
    seen: set[int] = set()
    for t in reachable_tensors(batch):
        if t.device.type == "cuda":
            storage = t.untyped_storage().data_ptr()
            if storage not in seen:
                seen.add(storage)
                t.record_stream(stream)
