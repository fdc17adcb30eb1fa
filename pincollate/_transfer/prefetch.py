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
6. **It measures itself where it stands.** It knows when the loop asked for a batch and
   when the batch was ready, and its staging thread times its reads and its staging:
   ``stats`` (an :class:`~pincollate.InputMeter`) says whether the loop waits for data.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Literal, TypeVar

import torch

from .._errors import CollateError
from .._memory.arena import accelerator_can_pin
from .meter import CopyTimes, InputMeter, LoaderWrapper, Metered, Metering, length_of
from .staging import Ahead, CudaStaging, MeteredPassthrough, Passthrough, moved
from .transfer import pin

__all__ = ["Prefetcher"]

T = TypeVar("T")


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Prefetcher(LoaderWrapper, Generic[T]):
    """Iterate a loader with each batch already on ``device``, copied in advance.

    Without an accelerator (``device`` is CPU) it is a synchronous passthrough that
    applies ``transform``. ``len()``, ``sampler``, ``batch_sampler``, ``dataset``
    and ``set_epoch`` pass through to the loader.

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
        stats: measure whether the loop waits for data (:attr:`stats`); a few clock
            reads per batch.
        progress: show a tqdm progress bar per epoch with batches/s and the
            input-bound share (needs ``stats``).
        summary: at the end of each epoch, print one line of figures (``True``), or
            pass it to a callable (needs ``stats``).

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> import pincollate
        >>> loader = DataLoader([{"x": torch.ones(2)}] * 4, batch_size=2, collate_fn=pincollate.mm_collate)
        >>> batches = pincollate.Prefetcher(loader, device="cpu")
        >>> len(batches), [b["x"].shape for b in batches]
        (2, [torch.Size([2, 2]), torch.Size([2, 2])])
        >>> batches.stats.epoch.batches, batches.stats.epoch.samples
        (2, 4)
    """

    def __init__(
        self,
        loader: Iterable[T],
        device: torch.device | str | None = None,
        depth: int = 2,
        transform: Callable[[Any], Any] | None = None,
        pin_memory: bool | Literal["auto"] = "auto",
        pinned_limit: int | None = 4 << 30,
        stats: bool = True,
        progress: bool = False,
        summary: bool | Callable[[str], None] = False,
    ):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise CollateError(f"Prefetcher(depth=...) must be a positive int, got {depth!r}")
        if not (isinstance(pin_memory, bool) or pin_memory == "auto"):
            # 1 == True: taken by a membership test, then read as not True.
            raise CollateError(f"Prefetcher(pin_memory=...) must be True, False or 'auto', got {pin_memory!r}")
        if not isinstance(stats, bool):
            raise CollateError(f"Prefetcher(stats=...) must be True or False, got {stats!r}")
        if pinned_limit is not None:
            try:  # an int of any kind (numpy's too); a float is refused, as a byte count is whole
                pinned_limit = operator.index(pinned_limit)
            except TypeError:
                pinned_limit = -1
            if isinstance(pinned_limit, bool) or pinned_limit < 0:
                raise CollateError(
                    f"Prefetcher(pinned_limit=...) must be a whole number of bytes (an int >= 0) or None, got {pinned_limit!r}"
                )
        if transform is not None and not callable(transform):
            raise CollateError(f"Prefetcher(transform=...) must be callable, got {type(transform).__name__}")
        if not stats and (progress or summary):
            raise CollateError("Prefetcher(progress=..., summary=...) need stats=True")
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
        self._meter: InputMeter[T] | None = InputMeter(loader, progress=progress, summary=summary) if stats else None

    @property
    def stats(self) -> InputMeter[T]:
        """Whether the loop waits for data: read ``stats.epoch`` and ``stats.total``.

        Besides the loop's waits, the staging thread's time reading the loader
        (``loader_s``) and staging batches (``staging_s``), and on CUDA the bytes copied
        and the copies' device time. An :class:`~pincollate.InputMeter` over the same
        loader; iterate the Prefetcher, not it.
        """
        if self._meter is None:
            raise CollateError("this Prefetcher was made with stats=False")
        return self._meter

    def _renumber(self, epoch: int) -> None:
        if self._meter is not None:
            self._meter._clock.renumber(epoch)

    # iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        meter = self._meter
        metering: Metering | None = None
        if meter is not None:
            clock = meter._clock
            # A passthrough with nothing to stage (CPU, no transform, no pin): the loop's waits are its reads.
            direct = self.device.type == "cpu" and self.transform is None and not self.pin
            metering = (clock, clock.begin(length_of(self.loader), direct), meter._count)
        try:
            source: Iterator[Any] = iter(self.loader)
        except BaseException:
            if metering is not None:
                metering[0].release(metering[1])  # no epoch began: none is left open
            raise
        if metering is not None:
            metering[0].started(metering[1])
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            staging = CudaStaging(self, None if metering is None else CopyTimes(metering[0], metering[1]))
            return Ahead(source, self.depth, staging.stage, self.device, staging.hand, metering, staging.flush)
        if self.pin:
            # Pinned on the staging thread, which the meter times as the CUDA path's; moved and
            # transformed on the consumer's.
            hand = None if self.device.type == "cpu" and self.transform is None else functools.partial(moved, self)
            return Ahead(source, self.depth, pin, self.device, hand, metering, copies=self.device.type != "cpu")
        owned = source is not self.loader  # a generator passed in stays the caller's: never closed here
        if metering is None:
            return Passthrough(source, self, owned)
        if direct:
            # Nothing to stage: the loop's waits are its reads, timed as any metered loader's.
            return Metered(source, *metering, owned=owned)
        return MeteredPassthrough(source, self, metering, owned)
