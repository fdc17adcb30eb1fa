"""A small /dev/shm (Docker's 64 MiB): workers wait for their slots, then send by pipe.

The loader cases run in a private mount namespace whose /dev/shm is a 64 MiB tmpfs,
for that one process (``unshare -m``; root only): nothing outside it changes. They
skip, saying why, where a namespace cannot be made.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from pincollate import AsList, CollateError, MMCollate, Pad, mm_collate
from pincollate._memory import arena
from pincollate._memory import ring as _ring
from pincollate._memory import shm as _shm
from pincollate._memory.shm import SharedMemoryWarning
from samples import assert_same, buffer_of

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "small_shm.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNT = "mount -t tmpfs -o size=64m tmpfs /dev/shm"


def _namespace_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    if os.geteuid() != 0:
        return "a private /dev/shm needs root (unshare -m and mount)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", MOUNT], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot mount a private /dev/shm here: {probe.stderr.strip()[:200]}"
    return None


_PROBLEM = _namespace_problem() if sys.platform == "linux" else "Linux only"
small_shm = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


def run_case(case: str, mib: float, workers: int, *extra: str) -> dict:
    """One case of tests/scripts/small_shm.py in a 64 MiB /dev/shm."""
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "ignore::UserWarning:torch.utils.data.dataloader"}
    command = f'{MOUNT} && exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", command, "sh", sys.executable, SCRIPT, case, str(mib), str(workers), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.stderr[-2000:]
    out = json.loads(lines[-1])
    assert out["shm_mib"] == 64, out
    return out


def check_warning(out: dict, *, surely: bool = True) -> None:
    """One warning per loader, however many workers and batches.

    ``surely=False`` where whether any batch waits depends on timing: two workers of 24 MiB
    slots fill 48 MiB of the 64, and a worker's second batch waits only if the consumer
    still holds its first (a quick consumer has let go, and the slot is reused).
    """
    assert out["warnings"] == 1 if surely else out["warnings"] <= 1, out
    if out["warnings"]:
        assert "/dev/shm is too small" in out["warning"] and "it has 64 MiB" in out["warning"]
        assert "--shm-size" in out["warning"]


@small_shm
@pytest.mark.slow
@pytest.mark.parametrize(
    ("mib", "workers"),
    [(4, 2), (24, 2), (48, 2), (48, 4), (80, 2)],
    ids=["4MiB-2w", "24MiB-2w", "48MiB-2w", "48MiB-4w", "80MiB-bigger-than-shm"],
)
def test_an_epoch_completes_with_the_right_values(mib, workers):
    out = run_case("epoch", mib, workers)
    assert out["ok"] and out["batches"] == 4, out
    assert out["shm_left_mib"] == 0, out  # every slot and file given back
    if mib == 4:
        assert out["warnings"] == 0, out  # everything fits: nothing to say
    else:
        # 48 MiB slots: the second worker's first batch cannot fit beside the first's slot.
        check_warning(out, surely=mib != 24)


@small_shm
@pytest.mark.slow
@pytest.mark.parametrize("case", ["epoch", "keep"])
def test_without_memfd_what_does_not_fit_crosses_by_pipe(case):
    out = run_case(case, 48, 2, "pipe")
    assert out["ok"] and out["kept_intact"] and out["transport"] == "pipe", out
    check_warning(out)
    assert out["shm_left_mib"] == 0, out


@small_shm
@pytest.mark.slow
def test_persistent_workers_over_three_epochs():
    out = run_case("persistent", 24, 2)
    assert out["ok"] and out["batches"] == 12, out
    check_warning(out, surely=False)  # at most one over three epochs
    assert out["shm_left_mib"] == 0, out


@small_shm
@pytest.mark.slow
def test_batches_kept_by_the_consumer_stay_intact():
    # Four 24 MiB batches kept: more than all of /dev/shm, so some go by pipe.
    out = run_case("keep", 24, 2)
    assert out["ok"] and out["kept_intact"], out
    check_warning(out)
    assert out["shm_left_mib"] == 0, out


@small_shm
@pytest.mark.slow
def test_ragged_batches_with_a_policy():
    out = run_case("ragged", 24, 2)
    assert out["ok"], out
    check_warning(out, surely=False)  # 24 MiB slots: as the epoch case


@small_shm
@pytest.mark.slow
def test_a_worker_killed_while_it_waits_is_an_error_not_a_hang():
    out = run_case("kill", 24, 2)
    # torch names the dead worker one of two ways, by which of its checks sees the death first.
    assert not out["ok"] and ("killed by signal" in out["error"] or "exited unexpectedly" in out["error"]), out
    assert out["kept_intact"], out
    assert out["seconds"] < 60, out
    assert out["shm_left_mib"] == 0, out


@small_shm
@pytest.mark.slow
def test_default_collate_cannot_run_there():
    # What the namespace is for: the same epoch, its batches kept (as the "keep" case
    # keeps them), fails with torch's own collate: out of shared memory, or now and then a
    # hang that the loader's timeout ends. Kept, so that it cannot pass by a consumer
    # that happens to keep up with the workers on a busy machine.
    out = run_case("default", 24, 2)
    assert not out["ok"] and ("shared memory" in out["error"] or "timed out" in out["error"]), out


# --- the same paths without a namespace: /dev/shm made to look full ------------------------


@pytest.fixture
def full_shm(monkeypatch):
    """/dev/shm has no room for anything (workers are forked, so they see it too)."""
    monkeypatch.setattr(_shm, "room_for", lambda nbytes: False)
    monkeypatch.setattr(_shm, "WAIT_S", 0.2)
    monkeypatch.setattr(_shm, "_warned", set())
    monkeypatch.setattr(_shm, "_notice", [])
    monkeypatch.setattr(_shm, "_noticed", True)  # nothing to say in this process, unless a test asks


@pytest.fixture(params=["memfd", "pipe"])
def transport(request, monkeypatch):
    """How a worker batch crosses outside /dev/shm: a memfd, or (without one) its bytes by pipe."""
    if request.param == "pipe":
        monkeypatch.setattr(_shm, "_memfd", lambda nbytes: None)
    elif not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here")
    return request.param


_SAID = {"memfd": "outside /dev/shm", "pipe": "through its result pipe"}


def samples(n: int = 16) -> list[dict]:
    return [{"x": torch.full((3, 5), float(i)), "ids": torch.arange(i % 4 + 1), "label": i} for i in range(n)]


@pytest.mark.slow
def test_workers_send_batches_outside_shm_when_nothing_fits(full_shm, transport):
    from pincollate import MMCollate

    data = samples()
    collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
    loader = DataLoader(data, batch_size=4, num_workers=2, collate_fn=collate, timeout=60)
    with pytest.warns(SharedMemoryWarning, match=_SAID[transport]) as caught:
        batches = list(loader)
    assert len([w for w in caught if w.category is SharedMemoryWarning]) == 1
    reference = MMCollate(pin_memory=False, fields={"ids": Pad()})
    for i, batch in enumerate(batches):
        assert_same(batch, reference(data[4 * i : 4 * i + 4]))
        assert batch.layout is not None  # still one buffer, every tensor a view of it
        assert not buffer_of(batch).untyped_storage().is_shared()  # not torch's /dev/shm


def test_a_batch_crosses_as_its_bytes_where_shm_has_no_room(full_shm):
    batch = MMCollate(fields={"ids": AsList()})(samples(4))
    data = ForkingPickler.dumps(batch)
    assert len(data) >= batch.layout.nbytes  # the bytes are in the pickle
    back = pickle.loads(data)
    assert back.layout == batch.layout and back.buffer.data_ptr() != batch.buffer.data_ptr()
    assert_same(back, batch)
    back["x"] += 1  # the copy is its own
    assert not torch.equal(back["x"], batch["x"])


def test_a_worker_batch_goes_outside_shm_where_it_has_no_room(full_shm, transport, monkeypatch):
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    monkeypatch.setattr(_shm, "_noticed", False)
    batch = mm_collate([{"x": torch.zeros(100_000)}, {"x": torch.ones(100_000)}])
    assert not buffer_of(batch).untyped_storage().is_shared()
    assert (_shm.outside(batch.buffer)[1] is not None) is (transport == "memfd")
    assert torch.equal(batch["x"], default_collate([torch.zeros(100_000), torch.ones(100_000)]))
    assert _shm.noticed() and _SAID[transport] in _shm._notice[1]
    monkeypatch.setattr(arena, "get_worker_info", lambda: None)
    data = ForkingPickler.dumps(batch)
    # A memfd crosses as a descriptor; plain memory as its bytes.
    assert (len(data) < 4096) is (transport == "memfd")
    with pytest.warns(SharedMemoryWarning, match=_SAID[transport]):  # the notice it carried
        assert_same(pickle.loads(data), batch)


def test_an_output_that_cannot_cross_as_bytes_is_still_a_clear_error(full_shm, monkeypatch):
    # A top-level OrderedDict is no carrier: it crosses tensor by tensor, which needs /dev/shm.
    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    with pytest.raises(CollateError, match=r"needs [\d,]+ bytes of shared memory but /dev/shm has only"):
        mm_collate([OrderedDict(x=torch.zeros(1000)), OrderedDict(x=torch.zeros(1000))])


def test_the_warning_is_given_once_per_loader():
    notice = (("a loader",), "pincollate: /dev/shm is too small")
    _shm._warned.discard(notice[0])
    with pytest.warns(SharedMemoryWarning):
        _shm.warn_once(notice)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _shm.warn_once(notice)  # said already
        _shm.warn_once(None)


def test_workers_that_unpickled_their_own_dataset_share_one_notice_key(monkeypatch):
    # Spawned and forkserver workers (and each epoch's new ones) hold a dataset object of their own:
    # keyed by its id, their notices made one warning per worker and epoch.
    from types import SimpleNamespace

    class Numbered(torch.utils.data.Dataset):
        def __init__(self, n: int):
            self.n = n

    keys = []
    for worker in range(3):
        info = SimpleNamespace(dataset=Numbered(4), id=worker)
        monkeypatch.setattr(_shm, "get_worker_info", lambda info=info: info)
        monkeypatch.setattr(_shm, "_noticed", False)
        _shm.note("waited for a slot")
        keys.append(_shm.take_notice()[0])
    assert keys[0] == keys[1] == keys[2] and keys[0][1].endswith("Numbered")
    monkeypatch.setattr(_shm, "get_worker_info", lambda: SimpleNamespace(dataset=[1, 2], id=0))
    monkeypatch.setattr(_shm, "_noticed", False)
    _shm.note("waited for a slot")
    assert _shm.take_notice()[0] != keys[0]  # another dataset class: its own warning


def test_a_wait_is_bounded_and_remembered(monkeypatch):
    """A ring whose slot is held waits at most WAIT_S once, then skips the wait until a slot is back."""
    monkeypatch.setattr(_shm, "WAIT_S", 0.1)
    monkeypatch.setattr(_ring, "get_worker_info", lambda: object())
    monkeypatch.setattr(_ring, "_rings", {})
    held = _ring.take(1 << 16, 2)
    assert held is not None
    monkeypatch.setattr(_shm, "room_for", lambda nbytes: False)
    assert _ring.take(1 << 16, 2) is None  # no free slot and no room for another
    ring = _ring._rings[os.getpid()]
    assert ring.could_take(1 << 16) and not ring.could_take(1 << 20)
    assert _ring.wait(1 << 20) is None and not ring.starved  # no slot big enough: no wait
    assert _ring.wait(1 << 16) is None and ring.starved  # the held slot never came back
    del held
    again = _ring.take(1 << 16, 2)  # the slot is free again, and waits are worth it again
    assert again is not None and not ring.starved
    del again
    ring.state_storage = None
    _ring._rings.clear()


def test_a_batch_from_outside_shm_lands_pinned_where_its_collate_pins(full_shm, transport, fake_pinned, monkeypatch):
    from pincollate import MMCollate

    monkeypatch.setattr(arena, "get_worker_info", lambda: object())
    made = {mode: MMCollate(pin_memory=mode, fields={"ids": AsList()})(samples(4)) for mode in (True, False)}
    monkeypatch.setattr(arena, "get_worker_info", lambda: None)  # now the receiving main process
    for mode, batch in made.items():
        back = pickle.loads(ForkingPickler.dumps(batch))
        assert arena.is_pinned(back.buffer) is mode
        assert_same(back, batch)
    assert len(fake_pinned) == 1  # the one pinned buffer it landed in, no copy after


def test_a_dev_shm_without_a_limit_has_room_for_any_batch(monkeypatch):
    # A tmpfs mounted with size=0 has no limit; statvfs reports no blocks and none free.
    class Unlimited:
        f_blocks = f_bavail = 0
        f_frsize = 4096

    monkeypatch.setattr(_shm.os.path, "isdir", lambda path: True)
    monkeypatch.setattr(_shm.os, "statvfs", lambda path: Unlimited())
    assert _shm.shm_free() is None and _shm.shm_total() is None
    assert _shm.room_for(1 << 40)
