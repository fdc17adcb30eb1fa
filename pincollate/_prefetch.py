"""``Prefetcher``: batches copied to the accelerator ahead of the compute that needs them.

Design choices, in short:

1. **One side stream per prefetcher, created once.** A new stream per epoch would
   strand the caching allocator's blocks on streams nobody uses again.
2. **One copy per batch.** :func:`~pincollate.to_device` moves each storage's used
   span in one ``non_blocking`` copy; a pincollate batch has one storage.
3. **Staging off the training thread, ``depth`` batches ahead.** A background thread
   reads the loader, pins what the loader did not pin (one pinned allocation per
   batch), queues the copy and the transform on the side stream and records an event;
   at most ``depth`` staged batches wait for the consumer, and the next one is staged
   as soon as one is handed over, so with ``depth=1`` batch ``i + 1`` is copied while
   step ``i`` runs. The training thread only waits on the event.
4. **Memory safety across streams by** ``record_stream``. Device memory is
   allocated on the side stream and read on the consumer's; ``record_stream`` on
   one tensor per storage (every tensor the transform's result reaches, in any
   container or object) tells the caching allocator not to reuse it until the
   consumer's work is done. It costs one call per storage (one per batch), and
   unlike holding references until a later step it is correct however long the
   consumer keeps the batch. Pinned host memory needs nothing: the caching host
   allocator records an event for each non-blocking copy from it.
5. **The consumer waits on an event**, not on the whole side stream, so the copy of
   batch ``i + 1`` overlaps the compute of batch ``i``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, TypeVar

import torch

from ._arena import accelerator_can_pin, trim_pinned
from ._errors import CollateError
from ._transfer import pin, to_device
from ._trees import reachable_tensors

__all__ = ["Prefetcher"]

T = TypeVar("T")

_END = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error: BaseException = error


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Prefetcher(Generic[T]):
    """Iterate a loader with each batch already on ``device``, copied in advance.

    Args:
        loader: any iterable of batches, usually a ``DataLoader`` with
            ``collate_fn=pincollate.mm_collate``.
        device: where batches go; ``None`` picks the current CUDA device, else CPU.
        depth: how many batches are copied (and transformed) ahead, at least 1.
        transform: a callable applied to each batch on the device, in the prefetch
            stream (``pincollate.Normalize``, say).
        pin_memory: ``"auto"`` pins unpinned batches on a background thread when
            ``device`` is CUDA; ``True`` always does (an error if pinning is
            impossible); ``False`` never does.
        pinned_limit: bytes of pinned memory the CUDA host allocator may keep
            cached; past it the cache is emptied, so variable-size batches cannot
            grow pinned memory without bound. ``None``: no limit.

    Without an accelerator (``device`` is CPU) it is a synchronous passthrough that
    applies ``transform``. ``len()``, ``sampler``, ``batch_sampler``, ``dataset``
    and ``set_epoch`` pass through to the loader.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> import pincollate
        >>> loader = DataLoader([{"x": torch.ones(2)}] * 4, batch_size=2, collate_fn=pincollate.mm_collate)
        >>> batches = pincollate.Prefetcher(loader, device="cpu")
        >>> len(batches), [b["x"].shape for b in batches]
        (2, [torch.Size([2, 2]), torch.Size([2, 2])])
    """

    def __init__(
        self,
        loader: Iterable[T],
        device: torch.device | str | None = None,
        depth: int = 2,
        transform: Callable[[Any], Any] | None = None,
        pin_memory: bool | Literal["auto"] = "auto",
        pinned_limit: int | None = 4 << 30,
    ):
        if not isinstance(depth, int) or depth < 1:
            raise CollateError(f"Prefetcher(depth=...) must be a positive int, got {depth!r}")
        if pin_memory not in (True, False, "auto"):
            raise CollateError(f"Prefetcher(pin_memory=...) must be True, False or 'auto', got {pin_memory!r}")
        if transform is not None and not callable(transform):
            raise CollateError(f"Prefetcher(transform=...) must be callable, got {type(transform).__name__}")
        self.loader: Iterable[T] = loader
        self.device: torch.device = _default_device() if device is None else torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # Resolve "cuda" here, in the caller's thread (a DDP rank's device);
            # the pin thread would otherwise see device 0.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.depth: int = depth
        self.transform: Callable[[Any], Any] | None = transform
        self.pinned_limit: int | None = pinned_limit
        cuda = self.device.type == "cuda"
        if pin_memory is True and not accelerator_can_pin():
            raise CollateError("pin_memory=True but pinned memory is not available in this process")
        self.pin: bool = pin_memory is True or (pin_memory == "auto" and cuda and accelerator_can_pin())
        self._stream: Any = None

    # loader passthrough --------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        return self.loader.dataset  # type: ignore[attr-defined]

    @property
    def sampler(self) -> Any:
        return self.loader.sampler  # type: ignore[attr-defined]

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        """Call ``set_epoch(epoch)`` on the loader's sampler, batch sampler and dataset, where they have it."""
        seen: set[int] = set()
        found = False
        for name in ("sampler", "batch_sampler", "dataset"):
            target = getattr(self.loader, name, None)
            if target is None or id(target) in seen:
                continue
            seen.add(id(target))
            if callable(getattr(target, "set_epoch", None)):
                target.set_epoch(epoch)
                found = True
        if not found and callable(getattr(self.loader, "set_epoch", None)):
            self.loader.set_epoch(epoch)  # type: ignore[attr-defined]

    # iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        source: Iterator[Any] = iter(self.loader)
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            staging = _CudaStaging(self)
            return _Ahead(source, self.depth, staging.stage, self.device, staging.hand)
        if self.pin:
            source = _Ahead(source, self.depth, pin, self.device)
        return _Passthrough(source, self)


class _Staging:
    """What the staging thread works on. It holds no reference to its iterator, so
    dropping the iterator (an early ``break``) lets ``__del__`` stop the thread.

    ``permits`` bounds what is staged and not yet handed over to ``depth`` batches.
    """

    def __init__(self, source: Iterator[Any], depth: int, work: Callable[[Any], Any], device: torch.device):
        self.source: Iterator[Any] | None = source
        self.work: Callable[[Any], Any] = work
        self.queue: queue.Queue[Any] = queue.Queue()
        self.permits = threading.Semaphore(depth)
        self.stop = threading.Event()
        self.device: torch.device = device

    def run(self) -> None:
        # Thread-local: keeps the copies in pin() from competing with the consumer.
        torch.set_num_threads(1)
        if self.device.type == "cuda":
            # Pinned memory and streams belong to a device; a new thread starts on
            # device 0, which would put every DDP rank's staging on GPU 0.
            torch.cuda.set_device(self.device)
        try:
            while self._permit():
                try:
                    host = next(self.source)  # type: ignore[arg-type]
                except StopIteration:
                    self.queue.put(_END)
                    return
                if self.stop.is_set():
                    return
                self.queue.put(self.work(host))
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

    def _permit(self) -> bool:
        while not self.stop.is_set():
            if self.permits.acquire(timeout=0.1):
                return True
        return False


class _Ahead(Iterator[Any]):
    """Batches from the loader, each passed through ``work`` on a background thread,
    ``depth`` ahead of the consumer; ``hand`` runs on the consumer's thread."""

    def __init__(
        self,
        source: Iterator[Any],
        depth: int,
        work: Callable[[Any], Any],
        device: torch.device,
        hand: Callable[[Any], Any] | None = None,
    ):
        self._state = _Staging(source, depth, work, device)
        self._hand = hand
        self._done = False
        self._thread = threading.Thread(target=self._state.run, name="pincollate-prefetch", daemon=True)
        self._thread.start()

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        state = self._state
        item = state.queue.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            error = item.error
            if hasattr(error, "add_note"):
                error.add_note("(raised while pincollate.Prefetcher read the loader on its staging thread)")
            raise error
        state.permits.release()  # the next batch is staged while this one is used
        return item if self._hand is None else self._hand(item)

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
            except queue.Empty:
                break
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __del__(self) -> None:
        if not self._done:
            self.close(wait=False)


class _Passthrough(Iterator[Any]):
    """No accelerator: move (a no-op on CPU) and transform, synchronously."""

    def __init__(self, source: Iterator[Any], owner: Prefetcher[Any]):
        self._source: Iterator[Any] = source
        self._owner: Prefetcher[Any] = owner

    def __next__(self) -> Any:
        batch = next(self._source)
        owner = self._owner
        if owner.device.type != "cpu":
            batch = to_device(batch, owner.device)
        if owner.transform is not None:
            batch = owner.transform(batch)
        return batch

    def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        self.close()


class _CudaStaging:
    """The CUDA work of the staging thread and the hand-over on the consumer's.

    On the staging thread: pin what is not pinned, queue the one copy and the
    transform on the side stream, record an event, and ``record_stream`` every device
    storage the batch reaches for the consumer's stream (captured when iteration
    began), so the caching allocator cannot give the memory to the side stream's next
    batch while the consumer still reads it. On the consumer's thread: wait on the
    event, nothing else.
    """

    def __init__(self, owner: Prefetcher[Any]):
        self.owner: Prefetcher[Any] = owner
        self.consumer: Any = torch.cuda.current_stream(owner.device)
        self.count = 0

    def stage(self, host: Any) -> tuple[Any, Any, Any]:
        owner = self.owner
        if owner.pin:
            host = pin(host)  # a batch already pinned (DataLoader's pin thread, a registered slot) as it is
        stream = owner._stream
        with torch.cuda.device(owner.device), torch.cuda.stream(stream):
            batch = to_device(host, owner.device, non_blocking=True)
            if owner.transform is not None:
                batch = owner.transform(batch)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        _record_stream(batch, self.consumer)
        self.count += 1
        if owner.pinned_limit is not None and self.count % 16 == 0:
            # Here, not on the consumer's thread: emptying the cache waits for the device.
            trim_pinned(owner.pinned_limit)
        return batch, event, self.consumer

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
