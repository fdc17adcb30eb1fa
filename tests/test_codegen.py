"""The compiled plan (pincollate/_plan/codegen.py): one generated function per structure, equal to the careful walk.

``MMCollate(compile=False)`` walks every batch carefully: it is the reference every
compiled plan is compared with, fresh and warm, on every sample family.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest
import torch

from pincollate import CollateError, MMCollate
from pincollate._plan.fill import Mismatch
from pincollate._plan.tree_ops import CarefulOp
from samples import PARITY, RAGGED, assert_identical

GOLDEN = Path(__file__).parent / "golden"


def _same_or_same_error(make, *collates):
    """Each collate's result on a fresh copy of ``make()``: equal batches, or equal error texts."""
    results = []
    for collate in collates:
        try:
            results.append(collate(make()))
        except CollateError as error:
            results.append(str(error))
    first = results[0]
    for other in results[1:]:
        if isinstance(first, str) or isinstance(other, str):
            assert first == other
        else:
            assert_identical(other, first)


@pytest.mark.parametrize("name", sorted(PARITY) + sorted(RAGGED))
def test_the_compiled_plan_gives_what_the_careful_walk_gives(name):
    make = PARITY.get(name) or RAGGED[name]
    reference = MMCollate(pin_memory=False, compile=False)
    compiled = MMCollate(pin_memory=False)
    for _ in range(3):  # the first batch plans; later ones run the generated code
        _same_or_same_error(make, reference, compiled)


def test_compile_false_walks_every_batch_and_compiles_nothing_of_the_structure(monkeypatch):
    collate = MMCollate(pin_memory=False, compile=False)
    walked = []
    real = collate._planner.plan
    monkeypatch.setattr(collate._planner, "plan", lambda values, path: walked.append(path) or real(values, path))
    for _ in range(3):
        collate(PARITY["multimodal-dict"]())
    assert walked == [(), (), ()]
    plan = collate._plans.last
    assert type(plan.op) is CarefulOp and plan.op.recipe is None and collate._plans.planned == 1


def test_a_warm_batch_runs_the_generated_function_and_no_node_interprets_it():
    collate = MMCollate(pin_memory=False)
    batch = PARITY["multimodal-dict"]
    collate(batch())
    plan = collate._plans.last
    called = []

    def profile(frame, event, arg):
        if event == "call":
            called.append((frame.f_code.co_filename, frame.f_code.co_name))

    samples = batch()
    sys.setprofile(profile)
    try:
        collate(samples)
    finally:
        sys.setprofile(None)
    assert collate._plans.last is plan
    assert called.count((plan.compiled.filename, "run")) == 1
    # The nodes hold data and copy kernels; none of them runs (interprets) the batch.
    nodes = {os.path.join("_plan", "ops.py"), os.path.join("_plan", "tree_ops.py")}
    assert not [name for filename, name in called if name == "run" and any(filename.endswith(n) for n in nodes)]


def test_a_traceback_through_the_generated_code_shows_the_field_that_failed():
    collate = MMCollate(pin_memory=False)
    samples = [{"image": torch.zeros(3, 2, 2), "label": i} for i in range(2)]
    collate(samples)
    plan = collate._plans.last
    changed = [{"image": torch.zeros(3, 2, 2, dtype=torch.float64), "label": i} for i in range(2)]
    with pytest.raises(Mismatch) as info:
        plan.run(changed, collate._planner)
    text = "".join(traceback.format_exception(info.value))
    assert plan.compiled.filename in text and "raise Mismatch" in text and "# ['image']" in text
    assert info.value.paths == (("image",),)


def test_keys_and_values_reach_the_generated_code_only_through_its_constants():
    key = "x'] = 1\nraise SystemExit('spliced')\n#"
    samples = [{key: torch.ones(2), "s": "\nimport os"}, {key: torch.zeros(2), "s": "b"}]
    collate = MMCollate(pin_memory=False)
    for _ in range(2):
        out = collate(samples)
    assert torch.equal(out[key], torch.stack([torch.ones(2), torch.zeros(2)]))
    source = collate._plans.last.compiled.source
    # The generated code has no string literals: whatever follows a '#' is a comment.
    code = [line.split("#", 1)[0] for line in source.splitlines()]
    assert not [line for line in code if "SystemExit" in line or "import" in line or "x'" in line]


def _scenario_source(scenario: str) -> str:
    from pincollate.bench._methods import methods
    from pincollate.datasets import SCENARIOS, InMemory

    cls, batch_size = SCENARIOS[scenario]
    dataset = InMemory(cls(length=batch_size * 2))
    collate = methods(scenario)["mm_collate"]
    for i in range(2):
        collate([dataset[i * batch_size + j] for j in range(batch_size)])
    return collate._plans.last.compiled.source


@pytest.mark.parametrize("scenario", ["manyleaf", "nested", "video", "ragged", "tokens", "vlm", "audio", "detection"])
def test_the_bench_scenarios_generate_the_reviewed_code(scenario):
    # A change to the generator shows in review as a change to these files:
    # PINCOLLATE_GOLDEN=write rewrites them.
    path = GOLDEN / f"plan_{scenario}.py"
    header = (
        f'"""The generated plan of the bench\'s {scenario} scenario (tests/test_codegen.py): kN are its constants."""\n\n'
        "# ruff: noqa: F821\n\n"
    )
    source = _scenario_source(scenario)
    if os.environ.get("PINCOLLATE_GOLDEN") == "write":
        path.write_text(header + source)
    assert header + source == path.read_text()
