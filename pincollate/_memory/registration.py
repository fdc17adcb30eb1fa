"""Worker slots registered with CUDA in the receiving process (``pin_slots=True``).

``cudaHostRegister`` page-locks a slot's mapping once, so its batches arrive pinned and
``pin_memory()`` copies nothing. A non-blocking copy from a registered slot reads it
after the call returns: :func:`hold_until_copied` keeps the slot leased until an event
recorded after the copy has passed, as torch's pinned allocator does for its blocks.
A failed registration warns, clears the runtime's error and leaves the slot pageable.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from typing import Any

import torch

from .._locks import new_lock

__all__ = ["clear_error", "cudart", "hold_until_copied", "is_registered", "prune", "register", "runtime", "unregister"]

registered: dict[int, int] = {}  # start address -> end address of each registered mapping


def cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


@functools.cache
def runtime() -> Any:
    """The CUDA runtime library torch loaded (for ``cudaGetLastError``), or ``None``."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line and "/" in line}
    except OSError:
        paths = set()
    for name in (*sorted(paths), "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)  # the copy already loaded, where it is
        except OSError:
            continue
    return None


def clear_error() -> None:
    # A failed runtime call stays the runtime's last error until it is read; torch's next
    # kernel-launch check would read it and raise it as its own, far from here.
    library = runtime()
    if library is not None:
        library.cudaGetLastError()


def register(storage: torch.UntypedStorage) -> bool:
    """Register ``storage``'s memory with CUDA (page-locked); whether it worked."""
    if not torch.cuda.is_available():
        return False
    # Portable (flag 1): page-locked for every CUDA context, as torch's own pinned memory.
    error = int(cudart().cudaHostRegister(storage.data_ptr(), storage.nbytes(), 1))
    if error != 0:
        clear_error()
        warnings.warn(
            f"pincollate: cudaHostRegister failed for a worker slot (error {error}); its batches are pinned by copy",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    registered[storage.data_ptr()] = storage.data_ptr() + storage.nbytes()
    return True


def unregister(ptr: int) -> bool:
    """Unregister the memory registered at ``ptr``; whether it worked."""
    registered.pop(ptr, None)
    error = int(cudart().cudaHostUnregister(ptr))
    if error != 0:
        clear_error()
        warnings.warn(
            f"pincollate: cudaHostUnregister failed for a worker slot (error {error})", RuntimeWarning, stacklevel=2
        )
        return False
    return True


_in_flight: list[tuple[Any, torch.Tensor]] = []
_flight_lock = new_lock()


def is_registered(buffer: torch.Tensor) -> bool:
    """Whether ``buffer`` lies in a worker slot this process registered with CUDA."""
    if not registered:
        return False
    ptr = buffer.data_ptr()
    return any(start <= ptr < end for start, end in list(registered.items()))


def hold_until_copied(source: torch.Tensor, device: torch.device) -> None:
    """Keep ``source`` (a registered slot) leased until the copies queued to ``device`` finish.

    A non-blocking copy from page-locked memory reads it after the call returns; torch
    guards its own pinned blocks with an event, and this does the same for a slot, so
    the worker cannot refill it under the copy. The event is recorded on the current
    stream of the copy's target device, where the copy was queued.
    """
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    with _flight_lock:
        _in_flight.append((event, source))
    prune()


def prune() -> None:
    """Let go of the slots whose copies have finished."""
    if not _in_flight:
        return
    with _flight_lock:
        _in_flight[:] = [(event, source) for event, source in _in_flight if not event.query()]
