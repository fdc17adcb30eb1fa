"""Where a main-process batch's time goes: each stage of ``mm_collate`` timed on its own (``--stages``)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from .._batch.batch import carried, make_batch
from .._batch.views import Views
from .._collate.collate import MMCollate
from .._memory.arena import allocate, resolve_kind
from ..datasets import SCENARIOS, InMemory
from ._methods import methods

__all__ = ["format_stages", "main_stages"]


def _least_us(step: Callable[[Any], Any], batches: list[Any], repeat: int) -> float:
    """The least time of ``repeat`` runs of ``step`` over ``batches``, in microseconds per batch.

    The least, as ``timeit`` advises: on a shared machine noise only adds time. The
    garbage collector is off while timing, as ``timeit`` has it.
    """
    best = float("inf")
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            best = min(best, time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return best / len(batches) * 1e6


def main_stages(scenario: str = "ragged", quick: bool = False) -> dict[str, Any]:
    """A main-process batch of ``scenario``, its stages timed one by one (us): one batch again, and batches in turn.

    The scenario's baseline (``default_collate`` or the hand-written collate) and
    ``mm_collate`` whole; then ``mm_collate``'s stages: checking the batch against its
    cached plan and placing its per-batch parts (the plan's generated function up to the
    layout, which it returns without copying where it is asked for no buffer kind), the copies
    into a buffer kept from one call to the next (that function into the buffer, less the
    build), taking the buffer and handing it back (pageable memory without an accelerator; a
    large one is leased), and building the batch over it. ``rest`` is the
    whole less the stages: the calls between them, and what a fresh buffer costs that a
    kept one does not. ``stages_us`` collates one batch again and again (its samples stay
    in the caches); ``in_turn_us`` collates as many different batches in turn, as a
    loader does (each batch's samples read afresh).

    Examples:
        >>> report = main_stages("ragged", quick=True)
        >>> sorted(report["stages_us"])[:2], list(report["in_turn_us"]) == list(report["stages_us"])
        (['baseline (pad/cat by hand)', 'buffer: take and hand back'], True)
    """
    cls, batch_size = SCENARIOS[scenario]
    count = 8 if quick else 32
    dataset = InMemory(cls(length=batch_size * count))
    batches = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(count)]
    table = methods(scenario)
    baseline_name, baseline = next(iter(table.items()))
    collate = table["mm_collate"]
    assert isinstance(collate, MMCollate) and baseline is not None
    for batch in batches:
        collate(batch)
    plan = collate._plans.last
    assert plan is not None
    kind = resolve_kind(collate.pin_memory)
    # The plan's one generated function checks, copies and builds.
    buffer = allocate(max(plan.compiled.run(batch, None, 0, False, None).nbytes for batch in batches), kind)
    made = {id(batch): carried(plan.compiled.run(batch, kind, 0, False, None, buffer)) for batch in batches}
    nbytes = {key: state[0].nbytes for key, state in made.items()}  # type: ignore[index]
    built = {
        key: (state[0], state[2], Views(buffer, state[2], (), state[0].bulk()))  # type: ignore[index]
        for key, state in made.items()
    }

    def check(batch: Any) -> None:
        # The guards and the layout, nothing copied (``plan.check`` also copies, into scratch memory).
        plan.compiled.run(batch, None, 0, False, None)

    def copies(batch: Any) -> None:
        plan.compiled.run(batch, kind, 0, False, None, buffer)  # its build is timed on its own

    def build(batch: Any) -> None:
        layout, values, views = built[id(batch)]
        make_batch(layout, buffer, values, views)

    stages: dict[str, Callable[[Any], Any]] = {
        f"baseline ({baseline_name})": baseline,
        "mm_collate": collate,
        "guards and layout (no copy)": check,
        "check, place and copy": copies,
        "buffer: take and hand back": lambda batch: allocate(nbytes[id(batch)], kind),
        "build the batch": build,
    }
    repeat = 3 if quick else 8
    # Interleaved rounds: a phase of the machine weighs on every stage alike.
    runs = {"stages_us": [batches[0]] * count, "in_turn_us": batches}
    report: dict[str, Any] = {
        "scenario": scenario,
        "batch_size": batch_size,
        "batch_bytes": nbytes[id(batches[0])],
    }
    best: dict[str, dict[str, float]] = {key: {} for key in runs}
    for _ in range(3):
        for name, step in stages.items():
            for key, run in runs.items():
                took = _least_us(step, run, repeat)
                best[key][name] = min(best[key].get(name, took), took)
    for key in runs:
        out = {name: best[key][name] for name in stages}
        others = out["guards and layout (no copy)"] + out["build the batch"]
        out["copies"] = max(out.pop("check, place and copy") - others, 0.0)
        parts = ("guards and layout (no copy)", "copies", "buffer: take and hand back", "build the batch")
        out["rest"] = max(out["mm_collate"] - sum(out[name] for name in parts), 0.0)
        report[key] = out
    return report


def format_stages(report: dict[str, Any]) -> str:
    lines = [
        f"main-process batch stages, {report['scenario']} (batch {report['batch_size']}, "
        f"{report['batch_bytes'] / 2**10:.1f} KiB), us (least of several runs):",
        f"  {'':<44} {'one batch':>9}  {'in turn':>9}",
    ]
    lines += [f"  {name:<44} {us:9.1f}  {report['in_turn_us'][name]:9.1f}" for name, us in report["stages_us"].items()]
    return "\n".join(lines)
