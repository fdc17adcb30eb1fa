"""The GPU gate: the CUDA tests, then the GPU benchmark rows, and a JSON report whatever happens.

Usage: python3 tests/gpu_check.py [--out gpu-check.json] [--test-limit 120] [--row-limit 240] [--budget 540]
       [--tests FILE ...]

Needs only Python, torch, numpy and pytest: no make, no network, no Hypothesis (the files
that import it are left out where it is missing), no install (the working tree is put on
the path). Without CUDA every test skips, the rows are skipped, and it exits 0.

* The tests run in a pytest child process. Each test has ``--test-limit`` seconds: a test
  that runs past it is killed with its process, recorded as timed out (pytest dumps every
  thread's stack to the output first), and the run goes on from the next test.
* The benchmark rows run in a child process too, each within ``--row-limit`` seconds on
  the same terms, and each is recorded as soon as it is measured.
* Nothing starts once ``--budget`` seconds have passed: what did not run is recorded so.
* The report (``--out``) is written after every test phase and row, and at the end, on
  SIGTERM and on Ctrl-C too. It exits 1 when a test failed or timed out or a row failed.

The summary printed at the end gives the figures the project claims: DMAs per batch, H2D
bandwidth against the pinned peak measured in the same run, the overlap ratio, the pinned
footprint, ring registrations per epoch and registration time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = [
    "tests/test_arena.py",
    "tests/test_batch.py",
    "tests/test_meter.py",
    "tests/test_prefetch.py",
    "tests/test_registration.py",
    "tests/test_ring.py",
    "tests/test_transfer.py",
]
#: What the parent tells its children: pytest's events file, the file of tests to leave
#: out, the rows' file and the rows to leave out.
EVENTS, SKIP, ROWS, SKIP_ROWS = "GPU_CHECK_EVENTS", "GPU_CHECK_SKIP", "GPU_CHECK_ROWS", "GPU_CHECK_SKIP_ROWS"


def failed_rows(tree: Any, path: str = "") -> list[str]:
    """Where the report holds an ``error`` entry (a GPU row that failed)."""
    if isinstance(tree, dict):
        if "error" in tree:
            return [f"{path or 'report'}: {tree['error']}"]
        return [row for key, value in tree.items() for row in failed_rows(value, f"{path}.{key}" if path else key)]
    if isinstance(tree, list):
        return [row for i, value in enumerate(tree) for row in failed_rows(value, f"{path}[{i}]")]
    return []


# --- in the pytest child (loaded with -p gpu_check) ----------------------------------------


def _event(record: dict[str, Any]) -> None:
    with open(os.environ[EVENTS], "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Leave out the tests an earlier child ran (or that hung in it)."""
    if not os.path.exists(os.environ.get(SKIP, "")):
        return
    with open(os.environ[SKIP]) as f:
        done = set(f.read().split("\n"))
    items[:] = [item for item in items if item.nodeid not in done]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if os.environ.get(EVENTS):
        _event({"start": nodeid, "at": time.time()})


def pytest_runtest_logreport(report: Any) -> None:
    if not os.environ.get(EVENTS):
        return
    if report.when == "call" or report.outcome != "passed":
        text = "" if report.passed else str(report.longreprtext)[-1500:]
        _event({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text})
    if report.when == "teardown":
        _event({"end": report.nodeid})


# --- in the parent --------------------------------------------------------------------------


class _Child:
    """A child process whose output is echoed and kept (its last lines), killed with its group."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.tail: deque[str] = deque(maxlen=60)
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                print(line, end="", flush=True)
                self.tail.append(line.rstrip("\n"))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.wait()

    def wait(self) -> int:
        """The child's exit status, once its output is read to the end."""
        self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode


_children: list[_Child] = []


def _environment(**files: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **files)
    paths = [ROOT, os.path.join(ROOT, "tests"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _read_lines(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_tests(files: list[str], limit: float, deadline: float, work: str, save: Any) -> dict[str, Any]:
    """The cuda-marked tests, each within ``limit`` seconds, in as many pytest children as hangs need."""
    events, skip = os.path.join(work, "events.jsonl"), os.path.join(work, "skip.txt")
    command = [sys.executable, "-m", "pytest", "-p", "gpu_check", "-m", "cuda", "-p", "no:cacheprovider"]
    # Warnings are reported, not errors: a deprecation inside the device's torch is not a failure of ours.
    command += ["-o", "filterwarnings=default", "-o", f"faulthandler_timeout={max(limit - 10, 5):g}", "-q", "-rs"]
    result: dict[str, Any] = {"runs": [], "timed_out": [], "not_run": False, "tail": []}
    start = time.monotonic()
    while True:
        child = _Child(command + files, _environment(**{EVENTS: events, SKIP: skip}))
        _children.append(child)
        hung = None
        while child.process.poll() is None:
            time.sleep(0.5)
            records = _read_lines(events)
            ended = {r["end"] for r in records if "end" in r}
            running = [r for r in records if "start" in r and r["start"] not in ended]
            if running and time.time() - running[-1]["at"] > limit:
                hung = running[-1]["start"]
            if hung or time.monotonic() > deadline:
                child.kill()
                break
        _children.remove(child)
        child.wait()
        result["runs"].append({"rc": child.process.returncode, "hung": hung, "continued": bool(result["runs"])})
        result["tail"] = list(child.tail)
        if hung is None:
            result["not_run"] = child.process.returncode < 0  # killed at the budget's end
            return _outcomes(result, events, start)
        result["timed_out"].append(hung)
        with open(events, "a") as f:
            f.write(json.dumps({"nodeid": hung, "when": "call", "outcome": "timed out", "text": ""}) + "\n")
            f.write(json.dumps({"end": hung}) + "\n")
        done = {r["end"] for r in _read_lines(events) if "end" in r}
        with open(skip, "w") as f:
            f.write("\n".join(sorted(done | {hung})))
        save(_outcomes(result, events, start))
        if time.monotonic() > deadline:
            result["not_run"] = True
            return _outcomes(result, events, start)


def _outcomes(result: dict[str, Any], events: str, start: float) -> dict[str, Any]:
    """Each test's outcome (its worst phase), the counts, and whether the tests as a whole passed."""
    worst: dict[str, str] = {}
    details: dict[str, str] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2, "timed out": 3}
    for record in _read_lines(events):
        if "outcome" not in record:
            continue
        nodeid, outcome = record["nodeid"], record["outcome"]
        if rank[outcome] >= rank[worst.get(nodeid, "passed")]:
            worst[nodeid] = outcome
            if record["text"]:
                details[nodeid] = record["text"]
    counts = {name: sum(1 for o in worst.values() if o == name) for name in rank}

    def clean(run: dict[str, Any]) -> bool:
        # pytest's status: 0 every test passed or skipped; 5 none was left to run (after a hang, the
        # hung test was the last); 1 a test failed (counted above); 2-4 something around the tests broke.
        return run["hung"] is not None or run["rc"] == 0 or (run["rc"] == 5 and run["continued"])

    runs_ok = all(clean(run) for run in result["runs"])
    ok = runs_ok and counts["failed"] == counts["timed out"] == 0 and not result["not_run"]
    return {
        **result,
        "ok": ok,
        "seconds": round(time.monotonic() - start, 1),
        "counts": counts,
        "outcomes": worst,
        "failures": {k: details.get(k, "") for k, v in worst.items() if v in ("failed", "timed out")},
    }


def run_rows(limit: float, deadline: float, work: str, save: Any, command: list[str] | None = None) -> dict[str, Any]:
    """The GPU benchmark rows, each within ``limit`` seconds, recorded as each ends.

    ``command`` runs the rows (this script's ``--rows``): it writes ``{"started": name}``
    and then ``{"name": name, "row": ...}`` for each, leaving out those the parent names.
    """
    rows = os.path.join(work, "rows.jsonl")
    report: dict[str, Any] = {}
    while True:
        env = _environment(**{ROWS: rows, SKIP_ROWS: ",".join(report)})
        child = _Child(command or [sys.executable, os.path.abspath(__file__), "--rows"], env)
        _children.append(child)
        last, seen, why = time.monotonic(), len(_read_lines(rows)), None
        while child.process.poll() is None:
            time.sleep(0.5)
            count = len(_read_lines(rows))
            if count != seen:
                seen, last = count, time.monotonic()
            if time.monotonic() - last > limit:
                why = f"ran past {limit:g} s"
            elif time.monotonic() > deadline:
                why = "stopped at the end of the budget"
            if why:
                child.kill()
                break
        _children.remove(child)
        child.wait()
        records = _read_lines(rows)
        report.update((r["name"], r["row"]) for r in records if "name" in r)
        cut = next((r["started"] for r in records if "started" in r and r["started"] not in report), None)
        if cut is None:
            if child.process.returncode != 0:
                report["rows"] = {
                    "error": f"the rows' process exited {child.process.returncode}: {list(child.tail)[-5:]}"
                }
            return report
        report[cut] = {"error": why or f"its process exited {child.process.returncode}: {list(child.tail)[-5:]}"}
        save(report)
        if time.monotonic() > deadline:
            return report


def _rows_child() -> int:
    """In the rows' child: run every row not left out, writing each as it starts and ends."""
    sys.path.insert(0, ROOT)
    from pincollate.bench._gpu import _guarded, run_gpu
    from pincollate.bench._stats_cost import run_stats_cost

    path, skip = os.environ[ROWS], set(filter(None, os.environ.get(SKIP_ROWS, "").split(",")))

    def write(record: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    run_gpu(
        quick=True,
        done=lambda name, row: write({"name": name, "row": row}),
        started=lambda name: write({"started": name}),
        skip=skip,
    )
    if "stats_cost" not in skip:  # the Prefetcher's stats on the staging thread's path, which only a GPU takes
        write({"started": "stats_cost"})
        write({"name": "stats_cost", "row": _guarded(lambda: run_stats_cost(quick=True))})
    return 0


def summary(report: dict[str, Any]) -> list[str]:
    """The figures the project claims, from this run (or why they are missing)."""
    sys.path.insert(0, ROOT)
    from pincollate.bench._report import format_gpu
    from pincollate.bench._stats_cost import format_stats_cost

    tests = report.get("tests", {})
    counts = tests.get("counts", {})
    lines = ["", f"gpu-check on {report['device'] or 'no CUDA device'}, torch {report['torch']}"]
    lines.append("cuda tests: " + ", ".join(f"{v} {k}" for k, v in counts.items()) if counts else "cuda tests: not run")
    if report.get("bench") is None:
        lines.append("GPU rows: not measured (no CUDA device)" if not report["device"] else "GPU rows: not run")
    else:
        lines += format_gpu(report["bench"])
        cost = report["bench"].get("stats_cost")
        if cost is not None:
            lines.append(f"Prefetcher stats: FAILED {cost['error']}" if "error" in cost else format_stats_cost(cost))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "gpu-check.json"))
    parser.add_argument("--test-limit", type=float, default=120.0, help="seconds one test may take")
    parser.add_argument("--row-limit", type=float, default=240.0, help="seconds one benchmark row may take")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds after which nothing new starts")
    parser.add_argument("--tests", nargs="+", default=TESTS, help="the test files whose cuda tests run")
    parser.add_argument("--rows", action="store_true", help=argparse.SUPPRESS)  # the rows' child
    args = parser.parse_args()
    if args.rows:
        return _rows_child()
    import tempfile

    import torch

    deadline = time.monotonic() + args.budget
    cuda = torch.cuda.is_available()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "failures": ["interrupted before the end"],
    }

    def save(part: str) -> Any:
        def write(value: Any) -> None:
            report[part] = value
            _write(args.out, report)

        return write

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"gpu-check: signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    failures: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
            _write(args.out, report)
            report["tests"] = run_tests(args.tests, args.test_limit, deadline, work, save("tests"))
            _write(args.out, report)
            tests = report["tests"]
            failures += [f"{name}: {tests['outcomes'][name]}" for name in tests["failures"]]
            if not tests["ok"] and not failures:
                failures.append(f"pytest exited {[run['rc'] for run in tests['runs']]}: {tests['tail'][-3:]}")
            if cuda:
                report["bench"] = run_rows(args.row_limit, deadline, work, save("bench"))
                failures += failed_rows(report["bench"])
            else:
                print("gpu-check: no CUDA device here, GPU benchmark skipped", flush=True)
        report["failures"] = failures
    finally:
        for child in list(_children):
            child.kill()
        _write(args.out, report)
        for line in summary(report):
            print(line, flush=True)
        print(f"gpu-check: wrote {args.out}; {len(report['failures'])} failure(s)", flush=True)
        for failure in report["failures"]:
            print(f"  FAILED {failure}", flush=True)
    return 1 if report["failures"] else 0


def _write(path: str, report: dict[str, Any]) -> None:
    temporary = f"{path}.partial"
    with open(temporary, "w") as f:
        json.dump(report, f, indent=2, default=str)
    os.replace(temporary, path)


if __name__ == "__main__":
    sys.exit(main())
