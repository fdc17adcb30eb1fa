"""The specs of per-sample lists whose tensors lie in one region: what the list recipes build.

:class:`SplitSpec` is a list of per-sample tensors (detection boxes, say), each a view of
one tensor over their region (on the CPU a storage of its own, as a field's); :class:`RowsSpec` is one mapping per sample over such lists
(``PerSample()`` of detection targets); :class:`ItemsSpec` groups a sample's items (several
images of one prompt), stacked where they agree, else listed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .._types.build import make_mapping
from .._types.wrap import Wrap
from .layout import Spec, TensorSpec
from .views import Views

__all__ = [
    "GroupsSpec",
    "ItemsSpec",
    "RowsSpec",
    "SplitSpec",
    "grouped_units",
    "scalar_items",
    "split_views",
    "with_absent",
    "wrapped",
]

_SQUEEZE = torch.Tensor.squeeze


def scalar_items(column: torch.Tensor, count: int, step: int) -> list[torch.Tensor]:
    """``count`` 0-d tensors, one at the start of each ``step`` elements of the 1-D ``column``.

    Numbers of a per-sample list (a ``PerSample()`` label column, say), each a tensor over
    its own aligned bytes of one region. Not autograd views of ``column``: each keeps a
    version counter of its own. One split of a strided view makes them at C speed (a
    piece per number, not one per number and one per gap) and ``squeeze`` makes each 0-d:
    0.9 us a number against 1.5 for a split with the gaps and a ``view(())`` each.

    Examples:
        >>> items = scalar_items(torch.arange(8), 4, 2)
        >>> [item.item() for item in items], items[0].shape
        ([0, 2, 4, 6], torch.Size([]))
    """
    return list(map(_SQUEEZE, column.view(count, step)[:, 0].unsafe_split(1)))


def split_views(
    column: torch.Tensor, sizes: Sequence[int], shapes: Sequence[tuple[int, ...]] | None
) -> list[torch.Tensor]:
    """The values of a 1-D ``column`` whose ``sizes`` alternate a value's elements and the gap after it.

    Each a tensor of ``shapes``' (``None``: as split); not autograd views of ``column``: each
    keeps a version counter of its own, so an in-place change of one never invalidates another
    saved for backward.

    Examples:
        >>> [v.tolist() for v in split_views(torch.arange(6), [2, 1, 2, 1], [(2,), (1, 2)])]
        [[0, 1], [[3, 4]]]
    """
    pieces = column.unsafe_split_with_sizes(sizes)[0::2]
    return list(pieces) if shapes is None else list(map(torch.Tensor.view, pieces, shapes))


def grouped_units(units: Sequence[Any], groups: Sequence[int]) -> list[Any]:
    """Each sample's items from the batch's units: ``-1`` its one stacked unit, else a list of that many.

    Examples:
        >>> grouped_units(["ab", "c", "d", "ef"], [-1, 2, 0, -1])
        ['ab', ['c', 'd'], [], 'ef']
    """
    each = iter(units)
    return [next(each) if count < 0 else list(itertools.islice(each, count)) for count in groups]


def wrapped(items: list[torch.Tensor], wraps: Sequence[Wrap] | None) -> list[Any]:
    """Each of ``items`` made its class by its wrap (``None``: plain tensors, as they are)."""
    return items if wraps is None else list(map(Wrap.__call__, wraps, items))


def with_absent(items: list[Any], absent: Sequence[int]) -> list[Any]:
    """``items`` with ``None`` put in at the positions ``absent`` (ascending): a list's absent values.

    Examples:
        >>> with_absent(["a", "b"], [0, 2])
        [None, 'a', None, 'b']
    """
    for position in absent:
        items.insert(position, None)
    return items


class SplitSpec(Spec):
    """A list of per-sample tensors lying in one ``region``, each starting aligned.

    ``sizes`` alternate a value's rows (elements, for a flat region) and the gap after
    it; ``shapes`` are the values' shapes where the region is flat, ``None`` where its
    rows are the values' rows. ``absent`` are the list's positions that hold ``None``
    (values absent with ``missing="none"``), in ascending order. ``wraps`` (one per
    value) make each a tensor subclass (a torchvision ``BoundingBoxes`` with its own
    format and canvas size, say); ``None`` for plain tensors.
    """

    __slots__ = ("absent", "region", "shapes", "sizes", "wraps")
    _fields = ("region", "sizes", "shapes", "absent", "wraps")

    def __init__(
        self,
        region: TensorSpec,
        sizes: Sequence[int],
        shapes: Sequence[tuple[int, ...]] | None = None,
        absent: Sequence[int] = (),
        wraps: Sequence[Wrap] | None = None,
    ):
        self.region: TensorSpec = region
        self.sizes: tuple[int, ...] = tuple(sizes)
        self.shapes: tuple[tuple[int, ...], ...] | None = None if shapes is None else tuple(shapes)
        self.absent: tuple[int, ...] = tuple(absent)
        self.wraps: tuple[Wrap, ...] | None = None if wraps is None else tuple(wraps)

    def children_specs(self) -> tuple[Spec, ...]:
        return (self.region,)

    def build(self, views: Views) -> Any:
        region = self.region
        dtype = region.dtype
        out: list[torch.Tensor | None]
        if not region.nbytes:  # every item empty: torch.empty's own storages (see Views.tensor)
            offsets, shapes = self.places()
            out = [views.tensor(dtype, shape, offset) for offset, shape in zip(offsets, shapes, strict=True)]
        else:
            # The items share their column's storage: one tensor over the region (a storage
            # of its own, as a field's), split into a view per item at C speed. A detection
            # batch makes two such lists, a tensor per image: a storage each cost a
            # microsecond per item. Saving one item writes its column's bytes.
            column = views.tensor(dtype, region.shape, region.offset)
            sizes, item_shapes = self.sizes, self.shapes
            count = len(sizes) // 2
            if item_shapes == ((),) * count and sizes == sizes[:2] * count and sizes[0] == 1:
                out = list(scalar_items(column, count, 1 + sizes[1]))  # 0-d items, one per aligned step
            else:
                out = list(split_views(column, sizes, item_shapes))
        return with_absent(wrapped(out, self.wraps), self.absent)  # type: ignore[arg-type]

    def places(self) -> tuple[list[int], list[tuple[int, ...]]]:
        """Each value's byte offset in the buffer, and each value's shape."""
        region = self.region
        trailing = region.shape[1:]
        row = math.prod(trailing) * region.dtype.itemsize
        start = region.offset
        # Rows before each value: the sum of the sizes (values and gaps) before it.
        before = itertools.accumulate(self.sizes[:-1], initial=0)
        offsets = [start + rows * row for rows in itertools.islice(before, 0, None, 2)]
        shapes = [(rows, *trailing) for rows in self.sizes[0::2]] if self.shapes is None else list(self.shapes)
        return offsets, shapes


class RowsSpec(Spec):
    """One mapping per sample (``PerSample()`` of detection targets, say), of class ``cls``.

    Each key's values, one per sample, are a column: tensors in one region (a
    :class:`SplitSpec`; numbers are 0-d tensors), the samples' own strings, bytes and
    ``None`` (a :class:`~pincollate._batch.layout.ValueSpec` of their list), mappings again (a
    ``RowsSpec``) or per-sample lists (a :class:`GroupsSpec`). Row ``i`` maps every key
    to its column's ``i``-th value.
    """

    __slots__ = ("cls", "columns", "keys")
    _fields = ("cls", "keys", "columns")

    def __init__(self, cls: type | None, keys: Sequence[Hashable], columns: Sequence[Spec]):
        self.cls: type | None = cls
        self.keys: tuple[Hashable, ...] = tuple(keys)
        self.columns: tuple[Spec, ...] = tuple(columns)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.columns

    def build(self, views: Views) -> Any:
        columns = [column.build(views) for column in self.columns]
        rows = zip(*columns, strict=True)
        if self.cls is None:  # dicts: made at C speed, a call for the lot
            return list(map(dict, map(zip, itertools.repeat(self.keys), rows)))
        return [make_mapping(self.cls, dict(zip(self.keys, row, strict=True))) for row in rows]


class GroupsSpec(Spec):
    """Per-sample lists of items (``PerSample()`` of a list of per-object dicts, say).

    ``items`` is the column of every sample's items, in order (``None`` where every list
    is empty); ``counts`` says how many are each sample's. Built as lists, as the careful
    planner builds a sample's list or tuple.
    """

    __slots__ = ("counts", "items")
    _fields = ("items", "counts")

    def __init__(self, items: Spec | None, counts: Sequence[int]):
        self.items: Spec | None = items
        self.counts: tuple[int, ...] = tuple(counts)

    def children_specs(self) -> tuple[Spec, ...]:
        return () if self.items is None else (self.items,)

    def build(self, views: Views) -> Any:
        items = iter(() if self.items is None else self.items.build(views))
        return [list(itertools.islice(items, count)) for count in self.counts]


class ItemsSpec(Spec):
    """Per-sample lists of items (``sequences="items"``): each sample's items stacked where they agree.

    ``units`` lists the batch's tensors in order: a sample whose items agree is one unit
    (its items stacked, ``(k, *shape)``), any other sample's items are a unit each.
    ``groups`` says, per sample, ``-1`` (its one stacked unit) or how many units (items)
    its list holds (0: an empty list).
    """

    __slots__ = ("groups", "units")
    _fields = ("units", "groups")

    def __init__(self, units: SplitSpec, groups: Sequence[int]):
        self.units: SplitSpec = units
        self.groups: tuple[int, ...] = tuple(groups)

    def children_specs(self) -> tuple[Spec, ...]:
        return (self.units,)

    def build(self, views: Views) -> Any:
        return grouped_units(self.units.build(views), self.groups)
