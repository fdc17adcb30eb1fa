"""``make gpu-check``: the CUDA tests, then the GPU benchmark rows, and a JSON report either way.

Runs with the machine's own Python and torch (no install, no network). Writes
``gpu-check.json`` (the test outcome, its last lines, the benchmark report, and every
row that failed) and exits non-zero when a test failed or any GPU row failed. Without
CUDA the tests skip, the benchmark is skipped, and it exits 0.

Usage: python tests/gpu_check.py [--out gpu-check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = [
    "tests/test_batch.py",
    "tests/test_meter.py",
    "tests/test_prefetch.py",
    "tests/test_ring.py",
    "tests/test_transfer.py",
]


def failed_rows(tree: Any, path: str = "") -> list[str]:
    """Where the report holds an ``error`` entry (a GPU row that failed)."""
    if isinstance(tree, dict):
        if "error" in tree:
            return [f"{path or 'report'}: {tree['error']}"]
        return [row for key, value in tree.items() for row in failed_rows(value, f"{path}.{key}" if path else key)]
    if isinstance(tree, list):
        return [row for i, value in enumerate(tree) for row in failed_rows(value, f"{path}[{i}]")]
    return []


def run_tests() -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-o", "filterwarnings=default"]
    command += ["-q", "-rs", *TESTS]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    rc = process.wait()
    # 5: no test ran (every one skipped is 0); anything else but 0 is a failure.
    return {"rc": rc, "ok": rc == 0, "seconds": round(time.perf_counter() - start, 1), "tail": lines[-40:]}


def run_bench() -> dict[str, Any]:
    from pincollate import bench

    report = bench.run(["manyleaf", "video"], quick=True, workers=2, progress=False)
    report["gpu"] = bench.run_gpu(quick=True)
    print(bench.format_table(report), flush=True)
    from pincollate.bench._stats_cost import format_stats_cost, run_stats_cost

    report["stats_cost"] = run_stats_cost(quick=True)  # the staging thread's path: only a GPU takes it
    print(format_stats_cost(report["stats_cost"]), flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "gpu-check.json"))
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    import torch

    cuda = torch.cuda.is_available()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else None,
    }
    failures: list[str] = []
    try:
        report["tests"] = run_tests()
        if not report["tests"]["ok"]:
            failures.append(f"pytest -m cuda exited {report['tests']['rc']}")
        if cuda:
            try:
                report["bench"] = run_bench()
                failures += failed_rows(report["bench"].get("gpu", {}))
            except Exception:  # the report says what failed, and the exit status too
                report["bench"] = {"error": traceback.format_exc(limit=8)}
                failures.append("the GPU benchmark raised")
        else:
            print("gpu-check: no CUDA device here, GPU benchmark skipped", flush=True)
    finally:
        report["failures"] = failures
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)
        print(f"gpu-check: wrote {args.out}; {len(failures)} failure(s)", flush=True)
        for failure in failures:
            print(f"  FAILED {failure}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
