"""Walking the user's trees of tensors: rebuild them with a function, or list their tensors.

Used by every stage that handles a tree it did not build (moving another collate's
output, a batch whose contents changed, what a transform returned).
"""

from __future__ import annotations

import collections.abc as abc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from .._types.kinds import kind_of

__all__ = ["map_tensors", "nested_parts", "reachable_tensors", "tensors"]

T = TypeVar("T")


def map_tensors(tree: T, fn: Callable[[torch.Tensor], Any]) -> T:
    """Rebuild ``tree`` with ``fn`` applied to every tensor; other leaves pass through.

    Containers keep their types, as the DataLoader's own pinning does: mappings,
    namedtuples, sequences and dataclasses.
    """
    if isinstance(tree, torch.Tensor):
        return fn(tree)  # type: ignore[no-any-return]
    kind = kind_of(tree)
    if kind is None:
        return tree
    keys, children = kind.flatten(tree)
    return kind.rebuild(tree, keys, [map_tensors(child, fn) for child in children])  # type: ignore[no-any-return]


def tensors(tree: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf of ``tree`` (the components of nested tensors included)."""
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.extend(nested_parts(t) if t.is_nested else [t])
        return t

    map_tensors(tree, collect)
    return iter(found)


_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), type)


def reachable_tensors(obj: Any, limit: int = 100) -> Iterator[torch.Tensor]:
    """Every tensor ``obj`` reaches: through mappings, sequences, sets, dataclasses and the
    attributes (``__dict__``, ``__slots__``) of any other object; each object once.

    What a transform may return is not only containers: a model-input object holding
    its tensors as attributes needs its memory protected as much as a dict does.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            yield from nested_parts(item) if item.is_nested else (item,)
            continue
        if isinstance(item, _ATOMS) or id(item) in seen or depth > limit or callable(item):
            continue
        seen.add(id(item))
        if isinstance(item, abc.Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple, set, frozenset, abc.Sequence)):
            children = item
        else:
            children = list(getattr(item, "__dict__", {}).values())
            for cls in type(item).__mro__:
                slots = getattr(cls, "__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if not name.startswith("__") and hasattr(item, name):
                        children.append(getattr(item, name))
        stack.extend((child, depth + 1) for child in children)


def nested_parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a nested one lies in: a jagged one's values and offsets, a strided one's values."""
    if t.layout is not torch.jagged:
        return [t.values()]
    return [t.values(), t.offsets()]  # type: ignore[attr-defined]
