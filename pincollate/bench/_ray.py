"""``python -m pincollate.bench --ray``: Ray Data's own batch conversion against pincollate's, on a local cluster.

For the manyleaf, ragged and vlm scenarios, one Ray dataset of the scenario's samples is
iterated with Ray's ``iter_torch_batches`` three ways, in alternating rounds of one run:

* Ray's own conversion (manyleaf: its default, which takes every numeric column; ragged and
  vlm: Ray cannot convert ragged columns, so a hand-written ``NumpyBatchCollateFn`` pads
  (``pad_sequence``) and concatenates (``torch.cat``) them, what a user writes today);
* ``ColumnCollate`` on the trainer side (``collate.iter_torch_batches(dataset)``: Ray's
  iterator with the collate in its threads, each batch a ``pincollate.Batch``);
* ``ColumnCollate`` on the data side (``map_batches(collate.pack)``, then one packed row
  per batch unpacked on the trainer side). The packed dataset is materialized before the
  rounds, as a data cluster would have collated ahead of the trainer: what is timed is the
  trainer's share of the work, one copy of each batch's bytes.

The ragged row is token ids of 16 to 512 per sample, padded with their lengths, as the
main benchmark's ragged scenario: the same outputs from both collates. Ray hands the hand
collate a numpy batch (one array per ragged row), and ``ColumnCollate`` its Arrow table,
read from Arrow's buffers. The dataset is in blocks of about 512 rows, as files give them.

Reported: batches per second (higher is better) and each method's ratio to Ray's own.
Both the dataset's reads and the iteration run in this process's local cluster; the
string column of manyleaf is dropped for every method, since Ray's default refuses it.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from .._integrations.columns import ColumnCollate
from .._plan.packing import Concat
from .._plan.policies import Pad
from ..datasets import SCENARIOS, InMemory
from ._busy import busy_reasons, format_busy, load_average

__all__ = ["SCENARIOS_RAY", "format_ray", "run_ray"]

#: The scenarios iterated through Ray Data.
SCENARIOS_RAY = ("manyleaf", "ragged", "vlm")


def _rows(scenario: str, count: int) -> list[dict[str, Any]]:
    cls, _ = SCENARIOS[scenario]
    dataset = InMemory(cls(length=count))
    rows = []
    for i in range(count):
        sample = dataset[i]
        row = {}
        for key, value in sample.items():
            if isinstance(value, str):
                continue  # Ray's default conversion refuses strings
            if isinstance(value, list):
                value = np.concatenate([v.float().numpy() for v in value])  # a VLM's patches, one ragged array
            row[key] = value.numpy() if isinstance(value, torch.Tensor) else value
        rows.append(row)
    return rows


def _by_hand_ragged() -> Any:
    from ray.data.collate_fn import NumpyBatchCollateFn

    class ByHand(NumpyBatchCollateFn):  # type: ignore[misc,unused-ignore]
        """What a Ray user writes for ragged token ids: pad them, with their lengths."""

        def __call__(self, batch: dict[str, np.ndarray]) -> Any:
            # np.array copies each read-only row: torch.from_numpy would warn about it.
            tokens = [torch.from_numpy(np.array(v)) for v in batch["tokens"]]
            return {
                "tokens": pad_sequence(tokens, batch_first=True),
                "tokens_lengths": torch.tensor([len(t) for t in tokens]),
                "label": torch.from_numpy(np.array(batch["label"])),
            }

    return ByHand()


def _by_hand_vlm() -> Any:
    from ray.data.collate_fn import NumpyBatchCollateFn

    class ByHand(NumpyBatchCollateFn):  # type: ignore[misc,unused-ignore]
        """What a Ray user writes for ragged columns: pad the ids, concatenate the patches."""

        def __call__(self, batch: dict[str, np.ndarray]) -> Any:
            ids = [torch.from_numpy(np.array(v)) for v in batch["input_ids"]]
            patches = [torch.from_numpy(np.array(v)) for v in batch["pixel_values"]]
            lengths = torch.tensor([len(t) for t in ids])
            return {
                "input_ids": pad_sequence(ids, batch_first=True),
                "attention_mask": torch.arange(int(lengths.max()))[None, :] < lengths[:, None],
                "pixel_values": torch.cat(patches),
                "pixel_values_offsets": torch.tensor([0, *np.cumsum([len(p) for p in patches])], dtype=torch.int32),
            }

    return ByHand()


def _collate(scenario: str) -> ColumnCollate:
    if scenario == "ragged":
        return ColumnCollate(fields={"tokens": Pad(mask_key=None)})
    if scenario == "vlm":
        return ColumnCollate(
            fields={
                "input_ids": Pad(mask_key="attention_mask", lengths_key=None),
                "pixel_values": Concat(counts_key=None, item_offsets_key=None),
            }
        )
    return ColumnCollate()


def _methods(scenario: str, dataset: Any, packed: Any, collate: ColumnCollate, batch_size: int) -> dict[str, Any]:
    """Each method as a function giving a fresh iterator over the scenario's batches."""
    own = {"vlm": _by_hand_vlm, "ragged": _by_hand_ragged}.get(scenario, lambda: None)()
    return {
        "Ray's own conversion": lambda: dataset.iter_torch_batches(batch_size=batch_size, device="cpu", collate_fn=own),
        "ColumnCollate, trainer side": lambda: collate.iter_torch_batches(dataset, batch_size=batch_size),
        # Collated by map_batches before the rounds (materialized): what is timed is the trainer's share.
        "ColumnCollate, data side": lambda: collate.iter_torch_batches(packed, batch_size=1, unpack=True),
    }


def run_ray(
    quick: bool,
    progress: bool = True,
    scenarios: tuple[str, ...] = SCENARIOS_RAY,
    batches: int | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """Batches per second of each method, per scenario, on a local cluster (started and stopped here if none runs).

    ``batches`` (a pass's) and ``rounds`` override the ``quick`` or full settings.
    """
    import ray
    from tqdm.auto import tqdm

    load = load_average()  # before the cluster and the rounds add to it
    rounds = rounds or (2 if quick else 9)
    batches = batches or (8 if quick else 192)
    started = not ray.is_initialized()  # a cluster already running (a test's) is used as it is
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: dict[str, Any] = {}
    rounds_of: list[tuple[str, list[float]]] = []  # each method's rounds, for busy_reasons
    try:
        bar = tqdm(total=len(scenarios) * 3 * rounds, desc="pincollate.bench --ray", disable=not progress, leave=False)
        for scenario in scenarios:
            _, batch_size = SCENARIOS[scenario]
            # Blocks of hundreds of rows, as files give them: from_items' default makes blocks of a
            # few rows, whose slicing and joining then dominate every method's time alike.
            rows = _rows(scenario, batch_size * batches)
            dataset = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // 512)).materialize()
            collate = _collate(scenario)
            packed = dataset.map_batches(collate.pack, batch_size=batch_size).materialize()
            methods = _methods(scenario, dataset, packed, collate, batch_size)
            rates: dict[str, list[float]] = {name: [] for name in methods}
            for round_ in range(rounds):
                order = list(methods) if round_ % 2 == 0 else list(methods)[::-1]
                for name in order:
                    start = time.perf_counter()
                    count = sum(1 for _ in methods[name]())
                    rates[name].append(count / (time.perf_counter() - start))
                    bar.update(1)
            base = rates["Ray's own conversion"]
            rounds_of.extend(
                (f"{scenario} {name}", [v / b for v, b in zip(values, base, strict=True)])
                for name, values in rates.items()
                if name != "Ray's own conversion"
            )
            results[scenario] = {
                name: {
                    "batches_per_s": statistics.median(values),
                    "ratio": statistics.median(values) / statistics.median(base),
                    "spread": [
                        min(v / b for v, b in zip(values, base, strict=True)),
                        max(v / b for v, b in zip(values, base, strict=True)),
                    ],
                }
                for name, values in rates.items()
            }
        bar.close()
    finally:
        if started:
            ray.shutdown()
    busy = busy_reasons(load, os.cpu_count(), rounds_of)
    return {"rounds": rounds, "batches": batches, "results": results, "load_before": load, "busy": busy}


def format_ray(report: dict[str, Any]) -> str:
    warning = format_busy(report.get("busy", []))
    lines = [warning] if warning else []
    lines += [
        f"Ray Data on a local 2-CPU cluster: batches per second through iter_torch_batches ({report['batches']} batches,",
        f"{report['rounds']} alternating rounds, medians; x Ray: ratio to Ray's own conversion, higher is better)",
        "",
        f"{'scenario':<10} {'method':<30} {'batches/s':>10} {'x Ray (spread)':>20}",
    ]
    lines.append("-" * len(lines[-1]))
    for scenario, rows in report["results"].items():
        for name, row in rows.items():
            ratio = f"{row['ratio']:.2f}x ({row['spread'][0]:.2f}-{row['spread'][1]:.2f})"
            lines.append(f"{scenario:<10} {name:<30} {row['batches_per_s']:>10.1f} {ratio:>20}")
    return "\n".join(lines)
