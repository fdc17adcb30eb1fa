"""``PerSample()`` mappings planned once: detection targets, one mapping per sample.

A target of torchvision's detection references is a mapping of per-image tensors
(boxes, labels, masks, areas) beside Python values (an ``int`` image id, a file name).
:class:`RowsRecipe` settles, from the first batch, each key's column: tensors listed per
sample (:class:`~pincollate._listed.ListRecipe`), Python numbers of one type (each
sample's a 0-d tensor, as the careful planner makes one), or strings, bytes and ``None``
(each sample's own object). For each batch it checks every column at C speed, places
the tensors and numbers in the batch's buffer, and builds one mapping per sample over
them (:class:`~pincollate._list_specs.RowsSpec`).
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ._build import container_cls
from ._builtin_leaves import NUMBERS
from ._fill import Fill
from ._kinds import MAPPING, kind_of
from ._layout import Part, ValueSpec
from ._list_specs import RowsSpec, SplitSpec
from ._listed import ListRecipe
from ._ops import fits_int64
from ._recipe import Recipe, kept_tensors, place
from ._views import ALIGN

__all__ = ["Numbers", "RowsRecipe", "Values", "rows_recipe"]

#: The Python values a target keeps as they are (a file name, a missing note).
_VALUES = frozenset((str, bytes, type(None)))


class Numbers:
    """A column of Python numbers of one type: each sample's value a 0-d tensor of its own.

    ``int`` becomes ``int64``, ``float`` ``float64``, ``bool`` ``bool``, as a number alone
    does in the careful planner. The values lie one per :data:`~pincollate._views.ALIGN`
    bytes of one region, filled by one numpy assignment; an ``int`` beyond ``int64``
    fails that assignment, and the batch is planned again, carefully, which names it.
    """

    __slots__ = ("dtype", "step", "types")

    def __init__(self, cls: type):
        self.types = frozenset((cls,))
        self.dtype: torch.dtype = NUMBERS[cls]
        self.step = ALIGN // self.dtype.itemsize

    def place(self, values: Sequence[Any], fill: Fill) -> SplitSpec | None:
        if set(map(type, values)) != self.types:
            return None
        n, step = len(values), self.step
        region = place(fill, self.dtype, (n * step,))
        fill.tasks.append((_fill_spaced, region, values, None))
        return SplitSpec(region, (1, step - 1) * n, ((),) * n)


def _fill_spaced(region: torch.Tensor, values: list[Any]) -> None:
    # One value at the start of each aligned step; the gaps are never read.
    region.numpy()[:: len(region) // len(values)] = values


class Values:
    """A column of strings, bytes or ``None``: each sample's own object, kept beside the buffer."""

    __slots__ = ()

    def place(self, values: Sequence[Any], fill: Fill) -> ValueSpec | None:
        if not _VALUES.issuperset(map(type, values)):
            return None
        fill.values.append(list(values))
        return ValueSpec(len(fill.values) - 1)


class _Tensors:
    """A column of per-sample tensors (plain, or one kept subclass), listed as :class:`ListRecipe` lists them."""

    __slots__ = ("recipe",)

    def __init__(self, recipe: ListRecipe):
        self.recipe = recipe

    def place(self, values: Sequence[Any], fill: Fill) -> SplitSpec | None:
        shapes = self.recipe.shapes(values)
        if shapes is None:
            return None
        part = self.recipe.sized(values, shapes, fill)
        assert isinstance(part.node, SplitSpec)  # per-sample lists never stack
        return part.node


Column = Numbers | Values | _Tensors


class RowsRecipe(Recipe):
    """``PerSample()`` of mappings of one class and key order (detection targets).

    Each key's column is tensors, numbers of one type or plain values, as the first batch
    showed (:func:`rows_recipe`); the batch holds one mapping per sample over them. A
    batch whose mappings or columns differ goes to the careful planner.
    """

    __slots__ = ("cls", "columns", "gather", "keys")

    def __init__(self, cls: type, keys: Sequence[Hashable], columns: Sequence[Column]):
        super().__init__(torch.uint8, 0)  # the columns check their own values
        self.types = frozenset((cls,))
        self.cls = container_cls(cls, dict)
        self.keys = tuple(keys)
        self.columns = tuple(columns)
        self.gather: Any = operator.itemgetter(*self.keys)

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool:
        if set(map(type, column)) != self.types or any(tuple(value) != self.keys for value in column):
            return False
        columns = (
            [list(map(self.gather, column))]
            if len(self.keys) == 1
            else list(zip(*map(self.gather, column), strict=True))
        )
        # Checked before any is placed: a column that does not fit leaves nothing behind.
        tasks, offset, nvalues = len(fill.tasks), fill.offset, len(fill.values)
        specs: list[SplitSpec | ValueSpec] = []
        for kind, values in zip(self.columns, columns, strict=True):
            spec = kind.place(values, fill)
            if spec is None:
                del fill.tasks[tasks:], fill.values[nvalues:]
                fill.offset = offset
                return False
            specs.append(spec)
        fill.parts[index] = Part(RowsSpec(self.cls, self.keys, specs))
        return True


def _column(values: Sequence[Any]) -> Column | None:
    """How a key's column is planned for each batch, or ``None``: the careful planner for every batch."""
    types = set(map(type, values))
    if len(types) == 1:
        cls = next(iter(types))
        if cls in NUMBERS:
            return Numbers(cls) if cls is not int or all(map(fits_int64, values)) else None
    if _VALUES.issuperset(types):
        return Values()
    described = kept_tensors(values)
    if described is None:
        return None
    dtype, ndim, kept = described
    return _Tensors(ListRecipe(dtype, ndim, stacks=False, cls=kept))


def rows_recipe(column: Sequence[Any]) -> Recipe | None:
    """A ``PerSample()`` recipe for mappings of one class and key order, or ``None``.

    Each key's values are tensors (plain, or of one subclass kept as its class:
    torchvision's ``BoundingBoxes`` and ``Mask``), Python numbers of one type (an image
    id), or strings, bytes and ``None`` (a file name).
    """
    first = column[0]
    cls = type(first)
    if kind_of(first) is not MAPPING or not len(first) or set(map(type, column)) != {cls}:
        return None
    keys = tuple(first)
    if any(tuple(value) != keys for value in column):
        return None
    columns = []
    for key in keys:
        found = _column([value[key] for value in column])
        if found is None:
            return None
        columns.append(found)
    return RowsRecipe(cls, keys, columns)
