"""Packed layouts for ragged fields: ``Concat`` (values back to back, with offsets) and
``Jagged`` (a ``torch.nested`` jagged tensor on the same memory)."""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Hashable
from typing import Literal

import torch

from .._batch.layout import Spec
from .._batch.specs import JaggedSpec
from .._errors import CollateError
from .._types.wrap import Wrap
from .column import Column
from .fill import Node, Segment, TensorNode, Tree
from .padding import Joined
from .policies import Policy, int_node

__all__ = ["INT32_MAX", "Concat", "Jagged", "offsets", "spread"]

_TRAILING = operator.itemgetter(slice(1, None))

INT32_MAX = 2**31 - 1


def offsets(rows: list[int], counts: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Packing's offsets rule, the careful walk's and the compiled plan's: where each value's rows start
    (and the end), and where each sample's do.

    ``counts``: how many of the values (items) each sample gave; ``None``: a value a sample,
    whose offsets are the values' own.

    Examples:
        >>> offsets([2, 1, 3])
        ([0, 2, 3, 6], [0, 2, 3, 6])
        >>> offsets([2, 1, 3], counts=[2, 0, 1])
        ([0, 2, 3, 6], [0, 3, 3, 6])
    """
    item_offsets = [0, *itertools.accumulate(rows)]
    if counts is None:
        return item_offsets, item_offsets
    # Sample i's rows end where its last item's do.
    return item_offsets, list(map(item_offsets.__getitem__, itertools.accumulate(counts, initial=0)))


def spread(offsets: list[int]) -> tuple[int, int]:
    """The fewest and most rows of a sample, from the samples' offsets: a nested tensor's sequence lengths."""
    per_sample = list(map(operator.sub, offsets[1:], offsets))
    return min(per_sample, default=0), max(per_sample, default=0)


class Concat(Policy):
    """Concatenate values along dim 0, with ``int32`` offsets of length ``B + 1``.

    This is the packed layout of variable-length attention kernels (``cu_seqlens``).
    Per-sample lists of items (several images of one prompt) are concatenated in
    order: the offsets still bound each sample, and the item counts and item
    offsets (``int32``, one more than the number of items in the batch) bound each
    item. Missing values (``missing="none"``) count as empty.

    What an item is decides how items join: ``items="cat"`` (the default) takes
    each item as rows, as a VLM's patches ``(n_i, D)`` are, and concatenates the
    rows, ``(total rows, D)``; ``items="stack"`` takes each item whole, as an image
    ``(C, H, W)`` is, and stacks it as one row, ``(total items, C, H, W)``. Stacked
    items must share one shape; the offsets then count items (they bound each
    sample's images), and there are no item offsets (item ``i`` is row ``i``).

    Args:
        offsets_key: name of the per-sample offsets, or ``None``.
        counts_key: name of the per-sample item counts (``int64``, lists of items
            only), or ``None``.
        item_offsets_key: name of the per-item offsets (lists of items under
            ``items="cat"`` only), or ``None``.
        items: ``"cat"``: an item's rows join the rows of the others (patches,
            sequences); ``"stack"``: each item is one row (whole images).

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, Concat
        >>> collate = MMCollate(fields={"ids": Concat()})
        >>> batch = collate([{"ids": torch.tensor([1, 2, 3])}, {"ids": torch.tensor([4])}])
        >>> batch["ids"].tolist(), batch["ids_offsets"].tolist()
        ([1, 2, 3, 4], [0, 3, 4])

        Whole images, two for the first prompt and one for the second:

        >>> images = MMCollate(fields={"images": Concat(items="stack")})
        >>> batch = images([{"images": [torch.zeros(3, 14, 14)] * 2}, {"images": [torch.ones(3, 14, 14)]}])
        >>> tuple(batch["images"].shape), batch["images_offsets"].tolist(), batch["images_counts"].tolist()
        ((3, 3, 14, 14), [0, 2, 3], [2, 1])
    """

    takes_items = True
    numbers_as_sequence = True
    empty_when_absent = True
    _extra_keys = ("offsets_key", "counts_key", "item_offsets_key")
    _offsets_dtype = torch.int32

    def __init__(
        self,
        offsets_key: str | None = "{key}_offsets",
        counts_key: str | None = "{key}_counts",
        item_offsets_key: str | None = "{key}_item_offsets",
        items: Literal["cat", "stack"] = "cat",
    ):
        if items not in ("cat", "stack"):
            raise CollateError(f"{type(self).__name__}(items=...) must be 'cat' or 'stack', got {items!r}")
        self.offsets_key: str | None = offsets_key
        self.counts_key: str | None = counts_key
        self.item_offsets_key: str | None = item_offsets_key
        self.items: Literal["cat", "stack"] = items

    def _values(self, column: Column) -> tuple[TensorNode, list[int]]:
        present = column.present
        if not present:
            # Nothing to concatenate (a text-only batch): empty values, zero offsets.
            return TensorNode(torch.float32, (0,), []), [0] * len(column.values)
        if self.items == "stack":
            return self._stacked(column), [int(shape is not None) for shape in column.shapes]
        first = present[0]
        shapes = column.known
        known = shapes.values()
        # At C speed where every value has a rank and the trailing sizes agree; else the value to name.
        if not shapes[first] or len(set(map(_TRAILING, known))) != 1 or 0 in set(map(len, known)):
            for i in present:
                shape = shapes[i]
                if len(shape) == 0:
                    raise column.error(f"{type(self).__name__}() cannot concatenate 0-d values", i)
                if shape[1:] != shapes[first][1:]:
                    raise column.error(
                        f"{type(self).__name__}() needs equal trailing dims, got shape {shape} here and "
                        f"{shapes[first]} in sample {column.origin(first)[0]}",
                        i,
                    )
        if not column.plain and len({type(column.values[i]) for i in present}) > 1:
            column.joined_class(torch.cat)  # two classes torch.cat refuses together: named here, not in the copy
        rows = [0 if shape is None else shape[0] for shape in column.shapes]
        trailing = shapes[first][1:]
        total = sum(rows)
        concat = column.handler.concat
        if concat is not None:
            # One call for the whole field: torch.cat straight into the region.
            values = column.values
            # Rows read from Arrow come joined already: one copy of the tensor they are.
            pieces = (
                [values.flat]
                if type(values) is Joined and len(present) == len(values)
                else [values[i] for i in present]
            )
            segments = [Segment(0, (total, *trailing), concat, pieces)]
        else:
            segments = []
            start = 0
            row_numel = math.prod(trailing)
            for i in present:
                segments.append(Segment(start, (1, rows[i], *trailing), column.handler.fill, [column.values[i]]))  # type: ignore[arg-type]
                start += rows[i] * row_numel
        return TensorNode(column.dtype, (total, *trailing), segments, self._wrap(column)), rows

    def _stacked(self, column: Column) -> TensorNode:
        """Each present value whole, as one row (``items="stack"``): they must share a shape."""
        present = column.present
        if not column.stackable:
            i, refusing = column.refusing()
            raise column.error(f"Concat(items='stack') cannot stack {refusing.name}: they stay one tensor each", i)
        first = column.known[present[0]]
        for i in present:
            if column.known[i] != first:
                raise column.error(
                    f"Concat(items='stack') needs items of one shape, got {column.known[i]} here and {first} in "
                    f"sample {column.origin(present[0])[0]} (items='cat' joins items along their first dim)",
                    i,
                )
        if len(present) < len(column.values):  # absent values (missing="none"): no items
            column = column.subset(present)
        if not column.uniform:
            raise column.error("Concat(items='stack') needs equal metadata (a box format or canvas size differs)")
        return column.stacked()

    @staticmethod
    def _wrap(column: Column) -> Wrap | None:
        """Keep a tv_tensors subclass and its metadata when every value shares them."""
        wrap = column.handler.wrap
        if wrap is None or column.plain:  # plain tensors have no class to keep
            return None
        wraps = {wrap(column.values[i]) for i in column.present}
        return wraps.pop() if len(wraps) == 1 else None

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        node, rows = self._values(column)
        if self._offsets_dtype == torch.int32 and sum(rows) > INT32_MAX:
            raise column.error(
                f"{sum(rows):,} rows do not fit Concat()'s int32 offsets (cu_seqlens); use Jagged(), whose offsets are int64"
            )
        return node, self._extras(rows, counts, name)

    def _extras(self, rows: list[int], counts: list[int] | None, name: Hashable) -> dict[str, Node]:
        """Offsets per sample; with lists of items, also counts and item offsets (:func:`offsets`)."""
        extras: dict[str, Node] = {}
        item_offsets, per_sample = offsets(rows, counts)
        offsets_name = self._extra_name(self.offsets_key, name)
        if offsets_name is not None:
            extras[offsets_name] = int_node(per_sample, self._offsets_dtype)
        if counts is not None:
            counts_name = self._extra_name(self.counts_key, name)
            if counts_name is not None:
                extras[counts_name] = int_node(counts)
            # Stacked items are one row each: item i is row i, no offsets needed.
            items_name = self._extra_name(self.item_offsets_key, name) if self.items == "cat" else None
            if items_name is not None:
                extras[items_name] = int_node(item_offsets, self._offsets_dtype)
        return extras


class Jagged(Concat):
    """A ``torch.nested`` jagged tensor over the concatenated values, no extra copy.

    The values and ``int64`` offsets both live in the batch buffer; the nested
    tensor is built on them with ``torch.nested.nested_tensor_from_jagged``. On a
    field whose values are lists of items, the items' rows join one sample's rows
    (as ``Concat()``'s ``items="cat"``).

    Args:
        counts_key: name of the per-sample item counts (``int64``, lists of items
            only), or ``None``.
        item_offsets_key: name of the per-item offsets (lists of items only), or
            ``None``.

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, Jagged
        >>> batch = MMCollate(fields={"ids": Jagged()})([{"ids": torch.arange(3)}, {"ids": torch.arange(2)}])
        >>> batch["ids"].is_nested, [t.tolist() for t in batch["ids"].unbind()]
        (True, [[0, 1, 2], [0, 1]])
    """

    _offsets_dtype = torch.int64

    def __init__(self, counts_key: str | None = "{key}_counts", item_offsets_key: str | None = "{key}_item_offsets"):
        super().__init__(offsets_key=None, counts_key=counts_key, item_offsets_key=item_offsets_key)

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        values, rows = self._values(column)
        values.wrap = None  # torch.nested takes plain values
        per_sample = offsets(rows, counts)[1]
        # Known here: attention kernels would otherwise read them back from the device.
        seqlens = spread(per_sample)
        node = Tree(functools.partial(_jagged, seqlens=seqlens), [values, int_node(per_sample, torch.int64)])
        return node, self._extras(rows, counts, name)


def _jagged(specs: list[Spec], seqlens: tuple[int, int]) -> Spec:
    values, offsets = specs
    return JaggedSpec(values, offsets, *seqlens)  # type: ignore[arg-type]
