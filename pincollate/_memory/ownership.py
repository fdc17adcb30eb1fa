"""Recycled memory and who may still read it: the one rule for handing it out again.

pincollate recycles three kinds of memory: the slots of a DataLoader worker's ring
(shared memory the worker fills and the main process reads), the large plain buffers
of main-process batches, and slots registered with CUDA (``pin_slots``). (Memory that
is never handed out again, such as a small main-process buffer, needs no lease: every
storage over it holds it.) All recycled memory reaches a user only through a *lease*, made by :func:`grant`: a new torch storage over
exactly the batch's bytes, whose memory belongs to someone else. The user follows no
contract, so the rule is written from what can hold that memory:

**Recycled memory is handed out again only when nothing can read it any more:**

1. *this process*: the lease's storage is dead. Every tensor, view or slice of a leaf,
   storage object (``untyped_storage()``, ``storage()``), numpy array, memoryview of
   one, and DLPack capsule made from the batch holds that storage, so its death means
   none of them is left. torch keeps a storage's Python object for as long as the
   storage lives, so a finalizer on that object tells when it dies. In pageable
   memory each tensor of a batch (and ``batch.buffer``) has a storage of its own over
   its bytes (so one field saves alone); each such storage's Python object holds the
   lease's storage for as long as it lives (:class:`pincollate._batch.views.Views`), whether or not it
   still holds the bytes, so the lease's storage outlives every one of them and no
   user ever holds the lease's storage itself.
2. *a storage that moved*: ``share_memory_()`` (which torch also runs when a tensor is
   sent to another process through a queue, a pipe or a spawned process's arguments)
   copies a storage that is not yet shared into fresh shared memory and swaps its
   pointer in place. The new memory is torch's and safe; the old one is released by
   the storage although numpy arrays and DLPack capsules made earlier still point into
   it. A lease released while its storage is still alive is that escape: its memory
   is reused only once the storage dies (every such array holds the storage). A
   field's own storage that moves keeps holding the lease's storage (rule 1).
3. *other processes*: a ring slot crosses to one receiver as its index and comes back
   only when that receiver's own lease ends. A fork while a lease of shared memory is
   alive gives the child a mapping nobody here can watch: that memory is *retired*,
   never handed out again (the ring replaces the slot; the memory goes back to the
   system when its last mapping, the child's too, is gone). Plain memory is copied on
   write in a fork child, so a fork does not retire it.

What cannot be seen is never counted as free. :func:`verdict` applies the rule; every
owner (the worker's ring, the receiving process, the plain-buffer pool) learns the
answer through the callback it gave :func:`grant`, once per lease, in the process that
made the lease. The checks cost two weak references per batch, nothing per tensor.
"""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._locks import new_rlock

__all__ = ["Lease", "bytes_of", "grant", "hold", "holder", "live", "verdict"]

#: ``done(reusable)``: the lease is over; ``reusable`` is False for retired memory.
Done = Callable[[bool], None]


class Lease:
    """One hand-out of recycled memory: what decides when, and whether, it comes back."""

    __slots__ = ("__weakref__", "alive", "done", "exported", "forked", "keep", "pid", "shared", "watches")

    def __init__(self, done: Done, shared: bool, keep: Any):
        self.done: Done | None = done
        self.shared = shared  # shared memory: a fork child would map it too
        self.keep = keep  # what must stay alive (a mapping) while anything can read the memory
        self.pid = os.getpid()
        self.alive = True  # the lease's storage lives
        self.exported = True  # the storage still holds this memory (it has not moved)
        self.forked = False
        #: The weak references that tell of the storage's death and of its memory's release.
        self.watches: tuple[weakref.ref[Any], ...] | None = None


def verdict(lease: Lease) -> bool | None:
    """May ``lease``'s memory be handed out again? The rule of this module, in one place.

    Returns ``None`` while anything in this process can still read it (its storage
    lives, or still holds the memory), ``True`` once nothing can, and ``False`` when it
    must be retired: a fork child may hold it.
    """
    if lease.alive or lease.exported:
        return None
    return not lease.forked


_live: dict[int, Lease] = {}  # this process's leases that are not over yet
# Reentrant: the garbage collector may run a callback (another lease's end) while this
# thread holds it.
_lock = new_rlock()
#: Set at interpreter exit: what dies then ends no lease (its owners are going too).
_exiting: list[bool] = []
atexit.register(_exiting.append, True)


def _settle(
    lease: Lease,
    name: str,
    _getpid: Callable[[], int] = os.getpid,
    _lock: Any = _lock,
    _live: dict[int, Lease] = _live,
    _exiting: list[bool] = _exiting,
    _verdict: Callable[[Lease], bool | None] = verdict,
) -> None:
    """Record what happened to the lease's storage; end the lease once the rule says so.

    A weak reference's callback. ``_exiting`` is bound here: one that runs while the interpreter
    exits, after this module's names may be gone, returns at once (as a finalizer with
    ``atexit = False`` did). The others are bound to spare a global look-up per batch.
    """
    if _exiting or _getpid() != lease.pid:
        return  # a fork child's copy dying says nothing about this process's lease
    with _lock:
        setattr(lease, name, False)
        answer = _verdict(lease)
        done, keep = lease.done, lease.keep
        if answer is None or done is None:
            return
        lease.done = lease.keep = lease.watches = None
        _live.pop(id(lease), None)
    # Outside the lock: an owner's callback takes its own locks, in whichever thread let go.
    done(answer)
    del keep  # the memory stays mapped until its owner has heard


def _watch(lease: Lease, name: str, _settle: Callable[[Lease, str], None] = _settle) -> Callable[[Any], None]:
    """The callback of a weak reference that records ``name`` as over (the memory released, the storage dead)."""
    return lambda _: _settle(lease, name)


def grant(memory: np.ndarray[Any, Any], done: Done, *, shared: bool, keep: Any = None) -> torch.Tensor:
    """A flat ``uint8`` tensor over ``memory``'s bytes, leased under the rule above.

    ``memory`` is a 1-D ``uint8`` array over exactly the bytes, made for this lease alone
    (a fresh slice: ``array[:nbytes]``); the lease's storage holds it for exactly as long as
    it holds these bytes. ``done(reusable)`` is called once, in this process, when the
    memory may be handed out again (``True``) or must be retired (``False``). ``keep``
    stays referenced until then. The tensor's storage covers exactly these bytes, so
    saving or pickling a batch writes its own size, and it cannot be resized over a
    neighbour.

    Examples:
        >>> import torch
        >>> owner = torch.zeros(256, dtype=torch.uint8).numpy()
        >>> answers = []
        >>> lease = grant(owner[:128], answers.append, shared=False)
        >>> view = lease[:8].numpy()
        >>> del lease
        >>> answers  # the numpy view still reads it
        []
        >>> del view
        >>> answers
        [True]
    """
    buffer = torch.from_numpy(memory)
    lease = Lease(done, shared, keep)
    # The storage holds ``memory`` until it dies, or until share_memory_ swaps its pointer
    # ("exported": its memory released), and torch keeps the storage's Python object while the
    # storage lives ("alive"). The lease holds both weak references (and ``_live`` the lease)
    # until it ends, so both callbacks run; a weak reference costs a fifth of a finalizer.
    lease.watches = (
        weakref.ref(memory, _watch(lease, "exported")),
        weakref.ref(buffer.untyped_storage(), _watch(lease, "alive")),
    )
    _live[id(lease)] = lease
    return buffer


def bytes_of(storage: torch.UntypedStorage) -> np.ndarray[Any, Any]:
    """A ``uint8`` array over all of ``storage`` (it holds the storage), to slice leases from."""
    return torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage).numpy()


def hold(tensor: torch.Tensor, owner: Any) -> torch.Tensor:
    """Make ``tensor``'s storage hold ``owner`` (what keeps its memory) for as long as it lives.

    On the storage's Python object, which torch keeps while the storage lives: unlike
    what the storage was made from, it stays after ``share_memory_`` moves the storage's
    bytes away, so arrays made from it earlier still read live memory. Returns ``tensor``.
    """
    tensor.untyped_storage()._pincollate_owner = owner  # type: ignore[attr-defined]
    return tensor


_STORAGE = torch.Tensor.untyped_storage


def hold_all(tensors: list[torch.Tensor], owner: Any) -> list[torch.Tensor]:
    """:func:`hold` for every tensor of ``tensors`` (a per-sample list made at once). Returns ``tensors``."""
    for storage in map(_STORAGE, tensors):
        storage._pincollate_owner = owner  # type: ignore[attr-defined]
    return tensors


def holder(storage: torch.UntypedStorage) -> Any:
    """What :func:`hold` made ``storage`` hold, or ``None``."""
    return getattr(storage, "_pincollate_owner", None)


def live() -> int:
    """How many leases of this process are not over yet (for tests and leak checks)."""
    return sum(1 for lease in list(_live.values()) if lease.pid == os.getpid())


def _before_fork() -> None:
    # The child gets a mapping of every shared lease alive now; nobody here can see it go.
    for lease in list(_live.values()):
        if lease.shared:
            lease.forked = True


os.register_at_fork(before=_before_fork)
