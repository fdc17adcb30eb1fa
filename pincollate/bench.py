"""``python -m pincollate.bench``: collate and transfer methods side by side, as ratios.

Every method runs on the same samples in the same process, in interleaved rounds
(A, B, C, A, B, C, ...), and the table reports medians and each method's ratio to
the baseline: ``default_collate``, or for ragged scenarios (which it rejects) a
hand-written ``pad_sequence``/``torch.cat`` collate. Machines are noisy; ratios
from one run are the claim, never absolute times from different runs.

Modes: ``main`` times one collate call in this process; ``workers`` times a
``DataLoader`` with ``--workers`` worker processes end to end (collate in the
workers, batches sent to this process). With ``--gpu`` and a CUDA device it adds
host-to-device transfer and compute/copy overlap rows.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, default_collate

from ._arena import accelerator_can_pin, pinned_footprint
from ._collate import MMCollate
from ._packing import Concat
from ._policies import Pad
from .datasets import SCENARIOS, InMemory, _Repeat

__all__ = ["machine", "main", "run"]

Collate = Callable[[list[Any]], Any]


# --- baselines written from their published behaviour -----------------------------------


def per_leaf_pinned_stack(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each field stacked into its own fresh tensor, pinned where possible (the vLLM change)."""
    pin = accelerator_can_pin()
    out: dict[str, Any] = {}
    for key, first in samples[0].items():
        values = [s[key] for s in samples]
        if isinstance(first, torch.Tensor):
            target = torch.empty((len(values), *first.shape), dtype=first.dtype, pin_memory=pin)
            out[key] = torch.stack(values, out=target)
        elif isinstance(first, (int, float)):
            out[key] = torch.tensor(values, dtype=torch.float64 if isinstance(first, float) else None)
        else:
            out[key] = values
    return out


def tensordict_consolidate(samples: list[dict[str, Any]]) -> Any:
    """``default_collate`` then ``TensorDict(...).consolidate()``: one storage, two copies."""
    from tensordict import TensorDict

    batch = default_collate(samples)
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return TensorDict(tensors, batch_size=[len(samples)]).consolidate()


def vlm_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ids = [s["input_ids"] for s in samples]
    lengths = torch.tensor([len(t) for t in ids])
    patches = [p for s in samples for p in s["pixel_values"]]
    rows = torch.tensor([0] + [sum(p.shape[0] for p in s["pixel_values"]) for s in samples]).cumsum(0).to(torch.int32)
    return {
        "input_ids": pad_sequence(ids, batch_first=True),
        "attention_mask": torch.arange(int(lengths.max()))[None, :] < lengths[:, None],
        "pixel_values": torch.cat(patches),
        "pixel_values_offsets": rows,
    }


def audio_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    waves = [s["audio"].transpose(0, 1) for s in samples]
    return {
        "audio": pad_sequence(waves, batch_first=True).transpose(1, 2),
        "audio_lengths": torch.tensor([w.shape[0] for w in waves]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


def ragged_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [s["tokens"] for s in samples]
    return {
        "tokens": pad_sequence(tokens, batch_first=True),
        "tokens_lengths": torch.tensor([len(t) for t in tokens]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


@functools.cache
def hf_padding_collator() -> Any:
    """Hugging Face's ``DataCollatorWithPadding``, over a word-level tokenizer built offline.

    What users of ``transformers`` pick for token ids; padding needs only the tokenizer's
    pad token, so a two-word vocabulary does. ``None`` without ``transformers``.
    """
    try:
        from tokenizers import Tokenizer, models
        from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast
    except ImportError:
        return None
    words = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")  # type: ignore[no-untyped-call]
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")


def ragged_hf(samples: list[dict[str, Any]]) -> Any:
    """``DataCollatorWithPadding``: ids padded, an int64 attention mask, ``label`` as ``labels``."""
    return hf_padding_collator()([{"input_ids": s["tokens"], "label": s["label"]} for s in samples])


def vlm_hf(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``DataCollatorWithPadding`` for the text, the image items concatenated by hand."""
    out = dict(hf_padding_collator()([{"input_ids": s["input_ids"]} for s in samples]))
    patches = [p for s in samples for p in s["pixel_values"]]
    rows = torch.tensor([0] + [sum(p.shape[0] for p in s["pixel_values"]) for s in samples]).cumsum(0).to(torch.int32)
    out["pixel_values"] = torch.cat(patches)
    out["pixel_values_offsets"] = rows
    return out


def detection_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "image": torch.stack([s["image"] for s in samples]),
        "boxes": [s["boxes"] for s in samples],
        "labels": [s["labels"] for s in samples],
    }


def methods(scenario: str) -> dict[str, Collate | None]:
    """The methods compared in a scenario; the first is the baseline."""
    if scenario == "nested":
        return {"default_collate": default_collate, "mm_collate": MMCollate()}
    if scenario in ("manyleaf", "video"):
        table: dict[str, Collate | None] = {
            "default_collate": default_collate,
            "per-leaf pinned stack": per_leaf_pinned_stack,
            "tensordict": tensordict_consolidate if _has_tensordict() else None,
            # Every worker batch in a fresh shared buffer: what the workers' ring saves.
            "mm_collate, no ring": MMCollate(worker_slots=0),
            "mm_collate": MMCollate(),
        }
        return table
    ours = {
        "vlm": MMCollate(
            fields={
                "input_ids": Pad(mask_key="attention_mask", lengths_key=None),
                "pixel_values": Concat(counts_key=None, item_offsets_key=None),
            }
        ),
        "audio": MMCollate(fields={"audio": Pad(dims=[-1], mask_key=None)}),
        "detection": MMCollate(),
        # The same outputs as the hand-written collate: padded tokens, their lengths, labels.
        "ragged": MMCollate(fields={"tokens": Pad(mask_key=None)}),
    }[scenario]
    by_hand = {"vlm": vlm_by_hand, "audio": audio_by_hand, "detection": detection_by_hand, "ragged": ragged_by_hand}[
        scenario
    ]
    table = {"pad/cat by hand": by_hand}
    if scenario in ("ragged", "vlm") and hf_padding_collator() is not None:
        table["HF DataCollatorWithPadding"] = ragged_hf if scenario == "ragged" else vlm_hf
    table["mm_collate"] = ours
    return table


def _has_tensordict() -> bool:
    try:
        import tensordict  # noqa: F401
    except ImportError:
        return False
    return True


# --- measuring ---------------------------------------------------------------------------


def _time_main(fns: dict[str, Collate], batches: list[list[Any]], rounds: int, progress: Any) -> dict[str, list[float]]:
    """Seconds per batch of each method, one value per round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up: cached plans, allocator caches
        fn(batches[0])
        fn(batches[0])
    for round_ in range(rounds):
        for name, fn in _rotated(fns, round_):
            start = time.perf_counter()
            for batch in batches:
                fn(batch)
            times[name].append((time.perf_counter() - start) / len(batches))
            progress.update(1)
    return times


def _rotated(fns: dict[str, Collate], round_: int) -> list[tuple[str, Collate]]:
    """The methods in this round's order: each one follows every other equally often.

    What ran just before a method (its allocations, what it left in the caches)
    changes that method's time: right after a method 40 times slower, a fast one
    runs its next batches cold. Plain rotation (A B C, B C A, C A B) puts one method
    after a given other in most rounds; adding the reversed rotations (C B A, ...)
    gives every ordered pair the same share over ``2 * len(fns)`` rounds.

    Example:
        >>> [[name for name, _ in _rotated(dict.fromkeys("abc"), r)] for r in range(6)]  # doctest: +NORMALIZE_WHITESPACE
        [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['c', 'b', 'a'], ['b', 'a', 'c'], ['a', 'c', 'b']]
    """
    items = list(fns.items())
    cycle, shift = divmod(round_, len(items))
    if cycle % 2:
        items.reverse()
    return items[shift:] + items[:shift]


def _whole(rounds: int, fns: dict[str, Collate]) -> int:
    """``rounds`` rounded up to whole cycles of :func:`_rotated`'s orders."""
    cycle = 2 * len(fns)
    return -(-rounds // cycle) * cycle


def _time_workers(
    fns: dict[str, Collate],
    dataset: Dataset[Any],
    batch_size: int,
    workers: int,
    rounds: int,
    progress: Any,
    batches: int,
) -> dict[str, list[float]]:
    """Batches per second of a DataLoader over ``batches`` batches (after the first), per method and round.

    Long enough that a worker's start (its first batches, new processes) is not what
    is measured: a training epoch is thousands of batches.
    """
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(rounds):
        for name, fn in _rotated(fns, round_):
            loader = DataLoader(
                _Repeat(dataset, batches * batch_size),
                batch_size=batch_size,
                num_workers=workers,
                collate_fn=fn,
                prefetch_factor=4,
                timeout=120,
            )
            iterator = iter(loader)
            next(iterator)  # workers started and warm
            start = time.perf_counter()
            count = sum(1 for _ in iterator)
            rates[name].append(count / (time.perf_counter() - start))
            del iterator, loader
            progress.update(1)
    return rates


def _padding_bytes(scenario: str, collate: Collate, batches: list[list[Any]]) -> float | None:
    if scenario not in ("vlm", "audio"):
        return None
    key = "input_ids" if scenario == "vlm" else "audio"
    total = 0
    for batch in batches:
        out = collate(batch)
        padded = out[key]
        real = sum(s[key].numel() for s in batch)
        total += (padded.numel() - real) * padded.element_size()
    return total / len(batches)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    accelerator = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerator": accelerator,
        "date": time.strftime("%Y-%m-%d"),
    }


def run(scenarios: list[str], quick: bool, workers: int, progress: bool = True) -> dict[str, Any]:
    """Run the collate benchmark; returns a JSON-ready report."""
    from tqdm.auto import tqdm

    rounds_main, rounds_workers = (11, 3) if quick else (21, 5)
    scenarios = [name for name in SCENARIOS if name in scenarios]
    results: list[dict[str, Any]] = []
    plan = []
    for scenario in scenarios:
        fns = {k: v for k, v in methods(scenario).items() if v is not None}
        plan.append((scenario, fns))
    steps = sum(len(fns) * (_whole(rounds_main, fns) + (rounds_workers if workers else 0)) for _, fns in plan)
    bar = tqdm(total=steps, desc="pincollate.bench", file=sys.stderr, disable=not progress, leave=False)
    for scenario, fns in plan:
        cls, batch_size = SCENARIOS[scenario]
        n_batches = 12 if quick else 32
        if scenario == "video":
            n_batches = 4 if quick else 12
        dataset = InMemory(cls(length=batch_size * n_batches))
        batches = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(n_batches)]
        bar.set_postfix_str(f"{scenario}: main process")
        main_times = _time_main(fns, batches, _whole(rounds_main, fns), bar)
        worker_rates: dict[str, list[float]] = {}
        if workers:
            bar.set_postfix_str(f"{scenario}: {workers} workers")
            worker_rates = _time_workers(fns, dataset, batch_size, workers, rounds_workers, bar, 24 if quick else 96)
        baseline = next(iter(fns))
        padding = _padding_bytes(scenario, fns["mm_collate"], batches)
        for name in fns:
            main_ratios = [b / t for b, t in zip(main_times[baseline], main_times[name], strict=True)]
            row: dict[str, Any] = {
                "scenario": scenario,
                "method": name,
                "baseline": baseline,
                "main_ms": statistics.median(main_times[name]) * 1e3,
                "main_speedup": statistics.median(main_times[baseline]) / statistics.median(main_times[name]),
                # Each round timed every method back to back: its ratio, lowest and highest.
                "main_spread": [min(main_ratios), max(main_ratios)],
            }
            if workers:
                worker_ratios = [r / b for r, b in zip(worker_rates[name], worker_rates[baseline], strict=True)]
                row["workers_batches_per_s"] = statistics.median(worker_rates[name])
                row["workers_speedup"] = row["workers_batches_per_s"] / statistics.median(worker_rates[baseline])
                row["workers_spread"] = [min(worker_ratios), max(worker_ratios)]
            if name == "mm_collate" and padding is not None:
                row["padding_bytes_per_batch"] = padding
            results.append(row)
    bar.close()
    return {
        "machine": machine(),
        "workers": workers,
        "quick": quick,
        "results": results,
        "first_batch": first_batch_cost(quick),
    }


def first_batch_cost(quick: bool, fields: int = 150, batch_size: int = 8) -> dict[str, Any]:
    """The first call of a fresh collate on samples with ``fields`` ragged fields, against later calls.

    The first call plans the structure once (the ragged fields become parts); later
    calls reuse the plan and plan only the parts.
    """
    samples = [{f"r{j}": torch.zeros(i + 1 + j % 3) for j in range(fields)} for i in range(batch_size)]
    firsts, steady = [], []
    for _ in range(3 if quick else 7):
        collate = MMCollate(pin_memory=False)
        start = time.perf_counter()
        collate(samples)
        firsts.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            collate(samples)
            steady.append(time.perf_counter() - start)
    first, later = statistics.median(firsts), statistics.median(steady)
    return {"fields": fields, "first_ms": first * 1e3, "steady_ms": later * 1e3, "ratio": first / later}


# --- where a worker batch's time goes ------------------------------------------------------


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

    from ._arena import allocate
    from ._batch import make_batch

    cls, batch_size = SCENARIOS[scenario]
    n = 6
    dataset = InMemory(cls(length=batch_size * n))
    batches = [[dataset[i * batch_size + j] for j in range(batch_size)] for i in range(n)]
    collate = MMCollate(pin_memory=False)
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
        layout, fill = plan.run(batches[i % n], collate._planner)
        buffer = allocate(layout.nbytes, "shared") if buffer is None else buffer
        return make_batch(layout, buffer, fill.values, fill.execute(buffer))

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
    stages.update(_ring_breakdown(plan, collate, batches, repeat))
    stages["lease: made and ended (once per batch, each side)"] = _lease_ms(reused)
    return {"scenario": scenario, "batch_bytes": plan.nbytes, "stages_ms": stages}


def _lease_ms(buffer: torch.Tensor, count: int = 2000) -> float:
    """What the ownership rule costs a batch: one lease of recycled memory, made and ended."""
    from . import _ownership

    def ended(reusable: bool) -> None:
        pass

    times = []
    for _ in range(count):
        start = time.perf_counter()
        lease = _ownership.grant(buffer.data_ptr(), buffer.numel(), ended, shared=True)
        del lease
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _ring_breakdown(plan: Any, collate: MMCollate, batches: list[list[Any]], repeat: int) -> dict[str, float]:
    """The same trip through a worker's ring of slots: a forked child fills a slot and sends
    its index; this process leases the batch, reads it once and drops it (freeing the slot)."""
    import multiprocessing
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from . import _receiver, _ring
    from ._batch import make_batch

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
            layout, fill = plan.run(batches[i % len(batches)], collate._planner)
            batch = make_batch(layout, buffer, fill.values, fill.execute(buffer))
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


# --- GPU rows ------------------------------------------------------------------------------


def run_gpu(quick: bool) -> dict[str, Any]:
    """Transfer and overlap on the current CUDA device (see ``make gpu-check``)."""
    from ._prefetch import Prefetcher
    from ._transfer import to_device
    from ._trees import tensors

    device = torch.device("cuda")
    report: dict[str, Any] = {}

    def timed(fn: Callable[[], Any], repeat: int) -> float:
        fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / repeat

    big = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    seconds = timed(lambda: big.to(device, non_blocking=True), 10)
    report["peak_pinned_h2d_gb_per_s"] = big.numel() / seconds / 1e9

    dataset = InMemory(SCENARIOS["manyleaf"][0](length=32 * 4))
    samples = [dataset[i] for i in range(32)]
    ours = MMCollate()(samples)
    nbytes = sum(t.numel() * t.element_size() for t in tensors(ours))
    theirs = default_collate(samples)
    theirs = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in theirs.items()}

    def per_leaf() -> Any:
        return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in theirs.items()}

    rows = {}
    for name, fn in (
        ("mm_collate + to_device", lambda: to_device(ours, device)),
        ("per-leaf .to(non_blocking)", per_leaf),
    ):

        def row(fn: Callable[[], Any] = fn) -> dict[str, Any]:
            return {"gb_per_s": nbytes / timed(fn, 50) / 1e9, "memcpys": _count_memcpy(fn)}

        rows[name] = _guarded(row)
    report["manyleaf_transfer"] = rows
    report["manyleaf_batch_bytes"] = nbytes
    report["prefetch_loaders"] = _guarded(lambda: _prefetch_loaders(device, quick, Prefetcher))
    report["overlap"] = _guarded(lambda: _overlap(device, quick, Prefetcher))
    report["pinned_slots"] = _guarded(lambda: _pinned_slots(device, quick))
    report["slot_registration"] = _guarded(_registration_cost)
    report["pinned_trim"] = _guarded(lambda: _trim_cost(device, Prefetcher))
    return report


def _trim_cost(device: torch.device, prefetcher: Any) -> dict[str, Any]:
    """Ragged 1-32 MiB batches through the Prefetcher with a 128 MiB pinned limit: the
    pinned footprint it keeps, and what each trim of the cache costs."""
    from . import _prefetch

    real = getattr(_prefetch, "trim_pinned")  # noqa: B009 (patched for this row, restored after)
    trims: list[tuple[bool, float]] = []

    def timed_trim(limit: int) -> bool:
        start = time.perf_counter()
        done = bool(real(limit))
        trims.append((done, time.perf_counter() - start))
        return done

    sizes = [(1 + (i * 7) % 32) << 18 for i in range(96)]  # float32: 1 to 32 MiB
    data = [{"x": torch.zeros(n)} for n in sizes]
    loader: DataLoader[Any] = DataLoader(data, batch_size=1, collate_fn=MMCollate(), pin_memory=False)  # type: ignore[arg-type]
    setattr(_prefetch, "trim_pinned", timed_trim)  # noqa: B010
    try:
        peak = 0
        for batch in prefetcher(loader, device=device, pinned_limit=128 << 20):
            batch["x"].sum()
            peak = max(peak, pinned_footprint()["reserved"])
        torch.cuda.synchronize()
    finally:
        setattr(_prefetch, "trim_pinned", real)  # noqa: B010
    done = [seconds for trimmed, seconds in trims if trimmed]
    return {
        "batches": len(sizes),
        "trim_checks": len(trims),
        "trims": len(done),
        "trim_ms_median": statistics.median(done) * 1e3 if done else None,
        "peak_reserved_mib": peak / 2**20,
    }


def _registration_cost() -> dict[str, Any]:
    """What registering one worker slot with CUDA costs (``pin_slots``), by slot size.

    It runs once per slot in the thread that unpickles the slot's first batch, and again
    every epoch when workers are not persistent (new workers, new slots).
    """
    from . import _registration

    rows: dict[str, Any] = {}
    for mib in (8, 32, 128):
        storage = torch.UntypedStorage._new_shared(mib << 20)  # type: ignore[no-untyped-call]
        start = time.perf_counter()
        ok = _registration.register(storage)
        seconds = time.perf_counter() - start
        if ok:
            _registration.unregister(storage.data_ptr())
        rows[f"{mib} MiB"] = {"registered": ok, "ms": seconds * 1e3, "gb_per_s": (mib << 20) / seconds / 1e9}
    return rows


def _pinned_slots(device: torch.device, quick: bool) -> dict[str, Any]:
    """Video batches/s from 2 workers to the GPU: slots registered once against a pin copy per batch.

    Both loaders pin (``pin_memory=True``); with ``pin_slots`` the pin thread finds each
    batch page-locked already and copies nothing. Also reports the pinned copies made.
    """
    stored = InMemory(SCENARIOS["video"][0](length=8 * 8))
    dataset = _Repeat(stored, 8 * (32 if quick else 128))

    def rate(pin_slots: bool) -> float:
        loader = DataLoader(
            dataset,
            batch_size=8,
            num_workers=2,
            pin_memory=True,
            collate_fn=MMCollate(pin_slots=pin_slots),
            timeout=120,
        )
        iterator = iter(loader)
        next(iterator)
        start = time.perf_counter()
        count = 0
        for batch in iterator:
            batch.to(device, non_blocking=True)["video"].float().mean()
            count += 1
        torch.cuda.synchronize()
        return count / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"pin copy per batch": [], "pin_slots": []}
    for _ in range(3):
        rates["pin copy per batch"].append(rate(False))
        rates["pin_slots"].append(rate(True))
    medians: dict[str, Any] = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["pin_slots"] / medians["pin copy per batch"]
    return medians


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One GPU row; a failure is recorded in the report instead of ending the run."""
    try:
        return fn()
    except Exception as error:  # reported, not hidden: the row says what failed
        return {"error": f"{type(error).__name__}: {error}"}


class _TimmStylePrefetcher:
    """timm's ``PrefetchLoader`` pattern, from its published behaviour.

    Per-leaf ``non_blocking`` copies of ``(input, target)`` and the normalisation on a
    side stream made per epoch; the consumer's stream waits on the whole side stream.
    """

    def __init__(self, loader: Any, mean: list[float], std: list[float], device: torch.device):
        self.loader = loader
        self.device = device
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255

    def __iter__(self) -> Any:
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        first = True
        current: Any = None
        for images, targets in self.loader:
            with torch.cuda.stream(stream):
                images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
                targets = targets.to(self.device, non_blocking=True)
            if not first:
                yield current
            first = False
            torch.cuda.current_stream().wait_stream(stream)
            current = (images, targets)
        if current is not None:
            yield current


class _Images(Dataset[Any]):
    def __init__(self, n: int):
        self.images = [torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], i % 1000


def _prefetch_loaders(device: torch.device, quick: bool, prefetcher: Any) -> dict[str, Any]:
    """Batches/s of image batches reaching the GPU normalised: timm-style against ours."""
    from ._transforms import Normalize

    dataset = _Images(64 * (4 if quick else 16))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

    def consume(batches: Any) -> float:
        start = time.perf_counter()
        count = 0
        for batch in batches:
            images = batch[0]
            images.sum()
            count += 1
        torch.cuda.synchronize()
        return count / (time.perf_counter() - start)

    def loader(collate: Any) -> DataLoader[Any]:
        return DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True, collate_fn=collate)

    norm = Normalize(mean, std)
    rates: dict[str, list[float]] = {"timm-style + default_collate": [], "Prefetcher + mm_collate": []}
    for _ in range(3):
        rates["timm-style + default_collate"].append(
            consume(_TimmStylePrefetcher(loader(default_collate), mean, std, device))
        )
        rates["Prefetcher + mm_collate"].append(
            consume(prefetcher(loader(MMCollate()), device=device, transform=lambda b: [norm.normalize(b[0]), b[1]]))
        )
    medians = {name: statistics.median(values) for name, values in rates.items()}
    medians["ratio"] = medians["Prefetcher + mm_collate"] / medians["timm-style + default_collate"]
    return medians


def _count_memcpy(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "Memcpy HtoD" in e.name)


def _overlap(device: torch.device, quick: bool, prefetcher: Any) -> dict[str, Any]:
    """Step time with the Prefetcher against max(compute, copy) for a synthetic kernel."""
    batches = 4 if quick else 12
    dataset = InMemory(SCENARIOS["video"][0](length=8 * batches))
    collate = MMCollate()
    host_batches = [collate([dataset[i * 8 + j] for j in range(8)]) for i in range(batches)]
    weight = torch.randn(4096, 4096, device=device)

    def compute(n: int) -> None:
        x = weight
        for _ in range(n):
            x = torch.tanh(x @ weight)

    from ._transfer import to_device

    def avg(fn: Callable[[], Any], repeat: int = 5) -> float:
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeat

    copy_s = avg(lambda: to_device(host_batches[0], device))
    # Compute as long as the copy (equal lengths: full overlap halves the step).
    per_iter = avg(functools.partial(compute, 16)) / 16
    iters = max(1, min(4096, round(copy_s / per_iter)))
    compute_s = avg(functools.partial(compute, iters))
    torch.cuda.synchronize()
    start = time.perf_counter()
    steps = 0
    for batch in prefetcher(host_batches, device=device, depth=2):
        compute(iters)
        batch["flow"].sum()  # the step reads its batch, as training would
        steps += 1
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / steps
    return {
        "compute_ms": compute_s * 1e3,
        "copy_ms": copy_s * 1e3,
        "step_ms": step_s * 1e3,
        "step_over_max": step_s / max(compute_s, copy_s),
    }


# --- output --------------------------------------------------------------------------------


def format_table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}",
        "",
    ]
    kind = "quick run (fewer rounds and batches)" if report.get("quick") else "full run"
    lines += [
        f"{kind}. main ms: milliseconds per collate call in the main process (lower is better).",
        "x base: speed over the scenario's baseline in this run (higher is better; the median round,",
        "lowest-highest round in brackets). Baselines: default_collate; for ragged, vlm, audio and",
        "detection, which it rejects, a hand-written pad_sequence/torch.cat collate with the same outputs.",
    ]
    if report["workers"]:
        lines.append(f"workers b/s: batches per second through a DataLoader with {report['workers']} worker processes.")
    lines.append("")
    header = f"{'scenario':<10} {'method':<26} {'main ms':>9} {'x base (spread)':>20}"
    if report["workers"]:
        header += f" {'workers b/s':>12} {'x base (spread)':>20}"
    header += "  notes"
    lines += [header, "-" * len(header)]
    for row in report["results"]:
        line = f"{row['scenario']:<10} {row['method']:<26} {row['main_ms']:>9.3f} {_ratio(row, 'main'):>20}"
        if report["workers"]:
            line += f" {row['workers_batches_per_s']:>12.1f} {_ratio(row, 'workers'):>20}"
        notes = []
        if row["method"] == row["baseline"]:
            notes.append("baseline")
        if "padding_bytes_per_batch" in row:
            notes.append(f"padding {row['padding_bytes_per_batch'] / 1024:.1f} KiB/batch")
        lines.append(line + ("  " + ", ".join(notes) if notes else ""))
    first = report.get("first_batch")
    if first:
        lines += [
            "",
            f"first batch of {first['fields']} ragged fields: {first['first_ms']:.2f} ms, later batches {first['steady_ms']:.2f} ms "
            f"(first/later = {first['ratio']:.2f}x)",
        ]
    gpu = report.get("gpu")
    if gpu:
        lines += ["", f"peak pinned H2D: {gpu['peak_pinned_h2d_gb_per_s']:.1f} GB/s"]
        for name, row in gpu["manyleaf_transfer"].items():
            text = row.get("error") or f"{row['gb_per_s']:6.1f} GB/s  {row['memcpys']} memcpy"
            lines.append(f"manyleaf transfer, {name:<28} {text}")
        loaders = gpu["prefetch_loaders"]
        lines.append(
            "prefetch loaders (batches/s): "
            + (loaders.get("error") or ", ".join(f"{k} {v:.2f}" for k, v in loaders.items()))
        )
        slots = gpu.get("pinned_slots", {})
        lines.append(
            "video from 2 workers to the GPU (batches/s): "
            + (slots.get("error") or ", ".join(f"{k} {v:.2f}" for k, v in slots.items()))
        )
        o = gpu["overlap"]
        lines.append(
            "overlap: "
            + (
                o.get("error")
                or f"step {o['step_ms']:.2f} ms, compute {o['compute_ms']:.2f} ms, copy {o['copy_ms']:.2f} ms, step/max = {o['step_over_max']:.3f}"
            )
        )
    return "\n".join(lines)


def _ratio(row: dict[str, Any], mode: str) -> str:
    text = f"{row[f'{mode}_speedup']:.2f}x"
    spread = row.get(f"{mode}_spread")
    if spread and row["method"] != row["baseline"]:
        text += f" ({spread[0]:.2f}-{spread[1]:.2f})"
    return text


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["method"] != r["baseline"]]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods_ = list(dict.fromkeys(r["method"] for r in rows))
    modes = [("main_speedup", "main process")] + (
        [("workers_speedup", f"{report['workers']} workers")] if report["workers"] else []
    )
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    width = 0.8 / max(len(methods_), 1)
    for ax, (key, title) in zip(axes[0], modes, strict=True):
        for i, method in enumerate(methods_):
            xs, ys, low, high = [], [], [], []
            for j, scenario in enumerate(scenarios):
                for r in rows:
                    if r["scenario"] == scenario and r["method"] == method:
                        xs.append(j + i * width)
                        ys.append(r[key])
                        spread = r.get(key.replace("speedup", "spread")) or [r[key], r[key]]
                        low.append(max(r[key] - spread[0], 0.0))
                        high.append(max(spread[1] - r[key], 0.0))
            ax.bar(xs, ys, width=width, label=method, yerr=[low, high], capsize=2)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(methods_) - 1) / 2 for j in range(len(scenarios))], scenarios)
        ax.set_ylabel("speed over the scenario's baseline (x, higher is better)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    m = report["machine"]
    kind = "quick run" if report.get("quick") else "full run"
    fig.suptitle(
        f"pincollate.bench ({kind}): {m['cpu']}, {m['cores']} cores, torch {m['torch']}. Bars: median round; "
        "whiskers: lowest and highest round.\nBaseline 1.0: default_collate, or a hand-written "
        "pad_sequence/torch.cat collate for ragged, vlm, audio, detection",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pincollate-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeat to pick several (default: all)"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the workers mode (0 skips it)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batches (under 90 s on 2 cores)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write ratio bars as PNG (matplotlib)")
    parser.add_argument(
        "--gpu", action="store_true", help="require the transfer and overlap rows (added anyway when CUDA is present)"
    )
    parser.add_argument("--no-gpu", action="store_true", help="skip the transfer and overlap rows even with CUDA")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--breakdown", action="store_true", help="only time the stages of a worker batch (video scenario) and exit"
    )
    parser.add_argument(
        "--small-shm",
        nargs="?",
        const="64m",
        metavar="SIZE",
        help="only time the video scenario through workers with ample /dev/shm and with SIZE (default 64m, "
        "Docker's default) side by side, and exit; needs root (unshare -m)",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="only time Ray Data's own batch conversion against ColumnCollate (trainer and data side), and exit",
    )
    args = parser.parse_args(argv)
    if args.ray:
        from ._bench_ray import format_ray, run_ray

        m = machine()
        print(
            f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}"
        )
        report = run_ray(args.quick, not args.no_progress)
        print(format_ray(report))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": m, "ray": report}, f, indent=2)
        return 0
    if args.small_shm:
        from ._bench_shm import format_small_shm, run_small_shm

        report = run_small_shm(args.small_shm, args.workers or 2, 3 if args.quick else 5, not args.no_progress)
        print(format_small_shm(report))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine(), "small_shm": report}, f, indent=2)
        return 0
    if args.breakdown:
        m = machine()
        print(
            f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, accelerator: {m['accelerator']}, {m['date']}"
        )
        print(format_breakdown(worker_breakdown("video", args.quick)))
        return 0
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu needs a CUDA device")
    scenarios = args.scenario or list(SCENARIOS)
    torch.manual_seed(0)
    report = run(scenarios, args.quick, args.workers, progress=not args.no_progress)
    if torch.cuda.is_available() and not args.no_gpu:
        report["gpu"] = run_gpu(args.quick)
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
