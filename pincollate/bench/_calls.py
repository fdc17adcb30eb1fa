"""How many calls a warm main-process batch makes (``--calls``): the per-batch path's length, counted, not timed.

Counting is exact and does not depend on the machine's load, so it is the benchmark's
one figure that can be compared across runs and machines as it is.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..datasets import SCENARIOS, InMemory
from ._methods import methods

__all__ = ["count_calls", "format_calls", "run_calls"]


def count_calls(collate: Callable[[Any], Any], batches: list[Any]) -> dict[str, Any]:
    """Calls per batch while ``collate`` runs each of ``batches`` once: Python functions, C functions, and where.

    ``python`` counts calls of Python functions (generated ones included), ``c`` calls of
    C functions and methods made from Python (``torch.stack``, ``len``, ``map``), as
    ``sys.setprofile`` sees them; ``top`` names the Python functions called most.
    """
    python: Counter[str] = Counter()
    c_calls = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal c_calls
        if event == "call":
            code = frame.f_code
            python[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        elif event == "c_call":
            c_calls += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        for batch in batches:
            collate(batch)
    finally:
        sys.setprofile(previous)
    # The profiler sees its own exit call (sys.setprofile): not the collate's.
    c_calls -= 1
    n = len(batches)
    return {
        "python": sum(python.values()) / n,
        "c": c_calls / n,
        "functions": len(python),
        "top": [(name, count / n) for name, count in python.most_common(8)],
    }


def run_calls(scenarios: list[str] | None = None, batches: int = 8) -> dict[str, Any]:
    """Calls per warm batch of each scenario in the main process, ``mm_collate`` beside its baseline.

    Examples:
        >>> report = run_calls(["ragged"], batches=2)
        >>> sorted(report["ragged"]), report["ragged"]["mm_collate"]["python"] > 0
        (['baseline', 'mm_collate'], True)
    """
    report: dict[str, Any] = {}
    for scenario in scenarios or list(SCENARIOS):
        cls, batch_size = SCENARIOS[scenario]
        dataset = InMemory(cls(length=batch_size * batches))
        samples = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(batches)]
        table = methods(scenario)
        baseline_name, baseline = next(iter(table.items()))
        ours = table["mm_collate"]
        assert baseline is not None and ours is not None
        row: dict[str, Any] = {}
        for name, collate in (("baseline", baseline), ("mm_collate", ours)):
            # Warm: every structure planned (a new one's first batch is walked, not planned), every
            # cache filled (each batch's sizes seen by its plan).
            for batch in samples * 2:
                collate(batch)
            row[name] = {**count_calls(collate, samples), "name": baseline_name if name == "baseline" else name}
        report[scenario] = row
    return report


def format_calls(report: dict[str, Any]) -> str:
    """The report as a table: calls per warm batch, ours beside the baseline's, and our most called functions."""
    lines = [
        "Calls per warm main-process batch (sys.setprofile; Python functions / C functions)",
        f"{'scenario':<10} {'mm_collate':>16} {'baseline':>16}  baseline",
    ]
    for scenario, row in report.items():
        ours, theirs = row["mm_collate"], row["baseline"]
        lines.append(
            f"{scenario:<10} {ours['python']:>7.0f} / {ours['c']:<6.0f} {theirs['python']:>7.0f} / {theirs['c']:<6.0f}  "
            f"{theirs['name']}"
        )
    lines.append("")
    for scenario, row in report.items():
        top = ", ".join(f"{name} {count:.0f}" for name, count in row["mm_collate"]["top"])
        lines.append(f"{scenario}: {top}")
    return "\n".join(lines)
