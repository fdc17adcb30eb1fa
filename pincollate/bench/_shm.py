"""``python -m pincollate.bench --small-shm``: the video scenario in a 64 MiB /dev/shm.

Docker's default /dev/shm is 64 MiB. This times the video scenario (23 and 46 MiB batches)
through DataLoader workers with ample /dev/shm (this process) and, in the same run,
in a private mount namespace whose /dev/shm is a small tmpfs (a child process made
with ``unshare -m``; root only), in alternating rounds; each method runs there in a namespace of its own. A
method that cannot run there is reported with its error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, default_collate

from .._collate.collate import MMCollate
from ..datasets import SCENARIOS, InMemory, _Repeat

__all__ = ["format_small_shm", "run_small_shm", "small_shm_problem"]

_BATCHES = 48
_METHODS: dict[str, Callable[[list[Any]], Any]] = {
    "default_collate": default_collate,
    "mm_collate": MMCollate(pin_memory=False),
}


def _rates(workers: int, batches: int, names: list[str] | None = None, batch_size: int = 8) -> dict[str, float | str]:
    """Batches per second of each method (or those named) over ``batches`` video batches, or its error."""
    cls = SCENARIOS["video"][0]
    dataset = InMemory(cls(length=batch_size * 4))
    out: dict[str, float | str] = {}
    for name, fn in _METHODS.items():
        if names is not None and name not in names:
            continue
        iterator: Any = None
        loader: DataLoader[Any] = DataLoader(
            _Repeat(dataset, batch_size * (batches + 1)),
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=fn,
            timeout=int(os.environ.get("PINCOLLATE_BENCH_TIMEOUT", 120)),
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the small /dev/shm warning, said once per dataset class
                iterator = iter(loader)
                next(iterator)  # workers started and warm
                start = time.perf_counter()
                count = sum(1 for _ in iterator)
                out[name] = count / (time.perf_counter() - start)
        except Exception as error:  # the outcome is what is reported
            where = traceback.extract_tb(error.__traceback__)[-1]
            out[name] = (
                f"fails: {type(error).__name__}: {str(error).strip().splitlines()[-1][:120]} "
                f"(at {os.path.basename(where.filename)}:{where.lineno})"
            )
        finally:
            iterator = None
    return out


def _child(size: str, workers: int, batches: int, name: str, batch_size: int) -> dict[str, float | str]:
    """One method's rate in a fresh namespace: what one method leaves in /dev/shm cannot slow another."""
    # The size is the script's first argument, never its text: the shell reads it as one word.
    command = 'mount -t tmpfs -o "size=$1" tmpfs /dev/shm && shift && exec "$@"'
    code = (
        "import json; from pincollate.bench._shm import _rates; "
        f"print(json.dumps(_rates({workers}, {batches}, [{name!r}], {batch_size})))"
    )
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", command, "sh", size, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the small /dev/shm run failed (it needs root for unshare -m): {result.stderr[-400:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


#: Samples per batch: 8 video samples are 23 MiB, 16 are 46 MiB.
_SIZES = (8, 16)


def small_shm_problem(size: str, workers: int) -> str | None:
    """Why a ``--small-shm`` run cannot work here, or ``None``: asked before the run, not after its first minutes.

    ``size`` becomes a tmpfs mount option: a number of bytes with an optional ``k``, ``m`` or
    ``g``, or a share of memory (``10%``), as ``mount -t tmpfs -o size=`` reads it.

    Examples:
        >>> small_shm_problem("64m; rm -rf /", 2)
        'the size must be a number with k, m or g (64m) or a share of memory (10%), as tmpfs takes it'
        >>> small_shm_problem("64m", 0)
        'it times DataLoader workers: give --workers 1 or more'
    """
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgG]?|[1-9][0-9]?%|100%", size):
        return "the size must be a number with k, m or g (64m) or a share of memory (10%), as tmpfs takes it"
    if workers < 1:
        return "it times DataLoader workers: give --workers 1 or more"
    if shutil.which("unshare") is None:
        return "it needs the unshare command (util-linux) to mount a private /dev/shm"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "it needs root, to mount a private /dev/shm (unshare -m)"
    return None


def run_small_shm(size: str = "64m", workers: int = 2, rounds: int = 3, progress: bool = True) -> dict[str, Any]:
    """Median batches/s of each method with ample /dev/shm and with ``size``, rounds alternating.

    Raises:
        ValueError: the run cannot work here (:func:`small_shm_problem` says why).
    """
    from tqdm.auto import tqdm

    problem = small_shm_problem(size, workers)
    if problem:
        raise ValueError(f"small /dev/shm run of {size!r}: {problem}")

    cases = [(n, name) for n in _SIZES for name in _METHODS]
    ample: dict[tuple[int, str], list[float | str]] = {case: [] for case in cases}
    small: dict[tuple[int, str], list[float | str]] = {case: [] for case in cases}
    with tqdm(
        total=2 * rounds * len(_SIZES), desc=f"video, {size} /dev/shm", file=sys.stderr, disable=not progress
    ) as bar:
        for _ in range(rounds):
            for n in _SIZES:
                for name, rate in _rates(workers, _BATCHES, None, n).items():
                    ample[(n, name)].append(rate)
                bar.update(1)
                for name in _METHODS:
                    small[(n, name)].append(_child(size, workers, _BATCHES, name, n)[name])
                bar.update(1)
    rows = []
    for n, name in cases:
        row: dict[str, Any] = {
            "method": name,
            "samples": n,
            "batch_mib": n * _VIDEO_SAMPLE_BYTES / 2**20,
            "ample_rounds": ample[(n, name)],
            "small_rounds": small[(n, name)],
        }
        for side, values in (("ample", ample[(n, name)]), ("small", small[(n, name)])):
            errors = [r for r in values if isinstance(r, str)]
            if errors:
                row[f"{side}_error"] = errors[0]
            else:
                row[f"{side}_batches_per_s"] = statistics.median(values)  # type: ignore[type-var]
        if "ample_batches_per_s" in row and "small_batches_per_s" in row:
            row["small_vs_ample"] = row["small_batches_per_s"] / row["ample_batches_per_s"]
        rows.append(row)
    return {"size": size, "workers": workers, "rounds": rounds, "batches": _BATCHES, "rows": rows}


#: One video sample: 16 frames of 3x160x160 uint8 and 2x160x160 float16 flow.
_VIDEO_SAMPLE_BYTES = 16 * 3 * 160 * 160 + 16 * 2 * 160 * 160 * 2


def format_small_shm(report: dict[str, Any]) -> str:
    lines = [
        f"video through {report['workers']} workers, {report['batches']} batches, median of {report['rounds']} "
        f"rounds; /dev/shm ample vs {report['size']} (b/s: batches per second, higher is better)",
        f"{'method':<16} {'batch':>8} {'ample b/s':>10} {'small b/s':>10} {'small/ample':>12}",
    ]
    for row in report["rows"]:
        ample = f"{row['ample_batches_per_s']:>10.2f}" if "ample_batches_per_s" in row else f"{'fails':>10}"
        head = f"{row['method']:<16} {row['batch_mib']:>5.0f} MiB {ample}"
        if "small_error" in row:
            lines.append(f"{head} {row['small_error']}")
        elif "small_vs_ample" in row:
            lines.append(f"{head} {row['small_batches_per_s']:>10.2f} {row['small_vs_ample']:>11.2f}x")
        else:
            lines.append(f"{head} {row['small_batches_per_s']:>10.2f}")
    return "\n".join(lines)
