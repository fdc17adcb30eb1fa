"""Moving a batch by its layout: one pinned copy, one copy to a device, one cast.

A batch that still matches its layout moves as its one buffer and is built again
over the copy, by its own type (``_pincollate_make``, set by :mod:`pincollate._batch.batch`); one whose
contents changed moves one copy per storage (:mod:`pincollate._batch.spans`) and comes back as its
type without a layout.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

import torch

from .._memory.arena import copy_to_device, is_pinned, new_pinned
from .._types.build import new_dataclass
from .._types.kinds import is_dataclass
from .check import carried
from .spans import moves_alone, pin_spans, spans_to_device
from .trees import map_tensors

__all__ = ["batch_pin_memory", "batch_to", "contents"]

T = TypeVar("T")


def batch_pin_memory(self: T, device: Any = None) -> T:
    """This batch in pinned memory: one pinned allocation and one copy (itself if pinned)."""
    state = carried(self)
    if state is None:
        return _plain_again(self, pin_spans(contents(self)))  # type: ignore[no-any-return]
    layout, buffer, values = state
    if is_pinned(buffer):
        return self
    pinned = new_pinned(layout.nbytes)
    pinned.copy_(buffer[: layout.nbytes])
    return type(self)._pincollate_make(layout, pinned, values)  # type: ignore[attr-defined,no-any-return]


def batch_to(self: T, *args: Any, **kwargs: Any) -> T:
    """This batch moved or cast as ``Tensor.to`` would move or cast each of its tensors.

    Takes ``Tensor.to``'s arguments (``device``, ``dtype``, ``non_blocking``, ``copy``;
    positional or keyword) with its defaults. A dtype casts the floating-point
    tensors only; integer and bool tensors keep theirs. The buffer moves in one copy.
    """
    # copy is Tensor.to's last positional argument: (dtype | tensor, non_blocking, copy) or
    # (device, dtype, non_blocking, copy); torch's parser of the rest takes no copy.
    at = 2 if args and isinstance(args[0], (torch.dtype, torch.Tensor)) else 3
    if len(args) > at:
        kwargs["copy"] = args[at]
        args = args[:at] + args[at + 1 :]
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if memory_format is not None and memory_format != torch.preserve_format:
        # Views in another memory format are not the layout's contiguous views: move by
        # the layout, then re-lay each tensor of a rank the format applies to.
        moved = batch_to(self, device=device, dtype=dtype, non_blocking=non_blocking, copy=copy)
        return _plain_again(moved, map_tensors(contents(moved), functools.partial(_in_format, memory_format)))  # type: ignore[no-any-return]
    state = carried(self)
    if state is None:
        return _plain_again(self, _move_changed(contents(self), device, dtype, non_blocking, copy))  # type: ignore[no-any-return]
    layout, buffer, values = state
    target = buffer.device if device is None else device
    cast = layout if dtype is None else layout.cast(dtype)
    same = _same_device(buffer.device, target)
    if same and cast is layout and not copy:
        return self
    source = buffer[: layout.nbytes]
    if not same:
        source = copy_to_device(source, target, non_blocking)
    elif cast is layout:
        source = source.clone()
    if cast is not layout:
        out = torch.empty(cast.nbytes, dtype=torch.uint8, device=target)
        with torch.no_grad():
            for old, new in zip(layout.tensors(), cast.tensors(), strict=True):
                new.of(out).copy_(old.of(source), non_blocking=non_blocking)
        source = out
    return type(self)._pincollate_make(cast, source, values)  # type: ignore[attr-defined,no-any-return]


def _move_changed(
    tree: Any, device: torch.device | None, dtype: torch.dtype | None, non_blocking: bool, copy: bool
) -> Any:
    """A changed batch's contents moved and cast: one copy per storage, then the casts.

    Its fields still lie in the batch's buffer and move in one copy of it, a value added
    since in one of its own (a registered slot stays held until copied, as for a whole
    batch). A leaf that did not move is copied only where ``copy`` asks for it.
    """
    leaves: list[torch.Tensor] = []  # kept alive: their ids stay theirs while this runs

    def keep(t: torch.Tensor) -> torch.Tensor:
        leaves.append(t)
        return t

    map_tensors(tree, keep)
    # A leaf that moves by its own to() (moves_alone) did not move where it is still itself.
    unmoved = {id(t) for t in leaves if moves_alone(t)}
    before = {_storage_key(t.values() if t.is_nested else t) for t in leaves if id(t) not in unmoved}
    if device is not None:
        tree = spans_to_device(tree, device, non_blocking)

    def finish(t: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and t.is_floating_point() else None
        if id(t) in unmoved:
            again = copy
        elif moves_alone(t):  # moved by its own to(): a copy already
            again = False
        else:
            again = copy and _storage_key(t.values() if t.is_nested else t) in before
        return t.to(dtype=cast, non_blocking=non_blocking, copy=again)

    return map_tensors(tree, finish)


def _storage_key(t: torch.Tensor) -> tuple[torch.device, int]:
    storage = t.untyped_storage()
    return storage.device, storage.data_ptr()


#: The rank each memory format applies to (others keep theirs, as no tensor of another rank can take it).
_FORMAT_RANK = {torch.channels_last: 4, torch.channels_last_3d: 5}


def _in_format(memory_format: torch.memory_format, t: torch.Tensor) -> torch.Tensor:
    rank = _FORMAT_RANK.get(memory_format)
    if rank is not None and t.dim() != rank:
        return t
    return t.contiguous(memory_format=memory_format)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (b.index is None or a.index == b.index)


def contents(batch: Any) -> Any:
    """The batch as plain containers, for leaf-by-leaf moves."""
    if isinstance(batch, dict):
        return dict(batch)
    if isinstance(batch, list):
        return list(batch)
    if isinstance(batch, tuple):
        return tuple(batch)
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


def _plain_again(like: Any, moved: Any) -> Any:
    """A moved batch of ``like``'s type that carries no layout (its contents changed)."""
    if is_dataclass(like):
        return new_dataclass(type(like), moved)
    if isinstance(like, tuple):
        return type(like)(*moved)
    return type(like)(moved)  # a Batch or a BatchList
