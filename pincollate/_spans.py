"""Moving a tree of tensors that carries no layout, one storage span at a time.

Leaves that view one storage are copied once (only the byte span they use) and
rebuilt on the copy with their own dtype, sizes, strides and offset. A storage much
larger than what its leaves use is copied leaf by leaf instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from ._arena import copy_to_device, is_pinned, pinned_allocator
from ._layout import ALIGN
from ._specs import jagged
from ._trees import map_tensors, nested_parts

__all__ = ["pin_spans", "spans_to_device"]

T = TypeVar("T")

#: Copy a storage's span in one piece unless it is this much larger than what its
#: leaves use (then per-leaf copies move fewer bytes).
SPARSE_SPAN_RATIO = 2.0


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
        leaves = parts.setdefault(id(t), nested_parts(t) if t.is_nested else [t])
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


def pin_spans(tree: T) -> T:
    """Pin every tensor of ``tree``: one pinned allocation and one copy per storage.

    Storages already pinned are left as they are, so pinning twice copies nothing.
    """

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


def spans_to_device(tree: T, device: torch.device, non_blocking: bool) -> T:
    """Copy every tensor of ``tree`` to ``device``, one copy per storage span (see the module)."""
    device = torch.device(device)

    def copy_span(flat: torch.Tensor) -> torch.Tensor:
        return copy_to_device(flat, device, non_blocking)

    def same_device(s: torch.UntypedStorage) -> bool:
        return s.device.type == device.type and (device.index is None or s.device.index == device.index)

    return _move(tree, copy_span, device, copy_span, same_device)
