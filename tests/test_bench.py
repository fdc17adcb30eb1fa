"""The benchmark CLI runs and reports consistent ratios (what it measures is not tested here)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import MMCollate, bench
from pincollate.datasets import SCENARIOS, InMemory
from samples import assert_same


def test_quick_run_writes_table_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    assert (
        bench.main(
            [
                "--quick",
                "--scenario",
                "manyleaf",
                "--scenario",
                "audio",
                "--workers",
                "0",
                "--no-progress",
                "--json",
                str(out_json),
                "--plot",
                str(out_png),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("machine: ") and "cores, torch" in printed
    report = json.loads(out_json.read_text())
    assert report["machine"]["torch"] == torch.__version__
    rows = {(r["scenario"], r["method"]): r for r in report["results"]}
    assert set(rows) >= {
        ("manyleaf", "default_collate"),
        ("manyleaf", "mm_collate"),
        ("audio", "pad/cat by hand"),
        ("audio", "mm_collate"),
    }
    for (scenario, _), row in rows.items():
        base = rows[(scenario, row["baseline"])]
        assert row["main_speedup"] == pytest.approx(base["main_ms"] / row["main_ms"])
    assert rows[("audio", "mm_collate")]["padding_bytes_per_batch"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_method_agrees_with_the_baseline_on_values(scenario):
    cls, batch_size = SCENARIOS[scenario]
    dataset = InMemory(cls(length=batch_size))
    samples = [dataset[i] for i in range(batch_size)]
    methods = {k: v for k, v in bench.methods(scenario).items() if v is not None}
    outputs = {name: fn(samples) for name, fn in methods.items()}
    ours = outputs["mm_collate"]
    if scenario == "nested":
        assert_same(ours, default_collate(samples))
    elif scenario in ("ragged", "tokens"):  # the same outputs: padded tokens, their lengths or mask, labels
        assert_same(dict(ours), outputs["pad/cat by hand"])
    elif scenario in ("manyleaf", "video"):
        reference = default_collate(samples)
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(ours[key], value)
                assert torch.equal(outputs["per-leaf pinned stack"][key], value)
    else:
        by_hand = outputs["pad/cat by hand"]
        for key, value in by_hand.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(ours[key].to(value.dtype), value), key
            else:
                assert all(torch.equal(a, b) for a, b in zip(ours[key], value, strict=True))
    if scenario in ("ragged", "vlm", "tokens"):  # Hugging Face's collator: the same ids, mask and labels
        theirs = outputs["HF DataCollatorWithPadding"]
        ids = "tokens" if scenario == "ragged" else "input_ids"
        assert torch.equal(theirs["input_ids"], ours[ids])
        lengths = torch.tensor([len(s[ids]) for s in samples])
        assert torch.equal(theirs["attention_mask"].bool(), torch.arange(ours[ids].shape[1]) < lengths[:, None])
        if scenario != "vlm":
            assert torch.equal(theirs["labels"], ours["label" if scenario == "ragged" else "labels"])
        else:
            assert torch.equal(theirs["pixel_values"], ours["pixel_values"])


def test_gpu_flag_without_cuda_is_refused(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--scenario", "manyleaf", "--workers", "0", "--no-progress", "--gpu"])


def test_worker_breakdown_times_every_stage(capsys):
    assert bench.main(["--breakdown", "--quick"]) == 0
    out = capsys.readouterr().out
    for stage in (
        "fill, fresh shared buffer",
        "fill, reused shared buffer",
        "pickle (fd shared)",
        "unpickle in another process",
        "ring: fill into a slot",
        "ring: pickle (the slot's index)",
        "ring: unpickle in another process (lease, views)",
    ):
        assert stage in out
    report = bench.worker_breakdown("video", quick=True)
    assert report["batch_bytes"] > 20 << 20 and all(ms > 0 for ms in report["stages_ms"].values())


@pytest.mark.parametrize("scenario", ["ragged", "detection"])
def test_main_stages_time_each_stage_of_a_main_process_batch(scenario, capsys):
    from pincollate.bench._stages import main_stages

    assert bench.main(["--stages", scenario, "--quick"]) == 0
    out = capsys.readouterr().out
    assert f"main-process batch stages, {scenario} (batch 32" in out and "guards and layout (no copy)" in out
    stages = main_stages(scenario, quick=True)["stages_us"]
    assert list(stages)[1:] == [
        "mm_collate",
        "guards and layout (no copy)",
        "buffer: take and hand back",
        "build the batch",
        "copies",
        "rest",
    ]
    assert next(iter(stages)).startswith("baseline (") and all(us >= 0 for us in stages.values())
    assert stages["mm_collate"] > 0 and stages["guards and layout (no copy)"] > 0
    parts = sum(stages[name] for name in list(stages)[2:6])
    assert stages["rest"] == pytest.approx(max(stages["mm_collate"] - parts, 0.0))
    assert "one batch" in out and "in turn" in out


def test_recipes_compare_fields_planned_once_with_the_careful_walk(capsys, monkeypatch):
    import random

    from pincollate._plan.careful import Planner
    from pincollate.bench import _recipes as _bench_recipes

    assert bench.main(["--recipes", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "fields planned once against the careful walk" in out
    assert all(name in out for name in _bench_recipes.KINDS)
    # What the comparison rests on: the careful side walks every batch, the recipe side none.
    walks = []
    plan = Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, *args: walks.append(1) or plan(self, *args))
    for name, (make, fields, _) in _bench_recipes.KINDS.items():
        rng = random.Random(0)
        batches = [[make(i, rng) for i in range(4)] for _ in range(3)]
        careful = _bench_recipes._careful(fields, batches[0])
        recipe = MMCollate(pin_memory=False, fields=fields)
        recipe(batches[0])
        walks.clear()
        for batch in batches:
            recipe(batch)
        assert not walks, name
        for batch in batches:
            careful(batch)
        assert len(walks) >= len(batches), name


def test_the_pinned_trim_row_runs_on_stand_ins(stand_in_cuda, host_allocator, monkeypatch):
    # The row times each trim where the staging thread calls it: a row that patched a name the
    # staging no longer uses recorded an AttributeError, or would record no trim checks at all.
    from pincollate._memory.arena import trim_pinned
    from pincollate._transfer import staging
    from pincollate.bench._gpu import trim_cost

    monkeypatch.setattr(staging, "to_device", lambda batch, device, non_blocking=True: batch)
    row = trim_cost(torch.device("cuda"), 1 << 12)
    assert row["batches"] == 96 and row["trim_checks"] == 96 // 16
    assert row["peak_reserved_mib"] > 0 and staging.trim_pinned is trim_pinned


def test_small_shm_report_reads_as_a_table():
    from pincollate.bench._shm import format_small_shm

    report = {
        "size": "64m",
        "workers": 2,
        "rounds": 5,
        "batches": 48,
        "rows": [
            {"method": "default_collate", "batch_mib": 23.4, "ample_batches_per_s": 40.0, "small_error": "fails: x"},
            {
                "method": "mm_collate",
                "batch_mib": 23.4,
                "ample_batches_per_s": 135.0,
                "small_batches_per_s": 89.0,
                "small_vs_ample": 89 / 135,
            },
        ],
    }
    text = format_small_shm(report)
    assert "default_collate     23 MiB      40.00 fails: x" in text
    assert "mm_collate          23 MiB     135.00      89.00        0.66x" in text


def test_stats_cost_times_the_prefetcher_with_and_without_stats(tmp_path, capsys, monkeypatch):
    from pincollate.bench import _stats_cost

    report = _stats_cost.run_stats_cost(quick=True, batches=12, rounds=4)
    assert (report["batches"], report["rounds"], report["target"]) == (12, 4, 0.01)
    assert set(report["loops"]) == {"training step", "data only"}
    for row in report["loops"].values():
        lo, hi = row["spread"]
        assert row["no_stats_us"] > 0 and row["stats_us"] > 0 and lo <= row["ratio"] <= hi
        # The stats side measured something: its loop's figures.
        assert 0.0 <= row["measured"]["input_bound"] <= 1.0 and row["measured"]["batches_per_s"] > 0
    table = _stats_cost.format_stats_cost(report)
    assert table.splitlines()[1].split() == ["loop", "no", "stats", "stats", "ratio", "(spread)", "cost", "us"]
    assert "training step" in table and "data only" in table and "target: at most 1%" in table
    # The command line: its machine line, the table, the JSON.
    monkeypatch.setattr(_stats_cost, "run_stats_cost", lambda quick: report)
    out_json = tmp_path / "s.json"
    assert bench.main(["--stats-cost", "--quick", "--json", str(out_json)]) == 0
    assert capsys.readouterr().out.startswith("machine: ")
    assert json.loads(out_json.read_text())["stats_cost"] == report


# --- a busy machine, and the plot -----------------------------------------------------------


def test_a_busy_machine_is_told_by_its_load_or_by_the_spread_of_its_rounds():
    from pincollate.bench._busy import busy_reasons

    steady = [("video mm_collate (main process)", [0.85, 1.1]), ("vlm mm_collate (workers)", [3.1, 3.8])]
    assert busy_reasons(0.3, 2, steady) == []
    assert busy_reasons(None, None, steady) == []  # no load average here: the spread alone decides
    assert busy_reasons(1.0, 2, steady) == ["load average 1.00 on 2 cores before the run"]
    assert busy_reasons(0.3, 16, [*steady, ("vlm mm_collate (main process)", [0.10, 11.74])]) == [
        "rounds of vlm mm_collate (main process) spread 0.10-11.74"
    ]


def test_one_round_that_met_a_pause_does_not_mark_the_machine_busy():
    from pincollate.bench._busy import busy_reasons

    # A quick run's video rounds are a few milliseconds: one that met a collection of the
    # interpreter or a page-cache flush is far off while the others agree.
    one_off = [1.0, 0.98, 1.02, 0.11, 1.01, 0.99, 1.0, 6.24, 1.0, 1.03, 0.97, 1.0]
    assert busy_reasons(None, 2, [("video mm_collate (main process)", one_off)]) == []
    # Four rounds: every one counts, as before.
    assert busy_reasons(None, 2, [("video", [1.0, 0.98, 1.02, 0.11])]) == ["rounds of video spread 0.11-1.02"]
    # Rounds all over the place are still a busy machine.
    scattered = [1.0, 0.4, 1.1, 0.3, 2.2, 0.5, 1.0, 2.5]
    assert busy_reasons(None, 2, [("nested", scattered)]) == [
        "rounds of nested spread 0.40-2.20 (the lowest and highest of 8 left out)"
    ]


def test_a_run_on_a_busy_machine_says_its_figures_are_unreliable(monkeypatch, tmp_path, capsys):
    import os

    monkeypatch.setattr(bench, "load_average", lambda: 4.0 * (os.cpu_count() or 1))  # a stand-in reading
    out_json = tmp_path / "b.json"
    argv = ["--quick", "--scenario", "audio", "--workers", "0", "--no-progress", "--json", str(out_json)]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("machine: ")
    assert lines[1].startswith("WARNING: the machine was busy (load average ") and "figures are unreliable" in lines[1]
    report = json.loads(out_json.read_text())
    assert report["load_before"] == 4.0 * (os.cpu_count() or 1) and report["busy"][0].startswith("load average")


def _report(busy: list[str], outlier: float) -> dict:
    rows = []
    for scenario, base in (("manyleaf", "default_collate"), ("vlm", "pad/cat by hand")):
        rows.append(
            {"scenario": scenario, "method": base, "baseline": base, "main_speedup": 1.0, "main_spread": [1, 1]}
        )
        for method, high in (("tensordict", 1.2), ("mm_collate", outlier if scenario == "vlm" else 1.1)):
            rows.append(
                {
                    "scenario": scenario,
                    "method": method,
                    "baseline": base,
                    "main_speedup": 0.9,
                    "main_spread": [0.1, high],
                }
            )
    machine = {"cpu": "a CPU whose name is long enough to need the room it gets", "cores": 2, "torch": "2.x"}
    return {"machine": machine, "workers": 0, "quick": True, "results": rows, "busy": busy}


def test_the_plot_keeps_its_labels_inside_and_apart_and_cuts_one_outlier():
    import matplotlib.pyplot as plt

    from pincollate.bench._report import figure

    fig = figure(_report(["load average 3.52 on 2 cores before the run"], outlier=11.74))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        whole = fig.bbox
        (ax,) = fig.axes
        label = ax.yaxis.label.get_window_extent(renderer)
        title = fig._suptitle.get_window_extent(renderer)
        for box in (label, title, ax.title.get_window_extent(renderer)):
            assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1
        assert not title.overlaps(ax.get_window_extent(renderer))  # the figure's title above the panel
        assert ax.get_ylim()[1] < 2  # the 11.74x round does not set the scale ...
        assert [t.get_text() for t in ax.texts] == ["\u219111.7x"]  # ... it is written at the top
        assert "BUSY MACHINE" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    quiet = figure(_report([], outlier=1.3))
    try:
        assert len(quiet.axes[0].texts) == 0 and "BUSY" not in quiet._suptitle.get_text()
    finally:
        plt.close(quiet)


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--json", "/nonexistent/folder/x.json"],
            "--json /nonexistent/folder/x.json: not a file in an existing folder",
        ),
        (["--plot", "bench.txt"], "--plot bench.txt: give a .png"),
        (["--calls", "--workers", "-1"], "--workers must be >= 0"),
        # Single-purpose modes given together: all but one used to be skipped without a word.
        (["--calls", "--stats-cost"], "--calls and --stats-cost each run alone"),
        (["--stages", "ragged", "--breakdown"], "--stages and --breakdown each run alone"),
        (["--gpu", "--no-gpu"], "--gpu and --no-gpu contradict each other"),
        # Settings a single-purpose mode does not read: dropped without a word before.
        (["--stats-cost", "--plot", "x.png"], "--stats-cost does not read --plot"),
        (["--stages", "ragged", "--scenario", "vlm"], "--stages does not read --scenario"),
        (["--recipes", "--gpu"], "--recipes does not read --gpu"),
        # The size becomes a mount option: checked before any run, never passed to a shell as it is.
        (["--small-shm", "64m; echo x"], "--small-shm 64m; echo x: the size must be a number"),
        (["--small-shm", "64mb"], "--small-shm 64mb: the size must be a number"),
        (["--small-shm", "--workers", "0"], "--small-shm 64m: it times DataLoader workers"),
    ],
)
def test_an_output_path_or_setting_that_cannot_work_is_refused_before_the_run(args, says, capsys):
    from pincollate.bench import main

    with pytest.raises(SystemExit) as info:
        main(["--quick", "--no-progress", *args])
    assert info.value.code == 2 and says in capsys.readouterr().err


def test_a_small_shm_run_without_root_or_unshare_is_refused_before_it_starts(monkeypatch, capsys):
    import shutil

    from pincollate.bench import _shm, main

    monkeypatch.setattr(_shm.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    with pytest.raises(SystemExit) as info:
        main(["--small-shm", "--no-progress"])
    assert info.value.code == 2 and "--small-shm 64m: it needs root" in capsys.readouterr().err
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        main(["--small-shm", "--no-progress"])
    assert "it needs the unshare command" in capsys.readouterr().err


def test_a_small_shm_size_reaches_mount_as_one_word_never_as_shell_text(monkeypatch):
    import subprocess

    from pincollate.bench import _shm

    with pytest.raises(ValueError, match="the size must be a number"):
        _shm.run_small_shm("64m; touch /tmp/x", 2, 1, progress=False)  # checked where it is run, too
    ran = []

    def record(argv, **kwargs):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout='{"mm_collate": 1.0}', stderr="")

    monkeypatch.setattr(_shm.subprocess, "run", record)
    _shm._child("64m", 2, 4, "mm_collate", 8)
    (argv,) = ran
    script = argv[argv.index("-c") + 1]
    assert "64m" not in script and argv[argv.index("-c") + 3] == "64m"  # after "sh": "$1"
