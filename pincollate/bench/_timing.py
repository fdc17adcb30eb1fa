"""Timing methods side by side: interleaved rounds whose order rotates and reverses.

The benchmark's modes time their methods here: in this process (one collate call per
batch) or through a ``DataLoader``'s workers (batches per second), each method in every
round, in an order that puts every method after every other equally often.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from torch.utils.data import DataLoader, Dataset

from ..datasets import _Repeat

__all__ = ["rotated", "time_main", "time_workers", "whole"]

Collate = Callable[[list[Any]], Any]
V = TypeVar("V")


def time_main(fns: dict[str, Collate], batches: list[list[Any]], rounds: int, progress: Any) -> dict[str, list[float]]:
    """Seconds per batch of each method, one value per round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up: cached plans, allocator caches
        fn(batches[0])
        fn(batches[0])
    for round_ in range(rounds):
        for name, fn in rotated(fns, round_):
            start = time.perf_counter()
            for batch in batches:
                fn(batch)
            times[name].append((time.perf_counter() - start) / len(batches))
            progress.update(1)
    return times


def rotated(fns: dict[str, V], round_: int) -> list[tuple[str, V]]:
    """The methods in this round's order: each one follows every other equally often.

    What ran just before a method (its allocations, what it left in the caches)
    changes that method's time: right after a method 40 times slower, a fast one
    runs its next batches cold. Plain rotation (A B C, B C A, C A B) puts one method
    after a given other in most rounds; adding the reversed rotations (C B A, ...)
    gives every ordered pair the same share over ``2 * len(fns)`` rounds.

    Examples:
        >>> [[name for name, _ in rotated(dict.fromkeys("abc"), r)] for r in range(6)]  # doctest: +NORMALIZE_WHITESPACE
        [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['c', 'b', 'a'], ['b', 'a', 'c'], ['a', 'c', 'b']]
    """
    items = list(fns.items())
    cycle, shift = divmod(round_, len(items))
    if cycle % 2:
        items.reverse()
    return items[shift:] + items[:shift]


def whole(rounds: int, fns: dict[str, Any]) -> int:
    """``rounds`` rounded up to whole cycles of :func:`rotated`'s orders."""
    cycle = 2 * len(fns)
    return -(-rounds // cycle) * cycle


def time_workers(
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
        for name, fn in rotated(fns, round_):
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
