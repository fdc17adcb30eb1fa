"""Per-sample lists planned once: ragged tensors listed (or stacked) per sample, and items.

:class:`ListRecipe` places a column of per-sample tensors (detection boxes; tensor
subclasses kept as their class) in one region: one ``torch.cat`` fills it and each
value's tensor is made over its own bytes; :mod:`pincollate._plan.rows` uses it for each tensor key of
``PerSample()`` mappings (detection targets). :class:`ItemsRecipe` takes per-sample lists
of items (several images of one prompt): each sample's items stacked where they agree,
the batch stacked where every sample's stack agrees.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._batch.layout import Part, Spec
from .._batch.list_specs import ItemsSpec, SplitSpec
from .._batch.views import ALIGN, pitch
from .._types.builtin import concat_tensors, stack_tensors
from .._types.kinds import LISTS
from .._types.leaves import lookup
from .._types.wrap import Wrap
from .fallback import FieldFallback
from .fill import Fill
from .ops import FIRST
from .recipe import Recipe, place, plain_tensors

__all__ = [
    "FLAT",
    "ItemsRecipe",
    "ListRecipe",
    "NumberItems",
    "aligned_pieces",
    "gaps_to",
    "items_recipe",
    "number_items",
    "zero_rows",
]


class ListRecipe(Recipe):
    """Per-sample tensors: stacked where this batch's shapes agree (no policy), else a list.

    The list lies in one region, each value starting aligned; one ``torch.cat`` fills it
    and each value's tensor is made over its bytes. With ``missing`` (``missing="none"``)
    an absent value is ``None`` in the list (and the batch is not stacked). A tensor
    subclass (``cls``) comes back as its class: each value wrapped as its leaf handler
    says, with its own metadata (a box's format and canvas size) where it has some.
    """

    __slots__ = ("fallback", "missing", "per_value", "stacks", "wrap")

    def __init__(
        self,
        dtype: torch.dtype,
        ndim: int,
        stacks: bool,
        missing: bool = False,
        cls: type = torch.Tensor,
        fallback: FieldFallback | None = None,
    ):
        super().__init__(dtype, ndim, cls)
        self.missing = missing
        #: Where a field without a policy is listed because its shapes differ: warned once.
        self.fallback = fallback
        handler = lookup(cls) if cls is not torch.Tensor else None
        #: How a value's view becomes its class (``None``: a plain tensor), and whether
        #: that depends on the value (metadata) or only on the class.
        self.wrap = None if handler is None else handler.wrap
        self.per_value = handler is not None and handler.meta is not None
        self.stacks = stacks and (handler is None or handler.stackable)

    def listed(self, shapes: Sequence[torch.Size], absent: Sequence[int] = ()) -> None:
        """Where a field without a policy is listed because its values' ``shapes`` differ: warn, once."""
        if self.fallback is not None and not self.fallback.done:
            samples = [i for i in range(len(shapes) + len(absent)) if i not in absent]
            self.fallback(zip(samples, shapes, strict=True))

    def geometry(
        self, shapes: Sequence[torch.Size], distinct: set[torch.Size] | None = None
    ) -> tuple[list[int], int, tuple[int, ...], tuple[tuple[int, ...], ...] | None]:
        """The size rule of a list's region, the walk's and the compiled plan's: each value's rows, the
        step its rows round up to, the rows' trailing sizes, and the values' shapes where they lie flat.

        Rows of one width (values whose trailing sizes agree): the region is ``(rows, *trailing)``,
        split along its rows. Otherwise (trailing sizes that differ: images of several heights;
        values without elements) each value lies flat, its elements its rows, and is viewed
        back as its shape. ``distinct``: the set of ``shapes``, where the caller has it.

        Examples:
            >>> recipe = ListRecipe(torch.float32, 2, stacks=False)
            >>> recipe.geometry([torch.Size((3, 2)), torch.Size((1, 2))])
            ([3, 1], 8, (2,), None)
            >>> recipe.geometry([torch.Size((3, 2)), torch.Size((1, 4))])
            ([6, 4], 16, (), ((3, 2), (1, 4)))
        """
        trailing: tuple[int, ...] = tuple(shapes[0][1:])
        itemsize = self.dtype.itemsize
        width: int = math.prod(trailing)
        if width and (self.ndim == 1 or len(set(map(_TRAILING, distinct or shapes))) == 1):
            return list(map(FIRST, shapes)), pitch(1, width * itemsize), trailing, None
        return list(map(math.prod, shapes)), ALIGN // itemsize, (), tuple(map(tuple, shapes))

    def sized(
        self, column: Sequence[torch.Tensor], shapes: list[torch.Size], fill: Fill, absent: Sequence[int] = ()
    ) -> Part:
        dtype = self.dtype
        first = shapes[0]
        distinct = set(shapes)  # torch.Size hashes as a tuple: one C-level pass
        wrap = self.wrap
        if self.stacks and not absent and len(distinct) == 1:
            stacked = place(fill, dtype, (len(shapes), *first), None if wrap is None else wrap(column[0]))
            fill.tasks.append((stack_tensors, stacked, column))
            return Part(stacked)
        if self.stacks and len(distinct) > 1:
            self.listed(shapes, absent)
        wraps: Sequence[Wrap | None] | None = None
        if wrap is not None:
            if self.per_value:
                wraps = tuple(map(wrap, column))
            else:
                # One wrap for the class; none where it is listed plain (nn.Parameter, as stack gives it).
                first_wrap = wrap(column[0])
                wraps = None if first_wrap is None else (first_wrap,) * len(column)
        counts, step, trailing, shapes_out = self.geometry(shapes, distinct)
        if shapes_out is not None:
            column = list(map(FLAT, column))
        gaps = gaps_to(counts, step)
        split = list(itertools.chain.from_iterable(zip(counts, gaps, strict=True)))
        pieces = aligned_pieces(column, counts, gaps, zero_rows(dtype, trailing, step))
        region = place(fill, dtype, (sum(split), *trailing))
        fill.tasks.append((concat_tensors, region, pieces))
        return Part(SplitSpec(region, split, shapes_out, absent, wraps))  # type: ignore[arg-type]  # a subclass's wrap is a Wrap


class ItemsRecipe(Recipe):
    """Per-sample lists (or tuples) of plain tensors taken as items: several images of one prompt.

    As the careful planner's item semantics: a sample's items stacked where their shapes
    agree (one item: a stack of one), else listed; where every sample is stacked with one
    count and shape, the batch is one tensor ``(B, k, *shape)``. With ``items`` ``False``
    (``sequences="transpose"``, whose lists are items only where their lengths differ) a
    batch whose lists all have one length goes to the careful planner, which transposes it.
    ``whole`` is what a field rule asks of the batch: ``None`` (no rule) as above,
    ``False`` (``AsList()``) a per-sample list even where every sample agrees, ``True``
    (``Stack()``) the one tensor, and the careful planner's error where it cannot be.
    """

    __slots__ = ("fallback", "items", "whole")

    def __init__(
        self,
        dtype: torch.dtype,
        ndim: int,
        items: bool,
        whole: bool | None = None,
        fallback: FieldFallback | None = None,
    ):
        super().__init__(dtype, ndim)
        self.items = items
        self.whole = whole
        #: Where samples' items (no policy) are listed because they do not stack: warned once.
        self.fallback = fallback

    def placed(
        self,
        fill: Fill,
        flat: Sequence[torch.Tensor],
        units: list[tuple[int, ...]],
        groups: list[int],
        sizes: list[int],
        pieces: list[torch.Tensor],
    ) -> Spec:
        """The items ``flat`` listed (:meth:`units`'s) in one region of the batch, filled by one ``torch.cat``: their spec."""
        region = place(fill, self.dtype, (sum(sizes),))
        fill.tasks.append((concat_tensors, region, pieces))
        return ItemsSpec(SplitSpec(region, sizes, units), groups)

    def arranged(
        self, flat: Sequence[torch.Tensor], counts: Sequence[int], shapes: Sequence[torch.Size]
    ) -> tuple[tuple[int, ...] | None, list[tuple[int, ...]], list[int], list[int], list[torch.Tensor]] | None:
        """What the batch's items make: one tensor ``(B, k, *shape)``, or each sample's stack or items.

        Where every sample's items agree in count and shape and the field's rule allows
        (no rule, or ``Stack()``), the first is the stack's shape and the sizes are the whole
        region's (its pieces the items, flat); else ``None`` and :meth:`units`'s, with the
        warning of a field without a rule that is listed. ``None`` where ``Stack()`` asks for
        one tensor the items cannot make (the careful walk's error).
        """
        agreed = _agreed(counts, shapes)
        alike = None not in agreed and len(set(counts)) == 1 and len(set(agreed)) == 1
        if self.whole and not alike:
            return None
        if alike and self.whole is not False:
            shape = (len(counts), counts[0], *shapes[0])
            return shape, [], [], [math.prod(shape), 0], [item.reshape(-1) for item in flat]
        if self.fallback is not None and not self.fallback.done:
            self.fallback(_item_shapes(counts, agreed, shapes), items=True)
        return (None, *self.units(flat, counts, shapes, agreed))

    def units(
        self,
        flat: Sequence[torch.Tensor],
        counts: Sequence[int],
        shapes: Sequence[torch.Size],
        agreed: Sequence[torch.Size | None] | None = None,
    ) -> tuple[list[tuple[int, ...]], list[int], list[int], list[torch.Tensor]]:
        """The placement rule of listed items: each sample's items one unit where they agree, else one each.

        Returns each unit's shape (a sample's stack ``(k, *shape)``, or one item's), each
        sample's group (``-1``: its one stacked unit; else how many units its list holds), the
        sizes (a unit's elements, then the gap that aligns the next) and the pieces that one
        ``torch.cat`` copies (a unit's items flat, then its gap's zeros; nothing empty, but where
        every item is empty the first, flat: cat takes no empty list, and copies nothing from it).
        ``agreed``: the shape each sample's items agree on (``None``: they do not), where known.
        """
        if agreed is None:
            agreed = _agreed(counts, shapes)
        step = ALIGN // self.dtype.itemsize
        zeros = zero_rows(self.dtype, (), step)
        units: list[tuple[int, ...]] = []
        groups: list[int] = []
        sizes: list[int] = []
        pieces: list[torch.Tensor] = []

        def unit(shape: tuple[int, ...], items: Sequence[torch.Tensor], numel: int) -> None:
            units.append(shape)
            gap = -numel % step
            sizes.extend((numel, gap))
            if numel:
                pieces.extend(item.reshape(-1) for item in items)
            if gap:
                pieces.append(zeros[gap])

        start = 0
        for count, shape in zip(counts, agreed, strict=True):
            values = flat[start : start + count]
            if shape is not None:
                groups.append(-1)
                unit((count, *shape), values, count * math.prod(shape))
            else:
                groups.append(count)
                for item, item_shape in zip(values, shapes[start : start + count], strict=True):
                    unit(tuple(item_shape), (item,), math.prod(item_shape))
            start += count
        return units, groups, sizes, pieces or [flat[0].reshape(-1)]


def _agreed(counts: Sequence[int], shapes: Sequence[torch.Size]) -> list[torch.Size | None]:
    """Per sample: the shape its items agree on (it has some), else ``None``."""
    agreed: list[torch.Size | None] = []
    start = 0
    for count in counts:
        own = shapes[start : start + count]
        start += count
        agreed.append(own[0] if count and own.count(own[0]) == count else None)
    return agreed


def _item_shapes(
    counts: Sequence[int], agreed: Sequence[torch.Size | None], shapes: Sequence[torch.Size]
) -> list[tuple[int, tuple[int, ...]]]:
    """What a warning names of items that did not stack: two items of one sample that
    differ, else each sample's stack (an empty list as ``(0,)``).
    """
    start = 0
    for sample, (count, shape) in enumerate(zip(counts, agreed, strict=True)):
        if count and shape is None:
            return [(sample, tuple(own)) for own in shapes[start : start + count]]
        start += count
    return [
        (i, (count, *shape) if shape is not None else (0,))
        for i, (count, shape) in enumerate(zip(counts, agreed, strict=True))
    ]


#: The numbers a per-sample list of one Python number type is read as, and the dtype the walk
#: stacks each sample's numbers to (``default_collate``'s rule for a column of them).
_NUMBER_ITEMS = {int: (np.int64, torch.int64), float: (np.float64, torch.float64), bool: (np.bool_, torch.bool)}


def number_items(column: Sequence[Any], kind: type) -> list[torch.Tensor] | None:
    """Each sample's list of Python numbers of exactly ``kind`` as a 1-D tensor, views of one tensor of all.

    ``None`` where a value is not a list or tuple, a list is empty (an empty list to the walk),
    a number is of another class (the walk gives each sample its own numbers' dtype) or an int
    does not fit ``int64``: the careful planner takes those.

    Examples:
        >>> [t.tolist() for t in number_items([[1, 2], [3]], int)]
        [[1, 2], [3]]
        >>> number_items([[1, 2], [3.5]], int) is None
        True
    """
    if set(map(type, column)) - LISTS:
        return None
    lengths = list(map(len, column))
    if not all(lengths):
        return None
    flat = list(itertools.chain.from_iterable(column))
    if set(map(type, flat)) != {kind}:
        return None
    try:
        numbers = torch.from_numpy(np.array(flat, dtype=_NUMBER_ITEMS[kind][0]))
    except OverflowError:  # an int beyond int64: the careful error
        return None
    return list(torch.split(numbers, lengths))


class NumberItems(Recipe):
    """``AsList()`` of Python number lists (a variable number of labels per sample): each sample's numbers
    as a 1-D tensor, as the walk stacks them.

    Every number of a batch must be exactly ``kind`` (``int``, ``float`` or ``bool``), so every
    sample's tensor has the one dtype the walk gives it; :func:`number_items` reads them all at
    once and ``inner`` (a listed recipe of 1-D tensors) places them.
    """

    __slots__ = ("inner", "kind")

    def __init__(self, kind: type):
        dtype = _NUMBER_ITEMS[kind][1]
        super().__init__(dtype, 1)
        self.kind = kind
        self.inner = ListRecipe(dtype, 1, stacks=False)

    @staticmethod
    def of(column: Sequence[Any]) -> NumberItems | None:
        """The recipe for a first column of number lists (one number class, no empty list), or ``None``."""
        if set(map(type, column)) - LISTS:
            return None
        kinds = set(map(type, itertools.chain.from_iterable(column)))
        if len(kinds) != 1 or (kind := kinds.pop()) not in _NUMBER_ITEMS:
            return None
        return NumberItems(kind) if number_items(column, kind) is not None else None


def items_recipe(
    column: Sequence[Any], items: bool, whole: bool | None = None, fallback: FieldFallback | None = None
) -> Recipe | None:
    """An :class:`ItemsRecipe` for per-sample lists of plain tensors of one dtype and rank."""
    if set(map(type, column)) - LISTS:
        return None
    described = plain_tensors([item for value in column for item in value])
    return None if described is None else ItemsRecipe(*described, items, whole, fallback)


#: A value flattened (a list's values that lie flat in its region).
FLAT = operator.methodcaller("reshape", -1)
#: A shape's trailing sizes, at C speed.
_TRAILING = operator.itemgetter(slice(1, None))


def gaps_to(counts: Sequence[int], step: int) -> list[int]:
    """The rows of zeros after each value of ``counts`` rows, so that the next starts at a multiple of ``step``.

    Examples:
        >>> gaps_to([3, 4, 0], 4)
        [1, 0, 0]
    """
    return list(map(step.__rmod__, map(operator.neg, counts)))  # -count % step, at C speed


def aligned_pieces(
    values: Sequence[torch.Tensor], counts: Sequence[int], gaps: Sequence[int], zeros: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """What one ``torch.cat`` copies into a list's region: each value, then its gap's rows of ``zeros``.

    No empty piece: one would take cat off its fast path
    (:func:`~pincollate._plan.padding.nonempty`); where every value is empty, the first
    (``torch.cat`` takes no empty list, and copies nothing from it).
    """
    pieces: list[torch.Tensor] = []
    for value, count, gap in zip(values, counts, gaps, strict=True):
        if gap:
            pieces += (value, zeros[gap])
        elif count:
            pieces.append(value)
    return pieces or list(values[:1])


@functools.lru_cache(maxsize=256)
def zero_rows(dtype: torch.dtype, trailing: tuple[int, ...], step: int) -> tuple[torch.Tensor, ...]:
    """Rows of zeros that fill the gap after a value, by the gap's length (0 to ``step - 1``)."""
    zeros = torch.zeros((step, *trailing), dtype=dtype, device="cpu")
    return tuple(zeros[:gap] for gap in range(step))
