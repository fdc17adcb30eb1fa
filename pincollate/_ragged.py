"""Ragged fields planned once: per batch, only the sizes are read.

When the first batch of a structure shows a field planned per batch (ragged, or under
a policy) as plain tensors of one dtype and one rank (token ids, waveforms, boxes,
image patches: what ragged data almost always is), its plan keeps a *recipe*: the
field's policy, dtype, rank and output names, settled once. For each batch the recipe
checks the column at C speed, reads the sizes, computes the offsets and queues one
copy per field: ``Pad`` as one masked scatter (large rows: one ``torch.cat`` with
their padding, or a copy per row), a per-sample list as one ``torch.cat`` into a
region whose views are made by one ``split``, ``PerSample()`` of mappings (detection
targets) as one such list per key. ``Concat`` and ``Jagged`` are in :mod:`._packed`;
Python number lists and numpy arrays are converted first (:mod:`._recipe`).
:func:`recipe_for` picks the recipe.

A batch the recipe does not describe (another dtype, a value that is too long for
``Pad(max_length=...)``, a missing value) goes to the careful planner, which gives
the same result for what it can take and the error, with sample and key path, for
what it cannot.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ._build import container_cls
from ._builtin_leaves import concat_tensors, fill_numbers, stack_tensors
from ._fill import Fill, Filler, Regions
from ._kinds import MAPPING, kind_of
from ._layout import Part, TensorSpec, Wrap
from ._leaves import lookup
from ._packed import concat_recipe
from ._packing import Concat, Jagged
from ._padding import fill_padded_1d, fill_padded_and_mask_1d
from ._policies import AsList, Pad, PerSample, Policy, fits
from ._recipe import Recipe, converted, kept_tensors, place, plain_tensors
from ._specs import RowsSpec, SplitSpec
from ._views import ALIGN, pitch

__all__ = ["ListRecipe", "PadRecipe", "recipe_for"]

Path = tuple[Hashable, ...]

_FIRST = operator.itemgetter(0)


class PadRecipe(Recipe):
    """``Pad`` over one dimension of plain tensors (the one whose sizes differ, or ``dims``).

    With ``missing`` (``missing="none"``) an absent value is an empty one: its row is all
    padding, its length 0.
    """

    __slots__ = ("dim", "fill_both", "fill_values", "left", "lengths_name", "mask_name", "missing", "policy")

    def __init__(self, dtype: torch.dtype, ndim: int, policy: Pad, name: Hashable, missing: bool = False):
        super().__init__(dtype, ndim)
        self.missing = missing
        self.policy = policy
        self.left = policy.side == "left"
        dims = None if policy.dims is None else tuple(d % ndim for d in policy.dims)
        self.dim: int | None = None if dims is None else dims[0]
        self.lengths_name = policy._extra_name(policy.lengths_key, name)
        self.mask_name = policy._extra_name(policy.mask_key, name)
        self.fill_values: Filler = functools.partial(fill_padded_1d, value=policy.value, left=self.left)
        self.fill_both: Filler = functools.partial(fill_padded_and_mask_1d, value=policy.value, left=self.left)

    def extras(self) -> tuple[str, ...]:
        return tuple(name for name in (self.lengths_name, self.mask_name) if name is not None)

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool:
        if self.missing and any(value is None for value in column):
            present = next((value for value in column if value is not None), None)
            if type(present) is not torch.Tensor:
                return False  # nothing present, or not a tensor: the careful planner
            # Empty along the padded dimension (``dims``, else the first: where that is not
            # the one whose sizes differ, two then differ and the careful planner pads).
            shape = list(present.shape)
            shape[0 if self.dim is None else self.dim] = 0
            empty = present.new_empty(shape)
            column = [empty if value is None else value for value in column]
        return super().run(column, fill, index)

    def sized(self, column: Sequence[torch.Tensor], shapes: list[torch.Size], fill: Fill) -> Part | None:
        n = len(shapes)
        if self.ndim == 1:
            dim = 0
            lengths = [shape[0] for shape in shapes]
            sizes = [max(lengths)]
        else:
            per_dim = list(zip(*shapes, strict=True))
            varying = [d for d, sizes_d in enumerate(per_dim) if len(set(sizes_d)) > 1]
            if self.dim is None:
                if len(varying) > 1:
                    return None  # several padded dimensions: the careful planner's mask
                dim = varying[0] if varying else 0
            else:
                dim = self.dim
                if any(d != dim for d in varying):
                    return None  # the careful planner names the dimension that differs
            lengths = list(per_dim[dim])
            sizes = [max(sizes_d) for sizes_d in per_dim]
        longest = sizes[dim]
        policy = self.policy
        if policy.max_length is not None:
            if longest > policy.max_length:
                return None  # truncated, or an error naming the sample: carefully
            longest = policy.max_length
        sizes[dim] = policy._round(longest)
        node = place(fill, next(iter(self.dtypes)), (n, *sizes))
        payload = (column, lengths, dim)
        extras: list[tuple[str, TensorSpec]] = []
        if self.lengths_name is not None:
            lengths_spec = place(fill, torch.int64, (n,))
            fill.tasks.append((fill_numbers, lengths_spec, lengths, None))
            extras.append((self.lengths_name, lengths_spec))
        if self.mask_name is None:
            fill.tasks.append((self.fill_values, node, payload, None))
        else:
            mask = place(fill, torch.bool, (n, sizes[dim]))
            # One copy writes both: the mask says where the values go.
            fill.tasks.append((self.fill_both, Regions(node, mask), payload, None))
            extras.append((self.mask_name, mask))
        return Part(node, tuple(extras))


class ListRecipe(Recipe):
    """Per-sample tensors: stacked where this batch's shapes agree (no policy), else a list.

    The list lies in one region, each value starting aligned; one ``torch.cat`` fills it
    and each value's tensor is made over its bytes. With ``missing`` (``missing="none"``)
    an absent value is ``None`` in the list (and the batch is not stacked). A tensor
    subclass (``cls``) comes back as its class: each value wrapped as its leaf handler
    says, with its own metadata (a box's format and canvas size) where it has some.
    """

    __slots__ = ("missing", "per_value", "stacks", "wrap")

    def __init__(self, dtype: torch.dtype, ndim: int, stacks: bool, missing: bool = False, cls: type = torch.Tensor):
        super().__init__(dtype, ndim, cls)
        self.missing = missing
        handler = lookup(cls) if cls is not torch.Tensor else None
        #: How a value's view becomes its class (``None``: a plain tensor), and whether
        #: that depends on the value (metadata) or only on the class.
        self.wrap = None if handler is None else handler.wrap
        self.per_value = handler is not None and handler.meta is not None
        self.stacks = stacks and (handler is None or handler.stackable)

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool:
        if not (self.missing and any(value is None for value in column)):
            return super().run(column, fill, index)
        absent = [i for i, value in enumerate(column) if value is None]
        present = [value for value in column if value is not None]
        shapes = self.shapes(present) if present else None
        if shapes is None:
            return False  # all absent, or not what the recipe takes: the careful planner
        fill.parts[index] = self.sized(present, shapes, fill, absent)
        return True

    def sized(
        self, column: Sequence[torch.Tensor], shapes: list[torch.Size], fill: Fill, absent: Sequence[int] = ()
    ) -> Part:
        dtype = next(iter(self.dtypes))
        first = shapes[0]
        distinct = set(shapes)  # torch.Size hashes as a tuple: one C-level pass
        wrap = self.wrap
        if self.stacks and not absent and len(distinct) == 1:
            stacked = place(fill, dtype, (len(shapes), *first), None if wrap is None else wrap(column[0]))
            fill.tasks.append((stack_tensors, stacked, column, None))
            return Part(stacked)
        wraps: Sequence[Wrap | None] | None = None
        if wrap is not None:
            wraps = tuple(map(wrap, column)) if self.per_value else (wrap(column[0]),) * len(column)
        trailing: tuple[int, ...] = tuple(first[1:])
        itemsize = dtype.itemsize
        width: int = math.prod(trailing)
        if width and (self.ndim == 1 or len({shape[1:] for shape in distinct}) == 1):
            # Rows of one width: the region is (rows, *trailing), split along its rows.
            counts = list(map(_FIRST, shapes))
            step = pitch(1, width * itemsize)  # each value's rows round up to this
            shapes_out = None
        else:
            counts = [math.prod(tuple(shape)) for shape in shapes]
            step = ALIGN // itemsize
            trailing = ()
            column = [value.reshape(-1) for value in column]
            shapes_out = tuple(tuple(shape) for shape in shapes)
        gaps = [-count % step for count in counts]
        split = list(itertools.chain.from_iterable(zip(counts, gaps, strict=True)))
        zeros = _zeros(dtype, trailing, step)
        # Each value, then its gap's zeros; no empty piece (one is cat's slow path, see nonempty).
        pieces = [
            piece
            for value, count, gap in zip(column, counts, gaps, strict=True)
            for piece in ((value, zeros[gap]) if gap else (value,) if count else ())
        ] or [column[0]]
        region = place(fill, dtype, (sum(split), *trailing))
        fill.tasks.append((concat_tensors, region, pieces, None))
        return Part(SplitSpec(region, split, shapes_out, absent, wraps))  # type: ignore[arg-type]  # a subclass's wrap is a Wrap


class RowsRecipe(Recipe):
    """``PerSample()`` of mappings of plain tensors (detection targets: boxes, labels, masks).

    Every sample's mapping is of one class with one key order; each key's values, one per
    sample, are placed as a per-sample list is (:class:`ListRecipe`), and the batch holds
    one mapping per sample over them.
    """

    __slots__ = ("cls", "columns", "gather", "keys", "types")

    def __init__(self, cls: type, keys: Sequence[Hashable], columns: Sequence[ListRecipe]):
        first = columns[0]
        super().__init__(next(iter(first.dtypes)), first.ndim)
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
        shapes = [recipe.shapes(values) for recipe, values in zip(self.columns, columns, strict=True)]
        if any(found is None for found in shapes):
            return False
        splits = []
        for recipe, values, found in zip(self.columns, columns, shapes, strict=True):
            part = recipe.sized(values, found, fill)  # type: ignore[arg-type]
            assert part is not None and isinstance(part.node, SplitSpec)  # per-sample lists never stack
            splits.append(part.node)
        fill.parts[index] = Part(RowsSpec(self.cls, self.keys, splits))
        return True


def _rows_recipe(column: Sequence[Any]) -> Recipe | None:
    """A ``PerSample()`` recipe for mappings of one class and key order whose values are tensors.

    Each key's values are plain tensors, or of one subclass kept as its class
    (torchvision's ``BoundingBoxes`` and ``Mask`` in detection targets).
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
        described = kept_tensors([value[key] for value in column])
        if described is None:
            return None
        dtype, ndim, kept = described
        columns.append(ListRecipe(dtype, ndim, stacks=False, cls=kept))
    return RowsRecipe(cls, keys, columns)


@functools.lru_cache(maxsize=256)
def _zeros(dtype: torch.dtype, trailing: tuple[int, ...], step: int) -> tuple[torch.Tensor, ...]:
    """Rows of zeros that fill the gap after a value, by the gap's length (0 to ``step - 1``)."""
    zeros = torch.zeros((step, *trailing), dtype=dtype)
    return tuple(zeros[:gap] for gap in range(step))


def recipe_for(column: Sequence[Any], policy: Policy | None, name: Hashable, missing: bool = False) -> Recipe | None:
    """The recipe for a ragged field first seen as ``column``, or ``None`` to plan it carefully each time.

    Columns of plain tensors of one dtype and one rank (at least 1), as they are or once
    converted (Python number lists under a policy that reads them as sequences, numpy
    arrays), get one under no policy, ``AsList``/``PerSample``, ``Pad`` (one padded
    dimension, a pad value that fits the dtype), ``Concat`` and ``Jagged`` (``missing``:
    absent item lists are no items); so do ``PerSample()`` mappings of such columns.
    """
    as_tensors = converted(column, policy)
    if as_tensors is not None:  # token ids as Python lists, numpy arrays: converted for each batch
        tensors, wrap = as_tensors
        inner = recipe_for(tensors, policy, name)
        return None if inner is None else wrap(inner)
    if type(policy) is Concat or type(policy) is Jagged:
        assert isinstance(policy, Concat)
        return concat_recipe(column, policy, name, missing)
    if type(policy) is PerSample and column and kind_of(column[0]) is MAPPING:
        return _rows_recipe(column)
    if missing and (policy is None or type(policy) in (Pad, AsList, PerSample)):
        column = [value for value in column if value is not None]  # absent: empty rows, or None in lists
    if policy is None or type(policy) in (AsList, PerSample):
        kept = kept_tensors(column)
        if kept is None:
            return None
        return ListRecipe(kept[0], kept[1], stacks=policy is None, missing=missing, cls=kept[2])
    described = plain_tensors(column)
    if described is None:
        return None
    dtype, ndim = described
    if type(policy) is Pad:
        assert isinstance(policy, Pad)
        dims = policy.dims
        if dims is not None and (len(dims) != 1 or not -ndim <= dims[0] < ndim):
            return None
        if not fits(policy.value, dtype):
            return None
        return PadRecipe(dtype, ndim, policy, name, missing)
    return None
