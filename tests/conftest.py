import pytest
import torch


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
    from pincollate import _arena as arena

    calls: list[int] = []
    pinned: set[int] = set()

    def allocate(nbytes: int) -> torch.Tensor:
        calls.append(nbytes)
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        pinned.add(buffer.untyped_storage().data_ptr())
        return buffer

    def is_pinned(tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in pinned

    previous = arena.set_pinned_allocator(allocate, is_pinned)
    yield calls
    arena.set_pinned_allocator(*previous)
