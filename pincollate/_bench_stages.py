"""Where a main-process batch's time goes: each stage of ``mm_collate`` timed on its own (``--stages``)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from ._arena import allocate, resolve_kind
from ._batch import make_batch
from ._bench_methods import methods
from ._collate import MMCollate
from .datasets import SCENARIOS, InMemory

__all__ = ["format_stages", "main_stages"]


def _least_us(step: Callable[[], Any], calls: int, repeat: int) -> float:
    """The least time of ``repeat`` runs of ``calls`` calls, in microseconds per call.

    The least, as ``timeit`` advises: on a shared machine noise only adds time. The
    garbage collector is off while timing, as ``timeit`` has it.
    """
    best = float("inf")
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(calls):
                step()
            best = min(best, time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return best / calls * 1e6


def main_stages(scenario: str = "ragged", quick: bool = False) -> dict[str, Any]:
    """One batch of ``scenario`` collated in the main process, its stages timed one by one (us).

    The scenario's baseline (``default_collate`` or the hand-written collate) and
    ``mm_collate`` whole; then ``mm_collate``'s stages: checking the batch against its
    cached plan and placing its per-batch parts (``plan.run``), the copies into a buffer
    kept from one call to the next (``fill.execute``, which also makes the tensors the
    copies write), taking the buffer and handing it back (pageable memory without an
    accelerator; a large one is leased), and building the batch over it. ``rest`` is the
    whole less the stages: the calls between them, and what a fresh buffer costs that a
    kept one does not.

    Example:
        >>> report = main_stages("ragged", quick=True)
        >>> sorted(report["stages_us"])[:2]
        ['baseline (pad/cat by hand)', 'buffer: take and hand back']
    """
    cls, batch_size = SCENARIOS[scenario]
    dataset = InMemory(cls(length=batch_size))
    batch = [dataset[j] for j in range(batch_size)]
    table = methods(scenario)
    baseline_name, baseline = next(iter(table.items()))
    collate = table["mm_collate"]
    assert isinstance(collate, MMCollate) and baseline is not None
    collate(batch)
    plan, planner = collate._plans.last, collate._planner
    assert plan is not None
    kind = resolve_kind(collate.pin_memory)
    layout, fill = plan.run(batch, planner)
    buffer = allocate(layout.nbytes, kind)
    views = fill.execute(buffer)
    calls, repeat = (5, 5) if quick else (20, 25)

    def copies() -> None:
        plan.run(batch, planner)[1].execute(buffer)

    stages = {
        f"baseline ({baseline_name})": lambda: baseline(batch),
        "mm_collate": lambda: collate(batch),
        "check and place (plan.run)": lambda: plan.run(batch, planner),
        "check, place and copy": copies,
        "buffer: take and hand back": lambda: allocate(layout.nbytes, kind),
        "build the batch": lambda: make_batch(layout, buffer, fill.values, views),
    }
    # Interleaved rounds: a phase of the machine weighs on every stage alike.
    rounds = 3
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, step in stages.items():
            took = _least_us(step, calls, max(repeat // rounds, 1))
            best[name] = min(best.get(name, took), took)
    out = {name: best[name] for name in stages}
    out["copies (fill.execute)"] = max(out.pop("check, place and copy") - out["check and place (plan.run)"], 0.0)
    parts = ("check and place (plan.run)", "copies (fill.execute)", "buffer: take and hand back", "build the batch")
    out["rest"] = max(out["mm_collate"] - sum(out[name] for name in parts), 0.0)
    return {"scenario": scenario, "batch_size": batch_size, "batch_bytes": layout.nbytes, "stages_us": out}


def format_stages(report: dict[str, Any]) -> str:
    lines = [
        f"main-process batch stages, {report['scenario']} (batch {report['batch_size']}, "
        f"{report['batch_bytes'] / 2**10:.1f} KiB), us (least of several runs):"
    ]
    lines += [f"  {name:<44} {us:9.1f}" for name, us in report["stages_us"].items()]
    return "\n".join(lines)
