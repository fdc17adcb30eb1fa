"""Stand-ins for what a CUDA device provides, so its control flow runs on a CPU machine."""

from __future__ import annotations

import collections
import weakref

import torch


class Stream:
    """A CUDA stream: counts the streams made and lists the events waited on."""

    made = 0

    def __init__(self, device=None):
        type(self).made += 1
        self.waited: list = []

    def wait_event(self, event):
        self.waited.append(event)


class Event:
    """A CUDA event: recorded on a stream; a timed one (``stats``' copy times) reads back 1 ms."""

    def __init__(self, enable_timing=False):
        self.timed = enable_timing

    def record(self, stream=None):
        self.stream = stream

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        assert self.timed and end.timed
        return 1.0


class CachingHostAllocator:
    """torch 2.11's caching host allocator as its statistics tell it, over ordinary memory.

    A request is rounded up to a power of two; a block comes back to the cache when its
    buffer's storage dies and is reused for a request of its size; emptying the cache
    frees the cached blocks. ``allocated_bytes`` (what it holds) is right, as in 2.11;
    ``active_bytes`` is raised by every block handed out and never lowered, as 2.11 does.
    """

    def __init__(self) -> None:
        self.cached: collections.Counter[int] = collections.Counter()
        self.reserved = self.peak = self.active = self.emptied = 0
        self.blocks: dict[weakref.ref[torch.UntypedStorage], tuple[int, int, int]] = {}

    def allocate(self, nbytes: int) -> torch.Tensor:
        block = 1 << (nbytes - 1).bit_length() if nbytes else 0
        if self.cached[block]:
            self.cached[block] -= 1
        else:
            self.reserved += block
            self.peak = max(self.peak, self.reserved)
        self.active += block
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        storage = buffer.untyped_storage()
        self.blocks[weakref.ref(storage, self._freed)] = (storage.data_ptr(), storage.data_ptr() + nbytes, block)
        return buffer

    def _freed(self, ref: weakref.ref[torch.UntypedStorage]) -> None:
        self.cached[self.blocks.pop(ref)[2]] += 1

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        at = tensor.untyped_storage().data_ptr()
        return any(start <= at < end for start, end, _ in self.blocks.values())

    def stats(self) -> dict[str, int]:
        return {
            "allocated_bytes.current": self.reserved,
            "allocated_bytes.peak": self.peak,
            "active_bytes.current": self.active,
        }

    def empty_cache(self) -> None:
        self.reserved -= sum(block * count for block, count in self.cached.items())
        self.cached.clear()
        self.emptied += 1
