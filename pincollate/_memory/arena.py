"""Where a batch's one buffer lives: shared memory, pinned memory or plain memory.

The kind is decided per call, never cached across processes:

* inside a DataLoader worker the buffer is shared memory: a slot of the worker's
  ring (:mod:`pincollate._memory.ring`), which crosses to the main process as its index once the slot
  has crossed, or a fresh shared storage (one file descriptor however many tensors
  it holds); a worker never touches CUDA (a forked child cannot create a context);
* in the main process it is pinned when pinning is wanted and possible (with
  ``"auto"``: in a process that started the accelerator);
* otherwise it is plain pageable memory.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Literal

import torch
from torch.utils.data import get_worker_info

from .._errors import CollateError
from .._locks import new_rlock
from . import registration as _registration
from . import ring as _ring
from . import shm as _shm
from .pool import Recycled

__all__ = [
    "Kind",
    "accelerator_can_pin",
    "allocate",
    "copy_to_device",
    "is_pinned",
    "new_pinned",
    "pinned_footprint",
    "resolve_kind",
    "set_pinned_allocator",
    "trim_pinned",
]

Kind = Literal["shared", "pinned", "plain"]
PinMode = bool | Literal["auto"]

PinnedAllocator = Callable[[int], torch.Tensor]


def _torch_pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)


def _torch_is_pinned(tensor: torch.Tensor) -> bool:
    # A worker slot registered with CUDA (pin_slots) is page-locked memory torch did not allocate.
    return tensor.is_pinned() or _registration.is_registered(tensor)


_pinned_allocator: PinnedAllocator = _torch_pinned
_is_pinned: Callable[[torch.Tensor], bool] = _torch_is_pinned


def set_pinned_allocator(
    allocator: PinnedAllocator | None, is_pinned: Callable[[torch.Tensor], bool] | None = None
) -> tuple[PinnedAllocator, Callable[[torch.Tensor], bool]]:
    """Replace how pinned ``uint8`` buffers are allocated and recognised.

    ``None`` restores torch's own. Returns the previous pair, to restore later.
    Tests use this to count pinned allocations on machines without an accelerator.
    """
    global _pinned_allocator, _is_pinned
    previous = (_pinned_allocator, _is_pinned)
    _settled.clear()  # the kinds settled under the previous allocator
    _pinned_allocator = allocator if allocator is not None else _torch_pinned
    _is_pinned = is_pinned if is_pinned is not None else _torch_is_pinned
    return previous


class _PinnedLedger:
    """The allocator's blocks behind pincollate's pinned buffers that are still alive, in bytes.

    torch 2.11's caching host allocator never lowers its ``active_bytes`` statistic when
    a block is freed (and raises it as copies' events complete), so what is in use is
    counted here: each buffer from :func:`new_pinned` adds the block the allocator gives
    it (a request rounded up to a power of two, torch's default) and the death of the
    buffer's storage takes it off again.
    """

    def __init__(self) -> None:
        self.held = 0
        self._blocks: dict[weakref.ref[torch.UntypedStorage], int] = {}
        # Reentrant: a storage's death (a callback here) can come from a collection that
        # an allocation inside add() started, on this same thread.
        self._lock = new_rlock()

    def add(self, buffer: torch.Tensor) -> None:
        nbytes = buffer.numel()
        block = 1 << (nbytes - 1).bit_length() if nbytes else 0
        ref = weakref.ref(buffer.untyped_storage(), self._drop)
        with self._lock:
            self._blocks[ref] = block
            self.held += block

    def _drop(self, ref: weakref.ref[torch.UntypedStorage]) -> None:
        with self._lock:
            self.held -= self._blocks.pop(ref, 0)


_ledger = _PinnedLedger()


def new_pinned(nbytes: int) -> torch.Tensor:
    """A pinned ``uint8`` buffer of ``nbytes`` bytes, counted in :func:`pinned_footprint`'s ``active``."""
    buffer = _pinned_allocator(nbytes)
    _ledger.add(buffer)
    return buffer


def is_pinned(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory is pinned (by torch, or by the injected allocator)."""
    return _is_pinned(tensor)


_available: dict[int, bool] = {}


def _probe_accelerator() -> bool:
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", None)
    if bad_fork is not None and bad_fork():
        return False  # a fork of a process that started CUDA cannot use it
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        if not accelerator.is_available():
            return False
        current = accelerator.current_accelerator()
        return current is not None and current.type != "mps"
    return torch.cuda.is_available()


def _accelerator_available() -> bool:
    # Asked once per process: a forked child inherits the parent's memory, and with
    # it any cached answer, so the answer is keyed by the process id.
    pid = os.getpid()
    known = _available.get(pid)
    if known is None:
        known = _available[pid] = _probe_accelerator()
    return known


def _accelerator_started() -> bool:
    """Whether this process has started the accelerator (pinning would not start it)."""
    if torch.cuda.is_available():
        return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
    return True


def accelerator_can_pin() -> bool:
    """Whether this process can allocate page-locked memory for an accelerator.

    Always ``False`` inside a DataLoader worker, where pinning is both impossible
    (no CUDA in a forked child) and useless (pinned pages do not cross processes),
    and in a fork of a process that started CUDA. Decided once per process.
    """
    if get_worker_info() is not None:
        return False
    if _pinned_allocator is not _torch_pinned:
        return True
    return _accelerator_available()


#: Each process's buffer kind by ``pin_memory`` setting, once it can no longer change there:
#: keyed by the process id, since a forked worker inherits the parent's answers.
_settled: dict[tuple[int, PinMode], Kind] = {}


def resolve_kind(pin_memory: PinMode) -> Kind:
    """The buffer kind for ``pin_memory`` in this process: settled once, where it cannot change.

    A worker's (shared), ``pin_memory=False``'s (plain) and a pinning process's (pinned)
    kinds never change in a process, nor does ``"auto"`` where no accelerator can pin:
    those are read from a table. ``"auto"`` in a process that can pin but has not started
    the accelerator is asked again for each batch (it pins once the accelerator starts),
    and so is every setting while a stand-in pinned allocator is set.
    """
    key = (os.getpid(), pin_memory)
    kind = _settled.get(key)
    if kind is None:
        kind = _resolve_kind(pin_memory)
        if _pinned_allocator is _torch_pinned and (kind != "plain" or pin_memory is False or not accelerator_can_pin()):
            _settled[key] = kind
    return kind


def _resolve_kind(pin_memory: PinMode) -> Kind:
    if get_worker_info() is not None:
        return "shared"
    if pin_memory is False:
        return "plain"
    # "auto" pins only in a process that started the accelerator itself: another
    # child process (a multiprocessing pool, a torchdata process mapper) does not
    # start CUDA for a buffer that pinning cannot carry across processes anyway.
    if accelerator_can_pin() and (
        pin_memory is True or _pinned_allocator is not _torch_pinned or _accelerator_started()
    ):
        return "pinned"
    if pin_memory is True:
        raise CollateError(
            "pin_memory=True but no accelerator with pinned memory is available "
            "in this process; use pin_memory='auto' to pin only when possible"
        )
    return "plain"


_recycled = Recycled()


def allocate(
    nbytes: int, kind: Kind, slots: int = 0, pin_slots: bool = False, pin: PinMode | None = None
) -> torch.Tensor:
    """Allocate one flat ``uint8`` buffer of ``nbytes`` bytes of the given kind.

    In a DataLoader worker a shared buffer is a slot of the worker's ring
    (:mod:`pincollate._memory.ring`, with ``slots > 0``) when one is free, else a fresh one. Where
    /dev/shm has no room for it and ``pin`` is given (the collate's pin setting: the
    batch is a carrier, which can cross as its bytes), the worker waits for one of its
    slots and then takes memory outside /dev/shm (:mod:`pincollate._memory.shm`).

    Raises:
        CollateError: the buffer cannot be allocated (or, with ``pin`` ``None``, does
            not fit /dev/shm).
    """
    if kind == "shared":
        slot = _ring.take(nbytes, slots, pin_slots)
        if slot is not None:
            return slot
        if not _shm.room_for(nbytes):
            slot = _ring.wait(nbytes)
            if slot is not None:
                return slot
            if pin is None:
                raise CollateError(
                    f"the batch needs {nbytes:,} bytes of shared memory but /dev/shm has only "
                    f"{_shm.shm_free() or 0:,} bytes free; lower the batch size or enlarge /dev/shm"
                )
            return _shm.outside_buffer(nbytes, pin)
    try:
        if kind == "shared":
            storage = _shm.new_shared(nbytes)
            return torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage)
        if kind == "pinned":
            return new_pinned(nbytes)
        return _recycled.take(nbytes)
    except (RuntimeError, MemoryError, OSError) as exc:
        if kind == "shared" and pin is not None:
            with contextlib.suppress(RuntimeError, MemoryError):
                return _shm.outside_buffer(nbytes, pin)  # another process took the room first
        where = " in /dev/shm" if kind == "shared" else f" ({kind} memory)"
        raise CollateError(f"cannot allocate the batch buffer of {nbytes:,} bytes{where}: {exc}") from exc


def copy_to_device(source: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """``source.to(device)``, non-blocking where asked and safe.

    On MPS a non-blocking copy from pageable memory is unsafe, so it blocks. On CUDA a
    non-blocking copy from a registered worker slot keeps the slot leased until the
    copy has finished, so the worker cannot refill it under the copy.
    """
    blocking = device.type == "mps" and not source.is_pinned()
    moved = _copy(source, device, non_blocking and not blocking)
    if non_blocking and device.type == "cuda" and _registration.is_registered(source):
        _registration.hold_until_copied(source, moved.device)
    return moved


def _copy(source: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    return source.to(device, non_blocking=non_blocking)


def pinned_footprint() -> dict[str, int]:
    """Bytes of pinned host memory held by the CUDA caching host allocator.

    Returns:
        A dict of byte counts: ``reserved`` (what the allocator holds, blocks in use
        and cached) and ``peak`` (the most it ever held), its own ``allocated_bytes``
        statistics; ``active``, what pincollate's pinned buffers still alive hold,
        counted by pincollate (torch 2.11's ``active_bytes`` is not lowered when a
        block is freed), so pinned memory that other code allocated counts as cached.
        All zero without CUDA.

    Examples:
        >>> import pincollate
        >>> sorted(pincollate.pinned_footprint())
        ['active', 'peak', 'reserved']
    """
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "host_memory_stats"):
        return {"reserved": 0, "active": 0, "peak": 0}
    stats = torch.cuda.host_memory_stats()
    return {
        "reserved": int(stats.get("allocated_bytes.current", 0)),
        "active": _ledger.held,
        "peak": int(stats.get("allocated_bytes.peak", 0)),
    }


def trim_pinned(limit: int) -> bool:
    """Empty the pinned-memory cache when it holds more than ``limit`` bytes it could free.

    Cached blocks are returned to the driver; blocks in use are untouched. Emptying
    the cache frees each block with ``cudaFreeHost``, which waits for the whole device,
    so it is done only when the reserved memory is over ``limit`` and at least a
    quarter of ``limit`` of it is not held by a live pincollate buffer: blocks in use
    alone over the limit are nothing a trim can free. Returns whether it trimmed.
    """
    footprint = pinned_footprint()
    cached = footprint["reserved"] - footprint["active"]
    if footprint["reserved"] <= limit or cached < max(limit // 4, 1):
        return False
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        return False
    empty()
    return True
