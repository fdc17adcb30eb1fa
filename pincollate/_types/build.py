"""Building containers: the classes a collated batch keeps, and instances made without ``__init__``.

As ``default_collate``: a mapping keeps its class where it can be built from a dict,
a sequence where it can be built from a list (tuples become lists), a namedtuple and a
dataclass always. Used by the layout's specs and by :mod:`pincollate._types.kinds` (a tree rebuilt).
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Hashable, Mapping
from typing import Any

__all__ = ["container_cls", "make_mapping", "make_sequence", "new_dataclass"]


def container_cls(cls: type, plain: type) -> type | None:
    """``None`` for the plain container type (``dict``, ``list``), else ``cls``.

    Tuples come back as lists, as in ``default_collate``.
    """
    if cls is plain or (plain is list and issubclass(cls, tuple)):
        return None
    return cls


#: Mapping classes whose constructor is a dict's own (read once per class), and those constructors:
#: such a class holds exactly what it is given, so it is built without checking what it holds.
_PLAIN_INIT: dict[type, bool] = {}
_DICT_INITS = frozenset((dict.__init__, collections.OrderedDict.__init__, collections.UserDict.__init__))


def make_mapping(cls: type | None, pairs: dict[Hashable, Any]) -> Any:
    """A mapping of type ``cls`` (``None``: ``dict``) holding ``pairs``.

    As ``default_collate``: the type is kept where it can be built from a dict or
    built empty and updated; otherwise the result is a ``dict``. A build counts only
    where the result holds exactly ``pairs``: a class whose constructor takes the dict
    as some other argument (``__init__(self, tag, **fields)``) would hold none of them.
    Whether it does can depend on the values (a constructor that validates them), so a
    class with a constructor of its own is checked at every build.
    """
    if cls is None:
        return pairs
    plain_init = _PLAIN_INIT.get(cls)
    if plain_init is None:
        plain_init = _PLAIN_INIT[cls] = getattr(cls, "__init__", None) in _DICT_INITS
    if plain_init:
        return cls(pairs)
    try:
        out = cls(pairs)
        if _holds_pairs(out, pairs):
            return out
    except Exception:  # the class's own constructor refused: try it empty, then a dict
        pass
    try:
        out = cls()
        out.update(pairs)
        if _holds_pairs(out, pairs):
            return out
    except Exception:  # no empty constructor; a read-only Mapping has no update
        pass
    return pairs


def make_sequence(cls: type | None, items: list[Any]) -> Any:
    """A sequence of type ``cls`` (``None``: ``list``; tuples become lists, as ``default_collate``).

    The type is kept where ``cls(items)`` holds exactly ``items``, each the item given (a
    class whose constructor takes ``*items``, or other arguments, comes back as a ``list``).
    """
    if cls is None:
        return items
    try:
        out = cls(items)
        if len(out) == len(items) and all(map(operator.is_, out, items)):
            return out
    except Exception:  # the class's own constructor refused: a list
        pass
    return items


def _holds_pairs(out: Any, pairs: dict[Hashable, Any]) -> bool:
    # Its keys counted, not len(): a TensorDict's len() is its batch size.
    return len(out.keys()) == len(pairs) and all(key in out and _same(out[key], value) for key, value in pairs.items())


def _same(got: Any, given: Any) -> bool:
    """Whether a built mapping holds ``given`` where it holds ``got``.

    The value itself, or a container the class converted to its own kind with the same
    keys (an attribute-access dict makes the dicts inside it of its class); never a
    container of other keys (a constructor that put the whole dict under one field).
    """
    if got is given:
        return True
    if isinstance(given, Mapping):
        return isinstance(got, Mapping) and list(got.keys()) == list(given.keys())
    if isinstance(given, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(given)
    return False


def new_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of the dataclass ``cls`` with ``fields`` set, ``__init__`` not run.

    Fields that are not ``init`` fields are set too; a frozen class is no obstacle.
    """
    out: Any = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out
