"""The benchmark's report: the ratio table and the bar plot."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import torch

__all__ = ["format_table", "machine", "plot"]


def format_table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}",
        "",
    ]
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
            f"first batch of {first['fields']} ragged fields: {first['first_ms']:.2f} ms, later batches {first['steady_ms']:.2f} ms "
            f"(first/later = {first['ratio']:.2f}x)",
        ]
    gpu = report.get("gpu")
    if gpu:
        lines += ["", f"peak pinned H2D: {gpu['peak_pinned_h2d_gb_per_s']:.1f} GB/s"]
        for name, row in gpu["manyleaf_transfer"].items():
            text = row.get("error") or f"{row['gb_per_s']:6.1f} GB/s  {row['memcpys']} memcpy"
            lines.append(f"manyleaf transfer, {name:<28} {text}")
        loaders = gpu["prefetch_loaders"]
        lines.append(
            "prefetch loaders (batches/s): "
            + (loaders.get("error") or ", ".join(f"{k} {v:.2f}" for k, v in loaders.items()))
        )
        slots = gpu.get("pinned_slots", {})
        lines.append(
            "video from 2 workers to the GPU (batches/s): "
            + (slots.get("error") or ", ".join(f"{k} {v:.2f}" for k, v in slots.items()))
        )
        o = gpu["overlap"]
        lines.append(
            "overlap: "
            + (
                o.get("error")
                or f"step {o['step_ms']:.2f} ms, compute {o['compute_ms']:.2f} ms, copy {o['copy_ms']:.2f} ms, step/max = {o['step_over_max']:.3f}"
            )
        )
    return "\n".join(lines)


def _ratio(row: dict[str, Any], mode: str) -> str:
    text = f"{row[f'{mode}_speedup']:.2f}x"
    spread = row.get(f"{mode}_spread")
    if spread and row["method"] != row["baseline"]:
        text += f" ({spread[0]:.2f}-{spread[1]:.2f})"
    return text


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["method"] != r["baseline"]]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods_ = list(dict.fromkeys(r["method"] for r in rows))
    modes = [("main_speedup", "main process")] + (
        [("workers_speedup", f"{report['workers']} workers")] if report["workers"] else []
    )
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    width = 0.8 / max(len(methods_), 1)
    for ax, (key, title) in zip(axes[0], modes, strict=True):
        for i, method in enumerate(methods_):
            xs, ys, low, high = [], [], [], []
            for j, scenario in enumerate(scenarios):
                for r in rows:
                    if r["scenario"] == scenario and r["method"] == method:
                        xs.append(j + i * width)
                        ys.append(r[key])
                        spread = r.get(key.replace("speedup", "spread")) or [r[key], r[key]]
                        low.append(max(r[key] - spread[0], 0.0))
                        high.append(max(spread[1] - r[key], 0.0))
            ax.bar(xs, ys, width=width, label=method, yerr=[low, high], capsize=2)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(methods_) - 1) / 2 for j in range(len(scenarios))], scenarios)
        ax.set_ylabel("speed over the scenario's baseline (x, higher is better)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    m = report["machine"]
    kind = "quick run" if report.get("quick") else "full run"
    fig.suptitle(
        f"pincollate.bench ({kind}): {m['cpu']}, {m['cores']} cores, torch {m['torch']}. Bars: median round; "
        "whiskers: lowest and highest round.\nBaseline 1.0: default_collate, or a hand-written "
        "pad_sequence/torch.cat collate for ragged, vlm, audio, detection",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
