"""``python -m pincollate.bench --stats-cost``: what ``Prefetcher.stats`` costs a loop, side by side.

A loop of tiny batches (8 samples of 16 floats and a label, collated in this process
by ``mm_collate``) through a ``Prefetcher`` with ``stats=False`` and with
``stats=True``, in rotating rounds: its time per batch either way and their ratio.
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
from ._timing import rotated, whole

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


def _epoch(loader: DataLoader[Any], device: torch.device, stats: bool, step: Step) -> tuple[float, Prefetcher[Any]]:
    """Seconds per batch of one epoch through a Prefetcher with or without stats."""
    prefetcher = Prefetcher(loader, device=device, stats=stats)
    start = time.perf_counter()
    n = 0
    for batch in prefetcher:
        step(batch)
        n += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / n, prefetcher


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
    ways = {"no stats": False, "stats": True}
    n_rounds = whole(rounds or (8 if quick else 24), ways)
    loops: dict[str, Any] = {}
    for name, step in (("training step", _training_step(device)), ("data only", _data_only)):
        for stats in ways.values():  # warm-up: plans, caches, the allocator
            _epoch(loader, device, stats, step)
        times: dict[str, list[float]] = {way: [] for way in ways}
        figures: dict[str, float] = {}
        for round_ in range(n_rounds):
            for way, stats in rotated(ways, round_):
                seconds, prefetcher = _epoch(loader, device, stats, step)
                times[way].append(seconds)
                if stats:
                    figures = prefetcher.stats.epoch.as_dict()
        ratios = [on / off for on, off in zip(times["stats"], times["no stats"], strict=True)]
        loops[name] = {
            "no_stats_us": statistics.median(times["no stats"]) * 1e6,
            "stats_us": statistics.median(times["stats"]) * 1e6,
            # Each round timed both back to back: the cost is the median round's ratio.
            "ratio": statistics.median(ratios),
            "spread": [min(ratios), max(ratios)],
            "cost_us": statistics.median([on - off for on, off in zip(times["stats"], times["no stats"], strict=True)])
            * 1e6,
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
        f"{report['rounds']} rounds (us per batch; ratio: with stats over without, median round, lowest-highest):",
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
