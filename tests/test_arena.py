"""Buffer kinds: shared in workers, pinned when asked and possible, plain otherwise."""

from __future__ import annotations

import pytest
import torch

from pincollate import CollateError, MMCollate
from pincollate._memory import arena
from samples import buffer_of


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
    assert buffer_of(out).untyped_storage().is_shared()


def test_injected_allocator_counts_as_pinning(fake_pinned):
    assert arena.resolve_kind("auto") == "pinned"
    buffer = arena.allocate(128, "pinned")
    assert fake_pinned == [128] and arena.is_pinned(buffer)


def test_zero_byte_batches(monkeypatch):
    assert MMCollate(pin_memory=False)([torch.zeros(0), torch.zeros(0)]).shape == (2, 0)
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    assert MMCollate()([torch.zeros(0), torch.zeros(0)]).shape == (2, 0)


def test_large_plain_buffers_are_reused_only_once_nothing_views_them():
    arena._recycled.clear()
    nbytes = 2 << 20
    first = arena.allocate(nbytes, "plain")
    view = first[:16]
    address = first.data_ptr()
    del first
    second = arena.allocate(nbytes, "plain")
    assert second.data_ptr() != address  # a view of the first is alive
    del view, second
    third = arena.allocate(nbytes, "plain")
    assert third.data_ptr() == address  # nothing views the first one now: reused
    del third
    assert arena.allocate(nbytes + 64, "plain").data_ptr() == address  # a little bigger fits
    assert arena.allocate(nbytes * 2, "plain").data_ptr() != address  # far bigger does not
    small = arena.allocate(1024, "plain")
    assert all(kept.owner.numel() >= 1 << 20 for kept in arena._recycled.kept)
    assert len(arena._recycled.kept) <= arena._recycled.slots
    del small
    arena._recycled.clear()


def test_a_recycled_buffer_never_changes_a_batch_still_held():
    collate = MMCollate(pin_memory=False)
    samples = [{"x": torch.full((1 << 18,), float(i))} for i in range(4)]
    kept = collate(samples)
    for _ in range(3):
        other = collate([{"x": torch.full((1 << 18,), 9.0)} for _ in range(4)])
        assert other.buffer.data_ptr() != kept.buffer.data_ptr()
    assert kept["x"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_auto_pins_only_in_a_process_that_started_the_accelerator(monkeypatch):
    monkeypatch.setattr(arena, "_accelerator_available", lambda: True)
    monkeypatch.setattr(arena, "_accelerator_started", lambda: False)
    assert arena.resolve_kind("auto") == "plain"
    assert arena.resolve_kind(True) == "pinned"
    monkeypatch.setattr(arena, "_accelerator_started", lambda: True)
    assert arena.resolve_kind("auto") == "pinned"


def test_the_buffer_kind_is_settled_once_per_process_where_it_cannot_change(monkeypatch):
    asked = []
    real = arena._resolve_kind
    monkeypatch.setattr(arena, "_resolve_kind", lambda pin: asked.append(pin) or real(pin))
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    assert [arena.resolve_kind("auto") for _ in range(3)] == ["shared"] * 3
    assert asked == ["auto"]  # a worker's kind, read from the table after the first batch
    monkeypatch.setattr(arena.os, "getpid", lambda: -1)  # another process (a fork) asks again
    assert arena.resolve_kind("auto") == "shared" and asked == ["auto", "auto"]


def test_auto_is_asked_again_until_the_accelerator_starts(monkeypatch):
    asked = []
    real = arena._resolve_kind
    monkeypatch.setattr(arena, "_resolve_kind", lambda pin: asked.append(pin) or real(pin))
    monkeypatch.setattr(arena, "_accelerator_available", lambda: True)
    monkeypatch.setattr(arena, "_accelerator_started", lambda: False)
    assert [arena.resolve_kind("auto") for _ in range(2)] == ["plain"] * 2 and len(asked) == 2
    monkeypatch.setattr(arena, "_accelerator_started", lambda: True)  # the loop moved a model to the GPU
    assert [arena.resolve_kind("auto") for _ in range(2)] == ["pinned"] * 2 and len(asked) == 3


def test_a_stand_in_allocator_settles_nothing(fake_pinned):
    assert arena.resolve_kind("auto") == "pinned"
    assert not arena._settled  # the stand-in goes with the test: the process's kind is not decided by it


def test_the_accelerator_answer_is_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(arena, "_probe_accelerator", lambda: calls.append(1) or False)
    monkeypatch.setattr(arena, "_available", {})
    assert not arena._accelerator_available() and not arena._accelerator_available()
    assert len(calls) == 1
    monkeypatch.setattr(arena.os, "getpid", lambda: -1)  # as a forked child sees it
    arena._accelerator_available()
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("reserved", "active", "trims"),
    [
        (3 << 30, 0, False),  # under the limit
        (6 << 30, 1 << 30, True),  # 5 GiB cached: worth a device-wide wait
        (6 << 30, 6 << 30, False),  # all in use: a trim would free nothing
        (6 << 30, (6 << 30) - (512 << 20), False),  # 512 MiB cached: under a quarter of the limit
    ],
)
def test_the_pinned_cache_is_trimmed_only_when_it_would_free_something(monkeypatch, reserved, active, trims):
    emptied = []
    monkeypatch.setattr(arena, "pinned_footprint", lambda: {"reserved": reserved, "active": active, "peak": reserved})
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: emptied.append(True), raising=False)
    assert arena.trim_pinned(4 << 30) is trims
    assert emptied == ([True] if trims else [])


def test_ragged_batch_sizes_reuse_the_kept_buffers_while_the_last_batch_is_held():
    # Sizes vary by up to 1.7x from batch to batch (a VLM's padded ids and image patches),
    # and a loop holds the last batch while the next one is collated: after the first
    # round of sizes, every batch is served by a kept buffer (made for the largest recent
    # size; kept buffers made for each batch's own size were replaced every other batch).
    arena._recycled.clear()
    collate = MMCollate(pin_memory=False)
    sizes = [1254400, 2134720, 1527360, 1937024, 1479424, 2001408, 1777344, 1482112] * 4
    kept = []
    held = None
    for i, nbytes in enumerate(sizes):
        held = collate([{"x": torch.full((nbytes // 8,), i, dtype=torch.int64)}])
        kept.append(len(arena._recycled.kept))
        assert held["x"][0, 0].item() == i
        if i == 7:
            made = [k.owner.data_ptr() for k in arena._recycled.kept]
    assert [k.owner.data_ptr() for k in arena._recycled.kept] == made  # nothing made after the first round
    assert max(kept) <= arena._recycled.slots
    del held
    arena._recycled.clear()


def test_a_large_batch_does_not_make_later_buffers_large():
    arena._recycled.clear()
    big = arena.allocate(64 << 20, "plain")
    del big
    small = arena.allocate(2 << 20, "plain")
    assert all(kept.owner.numel() <= 3 * (2 << 20) for kept in arena._recycled.kept if kept.busy)
    del small
    arena._recycled.clear()


def test_the_trim_rule_does_not_read_torch_2_11s_active_bytes(host_allocator):
    # torch 2.11 never lowers active_bytes when a block is freed: a rule that read it would
    # see nothing cached and never trim. What pincollate's live buffers hold is counted here.
    import gc

    gc.collect()
    before = arena.pinned_footprint()["active"]
    kept = arena.allocate(8 << 20, "pinned")
    dropped = [arena.allocate((n << 20) + 1, "pinned") for n in (4, 8, 16, 32)]  # blocks of 8, 16, 32 and 64 MiB
    del dropped
    footprint = arena.pinned_footprint()
    assert footprint["reserved"] == 128 << 20 and footprint["active"] - before == 8 << 20
    assert host_allocator.stats()["active_bytes.current"] == 128 << 20  # 2.11's count: all still active
    assert arena.trim_pinned(64 << 20) and host_allocator.emptied == 1
    assert arena.pinned_footprint()["reserved"] == 8 << 20  # only the block in use is left
    assert not arena.trim_pinned(4 << 20)  # over the limit, but in use: nothing to free
    del kept
    assert arena.pinned_footprint()["active"] == before
    assert arena.trim_pinned(4 << 20) and arena.pinned_footprint()["reserved"] == 0
