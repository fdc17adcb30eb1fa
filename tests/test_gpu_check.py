"""tests/gpu_check.py on a CPU machine: what it needs, its time limits, and its report whatever happens."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from gpu_check import failed_rows

ROOT = pathlib.Path(__file__).parent.parent
GPU_CHECK = ROOT / "tests" / "gpu_check.py"

#: What a lent device has besides Python's standard library.
DEVICE_PACKAGES = {"torch", "torchvision", "numpy", "pytest", "pillow"}


def _no_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: gpu-check would really run")


def _without_the_extras(tmp_path: pathlib.Path) -> dict[str, str]:
    """An environment in which every package pincollate's extras install fails to import.

    A module of the same name earlier on the path stands in for each, as a machine with
    only the device's packages would have none (Hypothesis, the frameworks, tqdm,
    matplotlib, tensordict, ...): importing it raises ``ModuleNotFoundError``. The pytest plugins
    those packages register stand in as empty modules (there, pytest would find none).
    """
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {
        re.split(r"[\[<>=~!;]", name)[0].strip().lower()
        for names in extras.values()
        for name in names
        if not name.startswith("pincollate")
    }
    absent = wanted - DEVICE_PACKAGES
    blocked = {
        module
        for module, distributions in importlib.metadata.packages_distributions().items()
        if {d.lower() for d in distributions} & absent
    }
    plugins = {
        ep.module.split(".")[0]
        for ep in importlib.metadata.entry_points(group="pytest11")
        if ep.dist is not None and ep.dist.name.lower() in absent
    }
    assert {"hypothesis", "tqdm", "matplotlib"} <= blocked and "_hypothesis_pytestplugin" in plugins
    stubs = tmp_path / "absent"
    stubs.mkdir()
    for module in blocked - plugins:
        (stubs / f"{module}.py").write_text(
            f"raise ModuleNotFoundError('{module} is not installed on the device', name='{module}')\n"
        )
    for module in plugins:
        (stubs / f"{module}.py").write_text("")
    return dict(os.environ, PYTHONPATH=str(stubs))


@pytest.mark.slow
def test_gpu_check_runs_with_only_the_devices_packages(tmp_path):
    _no_cuda()
    env = _without_the_extras(tmp_path)
    refused = subprocess.run([sys.executable, "-c", "import hypothesis"], env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "not installed on the device" in refused.stderr  # the stand-in works
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--co",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_property.py",
            "tests/test_arena.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stdout[-2000:]
    assert "test_arena.py::" in listed.stdout and "test_property.py::" not in listed.stdout  # skipped, not an error
    out = tmp_path / "gpu-check.json"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert time.monotonic() - start < 120  # no CPU-only rows: it only collects and skips here
    report = json.loads(out.read_text())
    assert report["failures"] == [] and report["tests"]["ok"] and report["device"] is None
    counts = report["tests"]["counts"]
    assert counts["skipped"] >= 20 and counts["passed"] == counts["failed"] == counts["timed out"] == 0
    assert "GPU rows: not measured (no CUDA device)" in result.stdout


@pytest.mark.slow
def test_make_gpu_check_is_a_thin_wrapper(tmp_path):
    _no_cuda()
    out = tmp_path / "gpu-check.json"
    result = subprocess.run(
        ["make", "-s", "gpu-check", f"PYTHON={sys.executable}", f"GPU_CHECK_JSON={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "GPU benchmark skipped" in result.stdout
    assert json.loads(out.read_text())["failures"] == []


FAKE_TESTS = """
import os, time
import pytest

@pytest.mark.cuda
def test_a_passes():
    pass

@pytest.mark.cuda
def test_b_hangs():
    with open(os.environ["HUNG_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)

@pytest.mark.cuda
def test_c_fails():
    assert 1 == 2, "a failure the report keeps"

@pytest.mark.cuda
def test_d_passes():
    pass

def test_e_is_not_a_cuda_test():
    raise AssertionError("never run: gpu-check runs the cuda tests only")
"""


def _fake_tests(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: needs a CUDA device\n")
    (tmp_path / "test_fake.py").write_text(FAKE_TESTS)
    return tmp_path / "test_fake.py", dict(os.environ, HUNG_PID=str(tmp_path / "hung.pid"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_a_hanging_test_is_cut_at_its_limit_and_the_rest_still_run(tmp_path):
    _no_cuda()
    tests, env = _fake_tests(tmp_path)
    out = tmp_path / "gpu-check.json"
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--out", str(out), "--test-limit", "5", "--tests", str(tests)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout[-3000:]
    report = json.loads(out.read_text())
    outcomes = {name.split("::")[1]: outcome for name, outcome in report["tests"]["outcomes"].items()}
    assert outcomes == {
        "test_a_passes": "passed",
        "test_b_hangs": "timed out",
        "test_c_fails": "failed",
        "test_d_passes": "passed",
    }
    assert [run["hung"] is not None for run in report["tests"]["runs"]] == [True, False]
    failures = {name.split("::")[1]: text for name, text in report["tests"]["failures"].items()}
    assert failures.keys() == {"test_b_hangs", "test_c_fails"}
    assert "a failure the report keeps" in failures["test_c_fails"]
    assert sorted(f.split(": ")[-1] for f in report["failures"]) == ["failed", "timed out"]
    assert "cuda tests: 2 passed, 0 skipped, 1 failed, 1 timed out" in result.stdout
    assert _gone(int((tmp_path / "hung.pid").read_text()))


@pytest.mark.slow
def test_the_report_is_written_when_gpu_check_is_terminated(tmp_path):
    _no_cuda()
    tests, env = _fake_tests(tmp_path)
    out = tmp_path / "gpu-check.json"
    process = subprocess.Popen(
        [sys.executable, str(GPU_CHECK), "--out", str(out), "--test-limit", "600", "--tests", str(tests)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120  # a bound for a hang, not a timing: the machine may be busy
    while not (tmp_path / "hung.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = int((tmp_path / "hung.pid").read_text())
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == ["interrupted before the end"]
    assert "gpu-check: wrote" in output and _gone(hung)


FAKE_ROWS = """
import json, os, time
path, skip = os.environ["GPU_CHECK_ROWS"], set(os.environ["GPU_CHECK_SKIP_ROWS"].split(","))
for name in ("first", "hangs", "second", "dies", "third"):
    if name in skip:
        continue
    with open(path, "a") as f:
        f.write(json.dumps({"started": name}) + "\\n")
    if name == "hangs":
        time.sleep(600)
    if name == "dies":
        os._exit(3)
    with open(path, "a") as f:
        f.write(json.dumps({"name": name, "row": {"value": 1}}) + "\\n")
"""


@pytest.mark.slow
def test_a_row_that_hangs_or_dies_is_recorded_and_the_rest_still_run(tmp_path):
    import gpu_check

    (tmp_path / "rows.py").write_text(FAKE_ROWS)
    saved = []
    report = gpu_check.run_rows(
        5,
        time.monotonic() + 120,
        str(tmp_path),
        lambda part: saved.append(list(part)),
        [sys.executable, str(tmp_path / "rows.py")],
    )
    assert report == {
        "first": {"value": 1},
        "hangs": {"error": "ran past 5 s"},
        "second": {"value": 1},
        "dies": {"error": "its process exited 3: []"},
        "third": {"value": 1},
    }
    assert saved == [["first", "hangs"], ["first", "hangs", "second", "dies"]]  # the report, after each cut
    assert failed_rows(report) == ["hangs: ran past 5 s", "dies: its process exited 3: []"]


def test_gpu_check_finds_every_failed_row():
    # A row that failed is an "error" entry; gpu-check exits non-zero on any.
    report = {
        "manyleaf_transfer": {"mm_collate + to_device": {"gb_per_s": 20.0}, "per-leaf": {"error": "RuntimeError: x"}},
        "overlap": {"error": "AssertionError: y"},
        "rows": [{"ok": 1}, {"error": "z"}],
    }
    assert failed_rows(report) == [
        "manyleaf_transfer.per-leaf: RuntimeError: x",
        "overlap: AssertionError: y",
        "rows[1]: z",
    ]
    assert failed_rows({"peak_pinned_h2d_gb_per_s": 50.0}) == []


def test_the_summary_names_every_figure_and_what_failed():
    from gpu_check import summary

    bench = {
        "peak_pinned_h2d_gb_per_s": 52.0,
        "dmas_per_batch": {"Batch.to": 1, "to_device": 1, "Prefetcher": 1.0, "per leaf (control)": 53, "leaves": 53},
        "manyleaf_transfer": {"error": "RuntimeError: x"},
        "overlap": {"copy_ms": 5, "compute_ms": 5, "serial_step_ms": 10, "step_ms": 5.2, "ratio": 0.52},
    }
    report = {"device": "a GPU", "torch": "2.11.0", "tests": {"counts": {"passed": 3}}, "bench": bench}
    text = "\n".join(summary(report))
    assert "DMAs per batch: Batch.to 1, to_device 1, Prefetcher 1; per leaf (control) 53 for 53 leaves" in text
    assert "H2D bandwidth, many-leaf batch: FAILED RuntimeError: x" in text
    assert "overlap: step 5.20 ms against 10.00 ms" in text and ": 0.52 (0.5 is full overlap" in text
    assert "pinned footprint: not measured" in text and "ring registrations per epoch (2 workers): not measured" in text
