"""``python -m pincollate.bench``: collate and transfer methods side by side, as ratios.

Every method runs on the same samples in the same process, in interleaved rounds
(A, B, C, A, B, C, ...), and the table reports medians and each method's ratio to
the baseline: ``default_collate``, or for ragged scenarios (which it rejects) a
hand-written ``pad_sequence``/``torch.cat`` collate. Machines are noisy; ratios
from one run are the claim, never absolute times from different runs.

Modes: ``main`` times one collate call in this process; ``workers`` times a
``DataLoader`` with ``--workers`` worker processes end to end (collate in the
workers, batches sent to this process). With ``--gpu`` and a CUDA device it adds
host-to-device transfer and compute/copy overlap rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from .._collate.collate import MMCollate
from .._plan.policies import AsList
from ..datasets import SCENARIOS, InMemory
from ._breakdown import format_breakdown, worker_breakdown
from ._busy import busy_reasons, load_average
from ._gpu import run_gpu
from ._methods import methods, padding_bytes
from ._report import format_table, machine, plot
from ._timing import time_main, time_workers, whole

__all__ = ["format_table", "machine", "main", "methods", "run", "run_gpu", "worker_breakdown"]


def run(scenarios: list[str], quick: bool, workers: int, progress: bool = True) -> dict[str, Any]:
    """Run the collate benchmark; returns a JSON-ready report."""
    from tqdm.auto import tqdm

    load = load_average()  # before the run's own work adds to it
    rounds_main, rounds_workers = (11, 3) if quick else (21, 5)
    scenarios = [name for name in SCENARIOS if name in scenarios]
    results: list[dict[str, Any]] = []
    rounds_of: list[tuple[str, list[float]]] = []  # each method's rounds, for busy_reasons
    plan = []
    for scenario in scenarios:
        fns = {k: v for k, v in methods(scenario).items() if v is not None}
        plan.append((scenario, fns))
    steps = sum(len(fns) * (whole(rounds_main, fns) + (rounds_workers if workers else 0)) for _, fns in plan)
    bar = tqdm(total=steps, desc="pincollate.bench", file=sys.stderr, disable=not progress, leave=False)
    for scenario, fns in plan:
        cls, batch_size = SCENARIOS[scenario]
        n_batches = 12 if quick else 32
        if scenario == "video":
            n_batches = 4 if quick else 12
        dataset = InMemory(cls(length=batch_size * n_batches))
        batches = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(n_batches)]
        bar.set_postfix_str(f"{scenario}: main process")
        main_times = time_main(fns, batches, whole(rounds_main, fns), bar)
        worker_rates: dict[str, list[float]] = {}
        if workers:
            bar.set_postfix_str(f"{scenario}: {workers} workers")
            worker_rates = time_workers(fns, dataset, batch_size, workers, rounds_workers, bar, 24 if quick else 96)
        baseline = next(iter(fns))
        padding = padding_bytes(scenario, fns["mm_collate"], batches)
        for name in fns:
            main_ratios = [b / t for b, t in zip(main_times[baseline], main_times[name], strict=True)]
            row: dict[str, Any] = {
                "scenario": scenario,
                "method": name,
                "baseline": baseline,
                "main_ms": statistics.median(main_times[name]) * 1e3,
                "main_speedup": statistics.median(main_times[baseline]) / statistics.median(main_times[name]),
                # Each round timed every method back to back: its ratio, lowest and highest.
                "main_spread": [min(main_ratios), max(main_ratios)],
            }
            if name != baseline:
                rounds_of.append((f"{scenario} {name} (main process)", main_ratios))
            if workers:
                worker_ratios = [r / b for r, b in zip(worker_rates[name], worker_rates[baseline], strict=True)]
                if name != baseline:
                    rounds_of.append((f"{scenario} {name} (workers)", worker_ratios))
                row["workers_batches_per_s"] = statistics.median(worker_rates[name])
                row["workers_speedup"] = row["workers_batches_per_s"] / statistics.median(worker_rates[baseline])
                row["workers_spread"] = [min(worker_ratios), max(worker_ratios)]
            if name == "mm_collate" and padding is not None:
                row["padding_bytes_per_batch"] = padding
            results.append(row)
    bar.close()
    return {
        "machine": machine(),
        "workers": workers,
        "quick": quick,
        "results": results,
        "first_batch": first_batch_cost(quick),
        "load_before": load,
        "busy": busy_reasons(load, os.cpu_count(), rounds_of),
    }


def first_batch_cost(quick: bool, fields: int = 150, batch_size: int = 8) -> dict[str, Any]:
    """The first call of a fresh collate on samples with ``fields`` ragged fields, against later calls.

    The first call walks the new structure carefully; the second plans it (the ragged
    fields become parts) and compiles the plan; later calls run it. ``ragged=AsList()``
    lists them, as no policy would, without a warning per field.
    """
    samples = [{f"r{j}": torch.zeros(i + 1 + j % 3) for j in range(fields)} for i in range(batch_size)]
    firsts: list[float] = []
    seconds: list[float] = []
    steady: list[float] = []
    for _ in range(3 if quick else 7):
        collate = MMCollate(pin_memory=False, ragged=AsList())
        for times in (firsts, seconds, *[steady] * 5):
            start = time.perf_counter()
            collate(samples)
            times.append(time.perf_counter() - start)
    first, second, later = statistics.median(firsts), statistics.median(seconds), statistics.median(steady)
    return {
        "fields": fields,
        "first_ms": first * 1e3,
        "second_ms": second * 1e3,
        "steady_ms": later * 1e3,
        "ratio": first / later,
    }


def _machine_line() -> str:
    m = machine()
    return f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}"


def _only(
    args: argparse.Namespace,
    name: str,
    measure: Callable[[], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
    machine_line: bool = True,
) -> int:
    """A single-purpose mode: its machine line, its report printed, and written with ``--json``."""
    if machine_line:
        print(_machine_line())
    report = measure()
    print(describe(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), name: report}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pincollate-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeat to pick several (default: all)"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the workers mode (0 skips it)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batches (under 90 s on 2 cores)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write ratio bars as PNG (matplotlib)")
    parser.add_argument(
        "--gpu", action="store_true", help="require the transfer and overlap rows (added anyway when CUDA is present)"
    )
    parser.add_argument("--no-gpu", action="store_true", help="skip the transfer and overlap rows even with CUDA")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--breakdown", action="store_true", help="only time the stages of a worker batch (video scenario) and exit"
    )
    parser.add_argument(
        "--stages",
        metavar="SCENARIO",
        choices=sorted(SCENARIOS),
        help="only time the stages of a main-process batch of SCENARIO (plan checks, copies, buffer, build) and exit",
    )
    parser.add_argument(
        "--small-shm",
        nargs="?",
        const="64m",
        metavar="SIZE",
        help="only time the video scenario through workers with ample /dev/shm and with SIZE (default 64m, "
        "Docker's default) side by side, and exit; needs root (unshare -m)",
    )
    parser.add_argument(
        "--recipes",
        action="store_true",
        help="only time fields planned once (ragged, policies) against the careful walk of every batch, and exit",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="only count the Python and C calls of a warm main-process batch of each scenario, and exit",
    )
    parser.add_argument(
        "--stats-cost",
        action="store_true",
        help="only time a loop of tiny batches through the Prefetcher with and without stats, and exit",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="only time Ray Data's own batch conversion against ColumnCollate (trainer and data side), and exit",
    )
    args = parser.parse_args(argv)
    # Checked before a run that may take minutes: a path that cannot be written would fail after it.
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path and (os.path.isdir(path) or not os.path.isdir(os.path.dirname(os.path.abspath(path)))):
            parser.error(f"{flag} {path}: not a file in an existing folder")
    if args.plot and os.path.splitext(args.plot)[1].lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
        parser.error(f"--plot {args.plot}: give a .png (or .pdf, .svg, .jpg) path")
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    # Each of these runs alone and exits: given together, all but one would be skipped without a word.
    modes = [
        flag
        for flag, given in (
            ("--calls", args.calls),
            ("--ray", args.ray),
            ("--small-shm", args.small_shm is not None),
            ("--stats-cost", args.stats_cost),
            ("--recipes", args.recipes),
            ("--stages", args.stages is not None),
            ("--breakdown", args.breakdown),
        )
        if given
    ]
    if len(modes) > 1:
        parser.error(f"{' and '.join(modes)} each run alone: give one of them per run")
    if modes:
        # A single-purpose mode reads its own settings: one it does not read would be dropped without a word.
        unread = [
            flag
            for flag, given, readers in (
                ("--plot", args.plot is not None, ()),
                ("--scenario", args.scenario is not None, ("--calls",)),
                ("--gpu", args.gpu, ()),
                ("--no-gpu", args.no_gpu, ()),
            )
            if given and modes[0] not in readers
        ]
        if unread:
            parser.error(f"{modes[0]} does not read {' or '.join(unread)}")
    if args.gpu and args.no_gpu:
        parser.error("--gpu and --no-gpu contradict each other")
    if args.small_shm is not None:
        from ._shm import small_shm_problem

        problem = small_shm_problem(args.small_shm, args.workers)
        if problem:
            parser.error(f"--small-shm {args.small_shm}: {problem}")
    if args.calls:
        from ._calls import format_calls, run_calls

        return _only(args, "calls", lambda: run_calls(args.scenario), format_calls)
    if args.ray:
        from ._ray import format_ray, run_ray

        return _only(args, "ray", lambda: run_ray(args.quick, not args.no_progress), format_ray)
    if args.small_shm is not None:
        from ._shm import format_small_shm, run_small_shm

        def small_shm() -> dict[str, Any]:
            return run_small_shm(args.small_shm, args.workers, 3 if args.quick else 5, not args.no_progress)

        return _only(args, "small_shm", small_shm, format_small_shm, machine_line=False)
    if args.stats_cost:
        from ._stats_cost import format_stats_cost, run_stats_cost

        return _only(args, "stats_cost", lambda: run_stats_cost(args.quick), format_stats_cost)
    if args.recipes:
        from ._recipes import format_recipes, run_recipes

        return _only(args, "recipes", lambda: run_recipes(args.quick), format_recipes)
    if args.stages:
        from ._stages import format_stages, main_stages

        return _only(args, "stages", lambda: main_stages(args.stages, args.quick), format_stages)
    if args.breakdown:
        return _only(args, "breakdown", lambda: worker_breakdown("video", args.quick), format_breakdown)
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu needs a CUDA device")
    scenarios = args.scenario or list(SCENARIOS)
    torch.manual_seed(0)
    report = run(scenarios, args.quick, args.workers, progress=not args.no_progress)
    if torch.cuda.is_available() and not args.no_gpu:
        report["gpu"] = run_gpu(args.quick)
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0
