"""The benchmark's GPU rows (``--gpu``, ``tests/gpu_check.py``).

Each row runs on the current CUDA device and is measured in the same run as the rows
it is compared with: DMAs per batch on every move path, bandwidth against the pinned
peak, copies overlapped with compute of the same length, pinned worker slots and what
registering them costs, and the pinned cache's trims. A row that fails is recorded as
``{"error": ...}`` and the others still run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from .._batch.trees import map_tensors, tensors
from .._collate.collate import MMCollate
from .._memory.arena import pinned_footprint, trim_pinned
from .._transfer import staging
from .._transfer.prefetch import Prefetcher
from .._transfer.transfer import to_device
from ..datasets import SCENARIOS, InMemory, _Repeat
from ._methods import Images, TimmStylePrefetcher

__all__ = ["count_h2d", "dmas_per_batch", "overlap", "per_leaf", "run_gpu", "spin", "spin_cycles", "trim_cost"]

#: Called with each row's name and result as soon as it is measured.
RowDone = Callable[[str, Any], None]


def run_gpu(
    quick: bool,
    done: RowDone | None = None,
    started: Callable[[str], None] | None = None,
    skip: Collection[str] = (),
) -> dict[str, Any]:
    """Every GPU row on the current CUDA device but those in ``skip``.

    ``started`` hears of each row as it starts, ``done`` of its result as it ends (the
    GPU gate records each at once, so a row that hangs loses nothing measured before it).
    """
    device = torch.device("cuda")
    report: dict[str, Any] = {}

    def row(name: str, fn: Callable[[], Any]) -> None:
        if name in skip:
            return
        if started is not None:
            started(name)
        report[name] = _guarded(fn)
        if done is not None:
            done(name, report[name])

    row("peak_pinned_h2d_gb_per_s", lambda: peak_h2d(device))
    peak = report.get("peak_pinned_h2d_gb_per_s")
    row("manyleaf_transfer", lambda: _transfer(device, peak if isinstance(peak, float) else None))
    row("dmas_per_batch", lambda: dmas_per_batch(device))
    row("overlap", lambda: overlap(device))
    row("prefetch_loaders", lambda: _prefetch_loaders(device, quick))
    row("pinned_slots", lambda: _pinned_slots(device, quick))
    row("slot_registration", _registration_cost)
    row("pinned_trim", lambda: trim_cost(device, 1 << 20))
    return report


def _guarded(fn: Callable[[], Any]) -> Any:
    """One GPU row; a failure is recorded in the report instead of ending the run."""
    try:
        return fn()
    except Exception as error:  # reported, not hidden: the row says what failed
        return {"error": f"{type(error).__name__}: {error}"}


def _device_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Device time of one call of ``fn`` (CUDA events around ``repeat`` calls, after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / repeat


def peak_h2d(device: torch.device) -> float:
    """GB/s of one 256 MiB copy from pinned memory: the peak the other rows are measured against."""
    big = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    return big.numel() / _device_seconds(lambda: big.to(device, non_blocking=True), 10) / 1e9


def count_h2d(fn: Callable[[], Any]) -> int:
    """Host-to-device copies the device ran during ``fn`` (``Memcpy HtoD`` in torch's profiler).

    The profiler records every copy the device runs, from any thread (the Prefetcher's
    staging thread too), one activity per ``cudaMemcpyAsync``.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if "Memcpy HtoD" in event.name)


def per_leaf(tree: Any, device: torch.device) -> Any:
    """``tree`` moved one ``.to()`` per tensor, as a hand-written loop does (the DMA counts' control)."""
    return map_tensors(tree, lambda t: t.to(device, non_blocking=True))


def _manyleaf() -> list[Any]:
    dataset = InMemory(SCENARIOS["manyleaf"][0](length=32 * 4))
    return [dataset[i] for i in range(32)]


def _transfer(device: torch.device, peak: float | None) -> dict[str, Any]:
    """A 32-sample many-leaf batch to the device: one copy of its buffer against a copy per leaf."""
    samples = _manyleaf()
    ours = MMCollate()(samples)
    nbytes = sum(t.numel() * t.element_size() for t in tensors(ours))
    theirs = map_tensors(default_collate(samples), lambda t: t.pin_memory())
    rows: dict[str, Any] = {"batch_bytes": nbytes, "leaves": len(list(tensors(theirs)))}
    for name, fn in (
        ("mm_collate + to_device", lambda: to_device(ours, device)),
        ("per-leaf .to(non_blocking)", lambda: per_leaf(theirs, device)),
    ):
        gb_per_s = nbytes / _device_seconds(fn, 50) / 1e9
        rows[name] = {"gb_per_s": gb_per_s, "of_peak": gb_per_s / peak if peak else None, "memcpys": count_h2d(fn)}
    return rows


def dmas_per_batch(device: torch.device) -> dict[str, float]:
    """Host-to-device copies per batch on each move path, counted by the profiler.

    ``Batch.to``, ``to_device`` and the ``Prefetcher`` move a pinned batch in one copy;
    a batch with a key added after collate moves one copy per storage (its buffer and
    the new value: 2); the same batch moved one ``.to()`` per leaf is the control.
    """
    samples = _manyleaf()
    collate = MMCollate(pin_memory=True)
    batch = collate(samples)
    changed = collate(samples)
    changed["added"] = torch.arange(1024.0).pin_memory()
    batches = [collate(samples) for _ in range(4)]
    return {
        "Batch.to": count_h2d(lambda: batch.to(device, non_blocking=True)),
        "to_device": count_h2d(lambda: to_device(batch, device)),
        "Prefetcher": count_h2d(lambda: list(Prefetcher(batches, device=device))) / len(batches),
        "changed batch (2 storages)": count_h2d(lambda: to_device(changed, device)),
        "per leaf (control)": count_h2d(lambda: per_leaf(batch, device)),
        "leaves": len(list(tensors(batch))),
    }


def spin(cycles: int) -> None:
    """Compute that takes the device ``cycles`` clock cycles and nothing else (no memory traffic)."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]


def spin_cycles(seconds: float) -> int:
    """Clock cycles :func:`spin` needs to take ``seconds`` on this device (calibrated here and now)."""
    probe = 10_000_000
    per_cycle = _device_seconds(lambda: spin(probe), 3) / probe
    return max(1, round(seconds / per_cycle))


def overlap(device: torch.device, megabytes: int = 256, steps: int = 12, one_stream: bool = False) -> dict[str, float]:
    """Steps of a copy and a compute of the same length: through the Prefetcher against one stream in turn.

    The compute is :func:`spin` calibrated to the copy's time. In turn on one
    stream a step takes both (``serial_step_ms``); copied ahead on the Prefetcher's side
    stream, only the longer (``ratio`` = step / serial: 0.5 is full overlap, 1.0 none).
    ``one_stream`` queues the Prefetcher's copies on the consumer's stream (the control).
    """
    collate = MMCollate(pin_memory=True)
    host = [collate([{"x": torch.full((megabytes << 20,), i, dtype=torch.uint8)}]) for i in range(2)]
    batches = [host[i % 2] for i in range(steps)]
    copy_s = _device_seconds(lambda: to_device(host[0], device), 5)
    cycles = spin_cycles(copy_s)
    compute_s = _device_seconds(lambda: spin(cycles), 5)

    def step(batch: Any) -> None:
        spin(cycles)
        batch["x"][:1].sum()  # the step reads its batch, as training would

    def serial() -> None:
        for batch in batches:
            step(to_device(batch, device))

    def prefetched() -> None:
        prefetcher = Prefetcher(batches, device=device, depth=2)
        if one_stream:
            prefetcher._stream = torch.cuda.current_stream(device)
        for batch in prefetcher:
            step(batch)

    serial_s = _wall_seconds(serial) / steps
    step_s = _wall_seconds(prefetched) / steps
    return {
        "copy_ms": copy_s * 1e3,
        "compute_ms": compute_s * 1e3,
        "serial_step_ms": serial_s * 1e3,
        "step_ms": step_s * 1e3,
        "ratio": step_s / serial_s,
    }


def _wall_seconds(fn: Callable[[], Any]) -> float:
    """Wall time of ``fn`` with the device drained before and after: the second of two runs."""
    seconds = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds[-1]


class _Ragged(Dataset[dict[str, torch.Tensor]]):
    """96 one-sample batches of 1 to 32 ``unit`` bytes (made when asked, not kept)."""

    def __init__(self, unit: int):
        self.sizes = [(1 + (i * 7) % 32) * unit for i in range(96)]

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.zeros(self.sizes[i] // 4)}


def trim_cost(device: torch.device, unit: int) -> dict[str, Any]:
    """Ragged batches (1 to 32 ``unit`` bytes) through the Prefetcher with a limit of 128 units:
    the pinned memory it keeps, and what each trim of the cache costs."""
    trims: list[tuple[bool, float]] = []

    def timed_trim(limit: int) -> bool:
        start = time.perf_counter()
        trimmed = trim_pinned(limit)
        trims.append((trimmed, time.perf_counter() - start))
        return trimmed

    loader: DataLoader[Any] = DataLoader(_Ragged(unit), batch_size=1, collate_fn=MMCollate(pin_memory=False))
    # Replaced where the staging thread looks it up, for this row (a CPU test runs the row).
    setattr(staging, "trim_pinned", timed_trim)  # noqa: B010
    try:
        peak = 0
        for batch in Prefetcher(loader, device=device, pinned_limit=128 * unit):
            batch["x"].sum()
            peak = max(peak, pinned_footprint()["reserved"])
        torch.cuda.synchronize()
    finally:
        setattr(staging, "trim_pinned", trim_pinned)  # noqa: B010
    done = [seconds for trimmed, seconds in trims if trimmed]
    return {
        "batches": len(loader),
        "limit_mib": 128 * unit / 2**20,
        "trim_checks": len(trims),
        "trims": len(done),
        "trim_ms_median": statistics.median(done) * 1e3 if done else None,
        "peak_reserved_mib": peak / 2**20,
        "end_reserved_mib": pinned_footprint()["reserved"] / 2**20,
    }


def _registration_cost() -> dict[str, Any]:
    """What registering one worker slot with CUDA costs (``pin_slots``), by slot size.

    It runs once per slot in the thread that unpickles the slot's first batch, and again
    every epoch when workers are not persistent (new workers, new slots).
    """
    from .._memory import registration

    rows: dict[str, Any] = {}
    for mib in (8, 32, 128):
        storage = torch.UntypedStorage._new_shared(mib << 20)  # type: ignore[no-untyped-call]
        start = time.perf_counter()
        ok = registration.register(storage)
        seconds = time.perf_counter() - start
        if ok:
            registration.unregister(storage.data_ptr())
        rows[f"{mib} MiB"] = {"registered": ok, "ms": seconds * 1e3, "gb_per_s": (mib << 20) / seconds / 1e9}
    return rows


def _pinned_slots(device: torch.device, quick: bool) -> dict[str, Any]:
    """Video batches/s from 2 workers to the GPU: slots registered once against a pin copy per batch.

    Both loaders pin (``pin_memory=True``); with ``pin_slots`` the pin thread finds each
    batch page-locked already and copies nothing. Every epoch starts new workers, whose
    slots are registered afresh: ``registrations_per_epoch`` counts them.
    """
    from .._memory import registration

    stored = InMemory(SCENARIOS["video"][0](length=8 * 8))
    dataset = _Repeat(stored, 8 * (32 if quick else 128))
    registered: list[int] = []
    real = registration.register

    def counted(storage: torch.UntypedStorage) -> bool:
        registered.append(storage.nbytes())
        return real(storage)

    def rate(pin_slots: bool) -> float:
        loader = DataLoader(
            dataset,
            batch_size=8,
            num_workers=2,
            pin_memory=True,
            collate_fn=MMCollate(pin_slots=pin_slots),
            timeout=120,
        )
        iterator = iter(loader)
        next(iterator)
        start = time.perf_counter()
        count = 0
        for batch in iterator:
            batch.to(device, non_blocking=True)["video"].float().mean()
            count += 1
        torch.cuda.synchronize()
        return count / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"pin copy per batch": [], "pin_slots": []}
    epochs: list[int] = []
    registration.register = counted
    try:
        for _ in range(3):
            rates["pin copy per batch"].append(rate(False))
            registered.clear()
            rates["pin_slots"].append(rate(True))
            epochs.append(len(registered))
    finally:
        registration.register = real
    medians: dict[str, Any] = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["pin_slots"] / medians["pin copy per batch"]
    medians["registrations_per_epoch"] = statistics.median(epochs)
    return medians


def _prefetch_loaders(device: torch.device, quick: bool) -> dict[str, Any]:
    """Batches/s of image batches reaching the GPU normalised: timm-style against ours."""
    from .._transfer.transforms import Normalize

    dataset = Images(64 * (4 if quick else 16))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

    def consume(batches: Iterator[Any]) -> float:
        start = time.perf_counter()
        count = 0
        for batch in batches:
            images = batch[0]
            images.sum()
            count += 1
        torch.cuda.synchronize()
        return count / (time.perf_counter() - start)

    def loader(collate: Any) -> DataLoader[Any]:
        return DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True, collate_fn=collate)

    norm = Normalize(mean, std)
    rates: dict[str, list[float]] = {"timm-style + default_collate": [], "Prefetcher + mm_collate": []}
    for _ in range(3):
        rates["timm-style + default_collate"].append(
            consume(iter(TimmStylePrefetcher(loader(default_collate), mean, std, device)))
        )
        prefetcher = Prefetcher(loader(MMCollate()), device=device, transform=lambda b: [norm.normalize(b[0]), b[1]])
        rates["Prefetcher + mm_collate"].append(consume(iter(prefetcher)))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["Prefetcher + mm_collate"] / medians["timm-style + default_collate"]
    return medians
