"""Building containers: the classes a collated batch keeps, and instances made without ``__init__``.

As ``default_collate``: a mapping keeps its class where it can be built from a dict,
a sequence where it can be built from a list (tuples become lists), a namedtuple and a
dataclass always. Used by the layout's specs and by :mod:`pincollate._types.kinds` (a tree rebuilt).
"""

from __future__ import annotations

import collections
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


#: How each container class was built, by its keys (a mapping's) or length (a sequence's): the
#: first build checks that the class holds exactly what it was given; later ones of the same
#: keys take the way that worked, without the check (a per-batch cost). Bounded.
_WAYS: dict[tuple[type, Any], str] = {}
_WAYS_KEPT = 1024


#: Mapping classes whose constructor is a dict's own (read once per class), and those constructors.
_PLAIN_INIT: dict[type, bool] = {}
_DICT_INITS = frozenset((dict.__init__, collections.OrderedDict.__init__, collections.UserDict.__init__))


def _way(cls: type, fields: Any, found: str, record: bool) -> str:
    if record:
        if len(_WAYS) >= _WAYS_KEPT:
            _WAYS.clear()
        _WAYS[(cls, fields)] = found
    return found


def make_mapping(cls: type | None, pairs: dict[Hashable, Any], record: bool = True) -> Any:
    """A mapping of type ``cls`` (``None``: ``dict``) holding ``pairs``.

    As ``default_collate``: the type is kept where it can be built from a dict or
    built empty and updated; otherwise the result is a ``dict``. A build counts only
    where the result holds exactly ``pairs``: a class whose constructor takes the dict
    as some other argument (``__init__(self, tag, **fields)``) would hold none of them.
    ``record=False``: a trial with stand-in values, which teaches nothing of how the
    class takes a batch's.
    """
    if cls is None:
        return pairs
    plain_init = _PLAIN_INIT.get(cls)
    if plain_init is None:
        plain_init = _PLAIN_INIT[cls] = getattr(cls, "__init__", None) in _DICT_INITS
    if plain_init:  # a dict's (or OrderedDict's, UserDict's) own constructor holds what it is given
        return cls(pairs)
    fields = tuple(pairs)
    way = _WAYS.get((cls, fields))
    try:
        if way == "init":
            return cls(pairs)
        if way == "update":
            out = cls()
            out.update(pairs)
            return out
    except Exception:  # these values refused where others were taken: judged anew
        way = None
    if way == "plain":
        return pairs
    try:
        out = cls(pairs)
        if _holds_pairs(out, pairs):
            _way(cls, fields, "init", record)
            return out
    except Exception:  # the class's own constructor refused: try it empty, then a dict
        pass
    try:
        out = cls()
        out.update(pairs)
        if _holds_pairs(out, pairs):
            _way(cls, fields, "update", record)
            return out
    except Exception:  # no empty constructor; a read-only Mapping has no update
        pass
    _way(cls, fields, "plain", record)
    return pairs


def make_sequence(cls: type | None, items: list[Any], record: bool = True) -> Any:
    """A sequence of type ``cls`` (``None``: ``list``; tuples become lists, as ``default_collate``).

    The type is kept where ``cls(items)`` holds exactly ``items`` (a class whose
    constructor takes ``*items``, or other arguments, comes back as a ``list``).
    """
    if cls is None:
        return items
    way = _WAYS.get((cls, len(items)))
    if way == "plain":
        return items
    try:
        out = cls(items)
        if way == "init" or (len(out) == len(items) and all(map(_same, out, items))):
            if way is None:
                _way(cls, len(items), "init", record)
            return out
    except Exception:  # the class's own constructor refused: a list
        pass
    if way is None:
        _way(cls, len(items), "plain", record)
    return items


def _holds_pairs(out: Any, pairs: dict[Hashable, Any]) -> bool:
    return len(out) == len(pairs) and all(key in out and _same(out[key], value) for key, value in pairs.items())


def _same(got: Any, given: Any) -> bool:
    """Whether a built container holds ``given`` where it holds ``got``.

    The value itself, or a container the class converted to its own kind (an
    attribute-access dict makes the dicts inside it of its class).
    """
    return got is given or isinstance(given, (Mapping, list, tuple))


def new_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of the dataclass ``cls`` with ``fields`` set, ``__init__`` not run.

    Fields that are not ``init`` fields are set too; a frozen class is no obstacle.
    """
    out: Any = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out
