import collections
import os
import weakref

import pytest
import torch
from hypothesis import settings
from torch.multiprocessing import reductions

from leaks import Snapshot

# The suite runs the same property examples every time (a failure reproduces, and a run cannot
# pass or fail by the examples it drew); HYPOTHESIS_PROFILE=explore draws new ones.
settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_pinned(monkeypatch):
    """Pretend pinning works: count pinned allocations and mark their buffers.

    The real allocator needs an accelerator; this one returns ordinary memory
    and records each allocation so tests can prove "one pinned copy per batch".
    """
    from pincollate._memory import arena

    calls: list[int] = []
    pinned: list[tuple[int, int, weakref.ref[torch.UntypedStorage]]] = []

    def allocate(nbytes: int) -> torch.Tensor:
        calls.append(nbytes)
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        storage = buffer.untyped_storage()
        pinned.append((storage.data_ptr(), storage.data_ptr() + nbytes, weakref.ref(storage)))
        return buffer

    def is_pinned(tensor: torch.Tensor) -> bool:
        # As the driver answers: by address, anywhere inside a live pinned allocation
        # (a batch's tensors each have a storage of their own inside its buffer).
        at = tensor.untyped_storage().data_ptr()
        return any(start <= at < end and alive() is not None for start, end, alive in pinned)

    previous = arena.set_pinned_allocator(allocate, is_pinned)
    yield calls
    arena.set_pinned_allocator(*previous)


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


@pytest.fixture
def host_allocator(monkeypatch):
    """Pinned buffers from a stand-in of torch 2.11's caching host allocator, which torch reports on."""
    from pincollate._memory import arena

    allocator = CachingHostAllocator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", allocator.stats)
    monkeypatch.setattr(torch._C, "_host_emptyCache", allocator.empty_cache, raising=False)
    previous = arena.set_pinned_allocator(allocator.allocate, allocator.is_pinned)
    yield allocator
    arena.set_pinned_allocator(*previous)


_rebuild_storage_fd = reductions.rebuild_storage_fd
_received = [0]


def _counting_rebuild(*args):
    # Module level: a worker forked after the patch pickles this function by name.
    _received[0] += 1
    return _rebuild_storage_fd(*args)


@pytest.fixture
def storages_received(monkeypatch):
    """Counts storages this process maps from a worker (each a file descriptor and a new mapping)."""
    _received[0] = 0
    monkeypatch.setattr(reductions, "rebuild_storage_fd", _counting_rebuild)
    return _received


@pytest.fixture
def pretend_accelerator(monkeypatch):
    """Make DataLoader believe an accelerator exists so its pin thread runs on CPU."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)


@pytest.fixture
def no_leaks():
    """The test leaves no file descriptor, /dev/shm file, thread or ring of its own behind."""
    before = Snapshot()
    yield before
    before.settled()
