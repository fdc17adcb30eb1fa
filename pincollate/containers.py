"""Rebuilding the user's containers with new contents, the way ``default_collate`` does.

Shared by collation (a batch's containers) and transfer (a moved batch's containers),
so both keep a mapping's or dataclass's type by the same rules.
"""

from __future__ import annotations

import collections.abc as abc
import copy
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

__all__ = ["rebuild_dataclass", "rebuild_mapping"]


def rebuild_mapping(like: Mapping, pairs: dict[Hashable, Any]) -> Any:
    """A mapping of ``like``'s type holding ``pairs``.

    Mutable mappings are copied and updated (they may carry other attributes);
    others are built from ``pairs``; a type that allows neither gives a ``dict``.
    """
    try:
        if isinstance(like, abc.MutableMapping):
            clone = copy.copy(like)
            clone.update(pairs)
            return clone
        return type(like)(pairs)  # type: ignore[call-arg]
    except TypeError:
        return pairs


def rebuild_dataclass(like: Any, fields: Iterable[tuple[str, Any]]) -> Any:
    """A shallow copy of the dataclass instance ``like`` with ``fields`` replaced."""
    clone = copy.copy(like)
    for name, value in fields:
        # object.__setattr__ also works on frozen dataclasses.
        object.__setattr__(clone, name, value)
    return clone
