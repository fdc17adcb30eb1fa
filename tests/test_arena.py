"""Buffer kinds: shared in workers, pinned when asked and possible, plain otherwise."""

from __future__ import annotations

import pytest
import torch

from pincollate import CollateError, MMCollate
from pincollate import arena


def test_main_process_without_accelerator_is_plain():
    if arena.accelerator_can_pin():
        pytest.skip("an accelerator is present")
    assert arena.resolve_kind("auto") == "plain"
    assert arena.resolve_kind(False) == "plain"


def test_pin_true_without_accelerator_is_a_clear_error():
    if arena.accelerator_can_pin():
        pytest.skip("an accelerator is present")
    with pytest.raises(CollateError, match="pin_memory=True but no accelerator"):
        MMCollate(pin_memory=True)([torch.zeros(1)])


def test_worker_always_gets_shared_memory(monkeypatch):
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    for mode in ("auto", True, False):
        assert arena.resolve_kind(mode) == "shared"
    out = MMCollate()([{"x": torch.ones(3)}, {"x": torch.ones(3)}])
    assert out["x"].untyped_storage().is_shared()


def test_injected_allocator_counts_as_pinning(fake_pinned):
    assert arena.resolve_kind("auto") == "pinned"
    buffer = arena.allocate(128, "pinned")
    assert fake_pinned == [128] and arena.is_pinned(buffer)


def test_zero_byte_batches(monkeypatch):
    assert MMCollate(pin_memory=False)([torch.zeros(0), torch.zeros(0)]).shape == (2, 0)
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    assert MMCollate()([torch.zeros(0), torch.zeros(0)]).shape == (2, 0)
