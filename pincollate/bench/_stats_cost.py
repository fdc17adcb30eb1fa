"""``python -m pincollate.bench --stats-cost``: what ``Prefetcher.stats`` costs a loop, side by side.

A loop of tiny batches (8 samples of 16 floats and a label, collated in this process
by ``mm_collate``) through a ``Prefetcher`` with ``stats=False`` and with
``stats=True`` side by side, a batch of each in turn: its time per batch either way and
their ratio.
Tiny batches make the measurement's share of the loop as large as it gets. Two loops:
a training step of a tiny model (what a loop does with a batch), and the data alone
(no step: the bound on the cost's share).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .._collate.collate import mm_collate
from .._transfer.prefetch import Prefetcher

__all__ = ["format_stats_cost", "run_stats_cost"]

#: The bound the issue sets: the measurement's cost, at most this share of the loop's time.
TARGET = 0.01

Step = Callable[[Any], None]


class _Tiny(Dataset[dict[str, Any]]):
    """``n`` samples of 16 floats and a label, made up front: loading costs an index."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.items = [{"x": torch.randn(16, generator=g), "label": i % 10} for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def _training_step(device: torch.device) -> Step:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


def _data_only(batch: Any) -> None:
    pass


def _paired_epoch(loader: DataLoader[Any], device: torch.device, step: Step) -> tuple[float, float, Prefetcher[Any]]:
    """One epoch through two Prefetchers at once, without and with stats, batch by batch.

    Each pair of steps runs one batch of each, in alternating order, and each batch's
    time (its ``next`` and its step) is read by the bench's own clock: what changes the
    whole machine's speed (another process, the clock frequency) falls on both sides of
    a pair alike. Returns the trimmed mean seconds per batch without stats, the trimmed
    mean extra with stats (over the pairs' differences), and the metered Prefetcher.
    """
    metered = Prefetcher(loader, device=device, stats=True)
    sides = (iter(Prefetcher(loader, device=device, stats=False)), iter(metered))
    off: list[float] = []
    extra: list[float] = []
    clock = time.perf_counter
    for i in range(len(loader)):
        first = i % 2
        t0 = clock()
        step(next(sides[first]))
        if device.type == "cuda":  # this stream's work only: the other side's copies run on their own
            torch.cuda.current_stream(device).synchronize()
        t1 = clock()
        step(next(sides[1 - first]))
        if device.type == "cuda":  # this stream's work only: the other side's copies run on their own
            torch.cuda.current_stream(device).synchronize()
        t2 = clock()
        plain, with_stats = (t1 - t0, t2 - t1) if first == 0 else (t2 - t1, t1 - t0)
        off.append(plain)
        extra.append(with_stats - plain)
    for side in sides:  # past the end: the metered epoch closes as a loop's does
        for _ in side:
            raise AssertionError("both sides read the same loader: neither has batches left")
    return _trimmed_mean(off), _trimmed_mean(extra), metered


def _trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    """The mean of ``values`` without their lowest and highest ``cut`` share: one preempted
    step (a millisecond among microseconds) must not decide a round."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    kept = ordered[k : len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def run_stats_cost(quick: bool, batches: int | None = None, rounds: int | None = None) -> dict[str, Any]:
    """Time both loops with and without stats; a JSON-ready report.

    ``batches`` (an epoch's) and ``rounds`` override the ``quick`` or full settings.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    # A tiny model's step on one thread: more only add waiting between them, which on a
    # shared machine swamps the step.
    torch.set_num_threads(1)
    try:
        return _run(device, quick, batches, rounds)
    finally:
        torch.set_num_threads(threads)


def _run(device: torch.device, quick: bool, batches: int | None, rounds: int | None) -> dict[str, Any]:
    batch_size = 8
    n = batches or (400 if quick else 2000)
    loader = DataLoader(_Tiny(n * batch_size), batch_size=batch_size, collate_fn=mm_collate)
    n_rounds = rounds or (8 if quick else 24)
    loops: dict[str, Any] = {}
    for name, step in (("training step", _training_step(device)), ("data only", _data_only)):
        _paired_epoch(loader, device, step)  # warm-up: plans, caches, the allocator
        offs: list[float] = []
        extras: list[float] = []
        figures: dict[str, float] = {}
        for _ in range(n_rounds):
            off, extra, metered = _paired_epoch(loader, device, step)
            offs.append(off)
            extras.append(extra)
            figures = metered.stats.epoch.as_dict()
        ratios = [(off + extra) / off for off, extra in zip(offs, extras, strict=True)]
        off_s = statistics.median(offs)
        extra_s = statistics.median(extras)
        loops[name] = {
            "no_stats_us": off_s * 1e6,
            "stats_us": (off_s + extra_s) * 1e6,
            # The cost is the median round's ratio; each round's from its pairs of batches.
            "ratio": statistics.median(ratios),
            "spread": [min(ratios), max(ratios)],
            "cost_us": extra_s * 1e6,
            "measured": {key: figures[key] for key in ("input_bound", "batches_per_s")},
        }
    return {
        "device": str(device),
        "batch_size": batch_size,
        "batches": n,
        "rounds": n_rounds,
        "target": TARGET,
        "loops": loops,
    }


def format_stats_cost(report: dict[str, Any]) -> str:
    lines = [
        f"Prefetcher stats, their own cost: tiny batches ({report['batch_size']} samples of 16 floats and a label, "
        f"mm_collate in this process), device {report['device']}, {report['batches']} batches an epoch, "
        f"{report['rounds']} rounds, a batch of each in turn (us per batch; ratio: with stats over without, median "
        "round, lowest-highest):",
        f"  {'loop':<16} {'no stats':>9} {'stats':>9} {'ratio':>7} {'(spread)':>15} {'cost':>7} {'us':>6}",
    ]
    for name, row in report["loops"].items():
        lo, hi = row["spread"]
        lines.append(
            f"  {name:<16} {row['no_stats_us']:9.1f} {row['stats_us']:9.1f} {row['ratio']:7.3f} "
            f"{f'({lo:.3f}-{hi:.3f})':>15} {row['ratio'] - 1:+7.1%} {row['cost_us']:6.2f}"
        )
    target = report["target"]
    met = report["loops"]["training step"]["ratio"] - 1 <= target
    lines.append(f"  target: at most {target:.0%} of a training loop's time: {'met' if met else 'NOT met'} in this run")
    return "\n".join(lines)
