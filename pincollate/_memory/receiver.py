"""The receiving side of the workers' rings: each slot mapped once, each batch a lease of it.

The receiving process (the main process, or whoever a worker's batches go to) keeps
its mapping of every slot of a worker's ring (:mod:`pincollate._memory.ring`) and builds each batch
over a lease of it (:mod:`pincollate._memory.ownership`); the slot goes back to its worker when that
lease is over. A ring (its slot mappings and their file descriptors) is closed when
its worker's process object is gone (the DataLoader iterator shut its workers down,
after an epoch, an error or a killed worker); a ring from a process that is not this
one's child once that process has died, checked as its batches are released and
when a new ring arrives. Batches still held keep their own slot mapped. With
``pin_slots`` each slot is registered with CUDA once (:mod:`pincollate._memory.registration`), so a
batch arrives page-locked and ``pin_memory()`` has nothing to copy.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import weakref
from typing import Any

import torch

from .._locks import new_rlock
from . import ownership as _ownership
from . import registration as _registration
from .ring import LAYOUTS_KEPT, Header, RecentLayouts, words

__all__ = ["close_all", "layout", "lease", "leased", "open_rings"]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None  # exited, not yet reaped
    return fields[19].decode()


def _alive(pid: int, started: str | None) -> bool:
    if started is not None:
        return _start_time(pid) == started  # a reused pid has another start time
    try:  # no /proc (or not readable): the pid is all there is
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Mapping:
    """The receiver's mapping of one slot generation (registered with CUDA, if asked)."""

    __slots__ = ("array", "generation", "ptr", "registered", "storage")

    def __init__(self, storage: torch.UntypedStorage, generation: int, pin: bool):
        self.storage = storage
        self.array = _ownership.bytes_of(storage)
        self.generation = generation
        self.ptr = storage.data_ptr()
        self.registered = pin and _registration.register(storage)

    def __del__(self) -> None:
        if self.registered:
            with contextlib.suppress(Exception):  # at interpreter exit CUDA may be gone first
                _registration.unregister(self.ptr)


class _Receiver:
    """The receiving process's view of one worker's ring."""

    def __init__(self, header: Header):
        token, pid, state_storage, _ = header
        self.token = token
        self.pid = pid
        self.started = _start_time(pid)
        self.state_storage: torch.UntypedStorage = state_storage
        self.state = words(state_storage, state_storage.nbytes() // 8)
        self.slots: dict[int, _Mapping] = {}
        self.closed = False
        self.watched = False  # its worker's Process object closes it (see _watch)
        # The layouts the worker sent, by key, kept by the worker's own rule and more of them.
        self.layouts: RecentLayouts = RecentLayouts(4 * LAYOUTS_KEPT)

    def release(self, index: int, reusable: bool) -> None:
        self.state[index] = 0 if reusable else 2
        # A ring whose Process object is watched closes when that goes; only one sent
        # by another process's worker is checked here, as its batches are released.
        if not self.closed and not self.watched and not _alive(self.pid, self.started):
            _close(self.token)


def layout(token: int, key: int, sent: Any) -> Any:
    """The layout a batch from ring ``token`` crossed with: ``sent``, kept under ``key``, or the one kept.

    A worker sends each layout once (:func:`pincollate._memory.ring.send`) and its batches arrive in the
    order it sent them, so a key always arrives after its layout. Both sides keep layouts
    by one rule (:class:`~pincollate._memory.ring.RecentLayouts`), the receiver more of them,
    so a key it is sent is still kept.
    """
    if key == 0:
        return sent
    with _receiving:
        receiver = _receivers.get(token)
        if receiver is None:
            raise RuntimeError("pincollate: a worker batch arrived for a ring this process has closed")
        if sent is not None:
            receiver.layouts.put(key, sent)
            return sent
        found = receiver.layouts.get(key)
    if found is None:
        raise RuntimeError(f"pincollate: a worker batch refers to layout {key}, which never arrived here")
    return found


_receivers: dict[int, _Receiver] = {}
# Reentrant: a lease released by the garbage collector while this thread holds the
# lock (inside lease()) may close a ring.
_receiving = new_rlock()


def _close(token: int) -> None:
    with _receiving:
        receiver = _receivers.pop(token, None)
        if receiver is not None:
            receiver.closed = True
            # Leased batches hold their own mapping. No /dev/shm name is removed here: torch
            # names a segment by its creator's pid alone, and a name of a dead worker's pid may
            # be another process's (a container sharing /dev/shm across pid namespaces, a pid
            # used again), live and read by name under the file_system strategy.
            receiver.slots.clear()


def _watch(receiver: _Receiver) -> None:
    """Close the ring when the worker's process object is gone (its iterator shut down)."""
    # A snapshot of this process's children, not active_children(): that one reaps and
    # edits the set, which may race with another thread starting workers.
    for process in list(getattr(multiprocessing.process, "_children", ())):
        if process.pid == receiver.pid:
            weakref.finalize(process, _close, receiver.token).atexit = False
            receiver.watched = True
            return


def _sweep() -> None:
    for token, receiver in list(_receivers.items()):
        if not _alive(receiver.pid, receiver.started):
            _close(token)


def lease(header: Header, index: int, generation: int, storage: Any, nbytes: int) -> torch.Tensor:
    """A ``uint8`` tensor over the first ``nbytes`` bytes of a worker's slot, in this process.

    The slot comes back to its worker when the lease is over (:mod:`pincollate._memory.ownership`); the
    lease keeps the slot's mapping until then, even after its ring was closed.

    Raises:
        RuntimeError: the slot never crossed to this process (a batch from a ring is
            received by one process).
    """
    token = header[0]
    with _receiving:
        receiver = _receivers.get(token)
        fresh = receiver is None
        if receiver is None:
            if header[2] is None:
                raise RuntimeError(
                    "pincollate: a worker batch arrived in a process that never received its "
                    "worker's ring; batches of one DataLoader worker must all go to one process"
                )
            receiver = _receivers[token] = _Receiver(header)
        if storage is not None:
            receiver.slots[index] = _Mapping(storage, generation, header[3])
        mapping = receiver.slots.get(index)
    if fresh:
        _watch(receiver)
        _sweep()
    _registration.prune()
    if mapping is None or mapping.generation != generation:
        raise RuntimeError(f"pincollate: slot {index} of a worker's ring is not mapped in this process")
    over = functools.partial(receiver.release, index)
    return _ownership.grant(mapping.array[:nbytes], over, shared=True, keep=mapping)


def leased(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory lies in a worker slot this process maps (for tests)."""
    ptr = tensor.data_ptr()
    with _receiving:
        mappings = [m for r in _receivers.values() for m in r.slots.values()]
    return any(m.ptr <= ptr < m.ptr + m.storage.nbytes() for m in mappings)


def open_rings() -> int:
    """How many workers' rings this process has mapped now (for tests and leak checks)."""
    with _receiving:
        return len(_receivers)


def close_all() -> None:
    """Close every ring this process maps (leased batches stay valid)."""
    for token in list(_receivers):
        _close(token)
