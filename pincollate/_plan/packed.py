"""Ragged fields packed back to back, planned once: ``Concat`` and ``Jagged`` recipes.

Per batch, the plan's generated function checks a field's values (one tensor per sample, or
per-sample lists of items) at C speed, concatenates them by one ``torch.cat`` into the batch's
buffer, and writes their offsets (and for items their counts and item offsets) beside them,
placed by :meth:`ConcatRecipe.placed`; under ``Jagged`` the values and their ``int64`` offsets
are one nested tensor. Anything else goes to the careful walk.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .._batch.layout import Part, Spec, TensorSpec
from .._batch.specs import JaggedSpec
from .._batch.views import align
from .packing import Concat, Jagged
from .recipe import Recipe, plain_tensors

__all__ = ["ConcatRecipe", "concat_recipe", "none_as_empty"]


class ConcatRecipe(Recipe):
    """``Concat`` of plain tensors, or of per-sample lists of them (``items``): one ``torch.cat``.

    Under ``Jagged`` the values and their ``int64`` offsets are one nested tensor.
    """

    __slots__ = ("containers", "counts_name", "item_offsets_name", "jagged", "offsets_name", "stack")

    def __init__(
        self, dtype: torch.dtype, ndim: int, policy: Concat, name: Hashable, containers: frozenset[type] | None
    ):
        super().__init__(dtype, ndim)
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
