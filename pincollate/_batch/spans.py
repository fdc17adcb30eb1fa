"""Moving a tree of tensors that carries no layout, one storage span at a time.

Leaves that view one storage are copied once (only the byte span they use) and
rebuilt on the copy with their own dtype, sizes, strides and offset. A storage much
larger than what its leaves use is copied leaf by leaf instead. A batch's fields on
the CPU each have a storage of their own inside the batch's buffer; they count as
views of that buffer (a plain dict of a batch's fields moves in one copy too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from .._memory.arena import copy_to_device, is_pinned, new_pinned
from .._memory.ownership import holder
from .._types.wrap import rewrap
from .specs import jagged
from .trees import map_tensors, nested_parts
from .views import ALIGN

__all__ = ["moves_alone", "pin_spans", "spans_to_device"]

T = TypeVar("T")

#: Copy a storage's span in one piece unless it is this much larger than what its
#: leaves use (then per-leaf copies move fewer bytes).
SPARSE_SPAN_RATIO = 2.0


def _home(leaf: torch.Tensor) -> tuple[torch.UntypedStorage, int]:
    """The storage whose span to copy for ``leaf``, and the leaf's byte offset in it.

    A batch's field (or a view of one) is placed in the batch's buffer, where its bytes
    still lie there (a storage moved by ``share_memory_`` lies elsewhere).
    """
    storage = leaf.untyped_storage()
    source = holder(storage)
    if source is not None:
        buffer = source.base.untyped_storage()
        at = leaf.data_ptr() - buffer.data_ptr()
        if at >= 0 and at + _extent(leaf) <= buffer.nbytes():
            return buffer, at
    return storage, int(leaf.storage_offset()) * leaf.dtype.itemsize


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to just past its last."""
    if not t.numel():
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n > 0)) * t.dtype.itemsize


def _span(leaves: list[tuple[torch.Tensor, int]]) -> tuple[int, int, int]:
    """(start, end, used) in bytes of the part of the storage the leaves, at their offsets, view."""
    start: int | None = None
    end = used = 0
    for t, lo in leaves:
        start = lo if start is None else min(start, lo)
        end = max(end, lo + _extent(t))
        used += t.numel() * t.dtype.itemsize
    start = 0 if start is None else start // ALIGN * ALIGN
    return start, end, used


def _rebuild(t: torch.Tensor, at: int, storage: torch.UntypedStorage) -> torch.Tensor:
    """``t`` again, over ``storage`` at byte ``at``."""
    out = torch.empty(0, dtype=t.dtype, device=storage.device)
    out.set_(storage, at // t.dtype.itemsize, t.size(), t.stride())
    return rewrap(out, t)


def moves_alone(t: torch.Tensor) -> bool:
    """Whether ``t`` moves by its own ``to()`` (or ``pin_memory()``), not as a span of its storage.

    A tensor with no storage to copy a span of (sparse) or no parts to rebuild it from (a
    strided nested tensor); one whose bytes are not its values as read (a conjugate or
    negative view, a quantized tensor), which a span rebuilt as plain bytes would change;
    and one that requires grad: its own move is part of its graph, as ``Tensor.to`` is.
    """
    if t.requires_grad or t.is_conj() or t.is_neg() or t.is_quantized:
        return True
    return t.layout is not torch.jagged if t.is_nested else t.layout is not torch.strided


def _move(
    tree: T,
    copy_span: Callable[[torch.Tensor], torch.Tensor],
    per_leaf: Callable[[torch.Tensor], torch.Tensor],
    keep: Callable[[torch.UntypedStorage], bool],
    alone: Callable[[torch.Tensor], torch.Tensor],
) -> T:
    parts: dict[int, list[torch.Tensor]] = {}
    groups: dict[int, tuple[torch.UntypedStorage, list[tuple[torch.Tensor, int]]]] = {}
    moved: dict[int, torch.Tensor] = {}

    def collect(t: torch.Tensor) -> torch.Tensor:
        if moves_alone(t):
            moved[id(t)] = alone(t)
            return t
        leaves = parts.setdefault(id(t), nested_parts(t) if t.is_nested else [t])
        for leaf in leaves:
            storage, at = _home(leaf)
            # By storage, not address: two storages can start at one address (numpy views).
            groups.setdefault(storage._cdata, (storage, []))[1].append((leaf, at))
        return t

    map_tensors(tree, collect)
    for storage, leaves in groups.values():
        if keep(storage):
            moved.update((id(t), t) for t, _ in leaves)
            continue
        start, end, used = _span(leaves)
        if end - start > SPARSE_SPAN_RATIO * used + ALIGN:
            moved.update((id(t), per_leaf(t)) for t, _ in leaves)
            continue
        flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, start, (end - start,), (1,))
        target = copy_span(flat).untyped_storage()
        moved.update((id(t), _rebuild(t, at - start, target)) for t, at in leaves)

    def swap(t: torch.Tensor) -> torch.Tensor:
        found = moved.get(id(t))  # a leaf moved by its span, or alone
        if found is not None:
            return found
        # A jagged tensor, rebuilt over its moved parts with the sequence lengths the original
        # carries (read without a device sync).
        values, offsets = parts[id(t)]
        lengths = (getattr(t, "_maybe_min_seqlen", None), getattr(t, "_maybe_max_seqlen", None))
        return jagged(moved[id(values)], moved[id(offsets)], *lengths)

    return map_tensors(tree, swap)


def pin_spans(tree: T) -> T:
    """Pin every tensor of ``tree``: one pinned allocation and one copy per storage.

    Storages already pinned are left as they are, so pinning twice copies nothing.
    """

    def copy_span(flat: torch.Tensor) -> torch.Tensor:
        out = new_pinned(flat.numel())
        out.copy_(flat)
        return out

    def keep(storage: torch.UntypedStorage) -> bool:
        return storage.device.type != "cpu" or is_pinned(torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage))

    def per_leaf(t: torch.Tensor) -> torch.Tensor:
        out = new_pinned(t.numel() * t.dtype.itemsize).view(t.dtype).view(t.shape)
        return out.copy_(t)

    def alone(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or t.is_pinned():
            return t
        if t.layout is torch.strided and not t.is_nested and not t.is_quantized:
            return per_leaf(t)  # copy_ keeps a graph (and reads a conjugate view as its values)
        return t.pin_memory()

    return _move(tree, copy_span, per_leaf, keep, alone)


def spans_to_device(tree: T, device: torch.device, non_blocking: bool) -> T:
    """Copy every tensor of ``tree`` to ``device``, one copy per storage span (see the module)."""
    device = torch.device(device)

    def copy_span(flat: torch.Tensor) -> torch.Tensor:
        return copy_to_device(flat, device, non_blocking)

    def same_device(s: torch.UntypedStorage) -> bool:
        return s.device.type == device.type and (device.index is None or s.device.index == device.index)

    def alone(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    return _move(tree, copy_span, copy_span, same_device, alone)
