"""The DDP example under torchrun, two processes on the CPU (gloo)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).parent.parent


def test_ddp_example_trains_on_disjoint_shards(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port: another suite may run a torchrun beside this one
        "--nproc_per_node",
        "2",
        str(ROOT / "examples" / "ddp_train.py"),
        "--out",
        str(tmp_path),
        "--workers",
        "1",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    first, second = (set(r["seen"]) for r in ranks)
    assert first and second and not first & second
    assert len(first | second) == 256
    for rank in ranks:
        losses = rank["losses"]
        assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1
