"""A ragged field's recipe: what its first batch settled, by which a plan's generated function reads it.

:class:`Recipe` holds the values' class, dtype and rank (the generated function checks a
column against them at C speed; :meth:`Recipe.shapes` is that check in Python, for the walk's
``PerSample()`` tensors) and its subclass (:mod:`pincollate._plan.ragged`,
:mod:`pincollate._plan.packed`, :mod:`pincollate._plan.listed`) the policy's size and placement
rules. Columns that are tensors only once converted (token ids as Python lists, numpy arrays)
get a recipe whose column is converted first (:class:`NumberLists`, :class:`Arrays`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from .._batch.layout import TensorSpec
from .._batch.views import align
from .._types.builtin import (
    ARRAY_DTYPE,
    NUMBER_TYPES,
    TENSOR_DTYPE,
    TENSOR_SHAPE,
    builtin,
    describe_tensors,
    numbers_tensor,
    plain_memory,
)
from .._types.kinds import LISTS
from .._types.leaves import lookup
from .._types.wrap import Wrap
from .fill import Fill
from .ops import PLAIN
from .padding import Joined

__all__ = [
    "PLAIN",
    "Arrays",
    "NumberLists",
    "Recipe",
    "array_column",
    "array_tensors",
    "concatenated_arrays",
    "holds_none",
    "kept_tensors",
    "number_tensor",
    "place",
    "plain_tensors",
]

_ARRAYS = frozenset((np.ndarray,))
_WRITEABLE: Any = operator.attrgetter("flags.writeable")


class Recipe:
    """What a part's first batch settled: the node the code generator reads the part by (its dtype,
    rank and class, its outputs' names), and the size and placement rules its subclass keeps.

    ``cls`` is the values' exact class: ``torch.Tensor``, or a tensor subclass kept as
    its class (torchvision's ``tv_tensors``, a user's subclass) by the recipes that
    list values per sample.
    """

    __slots__ = ("dtypes", "ndim", "subclass", "types")

    def __init__(self, dtype: torch.dtype, ndim: int, cls: type = torch.Tensor):
        self.dtypes = frozenset((dtype,))
        self.ndim = ndim
        self.types = frozenset((cls,))
        self.subclass = cls is not torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the values the recipe takes."""
        return next(iter(self.dtypes))

    def shapes(self, values: Sequence[Any]) -> list[torch.Size] | None:
        """The values' shapes if they are strided CPU tensors of the planned class, dtype and rank.

        A sparse, meta or accelerator tensor goes to the careful planner, which names it: the
        copies would refuse one with elements, but a recipe reshapes some values before any
        copy reads them, and none reads a value without elements.
        """
        if type(values) is Joined:  # plain tensors concatenated already: one dtype and rank, shapes from the lengths
            flat = values.flat
            fits = not self.subclass and flat.dtype in self.dtypes and flat.dim() == self.ndim
            return values.shapes() if fits else None
        try:
            if set(map(type, values)) != self.types:
                return None
            if self.subclass:
                # A subclass's own __torch_function__ would run for every dtype and shape read.
                with torch._C.DisableTorchFunctionSubclass():
                    return self._shapes(values)
            return self._shapes(values)
        except (TypeError, AttributeError, RuntimeError):  # a nested tensor has no shape
            return None

    def _shapes(self, values: Sequence[Any]) -> list[torch.Size] | None:
        if set(map(TENSOR_DTYPE, values)) != self.dtypes or not plain_memory(values):
            return None
        shapes = list(map(TENSOR_SHAPE, values))
        return shapes if set(map(len, shapes)) == {self.ndim} else None

    def extras(self) -> tuple[str, ...]:
        """The names of the outputs placed beside the field."""
        return ()

    def fits_beside(self, siblings: frozenset[Hashable] | None) -> bool:
        """Whether the extra outputs have a parent mapping and clash with none of its keys."""
        names = self.extras()
        return not names or (siblings is not None and not siblings.intersection(names))


def holds_none(values: Sequence[Any]) -> bool:
    """Whether any of ``values`` is ``None``, by identity at C speed (``None in values`` asks each
    value ``==``, which a numpy array answers element by element, and raises).

    Examples:
        >>> import numpy as np
        >>> holds_none([np.zeros(2), None]), holds_none([np.zeros(2)])
        (True, False)
    """
    return any(map(operator.is_, values, itertools.repeat(None)))


def plain_tensors(column: Sequence[Any]) -> tuple[torch.dtype, int] | None:
    """The dtype and rank of a column of plain strided tensors of one dtype and one rank (at least 1).

    ``None`` for anything else (an empty column, a subclass, a nested, sparse, quantized
    or non-CPU tensor, 0-d values): what the careful planner plans (or refuses) for each batch.
    """
    if not column or set(map(type, column)) != PLAIN or not builtin(torch.Tensor, lookup(torch.Tensor)):
        return None  # (a handler of the user's for torch.Tensor describes every value: the walk)
    return _described(column)


def kept_tensors(column: Sequence[Any]) -> tuple[torch.dtype, int, type] | None:
    """:func:`plain_tensors`, or a column of one tensor subclass the collate keeps as its class.

    The subclass's leaf handler (``tv_tensors`` are registered on first sight) must be a
    tensor one that says how a view is wrapped, copies as plain tensors are copied, and
    either stack values whose metadata agree (``Image``, ``Mask``, a user's subclass) or
    never stack them (``BoundingBoxes``).
    Returns the dtype, the rank and the class.
    """
    classes = set(map(type, column)) if column else set()
    if len(classes) != 1:
        return None
    cls = classes.pop()
    base = lookup(torch.Tensor)
    if not builtin(torch.Tensor, base):
        return None  # a handler of the user's for torch.Tensor describes every value: the walk
    if cls is not torch.Tensor:
        handler = lookup(cls)
        if (
            handler is None
            or base is None
            or handler.family != "tensor"
            or handler.wrap is None
            or (handler.meta is not None and handler.stackable)
            # Copied as plain tensors are: a handler of its own that copies otherwise keeps the careful walk.
            or handler.fill is not base.fill
            or handler.concat is not base.concat
        ):
            return None
    with torch._C.DisableTorchFunctionSubclass():
        described = _described(column)
    return None if described is None else (*described, cls)


def _described(column: Sequence[Any]) -> tuple[torch.dtype, int] | None:
    """The one dtype and rank (at least 1) of tensors the walk takes without a word (:func:`describe_tensors`), else ``None``."""
    described = describe_tensors(column)
    if described is None:
        return None
    dtypes, shapes = described
    ranks = set(map(len, shapes))
    if len(set(dtypes)) != 1 or len(ranks) != 1 or 0 in ranks:
        return None
    return dtypes[0], ranks.pop()


def place(fill: Fill, dtype: torch.dtype, shape: tuple[int, ...], wrap: Wrap | None = None) -> TensorSpec:
    """The next tensor of the batch's per-batch area, as :meth:`Fill.place` places one."""
    offset = fill.offset
    spec = TensorSpec(dtype, shape, offset, wrap)
    fill.offset = align(offset + spec.nbytes)
    return spec


def number_tensor(column: Sequence[Any]) -> torch.Tensor | None:
    """A column of lists (or tuples) of Python numbers as one flat tensor, or ``None``.

    ``torch.tensor`` of every number at once gives the dtype the careful planner gives
    such a column (it asks the same of all its numbers) and the values converted to it.
    Only exact ``list``/``tuple`` values of exact ``bool``/``int``/``float`` numbers, at
    least one in all, are taken: anything else (a missing value, a numpy scalar, an
    ``IntEnum``, a nested list) is left to the careful planner.
    """
    if set(map(type, column)) - LISTS:
        return None
    flat = list(itertools.chain.from_iterable(column))
    types = set(map(type, flat))
    if not flat or types - NUMBER_TYPES:
        return None
    try:
        return numbers_tensor(flat, types)
    except (OverflowError, RuntimeError, TypeError, ValueError):  # an int beyond int64: the careful error
        return None


class NumberLists(Recipe):
    """Token ids as Python lists (``datasets``, tokenizers, JSON): one ``torch.tensor`` per batch.

    The column becomes one flat tensor (:func:`number_tensor`), split into a view per
    sample, and ``inner`` (the recipe of a column of 1-D tensors of that dtype) places
    and copies it. A batch of another dtype, or of anything but number lists, goes to
    the careful planner.
    """

    __slots__ = ("inner",)

    def __init__(self, inner: Recipe):
        super().__init__(inner.dtype, 1)
        self.inner = inner

    def extras(self) -> tuple[str, ...]:
        return self.inner.extras()


def array_tensors(column: Sequence[Any], dtypes: frozenset[np.dtype[Any]] | None = None) -> list[torch.Tensor] | None:
    """A column of numpy arrays (of ``dtypes`` only, where given) as tensors over the same memory, or ``None``.

    Only exact, writeable ``ndarray`` s that ``torch.from_numpy`` takes (a numeric or bool
    dtype in this machine's byte order, no negative strides): read-only arrays, which it
    would warn about, and anything else go to the careful planner.
    """
    if set(map(type, column)) != _ARRAYS or not all(map(_WRITEABLE, column)):
        return None
    if dtypes is not None and set(map(ARRAY_DTYPE, column)) != dtypes:
        return None
    try:
        return list(map(torch.from_numpy, column))
    except (TypeError, ValueError, RuntimeError):
        return None


def concatenated_arrays(
    column: Sequence[Any], dtypes: frozenset[np.dtype[Any]] | None = None
) -> Sequence[torch.Tensor] | None:
    """A column of numpy arrays torch cannot view (read-only ones: an object store's rows) as tensors.

    One ``np.concatenate`` copies them into memory of their own (numpy reads a read-only
    array without a warning, where ``torch.from_numpy`` warns), split back into a view per
    array. The arrays must share a dtype (one of ``dtypes``, where given), a rank of at least
    one and their trailing dims; ``None`` for anything else, which the careful planner takes.
    """
    if not column or set(map(type, column)) != _ARRAYS:
        return None
    found = set(map(ARRAY_DTYPE, column))
    if len(found) != 1 or (dtypes is not None and found != dtypes):
        return None
    try:
        flat = torch.from_numpy(np.concatenate(column))
    except (TypeError, ValueError, RuntimeError):  # 0-d, other trailing dims, a dtype torch lacks
        return None
    return Joined(flat, list(map(len, column)))


class Arrays(Recipe):
    """Ragged numpy arrays (waveforms from soundfile or librosa, say): as tensors, then ``inner``.

    Each array becomes a tensor over its own memory (no copy), and ``inner`` (the recipe of
    that column of tensors) places and copies them. Read-only arrays (Ray Data's rows) are
    concatenated once instead (:func:`concatenated_arrays`). A batch of another numpy dtype,
    or of anything but arrays, goes to the careful planner.
    """

    __slots__ = ("arrays", "inner")

    def __init__(self, inner: Recipe, dtype: np.dtype[Any]):
        super().__init__(inner.dtype, inner.ndim)
        self.inner = inner
        self.arrays = frozenset((dtype,))

    def tensors(self, column: Sequence[Any]) -> Sequence[torch.Tensor] | None:
        """The column as tensors: over the arrays' own memory, or (read-only arrays) concatenated once; ``None``: not arrays of the planned dtype."""
        tensors: Sequence[torch.Tensor] | None = array_tensors(column, self.arrays)
        return concatenated_arrays(column, self.arrays) if tensors is None else tensors

    def extras(self) -> tuple[str, ...]:
        return self.inner.extras()


def array_column(column: Sequence[Any]) -> Sequence[torch.Tensor] | None:
    """A column of numpy arrays of one dtype as tensors (:func:`array_tensors`, else :func:`concatenated_arrays`); ``None`` for anything else."""
    tensors: Sequence[torch.Tensor] | None = array_tensors(column)
    if tensors is None or len(set(map(ARRAY_DTYPE, column))) != 1:
        tensors = concatenated_arrays(column)
    return tensors
