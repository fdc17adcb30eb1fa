"""``python -m pincollate.bench --recipes``: fields planned once against the careful walk, side by side.

A field that does not agree from batch to batch (ragged, or under a policy) is planned
once into a *recipe* where one describes it; where none does, the careful planner walks
its values for every batch. This times, for each kind of such field, a warm collate with
its recipe against one whose plan was made without recipes (so it walks every batch),
and the collate a user writes where there is one, on the same batches, in rotating
rounds: the recipe's speed over the careful walk and over the hand-written collate.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate

from .._collate.collate import MMCollate
from .._plan import template as _template
from .._plan.policies import AsList, Pad, PerSample, Policy
from ._timing import rotated

__all__ = ["format_recipes", "run_recipes"]

Collate = Callable[[list[Any]], Any]


def _image(i: int) -> torch.Tensor:
    return torch.full((3, 64, 64), i % 251, dtype=torch.uint8)


def _dict_target(i: int, rng: random.Random) -> dict[str, Any]:
    n = rng.randint(0, 12)
    target = {"boxes": torch.rand(n, 4), "labels": torch.arange(n), "image_id": i, "area": torch.rand(n)}
    return {"image": _image(i), "target": {**target, "iscrowd": torch.zeros(n, dtype=torch.int64), "file": f"{i}.jpg"}}


def _object_list(i: int, rng: random.Random) -> dict[str, Any]:
    objects = [{"box": torch.rand(4), "label": rng.randint(0, 80), "crowd": False} for _ in range(rng.randint(0, 12))]
    return {"image": _image(i), "target": objects}


def _scores(i: int, rng: random.Random) -> dict[str, Any]:
    return {"x": torch.zeros(16), "score": rng.choice([1, 0.5, 2, 0.25]), "id": i}


def _prompt_images(i: int, rng: random.Random) -> dict[str, Any]:
    size = rng.choice([24, 32])  # a prompt's images share a size, or not
    sizes = [size if rng.random() < 0.7 else 16 for _ in range(rng.randint(1, 4))]
    return {"images": [torch.full((3, s, s), float(i)) for s in sizes], "ids": torch.arange(rng.randint(8, 64))}


def _tokens(i: int, rng: random.Random) -> dict[str, Any]:
    return {"tokens": torch.randint(0, 1000, (rng.randint(16, 512),)), "label": i % 10}


def _by_hand_targets(samples: list[dict[str, Any]]) -> Any:
    return {"image": torch.stack([s["image"] for s in samples]), "target": [s["target"] for s in samples]}


def _by_hand_tokens(samples: list[dict[str, Any]]) -> Any:
    tokens = [s["tokens"] for s in samples]
    return {
        "tokens": pad_sequence(tokens, batch_first=True),
        "tokens_lengths": torch.tensor([len(t) for t in tokens]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


#: Each kind: how a sample is made, the collate's field policies, and the collate a user writes
#: (for detection targets: the images stacked, the targets listed as they are, nothing copied;
#: ``None`` where none gives these outputs).
KINDS: dict[str, tuple[Callable[[int, random.Random], Any], dict[str, Policy], Collate | None]] = {
    "Pad (token ids)": (_tokens, {"tokens": Pad(mask_key=None)}, _by_hand_tokens),
    "PerSample (dict targets)": (_dict_target, {"target": PerSample()}, _by_hand_targets),
    "PerSample (object lists)": (_object_list, {"target": PerSample()}, _by_hand_targets),
    "AsList (images per prompt)": (_prompt_images, {"images": AsList(), "ids": Pad()}, None),
    "ints beside floats": (_scores, {}, default_collate),
}


def _careful(fields: dict[str, Policy], first: list[Any]) -> MMCollate:
    """A collate whose plan, made without recipes, walks its per-batch fields for every batch.

    A new structure's first batch is walked and its plan made by the second: both run here.
    """
    collate = MMCollate(pin_memory=False, fields=fields)
    with mock.patch.object(_template, "part_recipe", lambda *args: None):
        collate(first)
        collate(first)
    plan = collate._plans.last
    parts = [op for _, op, _ in getattr(plan.op, "singles", ())] if plan is not None else []
    assert plan is not None and not any(getattr(op, "recipe", None) for op in parts), "a recipe in the careful plan"
    return collate


def run_recipes(quick: bool = False, batch_size: int = 32) -> dict[str, Any]:
    """Time every kind's recipe, careful walk and hand-written collate; medians (ms) and ratios.

    Examples:
        >>> report = run_recipes(quick=True)
        >>> sorted(report["kinds"]["ints beside floats"])
        ['by_hand_ms', 'careful_ms', 'over_by_hand', 'over_careful', 'recipe_ms']
    """
    rounds, count = (6, 3) if quick else (18, 8)
    kinds: dict[str, Any] = {}
    for name, (make, fields, by_hand) in KINDS.items():
        rng = random.Random(0)
        batches = [[make(i, rng) for i in range(batch_size)] for _ in range(count)]
        methods: dict[str, Collate] = {
            "careful": _careful(fields, batches[0]),
            "recipe": MMCollate(pin_memory=False, fields=fields),
        }
        if by_hand is not None:
            methods["by_hand"] = by_hand
        times: dict[str, list[float]] = {method: [] for method in methods}
        for fn in methods.values():
            for batch in batches:
                fn(batch)
        for round_ in range(rounds):
            for method, fn in rotated(methods, round_):
                start = time.perf_counter()
                for batch in batches:
                    fn(batch)
                times[method].append((time.perf_counter() - start) / count)
        row = {f"{method}_ms": statistics.median(values) * 1e3 for method, values in times.items()}
        row["over_careful"] = statistics.median(c / r for c, r in zip(times["careful"], times["recipe"], strict=True))
        if by_hand is not None:
            row["over_by_hand"] = statistics.median(
                h / r for h, r in zip(times["by_hand"], times["recipe"], strict=True)
            )
        kinds[name] = row
    return {"batch_size": batch_size, "rounds": rounds, "kinds": kinds}


def format_recipes(report: dict[str, Any]) -> str:
    lines = [
        f"fields planned once against the careful walk, main process, batch {report['batch_size']}, "
        f"{report['rounds']} rounds (ms per batch; x: the recipe's speed over each, median of the rounds' ratios):",
        f"  {'field':<30} {'recipe':>8} {'careful':>8} {'x careful':>10} {'by hand':>8} {'x by hand':>10}",
    ]
    for name, row in report["kinds"].items():
        hand = f"{row['by_hand_ms']:8.3f} {row['over_by_hand']:9.2f}x" if "by_hand_ms" in row else f"{'-':>8} {'-':>10}"
        lines.append(
            f"  {name:<30} {row['recipe_ms']:8.3f} {row['careful_ms']:8.3f} {row['over_careful']:9.2f}x {hand}"
        )
    return "\n".join(lines)
