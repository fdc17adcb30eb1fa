"""Stand-ins for what a CUDA device provides, so its control flow runs on a CPU machine."""

from __future__ import annotations

import collections
import ctypes
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


class Runtime:
    """The CUDA runtime's host registration, succeeding (the memory stays ordinary)."""

    def cudaHostRegister(self, ptr, nbytes, flags):
        return 0

    def cudaHostUnregister(self, ptr):
        return 0


class LaggingDevice:
    """A device that runs its copies late: each reads its source only when the device gets to it.

    A copy to it returns its destination at once, unfilled, as a non-blocking copy does;
    the device runs its queue only when the host waits on an event (``synchronize``),
    up to that event. An event's ``query`` runs nothing: it says whether the device has
    passed it. A queued copy keeps the source's address, not the tensor (a DMA engine
    holds no reference): a source reused between the call and the wait is what it reads.
    """

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[int, torch.Tensor]] = collections.deque()
        self.queued = self.done = 0
        device = self

        class DeviceEvent:
            def record(self, stream=None):
                self.at = device.queued

            def query(self):
                return device.done >= self.at

            def synchronize(self):
                device.run(self.at)

        self.Event = DeviceEvent

    def copy(self, source: torch.Tensor, target: torch.device, non_blocking: bool) -> torch.Tensor:
        assert source.is_contiguous()
        out = torch.empty_like(source)
        self.queue.append((source.data_ptr(), out))
        self.queued += 1
        return out

    def run(self, until: int | None = None) -> None:
        """Run the queued copies, up to the ``until``-th (all of them by default)."""
        until = self.queued if until is None else until
        while self.done < until:
            address, out = self.queue.popleft()
            ctypes.memmove(out.data_ptr(), address, out.numel() * out.element_size())
            self.done += 1
