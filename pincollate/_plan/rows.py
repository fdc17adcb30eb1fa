"""``PerSample()`` subtrees planned once: detection targets, one structure per sample.

A target of torchvision's detection references is a mapping of per-image tensors
(boxes, labels, masks, areas) beside Python values (an ``int`` image id, a file name);
other datasets give a list of per-object mappings per image. The first batch settles a
*column* for each place in such a subtree, taking the values at that place across the
samples (or across all their items) at once:

* :class:`Tensors`: tensors listed per sample, each over its own bytes (plain, or one
  kept subclass, as :class:`~pincollate._plan.listed.ListRecipe` lists them), and
  :class:`Arrays`: numpy arrays of one dtype, listed so as tensors;
* :class:`Numbers`: numbers of one type (Python's or numpy's), each a 0-d tensor of its own;
* :class:`Values`: strings, bytes and ``None``, each sample's own object;
* :class:`Rows`: mappings of one class and key order, a column per key;
* :class:`Groups`: per-sample lists (or tuples) of items, one column for all the items.

The careful walk's ``PerSample()`` places a column of the batch's samples by these columns
(their ``place``); a cached plan keeps them in a :class:`PerSampleRecipe`, whose every place
the generated function (:mod:`pincollate._plan.codegen`) checks at C speed and copies into the
batch's buffer, building each sample's structure over them as the walk does. A batch a column
does not describe leaves the generated function for the careful walk.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from .._batch.layout import Spec, ValueSpec
from .._batch.list_specs import GroupsSpec, RowsSpec, SplitSpec
from .._batch.views import ALIGN
from .._errors import CollateError
from .._types.build import container_cls
from .._types.builtin import ARRAY_DTYPE, KEPT_VALUES, NUMBERS, fits_int64
from .._types.kinds import EXACT_KEYS, LISTS, MAPPING, kind_of
from .._types.leaves import lookup
from .column import MAX_DEPTH
from .fill import Fill
from .listed import ListRecipe
from .recipe import Recipe, array_tensors, kept_tensors, place

__all__ = [
    "Arrays",
    "Groups",
    "Numbers",
    "PerSampleRecipe",
    "Rows",
    "Tensors",
    "Values",
    "column_for",
    "fill_spaced",
    "per_sample_recipe",
]


class Numbers:
    """Numbers of one type (Python's, or a numpy scalar type): each a 0-d tensor of its own.

    ``int`` becomes ``int64``, ``float`` ``float64``, ``bool`` ``bool``, a numpy scalar its
    own dtype, as a number alone does in the careful planner. The values lie one per
    :data:`~pincollate._batch.views.ALIGN` bytes of one region, filled by one numpy assignment;
    an ``int`` beyond ``int64`` fails that assignment, and the batch is planned again,
    carefully, which names it.
    """

    __slots__ = ("dtype", "step", "types")

    def __init__(self, cls: type, dtype: torch.dtype):
        self.types = frozenset((cls,))
        self.dtype: torch.dtype = dtype
        self.step = ALIGN // dtype.itemsize

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        if set(map(type, values)) != self.types:
            return None
        n, step = len(values), self.step
        region = place(fill, self.dtype, (n * step,))
        fill.tasks.append((fill_spaced, region, values))
        return SplitSpec(region, (1, step - 1) * n, ((),) * n)


def fill_spaced(region: torch.Tensor, values: list[Any]) -> None:
    # One value at the start of each aligned step; the gaps are never read.
    region.numpy()[:: len(region) // len(values)] = values


class Values:
    """Strings, bytes or ``None``: each sample's own object, kept beside the buffer."""

    __slots__ = ()

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        if not KEPT_VALUES.issuperset(map(type, values)):
            return None
        fill.values.append(list(values))
        return ValueSpec(len(fill.values) - 1)


class Tensors:
    """Per-sample tensors (plain, or one kept subclass), listed as :class:`ListRecipe` lists them."""

    __slots__ = ("recipe",)

    def __init__(self, recipe: ListRecipe):
        self.recipe = recipe

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        shapes = self.recipe.shapes(values)
        if shapes is None:
            return None
        part = self.recipe.sized(values, shapes, fill)
        return part.node  # a SplitSpec: per-sample lists never stack


class Arrays:
    """Numpy arrays of one dtype (boxes from a numpy pipeline): tensors over the same memory, listed as :class:`Tensors`."""

    __slots__ = ("dtypes", "tensors")

    def __init__(self, dtype: np.dtype[Any], tensors: Tensors):
        self.dtypes = frozenset((dtype,))
        self.tensors = tensors

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        tensors = array_tensors(values, self.dtypes)
        return None if tensors is None else self.tensors.place(tensors, fill)


_TYPE = itertools.repeat(type)


class Rows:
    """Mappings of one class and key order: a column per key, one mapping per value built over them.

    Each value's keys must be the plan's and of the same types: ``True == 1`` and they
    hash alike, but the careful planner keeps each sample's own key objects.
    """

    __slots__ = ("cls", "columns", "gather", "key_sets", "key_types", "keys", "types")

    def __init__(self, cls: type, keys: Sequence[Hashable], columns: Sequence[Column]):
        self.types = frozenset((cls,))
        self.cls = container_cls(cls, dict)
        self.keys = tuple(keys)
        self.key_sets = {self.keys}  # every value's keys in order, read at C speed
        #: Each value's key types, read at C speed (``map(type, value)`` for every value).
        self.key_types = {tuple(map(type, self.keys))}
        self.columns = tuple(columns)
        # One C-level call per mapping gathers its row; zip turns rows into columns.
        self.gather: Any = operator.itemgetter(*self.keys)

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        if (
            set(map(type, values)) != self.types
            or set(map(tuple, values)) != self.key_sets
            or set(map(tuple, map(map, _TYPE, values))) != self.key_types
        ):
            return None
        rows = map(self.gather, values)
        columns = [list(rows)] if len(self.keys) == 1 else list(zip(*rows, strict=True))
        specs = []
        for kind, column in zip(self.columns, columns, strict=True):
            spec = kind.place(column, fill)
            if spec is None:
                return None
            specs.append(spec)
        return RowsSpec(self.cls, self.keys, specs)


class Groups:
    """Per-sample lists (or tuples) of items: one column for all the items, split back per sample as lists."""

    __slots__ = ("items",)

    def __init__(self, items: Column):
        self.items = items

    def place(self, values: Sequence[Any], fill: Fill) -> Spec | None:
        if not LISTS.issuperset(map(type, values)):
            return None
        flat = list(itertools.chain.from_iterable(values))
        if not flat:  # every list empty: nothing to check or place
            return GroupsSpec(None, [0] * len(values))
        spec = self.items.place(flat, fill)
        return None if spec is None else GroupsSpec(spec, list(map(len, values)))


Column = Numbers | Values | Tensors | Arrays | Rows | Groups


def column_for(values: Sequence[Any], depth: int = 0) -> Column | None:
    """The column for ``values`` (one place of a subtree, across samples), or ``None``: the careful planner.

    ``values`` must all be numbers of one exact type (an ``int`` column fitting
    ``int64``; a numpy scalar type torch has a dtype for), strings, bytes and ``None``, tensors of one dtype and rank (plain or of
    one kept subclass), writeable numpy arrays of one dtype and rank, mappings of one class and key order whose keys' columns are
    columns, or lists and tuples whose items, all together, are a column.
    """
    if depth > MAX_DEPTH or not values:
        return None
    types = set(map(type, values))
    if len(types) == 1:
        cls = next(iter(types))
        if cls in NUMBERS:
            return Numbers(cls, NUMBERS[cls]) if cls is not int or all(map(fits_int64, values)) else None
        if issubclass(cls, (np.bool_, np.number)):
            handler = lookup(cls)
            try:  # numpy's scalar types torch has a dtype for, as the careful planner asks
                scalar = handler.describe(values[0], 0, ()) if handler and handler.describe else None
            except CollateError:
                return None
            return None if scalar is None else Numbers(cls, scalar[0])
    if KEPT_VALUES.issuperset(types):
        return Values()
    if LISTS.issuperset(types):
        items = column_for(list(itertools.chain.from_iterable(values)), depth + 1)
        return None if items is None else Groups(items)
    first = values[0]
    if len(types) == 1 and kind_of(first) is MAPPING and len(first):
        keys = tuple(first)
        key_types = tuple(map(type, keys))
        if not EXACT_KEYS.issuperset(key_types):
            return None  # -0.0 == 0.0, (True,) == (1,): the careful planner keeps each sample's own keys
        if any(tuple(value) != keys or tuple(map(type, value)) != key_types for value in values):
            return None  # True == 1: the careful planner keeps each sample's own keys
        columns = []
        for key in keys:
            found = column_for([value[key] for value in values], depth + 1)
            if found is None:
                return None
            columns.append(found)
        return Rows(type(first), keys, columns)
    tensors = array_tensors(values)
    if tensors is not None:
        inner = column_for(tensors, depth)
        dtypes = set(map(ARRAY_DTYPE, values))
        if type(inner) is not Tensors or len(dtypes) != 1:
            return None
        return Arrays(dtypes.pop(), inner)
    described = kept_tensors(values)
    if described is None:
        return None
    dtype, ndim, kept = described
    return Tensors(ListRecipe(dtype, ndim, stacks=False, cls=kept))


class PerSampleRecipe(Recipe):
    """``PerSample()`` of mappings or of per-sample lists, as :func:`column_for` settled them."""

    __slots__ = ("column",)

    def __init__(self, column: Rows | Groups):
        super().__init__(torch.uint8, 0)  # the column checks its own values
        self.column = column


def per_sample_recipe(column: Sequence[Any]) -> Recipe | None:
    """A ``PerSample()`` recipe for a column of mappings or of per-sample lists, or ``None``.

    Detection targets as a mapping per image (tensors beside an ``int`` image id and a
    file name) or as a list of per-object mappings per image.
    """
    found = column_for(column)
    return PerSampleRecipe(found) if isinstance(found, (Rows, Groups)) else None
