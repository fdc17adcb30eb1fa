"""Where a worker batch's time goes: each stage timed on its own (``--breakdown``)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .._collate.collate import MMCollate
from ..datasets import SCENARIOS, InMemory

__all__ = ["format_breakdown", "worker_breakdown"]


def worker_breakdown(scenario: str = "video", quick: bool = False) -> dict[str, Any]:
    """The stages a worker batch goes through, timed one by one in this process (ms, medians).

    Without the ring (``worker_slots=0``): worker fill into a fresh shared-memory buffer and
    into a reused one; pickling for the main process (the file descriptor shared);
    unpickling in another process (the descriptor received over a socket, the buffer mapped
    anew); the first read there (minor page faults of the new mapping) and a second one, the
    size of the pin copy (pinning itself needs an accelerator). Then the same trip through a
    worker's ring: fill into a slot and pickle its index in a forked child, lease and read
    the batch here, with the slot mapped once.
    """
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing

    from .._memory.arena import allocate

    cls, batch_size = SCENARIOS[scenario]
    n = 6
    dataset = InMemory(cls(length=batch_size * n))
    batches = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(n)]
    collate = MMCollate(pin_memory=False)
    collate(batches[0])  # a new structure's first batch is walked: its plan is compiled by the next
    collate(batches[0])
    plan = collate._plans.last
    assert plan is not None and plan.layout is not None, "the breakdown needs a scenario without per-batch parts"
    repeat = 10 if quick else 30

    def median_ms(step: Callable[[int], Any]) -> float:
        times = []
        for i in range(repeat):
            start = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    def shared_batch(i: int, buffer: torch.Tensor | None = None) -> Any:
        # The plan's generated function, into a fresh shared buffer or the one given.
        into = allocate(plan.nbytes, "shared") if buffer is None else buffer
        return plan.compiled.run(batches[i % n], "shared", 0, False, None, into)

    reused = allocate(plan.nbytes, "shared")
    made = [shared_batch(i) for i in range(repeat)]
    target = torch.empty(plan.nbytes, dtype=torch.uint8)
    # The main process's side, for real: batches made and pickled in a forked child,
    # received here (descriptor over a socket, a fresh mapping), then read once.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def child() -> None:
        torch.set_num_threads(1)  # as in a DataLoader worker: no thread pool after fork
        batches_there = [shared_batch(i) for i in range(2 * repeat)]
        theirs.send([bytes(ForkingPickler.dumps(b)) for b in batches_there])
        theirs.recv()  # keep the batches (and the fd sharer) alive until the parent is done

    process = context.Process(target=child, daemon=True)
    process.start()
    try:
        if not ours.poll(300):
            raise RuntimeError("the child process making batches did not answer")
        received = ours.recv()
        mapped: list[Any] = []
        stages = {
            "fill, fresh shared buffer": median_ms(lambda i: shared_batch(i)),
            "fill, reused shared buffer": median_ms(lambda i: shared_batch(i, reused)),
            "pickle (fd shared)": median_ms(lambda i: ForkingPickler.dumps(made[i])),
            "unpickle in another process (fd received, mapped)": median_ms(
                lambda i: mapped.append(pickle.loads(received[i]))
            ),
            "first read there (one copy of the mapped buffer)": median_ms(lambda i: target.copy_(mapped[i].buffer)),
            "one copy of the buffer again (pin copy's size)": median_ms(lambda i: target.copy_(mapped[i].buffer)),
        }
    finally:
        ours.send(None)
        process.join(timeout=60)
    stages.update(_ring_breakdown(plan, batches, repeat))
    stages["lease: made and ended (once per batch, each side)"] = _lease_ms(reused)
    return {"scenario": scenario, "batch_bytes": plan.nbytes, "stages_ms": stages}


def _lease_ms(buffer: torch.Tensor, count: int = 2000) -> float:
    """What the ownership rule costs a batch: one lease of recycled memory, made and ended."""
    from .._memory import ownership as _ownership

    def ended(reusable: bool) -> None:
        pass

    times = []
    for _ in range(count):
        start = time.perf_counter()
        lease = _ownership.grant(buffer.numpy()[:], ended, shared=True)
        del lease
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _ring_breakdown(plan: Any, batches: list[list[Any]], repeat: int) -> dict[str, float]:
    """The same trip through a worker's ring of slots: a forked child fills a slot and sends
    its index; this process leases the batch, reads it once and drops it (freeing the slot)."""
    import multiprocessing
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from .._memory import receiver as _receiver
    from .._memory import ring as _ring

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def child() -> None:
        torch.set_num_threads(1)
        ring = _ring._rings[os.getpid()] = _ring._Ring(2)  # what a DataLoader worker's first batch sets up
        fills, pickles = [], []
        for i in range(repeat + 1):
            start = time.perf_counter()
            buffer = ring.take(plan.nbytes)
            assert buffer is not None, "the parent did not free the slot"
            batch = plan.compiled.run(batches[i % len(batches)], "shared", 0, False, None, buffer)
            filled = time.perf_counter()
            data = bytes(ForkingPickler.dumps(batch))
            fills.append(filled - start)
            pickles.append(time.perf_counter() - filled)
            del batch, buffer
            theirs.send(data)
            theirs.recv()  # the parent dropped the batch: its slot is free
        theirs.send((statistics.median(fills[1:]), statistics.median(pickles[1:])))
        theirs.recv()

    process = context.Process(target=child, daemon=True)
    process.start()
    target = torch.empty(plan.nbytes, dtype=torch.uint8)
    loads, reads = [], []
    try:
        for _ in range(repeat + 1):
            if not ours.poll(300):
                raise RuntimeError("the child process filling slots did not answer")
            data = ours.recv()
            start = time.perf_counter()
            batch = pickle.loads(data)
            loaded = time.perf_counter()
            target.copy_(batch.buffer)
            loads.append(loaded - start)
            reads.append(time.perf_counter() - loaded)
            del batch
            ours.send(None)
        fill_s, pickle_s = ours.recv()
    finally:
        ours.send(None)
        process.join(timeout=60)
        _receiver.close_all()
    return {
        "ring: fill into a slot": fill_s * 1e3,
        "ring: pickle (the slot's index)": pickle_s * 1e3,
        "ring: unpickle in another process (lease, views)": statistics.median(loads[1:]) * 1e3,
        "ring: first read there (slot mapped once)": statistics.median(reads[1:]) * 1e3,
    }


def format_breakdown(report: dict[str, Any]) -> str:
    lines = [f"worker batch breakdown, {report['scenario']} ({report['batch_bytes'] / 2**20:.1f} MiB per batch), ms:"]
    lines += [f"  {name:<52} {ms:8.3f}" for name, ms in report["stages_ms"].items()]
    return "\n".join(lines)
