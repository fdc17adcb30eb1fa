"""How the careful planner walks containers: mappings, namedtuples, dataclasses, sequences.

:class:`ContainerWalk` is the container part of the careful planner's walk
(:mod:`pincollate._plan.careful`): it checks that every sample holds the same container (keys,
classes, lengths), plans each child column through the walk's ``plan``, and builds
the spec of the container around them. Lists of unequal length become per-sample
item lists (:mod:`pincollate._plan.items`). Every error names its sample and key path.
"""

from __future__ import annotations

import collections.abc as abc
import dataclasses
import operator
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .._errors import EXTRA_NAMES, Attr
from .._types.builtin import describe_tensor
from .._types.kinds import MAPPING, is_sequence, kind_of, registered, union_keys, value_at
from .._types.leaves import type_name
from .fill import Node, Tree
from .items import (
    ItemWalk,
    Origins,
    Path,
    container_name,
    dataclass_of,
    mapping_of,
    namedtuple_of,
    registered_of,
    sequence_of,
)

__all__ = ["ContainerWalk"]


def _same_dicts(values: Sequence[Any], keys: abc.Set[Hashable]) -> bool:
    """Whether every value is a ``dict`` with ``keys`` (as sets: the walk's own test), read at C speed."""
    if set(map(type, values)) != {dict}:
        return False
    return all(map(keys.__eq__, map(dict.keys, values)))


class ContainerWalk(ItemWalk):
    """Mappings, namedtuples, dataclasses and sequences, each checked across the batch."""

    def _mapping(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        first = next(v for v in values if v is not None) if self.missing else values[0]
        keys = list(first.keys())
        first_keys: abc.Set[Hashable] = first.keys()
        if not self.missing and _same_dicts(values, first_keys):
            # Dicts with the same keys (the common batch), checked at C speed; each column read
            # in one pass over the samples.
            if len(keys) < 2:  # itemgetter of one key gives the value, not a tuple of one
                columns: Iterable[Sequence[Any]] = [list(map(operator.itemgetter(key), values)) for key in keys]
            else:
                columns = map(list, zip(*map(operator.itemgetter(*keys), values), strict=True))
            return self._mapping_of(first, keys, columns, path, origins, depth, items)
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if kind_of(value) is not MAPPING:
                raise self._error(
                    f"expected a mapping, got {container_name(value)} ({type_name(value)})", i, path, origins
                )
            if value.keys() != first_keys and not self.missing:
                missing = [k for k in keys if k not in value]
                extra = [k for k in value if k not in first_keys]
                detail = "; ".join(
                    part
                    for part in (f"missing keys {missing}" if missing else "", f"extra keys {extra}" if extra else "")
                    if part
                )
                raise self._error(
                    f"keys differ from sample {self._blame(0, path, origins)[0]}: {detail} (pass missing='none' to allow absent keys)",
                    i,
                    path,
                    origins,
                )
        if self.missing:
            keys = union_keys(values)
            columns = ([None if v is None else value_at(v, key) for v in values] for key in keys)
        else:
            columns = (list(map(operator.itemgetter(key), values)) for key in keys)
        return self._mapping_of(first, keys, columns, path, origins, depth, items)

    def _mapping_of(
        self,
        first: Any,
        keys: list[Hashable],
        columns: Iterable[Sequence[Any]],
        path: Path,
        origins: Origins,
        depth: int,
        items: bool,
    ) -> Node:
        """The mapping's node: each key's ``column`` (one value per sample) planned, with the extras of its policy.

        No output name is given twice: an extra output takes no key's name (the sample's or
        the renamed one) nor another extra's, and ``rename`` gives no two keys one name.
        """
        renamed = self.renames.outputs(path, keys)
        # Each output name taken, with what took it: what an extra output that clashes names.
        taken: dict[Hashable, str] = {name: f"the key {name!r}" for name in (*keys, *renamed)}
        twice = self.renames.twice(keys, renamed)
        if twice is not None:
            raise self._error(f"rename gives the keys {twice[0]} one name, {twice[1]!r}", 0, path, origins)
        out_keys: list[Hashable] = []
        children: list[Node] = []
        for key, out_key, column in zip(keys, renamed, columns, strict=True):
            child, extras = self.plan(column, (*path, key), origins, depth + 1, items, True)
            out_keys.append(out_key)
            children.append(child)
            for name, extra_node in extras.items():
                if name in taken:
                    raise self._error(
                        f"the extra output {name!r} of field {key!r} clashes with {taken[name]}{EXTRA_NAMES}",
                        0,
                        path,
                        origins,
                    )
                taken[name] = f"the extra output {name!r} of field {key!r}"
                out_keys.append(name)
                children.append(extra_node)
        return Tree(mapping_of(first, out_keys), children)

    def _field(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        """A child of a container that has no keys to put a policy's extras beside."""
        return self._no_extras(self.plan(values, path, origins, depth + 1, items), path, origins)

    def _same_type(self, values: Sequence[Any], path: Path, origins: Origins, tuples: bool = False) -> type:
        """The class every value has (absent ones aside, with ``missing="none"``).

        With ``tuples``, any sequence of the same length passes too (a plain tuple or list,
        another namedtuple class, a tensor or array by its rows): ``default_collate`` zips
        them into the first value's class.
        """
        first = next(v for v in values if v is not None) if self.missing else values[0]
        cls = type(first)
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if type(value) is cls:
                continue
            if tuples and _zips(value):
                self._rows_of(value, i, path, origins)
                if len(value) == len(first):
                    continue
            raise self._error(f"expected {cls.__name__}, got {type_name(value)}", i, path, origins)
        return cls

    def _rows_of(self, value: Any, i: int, path: Path, origins: Origins) -> None:
        """Refuse, naming it, a tensor zipped by its rows beside sequences that the walk refuses as a value.

        A nested, quantized, sparse or accelerator tensor: its rows would be read before any
        of the walk's checks (a nested tensor's iteration raises torch's internal error).
        """
        if isinstance(value, torch.Tensor):
            sample, where = self._blame(i, path, origins)
            describe_tensor(value, sample, where)

    def _namedtuple(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        cls = self._same_type(values, path, origins, tuples=True)
        names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        # An absent sample (missing="none") has every field absent.
        rows = [(None,) * len(names) if v is None else v for v in values]
        children = [
            self._field(column, (*path, Attr(name)), origins, depth, items)
            for name, column in zip(names, zip(*rows, strict=True), strict=True)
        ]
        return Tree(namedtuple_of(cls), children)

    def _registered(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        """A class registered with ``register_container``: one key set, each child planned by its key."""
        cls = self._same_type(values, path, origins)
        kind = registered(cls)
        flat: list[tuple[list[Hashable], list[Any]] | None] = []
        for i, value in enumerate(values):
            if value is None and self.missing:
                flat.append(None)
                continue
            try:
                names, children = kind.flatten(value)
            except Exception as exc:
                raise self._error(f"flatten of {cls.__qualname__} failed: {exc!r}", i, path, origins) from exc
            if len(names) != len(children):
                raise self._error(
                    f"flatten of {cls.__qualname__} gave {len(names)} keys for {len(children)} children",
                    i,
                    path,
                    origins,
                )
            unhashable = next((key for key in names if not isinstance(key, Hashable)), None)
            if unhashable is not None:
                raise self._error(
                    f"flatten of {cls.__qualname__} gave a key that is not hashable: {unhashable!r}", i, path, origins
                )
            flat.append((list(names), list(children)))
        keys = next(entry for entry in flat if entry is not None)[0]
        for i, entry in enumerate(flat):
            if entry is not None and entry[0] != keys:
                raise self._error(
                    f"{cls.__qualname__} keys differ from sample {self._blame(0, path, origins)[0]}: "
                    f"{entry[0]} against {keys}",
                    i,
                    path,
                    origins,
                )
        rows = [[None] * len(keys) if entry is None else entry[1] for entry in flat]
        children = [
            self._field(list(column), (*path, key), origins, depth, items)
            for key, column in zip(keys, zip(*rows, strict=True), strict=True)
        ]
        return Tree(registered_of(cls, keys), children)

    def _dataclass(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        cls = self._same_type(values, path, origins)
        names = [f.name for f in dataclasses.fields(cls)]
        children = [
            self._field(
                [None if v is None else getattr(v, name) for v in values], (*path, Attr(name)), origins, depth, items
            )
            for name in names
        ]
        return Tree(dataclass_of(cls, names), children)

    def _sequence(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool = False) -> Node:
        rows = None  # the first tensor or array beside the sequences, which default_collate zips by its rows
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            # A namedtuple beside plain sequences is one more sequence, as default_collate zips it.
            if not is_sequence(value):
                if _has_rows(value):
                    self._rows_of(value, i, path, origins)
                    rows = i if rows is None else rows
                    continue
                raise self._error(
                    f"expected a sequence, got {container_name(value)} ({type_name(value)})", i, path, origins
                )
        first = values[0]
        size = len(first) if first is not None else -1
        if any(value is None or len(value) != size for value in values):
            if rows is not None:  # only a sequence is a sample's list of items
                value = values[rows]
                raise self._error(
                    f"expected a sequence, got {container_name(value)} ({type_name(value)})", rows, path, origins
                )
            # default_collate raises here; per-sample item lists are what such data means.
            return self._items(values, path, origins, depth)
        # zip's tuples, as default_collate: a column of strings comes back as one.
        children = [
            self._field(column, (*path, j), origins, depth, False) for j, column in enumerate(zip(*values, strict=True))
        ]
        return Tree(sequence_of(first), children)


def _has_rows(value: Any) -> bool:
    """A tensor or array of at least one dimension: ``default_collate`` zips it by its rows beside sequences."""
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0


def _zips(value: Any) -> bool:
    """What ``default_collate`` zips beside a namedtuple: any sequence, or a tensor or array by its rows."""
    return is_sequence(value) or _has_rows(value)
