"""Worker batches in a recycled ring of shared-memory slots, mapped once by the receiver.

A fresh shared buffer per batch costs a new file, page faults and zeroing for every
page written, a file descriptor over a socket and a new mapping in the main process.
Inside a DataLoader worker a batch is therefore filled into a *slot* of its ring:

* a worker keeps up to ``slots`` shared storages and one small shared state array
  (one ``int64`` per slot, written by the receiver); slots are made when the worker
  has more batches in flight than slots, so a ring holds what the loader keeps in
  flight (``prefetch_factor`` plus what the consumer holds);
* each batch is filled into a lease of its slot (:mod:`pincollate._memory.ownership`): a storage over
  exactly the batch's bytes, so ``torch.save`` and ``pickle`` write its own size;
* pickled for another process (multiprocessing's pickler only), a batch crosses as
  the ring's token, the slot's index and generation, the layout and the values. A
  slot's storage (and the state array) travel with its first batch only, a layout
  with the first batch of its structure (later ones carry its key). Anything else
  that leaves (a tensor sent beside the batch, a changed batch sent tensor by
  tensor) is moved into fresh shared memory by torch first;
* the receiver (:mod:`pincollate._memory.receiver`) keeps its mapping of every slot and builds each
  batch over a lease of it; the slot goes back to its worker when that lease is
  over, under the one rule of :mod:`pincollate._memory.ownership`;
* with no free slot that fits and the ring full, the batch takes a fresh buffer; a
  worker waits for a slot only where /dev/shm has no room for either (:mod:`pincollate._memory.shm`).
  A slot too small for a batch is replaced when free, as is a retired one (a fork
  while it was held). A new slot has headroom where /dev/shm has room for it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import time
from collections import OrderedDict
from typing import Any

import torch
from torch.utils.data import get_worker_info

from .._locks import new_rlock
from . import ownership as _ownership
from . import shm as _shm

__all__ = [
    "DEFAULT_SLOTS",
    "LAYOUTS_KEPT",
    "Header",
    "RecentLayouts",
    "capacity_for",
    "is_slot",
    "send",
    "take",
    "wait",
    "words",
]

#: At most this many slots per worker unless a collate says otherwise.
DEFAULT_SLOTS = 8

#: Slots are made this much bigger than the batch that asked for them, so batches
#: that vary a little in size share them. The pages past what a batch writes are
#: never touched, so they take no memory.
_HEADROOM = 1.25
_GRAIN = 1 << 16

#: (token, worker pid, the state array's storage or None, pin_slots)
Header = tuple[int, int, Any, bool]


def capacity_for(nbytes: int) -> int:
    """How big a recycled buffer made for ``nbytes`` is: headroom, rounded up to the grain."""
    return -(-int(nbytes * _HEADROOM) // _GRAIN) * _GRAIN


def words(storage: torch.UntypedStorage, count: int) -> Any:
    """``count`` int64 words over ``storage``'s memory, read and written at C speed."""
    return (ctypes.c_int64 * count).from_address(storage.data_ptr())


# --- the worker's side -------------------------------------------------------------------


class _Slot:
    __slots__ = ("array", "busy", "capacity", "generation", "pending", "ptr", "retired", "sent", "storage")

    def __init__(self, storage: torch.UntypedStorage, generation: int):
        self.storage = storage
        self.array = _ownership.bytes_of(storage)
        self.ptr = storage.data_ptr()
        self.capacity = storage.nbytes()
        self.generation = generation
        self.busy = False  # a lease of this process over it is not over (see _ownership)
        self.retired = False  # a fork child may map it: never handed out again
        self.pending = False  # handed to a batch that has not been sent yet
        self.sent = False  # this generation's storage has crossed once


class _Ring:
    """One worker process's slots.

    The state array says what the receiver holds: ``0`` nothing, ``1`` a batch sent
    from the slot whose lease there is not over, ``2`` retired by the receiver (a fork
    there while it held the batch). This process's own hold is the slot's lease.
    """

    def __init__(self, slots: int):
        self.token = secrets.randbits(62)
        self.pid = os.getpid()
        self.state_storage = _shm.new_shared(8 * slots)  # a new shared file reads as zeros: all free
        self.state = words(self.state_storage, slots)
        self.slots: list[_Slot | None] = [None] * slots
        # Reentrant: a lease's end (a finalizer) may run while this thread holds it.
        self.lock = new_rlock()
        self.state_sent = False
        self.pin = False  # ask the receiver to register slots with CUDA
        self.starved = False  # the last wait timed out (see wait)
        # Layouts already sent to the receiver, by id: a batch of one of them crosses as its key.
        self.layouts: RecentLayouts = RecentLayouts(LAYOUTS_KEPT)
        self.next_key = 1

    def _idle(self, index: int) -> bool:
        """Nothing in this process and nothing in the receiver can read slot ``index``."""
        slot = self.slots[index]
        return slot is not None and not slot.busy and not slot.retired and self.state[index] == 0

    def _replaceable(self, index: int) -> bool:
        slot = self.slots[index]
        return slot is not None and not slot.busy and (slot.retired or self.state[index] == 2)

    def take(self, nbytes: int) -> torch.Tensor | None:
        with self.lock:
            fits: int | None = None
            empty: int | None = None
            small: int | None = None
            for index, slot in enumerate(self.slots):
                if slot is None or self._replaceable(index):
                    if empty is None:
                        empty = index
                elif self._idle(index):
                    if slot.capacity >= nbytes:
                        if fits is None or slot.capacity < self.slots[fits].capacity:  # type: ignore[union-attr]
                            fits = index
                    elif small is None:
                        small = index  # too small: replaced by a bigger one
            if fits is None:
                fits = empty if empty is not None else small
                if fits is None:
                    return None  # every slot is in use: a fresh buffer, or a wait
                old = self.slots[fits]
                storage = _new_slot(nbytes)
                if storage is None:
                    return None  # /dev/shm has no room for it: a wait, or the pipe
                self.slots[fits] = _Slot(storage, 0 if old is None else old.generation + 1)
                self.state[fits] = 0
            else:
                self.starved = False  # a slot came back: waits are worth it again
            slot = self.slots[fits]
            assert slot is not None
            slot.busy = slot.pending = True
            return _ownership.grant(slot.array[:nbytes], functools.partial(self._over, slot), shared=True)

    def could_take(self, nbytes: int) -> bool:
        """Whether a slot of this ring big enough for ``nbytes`` may come back."""
        with self.lock:
            return any(
                slot is not None and not slot.retired and self.state[i] != 2 and slot.capacity >= nbytes
                for i, slot in enumerate(self.slots)
            )

    def _over(self, slot: _Slot, reusable: bool) -> None:
        with self.lock:
            slot.busy = False
            slot.retired = slot.retired or not reusable

    def find(self, buffer: torch.Tensor) -> int | None:
        """The slot ``buffer`` leases (by its memory: a storage that moved leases none)."""
        ptr = buffer.data_ptr()
        for index, slot in enumerate(self.slots):
            if slot is not None and slot.ptr == ptr and slot.busy:
                return index
        return None


def _new_slot(nbytes: int) -> torch.UntypedStorage | None:
    """A new slot's storage for ``nbytes``: with headroom where /dev/shm has room, else exact."""
    for capacity in (capacity_for(nbytes), -(-nbytes // 4096) * 4096):
        if _shm.room_for(capacity):
            try:
                return _shm.new_shared(capacity)
            except RuntimeError:  # another process took the room first (torch reserves it all)
                return None
    return None


_rings: dict[int, _Ring] = {}


def _worker_ring(slots: int) -> _Ring | None:
    if slots <= 0 or get_worker_info() is None:
        return None
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    if strategy != "file_descriptor":
        return None  # the file_system strategy names its files; it keeps today's path
    pid = os.getpid()
    ring = _rings.get(pid)
    if ring is None:
        _rings.clear()  # a fork's copy of its parent's ring is not its own
        if not _shm.room_for(8 * slots):
            return None  # not even room for its state array: batches take the fallback paths
        try:
            ring = _rings[pid] = _Ring(slots)
        except RuntimeError:  # another process took the room first
            return None
    return ring


def take(nbytes: int, slots: int, pin_slots: bool = False) -> torch.Tensor | None:
    """A buffer of ``nbytes`` bytes in a free slot of this worker's ring, or ``None``.

    ``None`` outside a DataLoader worker, with the ``file_system`` sharing strategy,
    with ``slots=0``, for an empty batch, and when every slot is in use.
    """
    if nbytes <= 0:
        return None
    ring = _worker_ring(slots)
    if ring is None:
        return None
    ring.pin = pin_slots
    return ring.take(nbytes)


def wait(nbytes: int) -> torch.Tensor | None:
    """Wait (at most :data:`pincollate._memory.shm.WAIT_S`) for a slot of this worker's ring to take ``nbytes``.

    For a batch that /dev/shm has no room for. ``None`` at once where no slot of the ring
    is big enough, or the last wait timed out and no slot has come back since.
    """
    ring = _rings.get(os.getpid())
    if nbytes <= 0 or ring is None or ring.starved or not ring.could_take(nbytes):
        return None
    start = time.monotonic()
    delay = 0.0001
    while True:
        buffer = ring.take(nbytes)
        if buffer is not None:
            waited = time.monotonic() - start
            _shm.note(f"waited {waited * 1e3:.0f} ms for a slot for a batch of {_shm.mib(nbytes)}")
            return buffer
        if time.monotonic() - start > _shm.WAIT_S:
            ring.starved = True
            return None
        time.sleep(delay)
        delay = min(2 * delay, 0.001)  # a slot comes back within a step: notice it soon


def is_slot(buffer: torch.Tensor) -> bool:
    """Whether ``buffer`` is a slot of this worker's ring."""
    ring = _rings.get(os.getpid())
    return ring is not None and ring.find(buffer) is not None


#: How many layouts a worker remembers having sent; its receiver keeps more (see _receiver).
LAYOUTS_KEPT = 64


class RecentLayouts:
    """The layouts one ring's batches crossed with, most recently used last: one rule for both sides.

    A worker remembers the last ``capacity`` layouts it sent (by id) and sends a batch of
    one of them as its key alone; the receiver keeps the layouts it was sent by key. Both
    evict the least recently *used* one, and a worker's batches arrive in the order it sent
    them, so the receiver, keeping at least as many, still holds every key a worker may
    send: a layout the worker keeps using is recent on both sides, however long ago it
    first crossed.
    """

    __slots__ = ("_kept", "capacity")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._kept: OrderedDict[Any, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: Any) -> Any:
        """The value kept under ``key`` (now the most recent), or ``None``."""
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def put(self, key: Any, value: Any) -> None:
        """Keep ``value`` under ``key`` as the most recent, evicting the least recently used."""
        self._kept[key] = value
        self._kept.move_to_end(key)
        if len(self._kept) > self.capacity:
            self._kept.popitem(last=False)


def send(buffer: torch.Tensor, layout: Any) -> tuple[Header, int, int, Any, tuple[int, Any]] | None:
    """What a batch over ``buffer`` crosses as, if ``buffer`` is a slot of this worker's ring.

    ``(header, index, generation, storage, (key, layout))``: ``storage`` (and the
    header's state array) only the first time a slot crosses; ``layout`` only the
    first time this layout crosses (the receiver keeps it under ``key``), or always
    where it has parts (a ragged batch's layout is its own; key 0). ``None`` when the
    buffer is no slot or the batch in it was sent already (it then crosses as a copy).
    """
    ring = _rings.get(os.getpid())
    if ring is None:
        return None
    with ring.lock:
        index = ring.find(buffer)
        if index is None:
            return None
        slot = ring.slots[index]
        assert slot is not None
        if not slot.pending:
            return None  # a second send of one batch: two receivers cannot share a slot
        slot.pending = False
        ring.state[index] = 1  # until the receiver's lease is over
        storage = None if slot.sent else slot.storage
        slot.sent = True
        state = None
        if not ring.state_sent or storage is not None:
            state = ring.state_storage
            ring.state_sent = True
        return (ring.token, ring.pid, state, ring.pin), index, slot.generation, storage, _layout_ref(ring, layout)


def _layout_ref(ring: _Ring, layout: Any) -> tuple[int, Any]:
    """``(key, layout)`` the first time ``layout`` crosses, ``(key, None)`` after (the ring's lock held)."""
    if layout.parts:
        return 0, layout
    known = ring.layouts.get(id(layout))
    if known is not None and known[0] is layout:
        return known[1], None
    key = ring.next_key
    ring.next_key += 1
    ring.layouts.put(id(layout), (layout, key))  # held, so its id stays its own
    return key, layout
