"""Batch containers that know their buffer and pin or move it in one piece.

DataLoader's pin-memory thread (and its inline pinning with ``num_workers=0``)
calls an object's own ``pin_memory()`` before it walks it as a mapping or a
sequence (torch 2.10 and later). The top-level container of a collated batch is
therefore one of these types, so the pin thread makes one pinned copy per batch
instead of one per tensor:

* a ``dict`` batch is a :class:`Batch` (a ``dict`` subclass),
* a ``list`` batch (tuples come back as lists) is a :class:`BatchList`,
* a namedtuple batch is an instance of a subclass made by :func:`pinnable`.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import torch

from .arena import is_pinned
from .transfer import pin, tensors, to_device

__all__ = ["Batch", "BatchList", "pinnable"]

T = TypeVar("T")


class _Movable:
    """``pin_memory`` and ``to`` for a batch: one copy per storage, views rebuilt."""

    __slots__ = ()

    def pin_memory(self: T, device: Any = None) -> T:
        """Pin the batch: one pinned allocation and one copy; itself when pinned."""
        if all(is_pinned(t) for t in _leaves(self)):
            return self
        return _carry(self, pin(_plain(self)))

    def to(self: T, device: torch.device | str, non_blocking: bool = True) -> T:
        """The batch on ``device``: one copy of the buffer, leaves rebuilt as views."""
        return _carry(self, to_device(_plain(self), device, non_blocking=non_blocking))


class Batch(_Movable, dict):
    """A collated ``dict`` batch whose tensors are all views of :attr:`buffer`.

    Example:
        >>> import torch
        >>> from pincollate import mm_collate
        >>> batch = mm_collate([{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}])
        >>> isinstance(batch, dict), batch.buffer.dtype
        (True, torch.uint8)
    """

    buffer: torch.Tensor | None = None


class BatchList(_Movable, list):
    """A collated ``list`` batch whose tensors are all views of :attr:`buffer`."""

    buffer: torch.Tensor | None = None


def _plain(batch: Any) -> Any:
    if isinstance(batch, Batch):
        return dict(batch)
    if isinstance(batch, BatchList):
        return list(batch)
    if isinstance(batch, tuple):
        return tuple(batch)
    return batch


def _carry(like: Any, moved: Any) -> Any:
    if isinstance(like, (Batch, BatchList)):
        out = type(like)(moved)
        out.buffer = _buffer_of(out)
        return out
    return type(like)(*moved)


def _leaves(batch: Any) -> list[torch.Tensor]:
    return list(tensors(_plain(batch)))


def _buffer_of(batch: Any) -> torch.Tensor | None:
    for t in _leaves(batch):
        storage = t.untyped_storage()
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return None


@functools.cache
def pinnable(cls: type[T]) -> type[T]:
    """A subclass of the namedtuple ``cls`` whose instances pin in one copy.

    Instances pickle as ``cls`` would, rebuilt as the subclass on the other side,
    so they cross process boundaries (DataLoader workers) like the original.
    """
    name = cls.__name__
    namespace = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__qualname__": getattr(cls, "__qualname__", name),
        "__reduce__": lambda self: (_rebuild_pinnable, (cls, tuple(self))),
        "__repr__": lambda self: cls.__repr__(self),
    }
    return type(name, (_Movable, cls), namespace)  # type: ignore[return-value]


def _rebuild_pinnable(cls: type, values: tuple) -> Any:
    return pinnable(cls)(*values)
