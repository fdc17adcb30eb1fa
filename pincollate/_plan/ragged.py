"""Ragged fields planned once: per batch, only the sizes are read.

When the first batch of a structure shows a field planned per batch (ragged, or under
a policy) as plain tensors of one dtype and one rank (token ids, waveforms, boxes,
image patches: what ragged data almost always is), its plan keeps a *recipe*: the
field's policy, dtype, rank and output names, settled once, and the policy's size and
placement rules (:meth:`PadRecipe.measure`, :meth:`PadRecipe.placed`). The plan's generated
function (:mod:`pincollate._plan.codegen`) reads each batch's column by it: checked at C speed,
its sizes read, one copy per field (``Pad``: :func:`~pincollate._plan.padding.pad_1d`, the
walk's copy kernel). Per-sample lists, ``PerSample()`` mappings (detection targets) and lists
of items are in :mod:`pincollate._plan.listed`, ``Concat`` and ``Jagged`` in
:mod:`pincollate._plan.packed`; Python number lists and numpy arrays are converted first
(:mod:`pincollate._plan.recipe`). :func:`recipe_for` builds the recipe for the branch the
careful walk took with the field's first column: the walk alone chooses the policy.

A batch the recipe does not describe (another dtype, a missing value where none was planned)
leaves the generated function for the careful walk, which gives the same result for what it
can take and the error, with sample and key path, for what it cannot.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .._batch.layout import Part, TensorSpec
from .._batch.views import align, numpy_dtype
from .._errors import ITEMS
from .._types.builtin import NUMBER_TYPES, builtin, ints_fit_float64, number_dtype
from .._types.kinds import LISTS, MAPPING, kind_of
from .._types.leaves import lookup
from .careful import ITEMS_ROUTE, LEAVES, NUMBER_LISTS, PACKED_ITEMS, PER_SAMPLE, Planner, Route
from .fallback import FieldFallback
from .listed import ListRecipe, NumberItems, items_recipe
from .ops import FIRST
from .packed import concat_recipe
from .packing import Concat, Jagged
from .padding import Joined
from .policies import AsList, Pad, PerSample, Policy, Stack, Unpadded, pad_refusal
from .recipe import Arrays, NumberLists, Recipe, array_column, kept_tensors, number_tensor, plain_tensors
from .rows import per_sample_recipe

__all__ = ["MixedNumbers", "PadRecipe", "part_recipe", "recipe_for"]

Path = tuple[Hashable, ...]


class PadRecipe(Recipe):
    """``Pad`` over one dimension of plain tensors (the one whose sizes differ, or ``dims``).

    With ``missing`` (``missing="none"``) an absent value is an empty one: its row is all
    padding, its length 0.
    """

    __slots__ = ("dim", "left", "lengths_name", "mask_name", "missing", "policy")

    def __init__(self, dtype: torch.dtype, ndim: int, policy: Pad, name: Hashable, missing: bool = False):
        super().__init__(dtype, ndim)
        self.missing = missing
        self.policy = policy
        self.left = policy.side == "left"
        dims = None if policy.dims is None else tuple(d % ndim for d in policy.dims)
        self.dim: int | None = None if dims is None else dims[0]
        self.lengths_name = policy._extra_name(policy.lengths_key, name)
        self.mask_name = policy._extra_name(policy.mask_key, name)

    def extras(self) -> tuple[str, ...]:
        return tuple(name for name in (self.lengths_name, self.mask_name) if name is not None)

    def with_empties(self, column: Sequence[Any]) -> list[Any] | None:
        """``missing="none"``: each absent value an empty one (its row all padding, its length 0).

        Empty along the padded dimension (``dims``, else the first). ``None`` where the
        careful planner pads instead: nothing present, not a tensor, another rank; or, without
        ``dims``, a padded dimension other than the first (the one whose sizes differ among the
        values present: an empty first dimension would not make it differ, and the stand-in
        would take another's length).
        """
        present = next((value for value in column if value is not None), None)
        if type(present) is not torch.Tensor or present.dim() != self.ndim:
            return None
        if self.dim is None:
            shapes = [value.shape for value in column if type(value) is torch.Tensor]
            if any(len(set(sizes)) > 1 for sizes in list(zip(*shapes, strict=False))[1:]):  # ranks checked after
                return None
        shape = list(present.shape)
        shape[0 if self.dim is None else self.dim] = 0
        empty = present.new_empty(shape)
        return [empty if value is None else value for value in column]

    def measure(self, shapes: Sequence[torch.Size]) -> tuple[list[int], int, tuple[int, ...], bool] | None:
        """The policy's size rule (:meth:`~pincollate.Pad.measure`, the walk's too) for this recipe:
        the values' lengths, the padded dimension, the padded sizes of one value, and whether
        a value is longer than ``max_length`` (``truncate``: :func:`~pincollate._plan.padding.cut`
        cuts it, and its length, before the copy).

        ``None`` where the recipe does not describe the batch (several dimensions differ, or
        one that ``dims`` does not pad; a value longer than ``max_length`` without
        ``truncate``): the careful planner pads or names the sample. The compiled plan reads
        1-D values' sizes inline, by this rule.
        """
        try:
            dims, sizes, longer = self.policy.measure(shapes)
        except Unpadded:
            return None  # the careful planner names the dimension that differs
        if len(dims) != 1 or (longer and not self.policy.truncate):
            return None  # several padded dimensions (the careful planner's mask), or a value refused
        dim = dims[0]
        lengths = list(map(FIRST, shapes)) if dim == 0 else [shape[dim] for shape in shapes]
        return lengths, dim, tuple(sizes), bool(longer)

    def placed(self, offset: int, n: int, dim: int, sizes: tuple[int, ...]) -> tuple[Part, list[TensorSpec], int]:
        """The placement rule: the part at byte ``offset`` for ``n`` values padded to ``sizes``.

        Returns the part, its tensors in buffer order (the values, then the lengths and the
        mask where the policy asks for them) and the offset after them.
        """
        node = TensorSpec(self.dtype, (n, *sizes), offset)
        offset = align(offset + node.nbytes)
        specs = [node]
        extras: list[tuple[str, TensorSpec]] = []
        if self.lengths_name is not None:
            lengths = TensorSpec(torch.int64, (n,), offset)
            offset = align(offset + lengths.nbytes)
            specs.append(lengths)
            extras.append((self.lengths_name, lengths))
        if self.mask_name is not None:
            mask = TensorSpec(self.policy.mask_dtype, (n, sizes[dim]), offset)
            offset = align(offset + mask.nbytes)
            specs.append(mask)
            extras.append((self.mask_name, mask))
        return Part(node, tuple(extras)), specs, offset


class MixedNumbers(Recipe):
    """Python numbers of several types in one column (ints beside floats, as JSON gives them).

    One tensor of the dtype ``default_collate`` gives the column (:func:`number_dtype`: the
    first value's type decides, an int column takes what torch infers for all of it),
    filled by one numpy assignment. A sized plan reads that dtype inline, as its key
    (:meth:`dtype_of`); an int beyond ``int64`` goes to the careful planner, which names it.
    """

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(torch.float64, 0)  # the dtype is the batch's own

    @staticmethod
    def dtype_of(column: Sequence[Any]) -> torch.dtype | None:
        """The dtype of this batch's column, or ``None`` where the careful planner takes it.

        Python numbers only (a numpy scalar or a tensor among them: the walk), in a dtype numpy
        has (one assignment fills it), and every int representable where they become floats.

        Examples:
            >>> MixedNumbers.dtype_of([0.5, 1]), MixedNumbers.dtype_of([True, 2])
            (torch.float64, torch.int64)
            >>> MixedNumbers.dtype_of([0.5, 2**1100]) is None
            True
        """
        if not NUMBER_TYPES.issuperset(map(type, column)):
            return None
        try:
            dtype = number_dtype(column)
        except (OverflowError, RuntimeError, ValueError):  # an int beyond int64: torch.tensor cannot read it
            return None
        if numpy_dtype(dtype) is None:
            return None  # a default dtype numpy lacks (bfloat16): the walk copies it
        if dtype.is_floating_point and not ints_fit_float64(column):
            return None  # an int too large for a float: the careful planner names it
        return dtype

    @staticmethod
    def placed(offset: int, n: int, dtype: torch.dtype) -> tuple[Part, list[TensorSpec], int]:
        """The placement rule: ``n`` numbers of ``dtype`` at byte ``offset``; the part, its tensor and the offset after."""
        node = TensorSpec(dtype, (n,), offset)
        return Part(node), [node], align(offset + node.nbytes)


def part_recipe(planner: Planner, column: Sequence[Any], path: Path, keyed: bool = False) -> Recipe | None:
    """The recipe of the part at ``path`` first seen as ``column``: the walk's route, run at C speed; or ``None``.

    Items (several images per sample) get one where no field rule names them and no
    ``ragged=`` policy applies to them: the walk applies those to each item. Rows read
    from Arrow come joined (:class:`~pincollate._plan.padding.Joined`): the walk takes them
    one by one, the recipe whole.
    """
    route = planner.route(list(column.views()) if type(column) is Joined else column, path, keyed)
    if route is None:
        return None
    rules = planner.rules
    named = rules and rules.lookup((*path, ITEMS)) is not None
    items = None if named or planner.default is not None else planner.items
    fallback = planner.fallbacks.field(path) if route.policy is None else None
    return recipe_for(column, route, planner.renames.key(path), planner.missing, items, fallback)


def recipe_for(
    column: Sequence[Any],
    route: Route,
    name: Hashable,
    missing: bool = False,
    items: bool | None = None,
    fallback: FieldFallback | None = None,
) -> Recipe | None:
    """The recipe for a part first seen as ``column``, taken by the careful walk's ``route``; ``None``: walk each batch.

    The walk (:meth:`~pincollate._plan.careful.Planner.route`) chose the branch and the
    policy; a recipe only says whether it can run that choice at C speed: plain tensors of
    one dtype and one rank (at least 1), as they are or once converted (Python number
    lists, numpy arrays), listed, padded (one padded dimension, a pad value that fits the
    dtype), concatenated or jagged; ``PerSample()`` mappings and per-sample lists whose
    every place holds such tensors, numbers of one type or plain values
    (:mod:`pincollate._plan.rows`); Python
    numbers of several types (:class:`MixedNumbers`); per-sample lists of such tensors as
    items. ``items`` says whether lists are items (``sequences="items"``) or transposed
    where their lengths agree; ``None`` where a field rule names the items or ``ragged=``
    is set, which the walk then applies to each item. ``fallback`` reports a field
    without a policy that this batch lists (:mod:`.fallback`).
    """
    kind, policy = route
    if kind == LEAVES:
        return _leaves(column, policy, name, missing, fallback)
    if kind == NUMBER_LISTS:
        flat = number_tensor(column)
        inner = None if flat is None else _leaves(torch.split(flat, list(map(len, column))), policy, name)
        return None if inner is None else NumberLists(inner)
    if kind == PACKED_ITEMS:
        assert isinstance(policy, Concat)
        return concat_recipe(column, policy, name, missing)
    lists = bool(column) and type(column[0]) in LISTS  # per-sample lists: items, or a subtree's
    if kind == PER_SAMPLE:
        return per_sample_recipe(column) if lists or (bool(column) and kind_of(column[0]) is MAPPING) else None
    if kind == ITEMS_ROUTE and lists and items is not None:
        if policy is None:
            return items_recipe(column, items, fallback=fallback)
        if type(policy) is AsList and (numbers := NumberItems.of(column)) is not None:
            return numbers  # each sample's numbers one 1-D tensor
        if type(policy) in (AsList, Stack):
            return items_recipe(column, True, whole=type(policy) is Stack)  # a rule on the lists: always items
    return None


def _leaves(
    column: Sequence[Any],
    policy: Policy | None,
    name: Hashable,
    missing: bool = False,
    fallback: FieldFallback | None = None,
) -> Recipe | None:
    """The recipe for a column of tensors, arrays or numbers under ``policy`` (the walk's :data:`LEAVES` route)."""
    if (
        policy is None
        and column
        and len(types := set(map(type, column))) > 1
        and NUMBER_TYPES.issuperset(types)
        and all(builtin(cls, lookup(cls)) for cls in types)
    ):
        return MixedNumbers()
    as_tensors = array_column(column)
    if as_tensors is not None:  # numpy arrays: converted for each batch
        inner = _leaves(as_tensors, policy, name, fallback=fallback)
        return None if inner is None else Arrays(inner, column[0].dtype)
    if type(policy) is Concat or type(policy) is Jagged:
        assert isinstance(policy, Concat)
        return concat_recipe(column, policy, name, missing)
    if missing and (policy is None or type(policy) in (Pad, AsList, PerSample)):
        column = [value for value in column if value is not None]  # absent: empty rows, or None in lists
    if policy is None or type(policy) in (AsList, PerSample):
        unasked = fallback if policy is None else None
        kept = kept_tensors(column)
        if kept is None:
            return None
        return ListRecipe(kept[0], kept[1], stacks=policy is None, missing=missing, cls=kept[2], fallback=unasked)
    described = plain_tensors(column)
    if described is None:
        return None
    dtype, ndim = described
    if type(policy) is Pad:
        assert isinstance(policy, Pad)
        dims = policy.dims
        if dims is not None and (len(dims) != 1 or not -ndim <= dims[0] < ndim):
            return None
        if pad_refusal(policy.value, dtype) is not None:
            return None  # the walk names it
        return PadRecipe(dtype, ndim, policy, name, missing)
    return None
