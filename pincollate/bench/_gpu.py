"""The benchmark's GPU rows: transfer, overlap, pinned slots (``--gpu``, ``make gpu-check``)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from .._collate.collate import MMCollate
from .._memory.arena import pinned_footprint
from ..datasets import SCENARIOS, InMemory, _Repeat
from ._methods import Images, TimmStylePrefetcher

__all__ = ["run_gpu"]


def run_gpu(quick: bool) -> dict[str, Any]:
    """Transfer and overlap on the current CUDA device (see ``make gpu-check``)."""
    from .._batch.trees import tensors
    from .._transfer.prefetch import Prefetcher
    from .._transfer.transfer import to_device

    device = torch.device("cuda")
    report: dict[str, Any] = {}

    def timed(fn: Callable[[], Any], repeat: int) -> float:
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

    big = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    seconds = timed(lambda: big.to(device, non_blocking=True), 10)
    report["peak_pinned_h2d_gb_per_s"] = big.numel() / seconds / 1e9

    dataset = InMemory(SCENARIOS["manyleaf"][0](length=32 * 4))
    samples = [dataset[i] for i in range(32)]
    ours = MMCollate()(samples)
    nbytes = sum(t.numel() * t.element_size() for t in tensors(ours))
    theirs = default_collate(samples)
    theirs = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in theirs.items()}

    def per_leaf() -> Any:
        return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in theirs.items()}

    rows = {}
    for name, fn in (
        ("mm_collate + to_device", lambda: to_device(ours, device)),
        ("per-leaf .to(non_blocking)", per_leaf),
    ):

        def row(fn: Callable[[], Any] = fn) -> dict[str, Any]:
            return {"gb_per_s": nbytes / timed(fn, 50) / 1e9, "memcpys": _count_memcpy(fn)}

        rows[name] = _guarded(row)
    report["manyleaf_transfer"] = rows
    report["manyleaf_batch_bytes"] = nbytes
    report["prefetch_loaders"] = _guarded(lambda: _prefetch_loaders(device, quick, Prefetcher))
    report["overlap"] = _guarded(lambda: _overlap(device, quick, Prefetcher))
    report["pinned_slots"] = _guarded(lambda: _pinned_slots(device, quick))
    report["slot_registration"] = _guarded(_registration_cost)
    report["pinned_trim"] = _guarded(lambda: _trim_cost(device, Prefetcher))
    return report


def _trim_cost(device: torch.device, prefetcher: Any) -> dict[str, Any]:
    """Ragged 1-32 MiB batches through the Prefetcher with a 128 MiB pinned limit: the
    pinned footprint it keeps, and what each trim of the cache costs."""
    from .._transfer import prefetch as _prefetch

    real = getattr(_prefetch, "trim_pinned")  # noqa: B009 (patched for this row, restored after)
    trims: list[tuple[bool, float]] = []

    def timed_trim(limit: int) -> bool:
        start = time.perf_counter()
        done = bool(real(limit))
        trims.append((done, time.perf_counter() - start))
        return done

    sizes = [(1 + (i * 7) % 32) << 18 for i in range(96)]  # float32: 1 to 32 MiB
    data = [{"x": torch.zeros(n)} for n in sizes]
    loader: DataLoader[Any] = DataLoader(data, batch_size=1, collate_fn=MMCollate(), pin_memory=False)  # type: ignore[arg-type]
    setattr(_prefetch, "trim_pinned", timed_trim)  # noqa: B010
    try:
        peak = 0
        for batch in prefetcher(loader, device=device, pinned_limit=128 << 20):
            batch["x"].sum()
            peak = max(peak, pinned_footprint()["reserved"])
        torch.cuda.synchronize()
    finally:
        setattr(_prefetch, "trim_pinned", real)  # noqa: B010
    done = [seconds for trimmed, seconds in trims if trimmed]
    return {
        "batches": len(sizes),
        "trim_checks": len(trims),
        "trims": len(done),
        "trim_ms_median": statistics.median(done) * 1e3 if done else None,
        "peak_reserved_mib": peak / 2**20,
    }


def _registration_cost() -> dict[str, Any]:
    """What registering one worker slot with CUDA costs (``pin_slots``), by slot size.

    It runs once per slot in the thread that unpickles the slot's first batch, and again
    every epoch when workers are not persistent (new workers, new slots).
    """
    from .._memory import registration as _registration

    rows: dict[str, Any] = {}
    for mib in (8, 32, 128):
        storage = torch.UntypedStorage._new_shared(mib << 20)  # type: ignore[no-untyped-call]
        start = time.perf_counter()
        ok = _registration.register(storage)
        seconds = time.perf_counter() - start
        if ok:
            _registration.unregister(storage.data_ptr())
        rows[f"{mib} MiB"] = {"registered": ok, "ms": seconds * 1e3, "gb_per_s": (mib << 20) / seconds / 1e9}
    return rows


def _pinned_slots(device: torch.device, quick: bool) -> dict[str, Any]:
    """Video batches/s from 2 workers to the GPU: slots registered once against a pin copy per batch.

    Both loaders pin (``pin_memory=True``); with ``pin_slots`` the pin thread finds each
    batch page-locked already and copies nothing. Also reports the pinned copies made.
    """
    stored = InMemory(SCENARIOS["video"][0](length=8 * 8))
    dataset = _Repeat(stored, 8 * (32 if quick else 128))

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
    for _ in range(3):
        rates["pin copy per batch"].append(rate(False))
        rates["pin_slots"].append(rate(True))
    medians: dict[str, Any] = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["pin_slots"] / medians["pin copy per batch"]
    return medians


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One GPU row; a failure is recorded in the report instead of ending the run."""
    try:
        return fn()
    except Exception as error:  # reported, not hidden: the row says what failed
        return {"error": f"{type(error).__name__}: {error}"}


def _prefetch_loaders(device: torch.device, quick: bool, prefetcher: Any) -> dict[str, Any]:
    """Batches/s of image batches reaching the GPU normalised: timm-style against ours."""
    from .._transfer.transforms import Normalize

    dataset = Images(64 * (4 if quick else 16))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

    def consume(batches: Any) -> float:
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
            consume(TimmStylePrefetcher(loader(default_collate), mean, std, device))
        )
        rates["Prefetcher + mm_collate"].append(
            consume(prefetcher(loader(MMCollate()), device=device, transform=lambda b: [norm.normalize(b[0]), b[1]]))
        )
    medians = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["Prefetcher + mm_collate"] / medians["timm-style + default_collate"]
    return medians


def _count_memcpy(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "Memcpy HtoD" in e.name)


def _overlap(device: torch.device, quick: bool, prefetcher: Any) -> dict[str, Any]:
    """Step time with the Prefetcher against max(compute, copy) for a synthetic kernel."""
    batches = 4 if quick else 12
    dataset = InMemory(SCENARIOS["video"][0](length=8 * batches))
    collate = MMCollate()
    host_batches = [collate([dataset[i * 8 + j] for j in range(8)]) for i in range(batches)]
    weight = torch.randn(4096, 4096, device=device)

    def compute(n: int) -> None:
        x = weight
        for _ in range(n):
            x = torch.tanh(x @ weight)

    from .._transfer.transfer import to_device

    def avg(fn: Callable[[], Any], repeat: int = 5) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeat

    copy_s = avg(lambda: to_device(host_batches[0], device))
    # Compute as long as the copy (equal lengths: full overlap halves the step).
    per_iter = avg(functools.partial(compute, 16)) / 16
    iters = max(1, min(4096, round(copy_s / per_iter)))
    compute_s = avg(functools.partial(compute, iters))
    torch.cuda.synchronize()
    start = time.perf_counter()
    steps = 0
    for batch in prefetcher(host_batches, device=device, depth=2):
        compute(iters)
        batch["flow"].sum()  # the step reads its batch, as training would
        steps += 1
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / steps
    return {
        "compute_ms": compute_s * 1e3,
        "copy_ms": copy_s * 1e3,
        "step_ms": step_s * 1e3,
        "step_over_max": step_s / max(compute_s, copy_s),
    }
