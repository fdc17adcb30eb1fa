"""Main-process host buffers that are not pinned: the last few large ones recycled, small ones fresh.

A large buffer is leased out (:mod:`pincollate._memory.ownership`) and kept for later batches of about
its size; a small one is made fresh for each batch, with nothing to hand back.
"""

from __future__ import annotations

import collections

import torch

from .._locks import new_lock
from . import ownership as _ownership
from .ring import capacity_for

__all__ = ["Recycled", "owned"]


class _Kept:
    __slots__ = ("array", "busy", "owner")

    def __init__(self, owner: torch.Tensor):
        self.owner = owner
        self.array = owner.numpy()
        self.busy = False

    def over(self, reusable: bool) -> None:
        self.busy = False  # plain memory: a fork child has its own copy, so always reusable


class Recycled:
    """The last few large plain buffers, leased out again once nothing can read them.

    A fresh large buffer costs a page fault and kernel zeroing per page written, as
    often as the C allocator hands its memory back to the kernel, which depends on
    what else allocates. Batches of one structure have about one size, so the last
    few buffers are kept and each batch gets a lease of one (:mod:`pincollate._memory.ownership`): a
    storage of exactly its bytes, handed out again under the one rule there. Ragged
    batches vary in size from batch to batch, so a new buffer is made for the largest
    of the last ``window`` requests (with headroom; at most twice this one), and a kept
    one serves any batch from a third of its size up: the smallest idle one that fits.
    At most ``slots`` are kept.
    """

    def __init__(self, slots: int = 2, least: int = 1 << 20, window: int = 16):
        self.slots = slots
        self.least = least
        self.kept: list[_Kept] = []
        self.recent: collections.deque[int] = collections.deque(maxlen=window)
        self.lock = new_lock()

    def take(self, nbytes: int) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8, device="cpu")  # no memory: nothing can read it
        if nbytes < self.least:
            return owned(nbytes)  # not recycled: nothing to hand back
        with self.lock:
            self.recent.append(nbytes)
            fitting = [kept for kept in self.kept if not kept.busy and nbytes <= kept.owner.numel() <= 3 * nbytes]
            found = min(fitting, key=lambda kept: kept.owner.numel(), default=None)
            if found is None:
                # Room for the recent batches, but never more than this one could use again.
                wanted = min(max(self.recent), 2 * nbytes)
                found = _Kept(torch.empty(capacity_for(wanted), dtype=torch.uint8, device="cpu"))
                self.kept.append(found)
                if len(self.kept) > self.slots:
                    idle = [kept for kept in self.kept if not kept.busy]
                    self.kept.remove(idle[0] if idle else self.kept[0])  # a busy one lives on in its lease
            found.busy = True
        return _ownership.grant(found.array[:nbytes], found.over, shared=False, keep=found)

    def clear(self) -> None:
        with self.lock:
            self.kept.clear()
            self.recent.clear()


def owned(nbytes: int) -> torch.Tensor:
    """A fresh flat ``uint8`` buffer whose memory outlives any move of its storage.

    The memory belongs to a tensor nobody else sees. The buffer's storage holds it, and
    so does every storage made over the buffer (:class:`pincollate._batch.views.Views`): ``share_memory_``
    on any of them (which swaps its memory for fresh shared memory) frees nothing that
    another reader still reads. No lease is needed: the memory is never handed out again.
    """
    owner = torch.empty(nbytes, dtype=torch.uint8, device="cpu").numpy()
    return _ownership.hold(torch.from_numpy(owner), owner)
