"""A small /dev/shm: what a worker does when its batch does not fit, and the one warning.

Docker gives a container 64 MiB of /dev/shm, Kubernetes pods often the same. A worker
that asks for more than that fails (torch reserves a shared file's pages as it makes
it, so the failure is an error, never a later bus error). A worker batch therefore
goes, in this order, into:

1. a free slot of the worker's ring (:mod:`pincollate._memory.ring`), or a new slot where one fits;
2. a fresh shared buffer, where one fits (every slot in use, /dev/shm ample);
3. a slot of its own ring once the main process lets go of it: the worker waits a
   bounded time (:data:`WAIT_S`) for a slot big enough, released under the rule of
   :mod:`pincollate._memory.ownership` (nothing can read it any more). A wait that times out makes the
   next batches skip the wait until a slot is free again, so a consumer that keeps
   every batch pays one wait, not one per batch;
4. anonymous shared memory outside /dev/shm (``memfd_create``: it counts against the
   container's memory, not the /dev/shm mount), crossing as one file descriptor; where
   the system has no memfd, plain memory whose bytes cross through the worker's result
   pipe in the batch's pickle. Either way the batch lands as one buffer in the main
   process, pinned where its collate would pin there, and the run goes on.

The first batch that waits or takes the pipe carries a notice; the main process turns it
into one :class:`SharedMemoryWarning` per dataset class.
"""

from __future__ import annotations

import mmap
import os
import warnings
import weakref
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .._locks import new_lock
from . import ownership as _ownership

__all__ = [
    "WAIT_S",
    "SharedMemoryWarning",
    "map_memfd",
    "mib",
    "new_shared",
    "note",
    "noticed",
    "outside",
    "outside_buffer",
    "room_for",
    "shm_free",
    "shm_total",
    "take_notice",
    "warn_once",
]

#: How long a worker waits for one of its slots before it sends a batch through its pipe.
WAIT_S = 2.0

#: What a room check leaves free in /dev/shm for everything else that uses it.
_MARGIN = 1 << 20


class SharedMemoryWarning(UserWarning):
    """/dev/shm is too small for a loader's batches: workers wait, or send batches outside it.

    Warned once per dataset class (not per worker or epoch). A batch that does not fit waits for one of its worker's
    slots, else crosses in a memfd (or, without ``memfd_create``, through the result
    pipe): slower, with the same values. The message says how big /dev/shm is and how
    to give it more.

    Examples:
        >>> import warnings
        >>> import pincollate
        >>> warnings.filterwarnings("ignore", category=pincollate.SharedMemoryWarning)
    """


def new_shared(nbytes: int) -> torch.UntypedStorage:
    """A fresh shared-memory storage of ``nbytes`` (a new file reads as zeros)."""
    return torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call,no-any-return]


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or ``None`` where there is none to ask or it has no limit."""
    if not os.path.isdir("/dev/shm"):
        return None
    stat = os.statvfs("/dev/shm")
    if stat.f_blocks == 0:  # a tmpfs mounted with size=0 has no limit, and reports no blocks at all
        return None
    return stat.f_bavail * stat.f_frsize


def shm_total() -> int | None:
    """The size of /dev/shm in bytes, or ``None`` where there is none or it has no limit."""
    if not os.path.isdir("/dev/shm"):
        return None
    stat = os.statvfs("/dev/shm")
    return stat.f_blocks * stat.f_frsize if stat.f_blocks else None


def room_for(nbytes: int) -> bool:
    """Whether /dev/shm has room for ``nbytes`` more, with a margin left for others."""
    free = shm_free()
    return free is None or nbytes + _MARGIN <= free


# --- the worker's side: buffers outside /dev/shm, and the notice --------------------------

#: For each buffer made outside /dev/shm, by address: the pin setting of the collate that
#: made it (the receiver pins the batch where that collate would pin in its process) and its
#: memfd, or ``None`` for plain memory whose bytes cross by pipe.
_outside: dict[int, tuple[Any, int | None]] = {}
_lock = new_lock()


def outside_buffer(nbytes: int, pin: Any) -> torch.Tensor:
    """A buffer of ``nbytes`` bytes outside /dev/shm for a worker batch.

    Anonymous shared memory (``memfd_create``: memory of the process's cgroup, not of the
    /dev/shm mount) where the system has it: the batch then crosses as one file
    descriptor, with no copy. Otherwise plain memory, whose bytes cross in the pipe.
    """
    fd = _memfd(nbytes)
    if fd is not None:
        mapping = mmap.mmap(fd, nbytes)
        view = np.frombuffer(mapping, dtype=np.uint8)
        # Leased like every buffer handed out: it stays mapped while anything can read it.
        buffer = _ownership.grant(view[:nbytes], _nothing, shared=True, keep=view)
        how = "outside /dev/shm (anonymous shared memory)"
    else:
        buffer = torch.empty(nbytes, dtype=torch.uint8, device="cpu")
        how = "through its result pipe"
    ptr = buffer.data_ptr()
    with _lock:
        _outside[ptr] = (pin, fd)
    weakref.finalize(buffer, _forget, ptr)
    note(f"sent a batch of {mib(nbytes)} {how}")
    return buffer


def _memfd(nbytes: int) -> int | None:
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd: int = create("pincollate-batch", os.MFD_CLOEXEC)
    except OSError:  # not allowed here (a seccomp profile, say)
        return None
    try:
        # Reserved now: memory that runs out is this error, not a SIGBUS on a later write.
        os.posix_fallocate(fd, 0, nbytes)
    except OSError:
        os.close(fd)
        return None
    return fd


def _nothing(reusable: bool) -> None:
    pass  # a buffer made for one batch is never handed out again


def mib(nbytes: int) -> str:
    """``nbytes`` in MiB, for messages."""
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**17 else f"{nbytes:,} bytes"


def _forget(ptr: int) -> None:
    with _lock:
        _, fd = _outside.pop(ptr, (None, None))
    if fd is not None:
        os.close(fd)


def outside(buffer: torch.Tensor) -> tuple[Any, int | None] | None:
    """``(pin setting, memfd or None)`` of a buffer made by :func:`outside_buffer`, else ``None``."""
    with _lock:
        return _outside.get(buffer.data_ptr())


def map_memfd(fd: int, nbytes: int) -> torch.Tensor:
    """The receiver's lease of a batch that crossed as a memfd (``fd`` is closed here)."""
    try:
        mapping = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    view = np.frombuffer(mapping, dtype=np.uint8)
    return _ownership.grant(view[:nbytes], _nothing, shared=True, keep=view)


_notice: list[Any] = []  # [key, text] once this worker has something to say, until it is sent
_noticed = False


def note(what: str) -> None:
    """Remember, once per worker process, that a batch waited or took the pipe."""
    global _noticed
    if _noticed:
        return
    _noticed = True
    info = get_worker_info()
    # One warning per dataset of the parent, whatever made the workers: spawned and forkserver
    # workers (and each epoch's new ones) unpickle a dataset object of their own, so its id would
    # make one warning per worker and epoch; its class is the same in every one.
    dataset = type(info.dataset) if info is not None else None
    key = (os.getppid(), None if dataset is None else f"{dataset.__module__}.{dataset.__qualname__}")
    total, free = shm_total() or 0, shm_free() or 0
    text = (
        f"pincollate: /dev/shm is too small for this loader's batches: it has {total / 2**20:.0f} MiB "
        f"({free / 2**20:.0f} MiB free) and a worker {what}. Workers now wait for "
        "their shared-memory slots and send what still does not fit outside /dev/shm (anonymous shared "
        "memory, or their result pipe), which is slower; the batches are the same. Give the container more shared memory: `docker run --shm-size=2g` "
        "(or `--ipc=host`), or in Kubernetes a memory-backed emptyDir mounted at /dev/shm."
    )
    _notice[:] = [key, text]


def noticed() -> bool:
    """Whether this worker has waited for a slot or sent a batch by pipe (for tests)."""
    return _noticed


def take_notice() -> tuple[Any, str] | None:
    """The notice for the next batch that crosses, once."""
    if not _notice:
        return None
    key, text = _notice
    _notice.clear()
    return key, text


# --- the receiver's side ------------------------------------------------------------------

_warned: set[Any] = set()


def warn_once(notice: tuple[Any, str] | None) -> None:
    """Warn about a worker's notice, once per dataset class."""
    if notice is None:
        return
    key, text = notice
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(text, SharedMemoryWarning, stacklevel=3)


def _after_fork() -> None:
    # A worker's notice is its own: a fork starts with nothing said.
    global _noticed
    _noticed = False
    _notice.clear()
    _outside.clear()  # the parent's descriptors: this process does not close them


os.register_at_fork(after_in_child=_after_fork)
