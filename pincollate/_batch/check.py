"""Whether a batch still matches its layout: the one walk that decides how it moves.

A batch carries ``(layout, buffer, values)``. Before it is pinned, moved, pickled or
saved in one piece, :func:`carried` walks it beside its layout once: a batch whose
contents were changed (a key added, a tensor replaced or viewed otherwise) moves leaf
by leaf instead, correctly, and carries no layout.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import torch

from .._types.build import make_mapping, make_sequence
from .._types.kinds import MAPPING, is_sequence, kind_of, registered
from .._types.wrap import Wrap
from .layout import Layout, Part, PartSpec, Spec, TensorSpec, ValueSpec
from .list_specs import GroupsSpec, ItemsSpec, RowsSpec, SplitSpec
from .specs import (
    DataclassSpec,
    JaggedSpec,
    ListSpec,
    MappingSpec,
    RegisteredSpec,
    SequenceSpec,
    jagged,
)

__all__ = ["Carried", "carried", "is_batch", "state_of"]

Carried = tuple[Layout, torch.Tensor, list[Any]]

#: What an exhausted iterator of keys gives: no key is of its class.
_END = object()


def state_of(obj: Any) -> Carried | None:
    """``(layout, buffer, values)`` as ``obj`` was made with them; ``None`` where it is no batch.

    Read only where ``obj``'s class is a batch class (every one defines the attribute): any
    other object's ``__getattr__`` is never asked, so an attribute dict (whose
    ``__getattr__`` is ``dict.__getitem__``, raising ``KeyError``) is simply not a batch.

    Example:
        >>> class AttrDict(dict):
        ...     __getattr__ = dict.__getitem__
        >>> state_of(AttrDict(x=1)) is None
        True
    """
    return obj._pincollate if hasattr(type(obj), "_pincollate") else None


def is_batch(obj: Any) -> bool:
    """Whether ``obj`` was made as a batch with a layout (:func:`carried` says if it still matches it)."""
    return state_of(obj) is not None


def carried(batch: Any) -> Carried | None:
    """``(layout, buffer, values)`` of a batch whose contents still match its layout."""
    state = state_of(batch)
    if state is None:
        return None
    layout, buffer, values = state
    views = _Check(buffer, values, layout.parts)
    # The tensors' own dtypes, shapes and flags, read without a subclass's __torch_function__
    # (a tv_tensor's requires_grad through it costs 2 us): what the layout placed.
    with torch._C.DisableTorchFunctionSubclass():
        return state if views.matches(layout.root, batch, top=True) else None


class _Check:
    """Walks a layout beside a batch: is every tensor still the view the layout says?

    What makes two batches the same values is compared: the address in the buffer,
    dtype, shape and strides, the conjugate and negative bits, no grad and no attribute of
    the user's on a tensor, and the exact class of every tensor and container (a tuple put
    where a list was, or a tensor subclass view, would otherwise come back as the layout's
    type after pickling or moving).
    The batch's own class (``top``) is its carrier class, not the layout's.

    By address: on the CPU each tensor has a storage of its own over its bytes of the
    buffer, and a tensor whose storage moved away (``share_memory_``) no longer reads
    the buffer, which its address then says. A tensor with no elements matches any
    address.
    """

    def __init__(self, buffer: torch.Tensor, values: list[Any], parts: tuple[Part, ...]):
        self.base = buffer.data_ptr()
        self.values = values
        self.parts = parts

    def matches(self, spec: Spec, obj: Any, top: bool = False) -> bool:
        kind = type(spec)
        if kind is TensorSpec:
            wrap = spec.wrap  # type: ignore[attr-defined]
            return (
                (type(obj) is torch.Tensor if wrap is None else wrap.fits(obj))
                and (obj.data_ptr() == self.base + spec.offset or not obj.numel())  # type: ignore[attr-defined]
                and obj.dtype == spec.dtype  # type: ignore[attr-defined]
                and obj.shape == spec.shape  # type: ignore[attr-defined]
                and obj.stride() == spec._strides  # type: ignore[attr-defined]
                and not obj.is_conj()
                and not obj.is_neg()
                and not obj.requires_grad
                and (not obj.__dict__ or _own_attributes(obj, wrap))
            )
        if kind is ValueSpec:
            return _same_value(obj, self.values[spec.index])  # type: ignore[attr-defined]
        if kind is PartSpec:
            return self.matches(self.parts[spec.index].node, obj, top)  # type: ignore[attr-defined]
        if kind is JaggedSpec:
            return (
                isinstance(obj, torch.Tensor)
                and obj.is_nested
                # Lengths shorten each row over the same values: not the layout's field any more.
                and obj.lengths() is None  # type: ignore[attr-defined]
                and not obj.requires_grad
                and obj.__dict__.keys() <= _jagged_own()
                and self.matches(spec.values, obj.values())  # type: ignore[attr-defined]
                and self.matches(spec.offsets, obj.offsets())  # type: ignore[attr-defined]
            )
        if kind is SplitSpec:
            return type(obj) is list and self._split(spec, obj)  # type: ignore[arg-type]
        if kind is RowsSpec:
            return self._rows(spec, obj)  # type: ignore[arg-type]
        if kind is GroupsSpec:
            return self._groups(spec, obj)  # type: ignore[arg-type]
        if kind is ItemsSpec:
            return self._items(spec, obj)  # type: ignore[arg-type]
        if not top and not _built_as(spec, type(obj)):
            return False
        if kind is MappingSpec:
            return self._mapping(spec, obj)  # type: ignore[arg-type]
        if kind is RegisteredSpec:
            return self._registered(spec, obj)  # type: ignore[arg-type]
        if isinstance(spec, DataclassSpec):
            return all(
                self.matches(child, getattr(obj, name, None))
                for name, child in zip(spec.names, spec.children, strict=True)
            )
        children = spec.children  # type: ignore[attr-defined]
        return is_sequence(obj) and len(obj) == len(children) and all(map(self.matches, children, obj))

    def _rows(self, spec: RowsSpec, obj: Any) -> bool:
        own = spec.cls or dict
        if type(obj) is not list or any(
            (type(row) is not own and type(row) is not _built_class(spec.cls, spec.keys)) or tuple(row) != spec.keys  # type: ignore[arg-type]
            for row in obj
        ):
            return False
        return all(
            self._column(column, [row[key] for row in obj]) for key, column in zip(spec.keys, spec.columns, strict=True)
        )

    def _groups(self, spec: GroupsSpec, obj: Any) -> bool:
        if type(obj) is not list or len(obj) != len(spec.counts):
            return False
        if any(type(group) is not list or len(group) != count for group, count in zip(obj, spec.counts, strict=True)):
            return False
        items = [item for group in obj for item in group]
        return not items if spec.items is None else self._column(spec.items, items)

    def _column(self, spec: Spec, values: list[Any]) -> bool:
        """A column of a ``PerSample()`` subtree (:mod:`pincollate._plan.rows`): ``values``, one per sample or item."""
        kind = type(spec)
        if kind is ValueSpec:
            kept = self.values[spec.index]  # type: ignore[attr-defined]
            return len(values) == len(kept) and all(map(_same_value, values, kept))
        if kind is SplitSpec:
            return self._split(spec, values)  # type: ignore[arg-type]
        if kind is RowsSpec:
            return self._rows(spec, values)  # type: ignore[arg-type]
        return kind is GroupsSpec and self._groups(spec, values)  # type: ignore[arg-type]

    def _items(self, spec: ItemsSpec, obj: Any) -> bool:
        if type(obj) is not list or len(obj) != len(spec.groups):
            return False
        units: list[Any] = []
        for count, value in zip(spec.groups, obj, strict=True):
            if count < 0:
                units.append(value)
            elif type(value) is list and len(value) == count:
                units += value
            else:
                return False
        return self._split(spec.units, units)

    def _split(self, spec: SplitSpec, obj: Any) -> bool:
        if not is_sequence(obj) or len(obj) != len(spec.sizes) // 2 + len(spec.absent):
            return False
        if spec.absent:
            if any(obj[i] is not None for i in spec.absent):
                return False
            gone = set(spec.absent)
            obj = [value for i, value in enumerate(obj) if i not in gone]
        dtype = spec.region.dtype
        wraps: list[Wrap | None] = [None] * len(obj) if spec.wraps is None else list(spec.wraps)
        for tensor, wrap, offset, shape in zip(obj, wraps, *spec.places(), strict=True):
            if not (
                (type(tensor) is torch.Tensor if wrap is None else wrap.fits(tensor))
                and (tensor.data_ptr() == self.base + offset or not tensor.numel())
                and tensor.dtype == dtype
                and tensor.shape == shape
                and tensor.is_contiguous()
                and not tensor.is_conj()
                and not tensor.is_neg()
                and not tensor.requires_grad
                and (not tensor.__dict__ or _own_attributes(tensor, wrap))
            ):
                return False
        return True

    def _registered(self, spec: RegisteredSpec, obj: Any) -> bool:
        keys, children = registered(spec.cls).flatten(obj)
        return (
            tuple(keys) == spec.keys
            and len(children) == len(spec.children)
            and all(map(self.matches, spec.children, children))
        )

    def _mapping(self, spec: MappingSpec, obj: Any) -> bool:
        if kind_of(obj) is not MAPPING:
            return False
        # The keys in the layout's order too: a key popped and set again puts it last, and the
        # batch then pickles and moves in its own order, leaf by leaf.
        keys = iter(obj)
        for key, child in zip(spec.keys, spec.children, strict=True):
            if not _same_key(next(keys, _END), key):
                return False
            if type(child) is PartSpec:
                part = self.parts[child.index]
                if not self.matches(part.node, obj[key]):
                    return False
                for name, extra in part.extras:
                    if not _same_key(next(keys, _END), name) or not self.matches(extra, obj[name]):
                        return False
            elif not self.matches(child, obj[key]):
                return False
        return next(keys, _END) is _END


def _own_attributes(tensor: torch.Tensor, wrap: Wrap | None) -> bool:
    """Whether the attributes ``tensor`` holds are its wrap's metadata (a box's format and canvas size).

    Any other (``t.source = ...``, set by the user) is not the layout's to rebuild: the batch then
    pickles and moves leaf by leaf, which keeps it, as it keeps ``requires_grad``.
    """
    return wrap is not None and tensor.__dict__.keys() <= wrap.names


@functools.cache
def _jagged_own() -> frozenset[str]:
    """The attributes a nested tensor holds as :func:`~pincollate._batch.specs.jagged` makes it (this torch's):
    any other is the user's."""
    made = jagged(torch.zeros(2, device="cpu"), torch.tensor([0, 1, 2], device="cpu"), 1, 1)
    return frozenset(made.__dict__)


def _same_key(key: Any, expected: Any) -> bool:
    """``key`` is the layout's ``expected`` key: equal and of its class (``True`` put where ``1`` was is not)."""
    return type(key) is type(expected) and key == expected


def _same_value(obj: Any, value: Any) -> bool:
    """A non-tensor output still the one the batch was made with: the object, or an equal one.

    Equal counts: ``DataLoader(batch_size=None)`` rebuilds lists of strings as it converts.
    """
    if obj is value:
        return True
    if type(obj) is not type(value):
        return False
    try:
        return bool(obj == value)
    except Exception:  # values whose == is elementwise (arrays) or refuses
        return False


def _built_as(spec: Spec, cls: type) -> bool:
    """Whether a container of class ``cls`` is what ``spec`` builds."""
    kind = type(spec)
    # The class itself, or what it falls back to where it cannot be built (the probe's stand-in
    # values may be refused by a class that took the batch's own).
    if kind is MappingSpec:
        return cls is (spec.cls or dict) or cls is _built_class(spec.cls, spec.keys)  # type: ignore[attr-defined]
    if kind is SequenceSpec:
        return cls is (spec.cls or list) or cls is _built_class(spec.cls, len(spec.children))  # type: ignore[attr-defined]
    if kind is ListSpec:
        return cls is list
    return cls is spec.cls  # type: ignore[attr-defined]


_PROBE = object()


@functools.lru_cache(maxsize=256)
def _built_class(cls: type | None, fields: tuple[Hashable, ...] | int) -> type:
    """The class a batch's container of ``cls`` is built as: ``cls``, or ``dict``/``list`` where it cannot be.

    ``fields``: a mapping's keys, or a sequence's length. Built as the batch's is, with
    stand-in values: whether a class holds exactly what it is given can depend on the keys
    (a constructor of keyword fields).
    """
    if isinstance(fields, int):
        return type(make_sequence(cls, [_PROBE] * fields))
    return type(make_mapping(cls, dict.fromkeys(fields, _PROBE)))
