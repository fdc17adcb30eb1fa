"""The careful planner: one field's values across the batch, validated value by value.

It plans what a cached plan cannot take at C speed (ragged tensors, lists of unequal
length, mixed dtypes, policies, absent keys) and gives every error its sample index
and key path. Its result is a planned node (:mod:`._fill`) plus the extra outputs
(lengths, masks, offsets) a policy asks for beside the field: ``plan`` returns both,
and a parent mapping places the extras beside the field's key.

The walk mirrors ``default_collate``: mappings by key, namedtuples and sequences by
position (transposed), leaves by type through the registry in :mod:`._leaves`. Where
``default_collate`` gives up it does not: tensors of unequal shape and lists of
unequal length come back as per-sample lists, each stacked where its parts agree.
"""

from __future__ import annotations

import collections.abc as abc
import dataclasses
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._errors import Attr, CollateError, format_path
from ._fill import Node, Segment, Slot, Tree, Value
from ._layout import Spec
from ._leaves import LeafHandler, lookup, torch_dtype, type_name
from ._ops import fits_int64
from ._patterns import ITEMS, Renames, Settings
from ._policies import AsList, Column, PerSample, Policy, Stack, stack_or_list
from ._specs import (
    DataclassSpec,
    ListSpec,
    MappingSpec,
    NamedTupleSpec,
    SequenceSpec,
    is_namedtuple,
    is_sequence,
)

if TYPE_CHECKING:
    from ._patterns import FieldRules

__all__ = ["MAX_DEPTH", "Planner", "container_cls", "number_dtype"]

Path = tuple[Hashable, ...]
Origins = list[tuple[int, Path]] | None
Extras = dict[str, Node]

#: Deeper than this is taken for a self-referencing sample.
MAX_DEPTH = 100


def _container_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if is_namedtuple(value):
        return "namedtuple"
    if is_sequence(value):
        return "sequence"
    return type_name(value)


def is_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def container_cls(cls: type, plain: type) -> type | None:
    """``None`` for the plain container type (``dict``, ``list``), else ``cls``.

    Tuples come back as lists, as in ``default_collate``.
    """
    if cls is plain or (plain is list and issubclass(cls, tuple)):
        return None
    return cls


def number_dtype(values: Sequence[Any]) -> torch.dtype:
    """The dtype ``default_collate`` gives a column of numbers: one rule, used everywhere.

    A column that starts with a Python float (or a subclass) is ``float64``; one that
    starts with an int or bool, or a numpy scalar, takes the dtype torch infers for the
    whole column, as ``torch.tensor`` / ``torch.as_tensor`` do there.
    """
    first = next(v for v in values if v is not None)
    present = [v for v in values if v is not None]
    if isinstance(first, float):
        return torch.complex128 if any(isinstance(v, complex) for v in present) else torch.float64
    if isinstance(first, complex):
        return torch.complex128
    if isinstance(first, int):
        return torch.tensor(present).dtype
    if isinstance(first, np.generic) and len({type(v) for v in present}) == 1:
        # One numpy scalar type (uint64 too, which torch.as_tensor of scalars refuses): its dtype.
        found = torch_dtype(first.dtype)
        if found is not None:
            return found
    return torch.as_tensor(present).dtype


def _dataclass_maker(cls: type, names: list[str]) -> Callable[[list[Spec]], Spec]:
    return lambda children: DataclassSpec(cls, names, children)


class Planner:
    """Plans one field's column carefully. One per :class:`~pincollate.MMCollate`."""

    def __init__(self, settings: Settings):
        self.rules: FieldRules = settings.rules
        self.renames: Renames = settings.renames
        self.default: Policy | None = settings.default
        self.missing: bool = settings.missing
        self.items: bool = settings.items

    def plan(self, values: Sequence[Any], path: Path) -> tuple[Node, Extras]:
        """Plan the column ``values`` (one per sample) found at ``path``."""
        return _Walk(self).plan(values, path, None, len(path), self.items)


class _Walk:
    """One column's walk; knows the containers open on the current path (cycles)."""

    def __init__(self, planner: Planner):
        self.rules = planner.rules
        self.renames = planner.renames
        self.default = planner.default
        self.missing = planner.missing
        self._open: dict[int, Path] = {}

    # errors ----------------------------------------------------------------------

    @staticmethod
    def _blame(i: int, path: Path, origins: Origins) -> tuple[int, Path]:
        if origins is None:
            return i, path
        sample, base = origins[i]
        return sample, base + path[len(base) :] if len(path) >= len(base) else base

    def _error(self, message: str, i: int | None, path: Path, origins: Origins) -> CollateError:
        if i is None:
            return CollateError(message, path=path)
        sample, where = self._blame(i, path, origins)
        return CollateError(message, sample=sample, path=where)

    def _no_extras(self, planned: tuple[Node, Extras], path: Path, origins: Origins) -> Node:
        node, extras = planned
        if extras:
            raise self._error(
                f"the policy for this field returns {sorted(extras)}, which need a parent mapping; set their *_key arguments to None",
                0,
                path,
                origins,
            )
        return node

    # dispatch --------------------------------------------------------------------

    def plan(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> tuple[Node, Extras]:
        if depth > MAX_DEPTH:
            raise self._error(
                f"nesting deeper than {MAX_DEPTH} levels: is the sample self-referencing?", 0, path, origins
            )
        policy = self.rules.lookup(path) if self.rules else None
        first = next((v for v in values if v is not None), None) if self.missing else values[0]
        handler = lookup(type(first))
        if handler is not None and (handler.is_tensor or (first is None and self.missing)):
            return self._leaves(values, path, origins, handler, policy)
        if policy is not None and policy.numbers_as_sequence and _number_lists(values):
            # Token ids as Python lists (datasets, tokenizers, webdataset's json): each
            # sample's list is one 1-D sequence, of the dtype torch.tensor gives the lot.
            sequences = self._number_sequences(values, path, origins)
            return self._leaves(sequences, path, origins, lookup(torch.Tensor), policy)  # type: ignore[arg-type]
        if isinstance(policy, PerSample) and (handler is None or not handler.is_tensor):
            # A whole subtree per sample, whatever it holds: lists of per-item dicts too.
            return self._per_sample(values, path, origins, depth), {}
        if policy is not None and is_sequence(first) and not is_namedtuple(first):
            if policy.takes_items:
                return self._items_policy(values, path, origins, policy)
            return self._sequence_policy(values, path, origins, depth, policy), {}
        if handler is not None:
            if isinstance(policy, AsList):
                return Value(list(values)), {}  # always a per-sample list
            if policy is not None:
                raise self._error(
                    f"{type(policy).__name__}() applies to tensors and lists of items, not to {handler.name} values",
                    None,
                    path,
                    origins,
                )
            return self._objects(values, path, origins, handler), {}
        container = self._container(first, items)
        if container is None:
            i = next(i for i, v in enumerate(values) if v is first)
            raise self._error(
                f"unsupported type {type_name(first)}: expected a tensor, numpy array, number, str, bytes, None, "
                "PIL image, mapping, sequence, namedtuple or dataclass",
                i,
                path,
                origins,
            )
        if isinstance(policy, PerSample):
            return self._per_sample(values, path, origins, depth), {}
        if policy is not None:
            raise self._error(
                f"{type(policy).__name__}() applies to tensors and lists of items, not to a {_container_name(first)}",
                None,
                path,
                origins,
            )
        seen = self._open.get(id(first))
        if seen is not None:
            raise self._error(
                f"the sample refers to itself: this object is also at {format_path(seen)}", 0, path, origins
            )
        self._open[id(first)] = path
        try:
            return container(values, path, origins, depth, items), {}
        finally:
            del self._open[id(first)]

    def _container(self, first: Any, items: bool) -> Callable[..., Node] | None:
        if isinstance(first, Mapping):
            return self._mapping
        if is_namedtuple(first):
            return self._namedtuple
        if is_dataclass(first):
            return self._dataclass
        if is_sequence(first):
            return self._items if items else self._sequence
        return None

    # leaves ----------------------------------------------------------------------

    def _column(self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler) -> Column:
        family = handler.family
        dtypes: list[torch.dtype | None] = []
        shapes: list[tuple[int, ...] | None] = []
        metas: list[Hashable] | None = [] if handler.meta is not None else None
        first_type = None
        for i, value in enumerate(values):
            if value is None and self.missing:
                dtypes.append(None)
                shapes.append(None)
                if metas is not None:
                    metas.append(None)
                continue
            h = lookup(type(value))
            if h is None or h.family != family:
                expected = handler.name if family != "number" else "a number"
                raise self._error(f"expected {expected}, got {type_name(value)}", i, path, origins)
            if first_type is None:
                first_type = type(value)
                handler = h
            sample, where = self._blame(i, path, origins)
            dtype, shape = h.describe(value, sample, where)  # type: ignore[misc]
            dtypes.append(dtype)
            shapes.append(shape)
            if metas is not None:
                metas.append(h.meta(value) if h.meta is not None else None)
        column = Column(values, path, handler, dtypes, shapes, metas, origins)
        if family == "number":
            try:
                column.dtype = number_dtype(values)
            except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
                failed: Exception | None = exc
            else:
                failed = None
            if failed is not None or not (column.dtype.is_floating_point or column.dtype.is_complex):
                # An int beyond int64 is refused where the column is integer, as torch does;
                # in a float column it is a float, as default_collate makes it.
                for i, value in enumerate(values):
                    if isinstance(value, int) and not fits_int64(value):
                        raise self._error(f"int {value} does not fit int64", i, path, origins)
            if failed is not None:
                raise self._error(f"these numbers do not fit one tensor: {failed}", None, path, origins) from failed
        return column

    def _leaves(
        self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler, policy: Policy | None
    ) -> tuple[Node, Extras]:
        if not handler.is_tensor:
            # Every value is None (missing="none"): a packing policy gives its empty result.
            if policy is not None and policy.takes_items:
                return policy.plan(Column.empty(len(values), path), self.renames.key(path))
            return Value([None] * len(values)), {}
        if policy is None and _mixed_families(values):
            return self._as_default_collate(values, path, origins), {}
        column = self._column(values, path, origins, handler)
        if policy is None and handler.family != "number" and any(column.known.values()):
            # ragged= is for fields that can be ragged: numbers and 0-d values just stack.
            policy = self.default
        if policy is None:
            return stack_or_list(column), {}
        return policy.plan(column, self.renames.key(path))

    def _number_sequences(self, values: Sequence[Any], path: Path, origins: Origins) -> list[Any]:
        numbers = [x for v in values if v is not None for x in v]
        try:
            dtype = torch.tensor(numbers).dtype if numbers else torch.int64
            return [None if v is None else torch.tensor(list(v), dtype=dtype) for v in values]
        except (OverflowError, RuntimeError, TypeError) as exc:
            raise self._error(f"these numbers do not fit one tensor: {exc}", None, path, origins) from exc

    def _as_default_collate(self, values: Sequence[Any], path: Path, origins: Origins) -> Node:
        """A column that mixes tensors, arrays and numbers: what ``default_collate`` makes of it.

        Its promotion rules for such columns (``torch.as_tensor`` of arrays, ``torch.tensor``
        of numbers and 0-d tensors) are kept exactly by asking it, then copying its result
        into the batch's buffer: one extra copy, for these columns only.
        """
        from torch.utils.data import default_collate

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its own performance hint for lists of arrays
                value = default_collate(list(values))
        except (RuntimeError, TypeError, ValueError):
            # It gives up where a tensor comes first: each value as a tensor, then stacked.
            try:
                value = torch.stack([torch.as_tensor(v) for v in values])
            except (RuntimeError, TypeError, ValueError) as exc:
                raise self._error(f"these values do not stack together: {exc}", None, path, origins) from exc
        shape = tuple(value.shape)
        return Slot(value.dtype, shape, [Segment(0, shape, _copy_into, value)])

    def _objects(self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler) -> Node:
        if handler.family in ("str", "bytes"):
            # default_collate returns a column that starts with a string as it is.
            return Value(values)
        for i, value in enumerate(values):
            h = lookup(type(value))
            if h is not handler and not (value is None and self.missing):
                raise self._error(f"expected {handler.name}, got {type_name(value)}", i, path, origins)
        # default_collate returns the batch's own list of strings.
        return Value(values)

    # containers ------------------------------------------------------------------

    def _mapping(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        first = next(v for v in values if v is not None) if self.missing else values[0]
        keys = list(first.keys())
        first_keys: abc.Set[Hashable] = first.keys()
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if not isinstance(value, Mapping):
                raise self._error(
                    f"expected a mapping, got {_container_name(value)} ({type_name(value)})", i, path, origins
                )
            if value.keys() != first_keys:
                missing = [k for k in keys if k not in value]
                extra = [k for k in value if k not in first_keys]
                if self.missing:
                    keys.extend(extra)
                    first_keys = set(keys)
                    continue
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
        out_keys: list[Hashable] = []
        children: list[Node] = []
        for key in keys:
            column = [None if v is None else v.get(key) for v in values] if self.missing else [v[key] for v in values]
            child, extras = self.plan(column, (*path, key), origins, depth + 1, items)
            out_keys.append(self.renames.key((*path, key)))
            children.append(child)
            for name, extra_node in extras.items():
                if name in keys or name in out_keys:
                    raise self._error(
                        f"the extra output {name!r} of field {key!r} clashes with an existing key", 0, path, origins
                    )
                out_keys.append(name)
                children.append(extra_node)
        cls = container_cls(type(first), dict)
        return Tree(lambda specs: MappingSpec(cls, out_keys, specs), children)

    def _field(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        """A child of a container that has no keys to put a policy's extras beside."""
        return self._no_extras(self.plan(values, path, origins, depth + 1, items), path, origins)

    def _same_type(self, values: Sequence[Any], path: Path, origins: Origins, tuples: bool = False) -> type:
        """The class every value has (absent ones aside, with ``missing="none"``).

        With ``tuples``, any tuple of the same length passes too (a plain one, another
        namedtuple class): ``default_collate`` zips them into the first value's class.
        """
        first = next(v for v in values if v is not None) if self.missing else values[0]
        cls = type(first)
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if type(value) is cls or (tuples and isinstance(value, tuple) and len(value) == len(first)):
                continue
            raise self._error(f"expected {cls.__name__}, got {type_name(value)}", i, path, origins)
        return cls

    def _namedtuple(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        cls = self._same_type(values, path, origins, tuples=True)
        names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        # An absent sample (missing="none") has every field absent.
        rows = [(None,) * len(names) if v is None else v for v in values]
        children = [
            self._field(column, (*path, Attr(name)), origins, depth, items)
            for name, column in zip(names, zip(*rows, strict=True), strict=True)
        ]
        return Tree(lambda specs: NamedTupleSpec(cls, specs), children)

    def _dataclass(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        cls = self._same_type(values, path, origins)
        names = [f.name for f in dataclasses.fields(cls)]
        children = [
            self._field(
                [None if v is None else getattr(v, name) for v in values], (*path, Attr(name)), origins, depth, items
            )
            for name in names
        ]
        return Tree(_dataclass_maker(cls, names), children)

    def _sequence(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool = False) -> Node:
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            # A namedtuple beside plain sequences is one more sequence, as default_collate zips it.
            if not is_sequence(value):
                raise self._error(
                    f"expected a sequence, got {_container_name(value)} ({type_name(value)})", i, path, origins
                )
        first = values[0]
        size = len(first) if first is not None else -1
        if any(value is None or len(value) != size for value in values):
            # default_collate raises here; per-sample item lists are what such data means.
            return self._items(values, path, origins, depth)
        # zip's tuples, as default_collate: a column of strings comes back as one.
        children = [
            self._field(column, (*path, j), origins, depth, False) for j, column in enumerate(zip(*values, strict=True))
        ]
        cls = container_cls(type(first), list)
        return Tree(lambda specs: SequenceSpec(cls, specs), children)

    # item semantics ----------------------------------------------------------------

    def _items(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool = True) -> Node:
        """Each value's list holds its own items: stack where they agree, else a list."""
        return _merge(self._item_nodes(values, path, origins, depth))

    def _per_sample(self, values: Sequence[Any], path: Path, origins: Origins, depth: int) -> Node:
        """``PerSample()``: one subtree per sample, nothing stacked across samples."""
        return Tree(
            ListSpec,
            [self._single(value, path, [self._blame(i, path, origins)], depth) for i, value in enumerate(values)],
        )

    def _single(self, value: Any, path: Path, origin: Origins, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self._error(
                f"nesting deeper than {MAX_DEPTH} levels: is the sample self-referencing?", 0, path, origin
            )
        if isinstance(value, Mapping):
            keys = list(value)
            children = [self._single(value[k], (*path, k), origin, depth + 1) for k in keys]
            cls = container_cls(type(value), dict)
            return Tree(lambda specs: MappingSpec(cls, keys, specs), children)
        if is_namedtuple(value) or (is_sequence(value) and not isinstance(value, (str, bytes))):
            names = [Attr(n) for n in value._fields] if is_namedtuple(value) else list(range(len(value)))
            children = [self._single(v, (*path, n), origin, depth + 1) for n, v in zip(names, value, strict=True)]
            if is_namedtuple(value):
                nt = type(value)
                return Tree(lambda specs: NamedTupleSpec(nt, specs), children)
            return Tree(ListSpec, children)
        handler = lookup(type(value))
        if handler is None or not handler.is_tensor:
            if handler is None and not is_dataclass(value):
                raise self._error(f"unsupported type {type_name(value)}", 0, path, origin)
            return Value(value)
        # One value: a column of one, its leading 1 dropped.
        return _unstack(stack_or_list(self._column([value], path, origin, handler)))  # type: ignore[arg-type]

    def _sequence_policy(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, policy: Policy) -> Node:
        """``AsList`` or ``Stack`` on a field whose values are lists of items."""
        children = self._item_nodes(values, path, origins, depth)
        if isinstance(policy, AsList):
            return Tree(ListSpec, children)
        if isinstance(policy, Stack):
            merged = _merge(children)
            if not isinstance(merged, Slot):
                shapes = [tuple(c.shape) if isinstance(c, Slot) else type(c).__name__ for c in children]
                raise self._error(
                    f"Stack() needs every sample's items to stack to one shape, got {shapes}", None, path, origins
                )
            return merged
        raise self._error(
            f"{type(policy).__name__}() takes tensors; for lists of items use Concat() or Jagged()", None, path, origins
        )

    def _item_nodes(self, values: Sequence[Any], path: Path, origins: Origins, depth: int) -> list[Node]:
        children: list[Node] = []
        for i, value in enumerate(values):
            if value is None and self.missing:
                children.append(Value(None))
                continue
            if is_sequence(value) and not is_namedtuple(value):
                sample, where = self._blame(i, path, origins)
                if not value:
                    children.append(Tree(ListSpec, []))
                    continue
                item_origins = [(sample, (*where, j)) for j in range(len(value))]
                child = self._no_extras(
                    self.plan(list(value), (*where, ITEMS), item_origins, depth + 1, True), path, origins
                )
            else:
                child = self._no_extras(
                    self.plan([value], path, [self._blame(i, path, origins)], depth + 1, True), path, origins
                )
                if isinstance(child, Tree) and child.make is ListSpec and len(child.children) == 1:
                    child = child.children[0]
                elif isinstance(child, Slot):
                    child = _unstack(child)
            children.append(child)
        return children

    def _items_policy(self, values: Sequence[Any], path: Path, origins: Origins, policy: Policy) -> tuple[Node, Extras]:
        """A Concat/Jagged field whose per-sample values are lists of items."""
        flat: list[Any] = []
        flat_origins: list[tuple[int, Path]] = []
        counts: list[int] = []
        for i, value in enumerate(values):
            sample, where = self._blame(i, path, origins)
            if value is None and self.missing:
                counts.append(0)
                continue
            if not is_sequence(value):
                raise self._error(f"expected a list of items, got {type_name(value)}", i, path, origins)
            counts.append(len(value))
            flat.extend(value)
            flat_origins.extend((sample, (*where, j)) for j in range(len(value)))
        if not flat:
            # No sample has an item: the policy gives its empty result.
            return policy.plan(Column.empty(0, path), self.renames.key(path), counts=counts)
        handler = lookup(type(flat[0]))
        if handler is None or not handler.is_tensor:
            raise self._error(
                f"expected tensor items, got {type_name(flat[0])}",
                0,
                (*path, 0),
                None if origins is None else flat_origins,
            )
        column = self._column(flat, path, flat_origins, handler)
        return policy.plan(column, self.renames.key(path), counts=counts)


_TENSOR_LIKE = frozenset(("tensor", "ndarray", "number"))


def _mixed_families(values: Sequence[Any]) -> bool:
    """Whether tensors, arrays and numbers are mixed in one column."""
    families = set()
    for value in values:
        if value is not None:
            handler = lookup(type(value))
            if handler is None or handler.family not in _TENSOR_LIKE:
                return False
            families.add(handler.family)
    return len(families) > 1


_NUMBER_TYPES = (bool, int, float)


def _number_lists(values: Sequence[Any]) -> bool:
    """Whether every present value is a list (or tuple) of Python numbers, one at least."""
    found = False
    for value in values:
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or is_namedtuple(value):
            return False
        if not all(isinstance(x, _NUMBER_TYPES) for x in value):
            return False
        found = found or bool(value)
    return found


def _copy_into(region: torch.Tensor, value: torch.Tensor) -> None:
    region.copy_(value)


def _unstack(slot: Slot) -> Slot:
    """A stack of one value, seen as that value (its leading 1 dropped)."""
    return Slot(slot.dtype, slot.shape[1:], slot.segments, slot.wrap, stackable=slot.stackable)


def _merge(children: list[Node]) -> Node:
    """Stack children that are tensors of one shape into one slot, else list them."""
    if not children or not all(isinstance(c, Slot) and c.stackable for c in children):
        return Tree(ListSpec, children)
    slots: list[Slot] = children  # type: ignore[assignment]
    shape = slots[0].shape
    if any(s.shape != shape for s in slots):
        return Tree(ListSpec, children)
    dtype = slots[0].dtype
    for s in slots[1:]:
        if s.dtype is not dtype:
            dtype = torch.promote_types(dtype, s.dtype)
    segments: list[Segment] = []
    numel = slots[0].numel
    for i, s in enumerate(slots):
        for segment in s.segments:
            segment = segment.shifted(i * numel)
            if segments and segment.follows(segments[-1]):
                prev = segments[-1]
                segments[-1] = Segment(
                    prev.start,
                    (prev.shape[0] + segment.shape[0], *prev.shape[1:]),
                    prev.fill,
                    [*prev.payload, *segment.payload],
                    True,
                )
            else:
                segments.append(segment)
    return Slot(dtype, (len(slots), *shape), segments, slots[0].wrap)
