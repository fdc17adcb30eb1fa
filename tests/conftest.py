import contextlib
import os
import weakref

import pytest
import torch
from torch.multiprocessing import reductions

from leaks import Snapshot
from stand_ins import CachingHostAllocator, Event, LaggingDevice, Runtime, Stream

try:
    from hypothesis import settings
except ImportError:  # a machine with only torch, numpy and pytest (a lent GPU's): its files skip
    settings = None

if settings is not None:
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


@pytest.fixture(autouse=True)
def fresh_mm_collate():
    """Each test finds ``pincollate.mm_collate`` as a new process does: no cached plans, its
    warnings (once per field, per collate) not yet given, so a test's warnings are its own, and
    no buffer kind settled.
    """
    from pincollate import mm_collate
    from pincollate._memory import arena

    mm_collate.__setstate__(mm_collate.__getstate__())
    # The buffer kinds this process settled: a test may stand in for another process (a worker).
    arena._settled.clear()


@pytest.fixture(autouse=True)
def compile_at_first_sight(request, monkeypatch):
    """A new structure's plan compiled by its first batch, so a test reads and exercises the plan its
    batch made; tests marked ``walk_first`` (workers, frameworks, the default's own tests) run as
    users do: the first batch walked, the plan compiled when the structure comes again.
    """
    if request.node.get_closest_marker("walk_first") is None and request.node.get_closest_marker("slow") is None:
        from pincollate._plan import cache

        monkeypatch.setattr(cache, "WALK_FIRST_SIGHT", False)


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


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """torch.cuda's streams, events and device switches as stand-ins; the staging's copy lists its batches.

    Returns the consumer's stream and the ``label[0]`` of each batch the staging thread moved.
    """
    from pincollate._transfer import staging

    Stream.made = 0
    consumer = Stream()
    Stream.made = 0
    moved: list[int] = []

    def to_device(batch, device, non_blocking=True):
        assert non_blocking
        moved.append(int(batch["label"][0]))
        return batch

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(staging, "to_device", to_device)
    return consumer, moved


@pytest.fixture
def lagging_device(monkeypatch):
    """Copies to "cuda" made by a :class:`LaggingDevice`; worker slots registered by a stand-in runtime.

    ``pin_slots`` registers each slot (the stand-in's ``cudaHostRegister`` succeeds), and a
    non-blocking copy from a registered slot holds it until the device has run the copy.
    """
    from pincollate._memory import arena, registration

    device = LaggingDevice()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", device.Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(registration, "cudart", Runtime)
    monkeypatch.setattr(arena, "_copy", device.copy)
    yield device
    device.run()
    registration.prune()


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
