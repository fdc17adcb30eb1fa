"""Ragged fields packed back to back, planned once: ``Concat`` and ``Jagged`` recipes.

Per batch, a field's values (one tensor per sample, or per-sample lists of items) are
checked at C speed (:class:`~pincollate._plan.recipe.Recipe`), concatenated by one
``torch.cat`` into the batch's buffer, and their offsets (and for items their counts and
item offsets) written beside them; under ``Jagged`` the values and their ``int64``
offsets are one nested tensor. Anything else goes to the careful planner.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .._batch.layout import Part, Spec, TensorSpec
from .._batch.specs import JaggedSpec
from .._batch.views import align
from .._types.builtin import concat_tensors, fill_numbers, stack_tensors
from .fill import Fill
from .ops import FIRST
from .packing import INT32_MAX, Concat, Jagged, offsets, spread
from .padding import Joined, nonempty
from .recipe import Recipe, holds_none, plain_tensors

__all__ = ["ConcatRecipe", "concat_recipe", "none_as_empty"]


class ConcatRecipe(Recipe):
    """``Concat`` of plain tensors, or of per-sample lists of them (``items``): one ``torch.cat``.

    Under ``Jagged`` the values and their ``int64`` offsets are one nested tensor.
    """

    __slots__ = ("containers", "counts_name", "item_offsets_name", "jagged", "offsets_name", "stack", "tail")

    def __init__(
        self, dtype: torch.dtype, ndim: int, policy: Concat, name: Hashable, containers: frozenset[type] | None
    ):
        super().__init__(dtype, ndim)
        # The trailing sizes of a shape, read at C speed.
        self.tail = operator.itemgetter(*range(1, ndim)) if ndim > 1 else FIRST
        #: The classes of the per-sample lists of items; ``None``: one tensor per sample.
        self.containers = containers
        self.jagged = isinstance(policy, Jagged)
        #: ``items="stack"``: each value whole, one row each (images), not its rows.
        self.stack = policy.items == "stack"
        self.offsets_name = policy._extra_name(policy.offsets_key, name)
        items = containers is not None
        self.counts_name = policy._extra_name(policy.counts_key, name) if items else None
        with_item_offsets = items and not self.stack
        self.item_offsets_name = policy._extra_name(policy.item_offsets_key, name) if with_item_offsets else None

    def extras(self) -> tuple[str, ...]:
        names = (self.offsets_name, self.counts_name, self.item_offsets_name)
        return tuple(name for name in names if name is not None)

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool:
        counts = None
        values = column
        if self.containers is not None:
            if set(map(type, column)) - self.containers:
                return False
            if holds_none(column):  # absent lists (missing="none"): no items
                column = none_as_empty(column)
            counts = list(map(len, column))
            values = list(itertools.chain.from_iterable(column))
        if not values:
            return False  # nothing to concatenate: the careful planner's empty result
        shapes = self.shapes(values)
        if shapes is None:
            return False
        if self.stack:
            return self._stacked(values.views() if type(values) is Joined else values, shapes, counts, fill, index)
        trailing = shapes[0][1:]
        if self.ndim > 1 and set(map(self.tail, shapes)) != {self.tail(shapes[0])}:
            return False  # the careful planner names the value whose trailing dims differ
        rows = list(map(FIRST, shapes))
        total = sum(rows)
        if total > INT32_MAX and not self.jagged:
            return False  # the careful planner says Concat's int32 offsets cannot hold it
        item_offsets, per_sample = offsets(rows, counts)
        spread_ = spread(per_sample) if self.jagged else (0, 0)
        key = (total, tuple(trailing), len(values))
        part, specs, fill.offset = self.placed(fill.offset, len(column), key, spread_)
        pieces = [values.flat] if type(values) is Joined else nonempty(values, rows)
        tasks = fill.tasks
        tasks.append((concat_tensors, specs[0], pieces, None))
        numbers = iter(specs[1:])
        if self.jagged:
            tasks.append((fill_numbers, next(numbers), per_sample, None))
        for name, found in (
            (self.offsets_name, per_sample),
            (self.counts_name, counts),
            (self.item_offsets_name, item_offsets),
        ):
            if name is not None:
                tasks.append((fill_numbers, next(numbers), found, None))
        fill.parts[index] = part
        return True

    def placed(
        self, offset: int, n: int, key: tuple[int, tuple[int, ...], int], spread: tuple[int, int] = (0, 0)
    ) -> tuple[Part, list[TensorSpec], int]:
        """The placement rule: the part at byte ``offset`` for ``n`` samples whose values have ``total`` rows
        of ``trailing`` sizes, ``nvalues`` of them (``key``); stacked items (``items="stack"``) are
        ``nvalues`` rows of the item's whole shape.

        Returns the part, its tensors in buffer order (the values; under ``Jagged`` its offsets;
        then the offsets, counts and item offsets the policy asks for) and the offset after them.
        ``spread``: under ``Jagged``, the fewest and most rows of a sample (its nested tensor's).
        """
        total, trailing, nvalues = key
        dtype = self.dtype
        specs = [TensorSpec(dtype, (total, *trailing), offset)]
        offset = align(offset + specs[0].nbytes)
        node: Spec = specs[0]
        if self.jagged:
            specs.append(TensorSpec(torch.int64, (n + 1,), offset))
            offset = align(offset + specs[-1].nbytes)
        extras: list[tuple[str, TensorSpec]] = []
        for name, dtype, size in (
            (self.offsets_name, torch.int32, n + 1),
            (self.counts_name, torch.int64, n),
            (self.item_offsets_name, torch.int64 if self.jagged else torch.int32, nvalues + 1),
        ):
            if name is not None:
                specs.append(TensorSpec(dtype, (size,), offset))
                offset = align(offset + specs[-1].nbytes)
                extras.append((name, specs[-1]))
        if self.jagged:
            node = JaggedSpec(specs[0], specs[1], *spread)
        return Part(node, tuple(extras)), specs, offset

    def _stacked(
        self, values: Sequence[torch.Tensor], shapes: list[torch.Size], counts: list[int] | None, fill: Fill, index: int
    ) -> bool:
        """``items="stack"``: the items stacked whole, ``(items, *shape)``; offsets count items."""
        if shapes.count(shapes[0]) != len(shapes):
            return False  # the careful planner names the item whose shape differs
        if len(values) > INT32_MAX:
            return False  # the careful planner says Concat's int32 offsets cannot hold it
        per_sample = offsets([1] * len(values), counts)[1]  # each item whole: one row
        key = (len(values), tuple(shapes[0]), len(values))
        part, specs, fill.offset = self.placed(fill.offset, len(values) if counts is None else len(counts), key)
        fill.tasks.append((stack_tensors, specs[0], values, None))
        numbers = iter(specs[1:])
        for name, found in ((self.offsets_name, per_sample), (self.counts_name, counts)):
            if name is not None:
                fill.tasks.append((fill_numbers, next(numbers), found, None))
        fill.parts[index] = part
        return True


def none_as_empty(column: Sequence[Any]) -> list[Any]:
    """Per-sample lists of items with an absent one (``missing="none"``) as no items."""
    return [() if value is None else value for value in column]


def concat_recipe(column: Sequence[Any], policy: Concat, name: Hashable, missing: bool) -> Recipe | None:
    """A ``Concat`` recipe: per-sample tensors, or per-sample lists (or tuples) of tensors.

    With ``missing`` (``missing="none"``) a list may be absent (``None``): no items.
    """
    containers = {type(value) for value in column}
    lists = containers - {type(None)} if missing else containers
    if lists and lists <= {list, tuple}:
        described = plain_tensors([item for value in column if value is not None for item in value])
        if described is None:
            return None
        allowed = frozenset(lists | {type(None)}) if missing else frozenset(lists)
        return ConcatRecipe(*described, policy, name, allowed)
    described = plain_tensors(column)
    return None if described is None else ConcatRecipe(*described, policy, name, None)
