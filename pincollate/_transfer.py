"""Moving any batch: pin it, copy it to a device, one storage span at a time.

A pincollate batch moves itself (one copy of its buffer, views rebuilt from its
layout). Any other tree (another collate's output, a batch whose contents were
changed) is moved here: its tensor leaves are grouped by the storage they view,
each storage is copied once (only the byte span its leaves use) and every leaf is
rebuilt on the copy with its own dtype, sizes, strides and offset.
"""

from __future__ import annotations

import collections.abc as abc
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ._arena import copy_to_device, is_pinned, pinned_allocator
from ._batch import batch_pin_memory, batch_to, carried
from ._layout import ALIGN
from ._specs import jagged, make_mapping, new_dataclass

__all__ = ["map_tensors", "pin", "reachable_tensors", "tensors", "to_device"]

T = TypeVar("T")

#: Copy a storage's span in one piece unless it is this much larger than what its
#: leaves use (then per-leaf copies move fewer bytes).
SPARSE_SPAN_RATIO = 2.0


def map_tensors(tree: T, fn: Callable[[torch.Tensor], Any]) -> T:
    """Rebuild ``tree`` with ``fn`` applied to every tensor; other leaves pass through.

    Containers keep their types, as the DataLoader's own pinning does: mappings,
    namedtuples, sequences and dataclasses.
    """
    if isinstance(tree, torch.Tensor):
        return fn(tree)  # type: ignore[no-any-return]
    if isinstance(tree, (str, bytes)) or tree is None:
        return tree
    if isinstance(tree, abc.Mapping):
        pairs = {k: map_tensors(v, fn) for k, v in tree.items()}
        return pairs if type(tree) is dict else make_mapping(type(tree), pairs)  # type: ignore[return-value]
    if isinstance(tree, tuple):
        if hasattr(tree, "_fields"):
            return type(tree)(*(map_tensors(v, fn) for v in tree))
        return type(tree)(map_tensors(v, fn) for v in tree)
    if isinstance(tree, list):
        clone = copy.copy(tree)
        for i, v in enumerate(tree):
            clone[i] = map_tensors(v, fn)
        return clone
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: map_tensors(getattr(tree, f.name), fn) for f in dataclasses.fields(tree)}
        return new_dataclass(type(tree), fields)  # type: ignore[no-any-return]
    return tree


def tensors(tree: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf of ``tree`` (the components of nested tensors included)."""
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        found.extend(_nested_parts(t) if t.is_nested else [t])
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
            yield from _nested_parts(item) if item.is_nested else (item,)
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


def _nested_parts(t: torch.Tensor) -> list[torch.Tensor]:
    return [t.values(), t.offsets()]  # type: ignore[attr-defined]


def _span(leaves: list[torch.Tensor]) -> tuple[int, int, int]:
    """(start, end, used) in bytes of the part of the storage the leaves view."""
    start: int | None = None
    end = used = 0
    for t in leaves:
        size = t.dtype.itemsize
        lo = int(t.storage_offset()) * size
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n > 0) if t.numel() else 0
        hi = lo + extent * size
        start = lo if start is None else min(start, lo)
        end = max(end, hi)
        used += t.numel() * size
    start = 0 if start is None else start // ALIGN * ALIGN
    return start, end, used


def _rebuild(t: torch.Tensor, storage: torch.UntypedStorage, base: int, device: torch.device) -> torch.Tensor:
    offset = t.storage_offset() * t.dtype.itemsize - base
    out = torch.empty(0, dtype=t.dtype, device=device)
    out.set_(storage, offset // t.dtype.itemsize, t.size(), t.stride())
    if type(t) is not torch.Tensor:
        out = _rewrap(out, t)
    return out


def _rewrap(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    wrap = getattr(type(like), "wrap", None)
    if wrap is not None:
        try:
            return wrap(out, like)  # type: ignore[no-any-return]
        except TypeError:
            pass
    return out.as_subclass(type(like))


def _move(
    tree: T,
    copy_span: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
    per_leaf: Callable[[torch.Tensor], torch.Tensor],
    keep: Callable[[torch.UntypedStorage], bool],
) -> T:
    parts: dict[int, list[torch.Tensor]] = {}
    groups: dict[int, list[torch.Tensor]] = {}

    def collect(t: torch.Tensor) -> torch.Tensor:
        leaves = parts.setdefault(id(t), _nested_parts(t) if t.is_nested else [t])
        for leaf in leaves:
            storage = leaf.untyped_storage()
            # By storage, not address: two storages can start at one address (numpy views).
            groups.setdefault(storage._cdata, []).append(leaf)
        return t

    map_tensors(tree, collect)
    moved: dict[int, torch.Tensor] = {}
    for leaves in groups.values():
        storage = leaves[0].untyped_storage()
        if keep(storage):
            moved.update((id(t), t) for t in leaves)
            continue
        start, end, used = _span(leaves)
        if end - start > SPARSE_SPAN_RATIO * used + ALIGN:
            moved.update((id(t), per_leaf(t)) for t in leaves)
            continue
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, start, (end - start,), (1,))
        target = copy_span(flat).untyped_storage()
        moved.update((id(t), _rebuild(t, target, start, device)) for t in leaves)

    def swap(t: torch.Tensor) -> torch.Tensor:
        leaves = parts[id(t)]
        if t.is_nested:
            # The sequence lengths the original carries, read without a device sync.
            lengths = (getattr(t, "_maybe_min_seqlen", None), getattr(t, "_maybe_max_seqlen", None))
            return jagged(moved[id(leaves[0])], moved[id(leaves[1])], *lengths)
        return moved[id(t)]

    return map_tensors(tree, swap)


def pin(tree: T) -> T:
    """Pin every tensor of ``tree``: one pinned allocation and one copy per storage.

    Storages already pinned are left as they are, so pinning twice copies nothing.
    A pincollate batch pins itself: one pinned copy of its buffer.
    """
    if carried(tree) is not None:
        return batch_pin_memory(tree)

    def copy_span(flat: torch.Tensor) -> torch.Tensor:
        out = pinned_allocator()(flat.numel())
        out.copy_(flat)
        return out

    cpu = torch.device("cpu")

    def keep(storage: torch.UntypedStorage) -> bool:
        return storage.device.type != "cpu" or is_pinned(torch.empty(0, dtype=torch.uint8).set_(storage))

    def per_leaf(t: torch.Tensor) -> torch.Tensor:
        out = pinned_allocator()(t.numel() * t.dtype.itemsize).view(t.dtype).view(t.shape)
        return out.copy_(t)

    return _move(tree, copy_span, cpu, per_leaf, keep)


def to_device(tree: T, device: torch.device | str, non_blocking: bool = True) -> T:
    """Copy every tensor of ``tree`` to ``device``, one copy per storage span.

    A pincollate batch moves in one copy of its buffer, rebuilt from its layout.
    Leaves of any other tree that view one storage move in one copy and are rebuilt
    on the device with their sizes, strides and offsets. A
    storage much larger than what its leaves use is copied leaf by leaf instead.
    Non-tensor leaves pass through.

    Args:
        tree: any nested batch (mappings, sequences, namedtuples, dataclasses).
        device: the target device.
        non_blocking: asynchronous copies; honoured only from pinned memory on
            MPS, where a non-blocking copy from pageable memory is unsafe.

    Example:
        >>> import torch
        >>> from pincollate import mm_collate, to_device
        >>> batch = mm_collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])
        >>> to_device(batch, "cpu")["x"].tolist()
        [[1.0, 1.0], [0.0, 0.0]]
    """
    device = torch.device(device)
    if carried(tree) is not None:
        return batch_to(tree, device, non_blocking=non_blocking)

    def copy_span(flat: torch.Tensor) -> torch.Tensor:
        return copy_to_device(flat, device, non_blocking)

    def same_device(s: torch.UntypedStorage) -> bool:
        return s.device.type == device.type and (device.index is None or s.device.index == device.index)

    return _move(tree, copy_span, device, copy_span, same_device)
