"""The benchmark's report: the ratio table and the bar plot."""

from __future__ import annotations

import os
import platform
import textwrap
import time
from typing import Any

import numpy as np
import torch

from ._busy import format_busy

__all__ = ["axis_top", "figure", "format_gpu", "format_table", "machine", "plot"]


def format_table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}",
    ]
    warning = format_busy(report.get("busy", []))
    lines += [warning, ""] if warning else [""]
    kind = "quick run (fewer rounds and batches)" if report.get("quick") else "full run"
    lines += [
        f"{kind}. main ms: milliseconds per collate call in the main process (lower is better).",
        "x base: speed over the scenario's baseline in this run (higher is better; the median round,",
        "lowest-highest round in brackets). Baselines: default_collate; for ragged, vlm, audio and",
        "detection, which it rejects, a hand-written pad_sequence/torch.cat collate with the same outputs.",
    ]
    if report["workers"]:
        lines.append(f"workers b/s: batches per second through a DataLoader with {report['workers']} worker processes.")
    lines.append("")
    header = f"{'scenario':<10} {'method':<26} {'main ms':>9} {'x base (spread)':>20}"
    if report["workers"]:
        header += f" {'workers b/s':>12} {'x base (spread)':>20}"
    header += "  notes"
    lines += [header, "-" * len(header)]
    for row in report["results"]:
        line = f"{row['scenario']:<10} {row['method']:<26} {row['main_ms']:>9.3f} {_ratio(row, 'main'):>20}"
        if report["workers"]:
            line += f" {row['workers_batches_per_s']:>12.1f} {_ratio(row, 'workers'):>20}"
        notes = []
        if row["method"] == row["baseline"]:
            notes.append("baseline")
        if "padding_bytes_per_batch" in row:
            notes.append(f"padding {row['padding_bytes_per_batch'] / 1024:.1f} KiB/batch")
        lines.append(line + ("  " + ", ".join(notes) if notes else ""))
    first = report.get("first_batch")
    if first:
        lines += [
            "",
            f"first batch of {first['fields']} ragged fields: {first['first_ms']:.2f} ms (walked), second "
            f"{first['second_ms']:.2f} ms (planned, compiled), later batches {first['steady_ms']:.2f} ms "
            f"(first/later = {first['ratio']:.2f}x)",
        ]
    gpu = report.get("gpu")
    if gpu:
        lines += ["", *format_gpu(gpu)]
    return "\n".join(lines)


def format_gpu(gpu: dict[str, Any]) -> list[str]:
    """The GPU rows as lines: a row that failed or did not run says so in its line."""

    def line(label: str, name: str, text: Any) -> str:
        row = gpu.get(name)
        if row is None:
            return f"{label}: not measured"
        if isinstance(row, dict) and "error" in row:
            return f"{label}: FAILED {row['error']}"
        return f"{label}: {text(row)}"

    def dmas(r: dict[str, Any]) -> str:
        paths = ", ".join(f"{k} {v:g}" for k, v in r.items() if k not in ("per leaf (control)", "leaves"))
        return f"{paths}; per leaf (control) {r['per leaf (control)']:g} for {r['leaves']} leaves"

    def bandwidth(r: dict[str, Any]) -> str:
        rows = [(k, v) for k, v in r.items() if isinstance(v, dict)]
        return (
            "; ".join(
                f"{k} {v['gb_per_s']:.1f} GB/s"
                + (f" ({v['of_peak']:.2f} of the pinned peak)" if v.get("of_peak") else "")
                + f", {v['memcpys']} memcpy"
                for k, v in rows
            )
            + f" ({r['batch_bytes'] / 2**20:.1f} MiB, {r['leaves']} leaves)"
        )

    def overlap(r: dict[str, Any]) -> str:
        return (
            f"step {r['step_ms']:.2f} ms against {r['serial_step_ms']:.2f} ms in turn on one stream "
            f"(copy {r['copy_ms']:.2f} ms, compute {r['compute_ms']:.2f} ms): {r['ratio']:.2f} "
            "(0.5 is full overlap, 1.0 none)"
        )

    def trims(r: dict[str, Any]) -> str:
        median = "" if r["trim_ms_median"] is None else f", median {r['trim_ms_median']:.1f} ms"
        return (
            f"peak {r['peak_reserved_mib']:.0f} MiB, end {r['end_reserved_mib']:.0f} MiB reserved with "
            f"pinned_limit {r['limit_mib']:.0f} MiB over {r['batches']} ragged batches; "
            f"{r['trims']} trims in {r['trim_checks']} checks{median}"
        )

    def registration(r: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v['ms']:.2f} ms ({v['gb_per_s']:.1f} GB/s)" for k, v in r.items())

    def rates(r: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k != "registrations_per_epoch")

    return [
        line("peak pinned H2D", "peak_pinned_h2d_gb_per_s", lambda v: f"{v:.1f} GB/s"),
        line("DMAs per batch", "dmas_per_batch", dmas),
        line("H2D bandwidth, many-leaf batch", "manyleaf_transfer", bandwidth),
        line("overlap", "overlap", overlap),
        line("pinned footprint", "pinned_trim", trims),
        line("ring registrations per epoch (2 workers)", "pinned_slots", lambda r: f"{r['registrations_per_epoch']:g}"),
        line("registration time per slot", "slot_registration", registration),
        line("video from 2 workers to the GPU (batches/s)", "pinned_slots", rates),
        line("prefetch loaders (batches/s)", "prefetch_loaders", rates),
    ]


def _ratio(row: dict[str, Any], mode: str) -> str:
    text = f"{row[f'{mode}_speedup']:.2f}x"
    spread = row.get(f"{mode}_spread")
    if spread and row["method"] != row["baseline"]:
        text += f" ({spread[0]:.2f}-{spread[1]:.2f})"
    return text


def plot(report: dict[str, Any], path: str) -> None:
    """Write the report's bar plot (``bench.png``) to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(report: dict[str, Any]) -> Any:
    """The report's bar plot: a panel per mode, each method's ratio per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["method"] != r["baseline"]]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods_ = list(dict.fromkeys(r["method"] for r in rows))
    modes = [("main_speedup", "main process")] + (
        [("workers_speedup", f"{report['workers']} workers")] if report["workers"] else []
    )
    # Constrained layout keeps the axis labels and the titles inside the figure and apart.
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.4), squeeze=False, layout="constrained")
    width = 0.8 / max(len(methods_), 1)
    for ax, (key, title) in zip(axes[0], modes, strict=True):
        bars = []  # (x, median, lowest round, highest round)
        for i, method in enumerate(methods_):
            xs, ys, low, high = [], [], [], []
            for j, scenario in enumerate(scenarios):
                for r in rows:
                    if r["scenario"] == scenario and r["method"] == method:
                        spread = r.get(key.replace("speedup", "spread")) or [r[key], r[key]]
                        xs.append(j + i * width)
                        ys.append(r[key])
                        low.append(max(r[key] - spread[0], 0.0))
                        high.append(max(spread[1] - r[key], 0.0))
                        bars.append((j + i * width, r[key], spread[0], spread[1]))
            ax.bar(xs, ys, width=width, label=method, yerr=[low, high], capsize=2)
        top = axis_top(bars)
        ax.set_ylim(0, top)
        for x, _, _, highest in bars:
            if highest > top:  # one unsteady round would flatten every other bar: clipped, its value written
                ax.annotate(
                    f"\u2191{highest:.1f}x",
                    (x, top),
                    xytext=(0, -3),
                    textcoords="offset points",
                    ha="center",
                    va="top",
                    fontsize=7,
                    color="darkred",
                    zorder=10,  # over the legend
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
                )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(methods_) - 1) / 2 for j in range(len(scenarios))], scenarios)
        ax.set_ylabel("x baseline (higher is better)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    m = report["machine"]
    kind = "quick run" if report.get("quick") else "full run"
    title = (
        f"pincollate.bench ({kind}): {m['cpu']}, {m['cores']} cores, torch {m['torch']}. Bars: median round; "
        "whiskers: lowest and highest round.\nBaseline 1.0: default_collate, or a hand-written "
        "pad_sequence/torch.cat collate for ragged, vlm, audio, detection"
    )
    busy = report.get("busy")
    if busy:
        title += "\nBUSY MACHINE, figures unreliable: " + "; ".join(busy[:2]) + ("; ..." if len(busy) > 2 else "")
    # Wrapped to the figure's width (about 0.55 of the font size per character), so one panel fits it too.
    chars = int(fig.get_figwidth() * 72 / (8 * 0.55))
    title = "\n".join(textwrap.fill(line, chars) for line in title.split("\n"))
    fig.suptitle(title, fontsize=8, color="darkred" if busy else "black")
    return fig


def axis_top(bars: list[tuple[float, float, float, float]]) -> float:
    """The top of a panel's y axis: every median bar, and every whisker but an outlier.

    A whisker is an outlier where it reaches past twice the panel's level (its highest
    median, or the 75th percentile of its whiskers, whichever is higher): one round that
    met a busy machine. It is cut at the top and labelled, so it does not flatten the panel.

    Examples:
        >>> round(axis_top([(0, 1.0, 0.9, 1.1), (1, 2.0, 1.8, 2.2)]), 2)
        2.42
        >>> round(axis_top([(i, 1.0, 0.9, 1.2) for i in range(9)] + [(9, 1.1, 0.1, 11.7)]), 2)
        1.32
    """
    if not bars:
        return 1.1
    medians = [median for _, median, _, _ in bars]
    highest = [high for _, _, _, high in bars]
    level = max(max(medians), float(np.percentile(highest, 75)))
    kept = [high for high in highest if high <= 2 * level]
    return 1.1 * max(*medians, *kept, 1.0)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    accelerator = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerator": accelerator,
        "date": time.strftime("%Y-%m-%d"),
    }
