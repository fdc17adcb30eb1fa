"""Faults, resources and concurrency: nothing hangs, leaks or turns into a cryptic error."""

from __future__ import annotations

import enum
import gc
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from leaks import shut_down
from pincollate import AsList, CollateError, MMCollate, Prefetcher, RaggedFieldWarning, mm_collate
from samples import PARITY, TreeDataset, assert_one_buffer, assert_same

pytestmark = pytest.mark.slow

SCRIPTS = pathlib.Path(__file__).parent / "scripts"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Faulty(Dataset):
    """Item ``bad`` is broken in the way ``mode`` says."""

    def __init__(self, mode: str, bad: int = 5, n: int = 12):
        self.mode, self.bad, self.n = mode, bad, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            if self.mode == "raise":
                raise ValueError(f"corrupt record {i}")
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "bad-leaf":
                return {"x": torch.zeros(2), "meta": {"boxes": "not a tensor"}}
        return {"x": torch.zeros(2), "meta": {"boxes": torch.zeros(3, 4)}}


# --- faults through real DataLoaders ----------------------------------------------------


def _drain(loader: DataLoader, error: type[BaseException], match: str) -> BaseException:
    """Iterate until ``error``, then shut the workers down at once (not at garbage collection)."""
    iterator = iter(loader)
    try:
        with pytest.raises(error, match=match) as raised:
            for _ in iterator:
                pass
    finally:
        shut_down(iterator)
    return raised.value


def test_dataset_exception_in_worker_surfaces_with_its_message(no_leaks):
    loader = DataLoader(_Faulty("raise"), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60)
    _drain(loader, ValueError, "corrupt record 5")


def test_collate_error_in_worker_names_sample_and_key_path(no_leaks):
    loader = DataLoader(_Faulty("bad-leaf"), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60)
    error = _drain(loader, CollateError, r"sample 1 at \['meta'\]\['boxes'\]: expected Tensor, got str")
    assert error.sample == 1 and error.path == ("meta", "boxes")  # kept across the process boundary


def test_worker_killed_by_sigkill_gives_dataloader_error_not_a_hang():
    loader = DataLoader(_Faulty("kill"), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60)
    start = time.monotonic()
    iterator = iter(loader)
    try:
        # RuntimeError, or what torch raises when the worker died with a message in flight.
        with pytest.raises((RuntimeError, ConnectionResetError, EOFError)) as raised:
            for _ in iterator:
                pass
    finally:
        shut_down(iterator)
    assert time.monotonic() - start < 50
    if raised.type is RuntimeError:
        assert re.search(r"DataLoader worker .*(killed by signal|exited unexpectedly)", str(raised.value))


def test_early_break_leaves_nothing_behind(no_leaks):
    loader = DataLoader(
        TreeDataset("multimodal-dict", repeat=8), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60
    )
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    # What an early break leads to, done at once rather than whenever the GC gets to it.
    iterator._shutdown_workers()
    del iterator, loader


def test_keyboard_interrupt_during_iteration(no_leaks):
    loader = DataLoader(
        TreeDataset("multimodal-dict", repeat=8), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60
    )
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(loader):
            if i == 2:
                raise KeyboardInterrupt
    del loader


def test_keyboard_interrupt_in_the_loader_reaches_the_prefetcher_consumer(fake_pinned, no_leaks):
    def batches():
        for i in range(10):
            if i == 3:
                raise KeyboardInterrupt
            yield mm_collate([{"x": torch.tensor(i)}])

    seen = []
    with pytest.raises(KeyboardInterrupt):
        for batch in Prefetcher(batches(), device="cpu", pin_memory=True):
            seen.append(int(batch["x"]))
    assert seen == [0, 1, 2]


def test_prefetcher_exception_mid_epoch_then_a_fresh_epoch(fake_pinned, no_leaks):
    dataset = _Faulty("raise", bad=9)
    loader = DataLoader(dataset, batch_size=2, collate_fn=mm_collate)
    prefetcher = Prefetcher(loader, device="cpu", pin_memory=True)
    with pytest.raises(ValueError, match="corrupt record 9"):
        list(prefetcher)
    dataset.bad = -1
    assert len(list(prefetcher)) == 6


# --- resources ---------------------------------------------------------------------------


def test_epochs_errors_and_breaks_leave_no_fds_threads_or_shm(no_leaks):
    dataset = TreeDataset("multimodal-dict", repeat=8)
    for _ in range(3):
        assert len(list(DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60))) == 8
    _drain(
        DataLoader(_Faulty("raise"), batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60),
        ValueError,
        "corrupt record 5",
    )
    for i, _ in enumerate(DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=mm_collate, timeout=60)):
        if i == 0:
            break


def test_process_memory_is_flat_over_2000_batches_of_varying_size():
    collate = MMCollate(pin_memory=False)
    generator = torch.Generator().manual_seed(0)

    def batch():
        n = int(torch.randint(1, 200, (), generator=generator))
        return [
            {"x": torch.zeros(n, 64), "y": torch.zeros(int(torch.randint(1, 50, (), generator=generator))), "label": 1}
            for _ in range(8)
        ]

    with pytest.warns(RaggedFieldWarning):  # x and y, listed without a policy
        for _ in range(200):
            collate(batch())
    gc.collect()
    warm = _rss()
    for _ in range(1800):
        collate(batch())
    gc.collect()
    assert _rss() - warm < 16 << 20, f"grew {(_rss() - warm) >> 20} MiB"


def test_worker_batches_are_flat_in_memory():
    class Varying(Dataset):
        def __len__(self):
            return 4000

        def __getitem__(self, i):
            return {"x": torch.zeros(1 + i % 97, 32), "y": i}

    collate = MMCollate(fields={"x": AsList()})
    loader = DataLoader(Varying(), batch_size=8, num_workers=2, collate_fn=collate, timeout=60)
    rss = []
    for i, _ in enumerate(loader):
        if i in (50, 499):
            gc.collect()
            rss.append(_rss())
    assert rss[1] - rss[0] < 16 << 20


@pytest.mark.parametrize("method,ok", [("mm", True), ("default", False)])
def test_low_open_file_limit_many_leaves(method, ok):
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "nofile.py"), method, "128"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=SCRIPTS,
    )
    line = next((out for out in result.stdout.splitlines() if out.startswith(("OK", "FAILED"))), result.stderr[-500:])
    if ok:
        assert line == "OK 8064.0", line
    else:
        assert line.startswith("FAILED") and "Too many open files" in line, line


def test_buffer_that_cannot_be_allocated_is_a_collate_error():
    huge = torch.zeros(1).expand(1 << 42)
    with pytest.raises(CollateError, match=r"cannot allocate the batch buffer of [\d,]+ bytes"):
        MMCollate(pin_memory=False)([huge, huge])


# --- threads ------------------------------------------------------------------------------


def test_one_instance_from_many_threads_gives_correct_batches():
    collate = MMCollate(pin_memory=False)
    names = ["multimodal-dict", "tuple-samples", "namedtuple", "deep", "numpy-arrays"]
    expected = {name: collate(PARITY[name]()) for name in names}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(150):
                name = names[(seed + i) % len(names)]
                out = collate(PARITY[name]())
                assert_same(out, expected[name])
                assert_one_buffer(out)
        except BaseException as error:  # collected and re-raised in the test thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]


class _Key(enum.Enum):
    IMAGE = "image"


@pytest.mark.slow
@pytest.mark.parametrize("key", ["img[0]", "a]'b", _Key.IMAGE, (1, "x")], ids=["brackets", "quote", "enum", "tuple"])
def test_a_worker_collate_error_keeps_any_key_path(key, no_leaks):
    samples = [{key: {"x": torch.ones(2)}}, {key: {"x": "oops"}}]
    loader = DataLoader(samples, batch_size=2, num_workers=1, collate_fn=mm_collate, timeout=60)
    error = _drain(loader, CollateError, "expected Tensor, got str")
    assert error.sample == 1 and error.path == (key, "x")
