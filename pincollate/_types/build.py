"""Building containers: the classes a collated batch keeps, and instances made without ``__init__``.

As ``default_collate``: a mapping keeps its class where it can be built from a dict,
a sequence where it can be built from a list (tuples become lists), a namedtuple and a
dataclass always. Used by the layout's specs and by :mod:`pincollate._types.kinds` (a tree rebuilt).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = ["container_cls", "make_mapping", "make_sequence", "new_dataclass"]


def container_cls(cls: type, plain: type) -> type | None:
    """``None`` for the plain container type (``dict``, ``list``), else ``cls``.

    Tuples come back as lists, as in ``default_collate``.
    """
    if cls is plain or (plain is list and issubclass(cls, tuple)):
        return None
    return cls


def make_mapping(cls: type | None, pairs: dict[Hashable, Any]) -> Any:
    """A mapping of type ``cls`` (``None``: ``dict``) holding ``pairs``.

    As ``default_collate``: the type is kept where it can be built from a dict or
    built empty and updated; otherwise the result is a ``dict``.
    """
    if cls is None:
        return pairs
    try:
        return cls(pairs)
    except TypeError:
        pass
    try:
        out = cls()
        out.update(pairs)
        return out
    except (TypeError, AttributeError):  # a read-only Mapping has no update
        return pairs


def make_sequence(cls: type | None, items: list[Any]) -> Any:
    """A sequence of type ``cls`` (``None``: ``list``; tuples become lists, as ``default_collate``)."""
    if cls is None:
        return items
    try:
        return cls(items)
    except TypeError:
        return items


def new_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of the dataclass ``cls`` with ``fields`` set, ``__init__`` not run.

    Fields that are not ``init`` fields are set too; a frozen class is no obstacle.
    """
    out: Any = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out
