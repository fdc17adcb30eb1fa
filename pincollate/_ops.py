"""The ops of a cached plan: per field, gather the column, check it, queue one copy.

An op mirrors one node of the cached Layout. It checks what the plan relies on at C
speed (``set(map(type, column))``, one dtype read per tensor, sample 0's shape; the
other shapes are compared by ``torch.stack`` as it copies) and raises
:class:`~pincollate._fill.Mismatch` where the batch differs. Fields that agree in
one container are gathered with one ``itemgetter`` per sample and stacked as
blocks: one call for all the plain tensors of one dtype and shape, one numpy
assignment for all the numbers of one type.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ._errors import CollateError
from ._fill import Fill, Filler, Mismatch
from ._layout import Part, TensorSpec


class Recipe(Protocol):
    """A ragged field's sizes-only plan (:mod:`._ragged`), as a careful op runs it."""

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool: ...


__all__ = [
    "TENSOR_DTYPE",
    "TENSOR_SHAPE",
    "BlockOp",
    "CarefulOp",
    "DataclassOp",
    "MappingOp",
    "NumbersOp",
    "Op",
    "SequenceOp",
    "StackOp",
    "ValueOp",
    "fits_int64",
]

Path = tuple[Hashable, ...]

#: The dtype getters, called at C speed by ``map``.
TENSOR_DTYPE: Callable[[Any], Any] = torch.Tensor.dtype.__get__  # type: ignore[attr-defined]
TENSOR_SHAPE: Callable[[Any], Any] = torch.Tensor.shape.__get__  # type: ignore[attr-defined]
ARRAY_DTYPE: Callable[[Any], Any] = np.ndarray.dtype.__get__


def fits_int64(value: int) -> bool:
    """Whether a Python int fits the ``int64`` a column of ints becomes."""
    return -(2**63) <= value < 2**63


class Op:
    """One node of a cached plan: gathers its column from the samples and queues copies.

    ``lists``: whether the op needs its column as a list (it may keep it), where a
    parent would hand it a tuple.
    """

    __slots__ = ("path",)
    lists = False

    def __init__(self, path: Path):
        self.path: Path = path

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        raise NotImplementedError

    def blame(self, payload: Any) -> tuple[Path, ...]:
        """The key paths to plan carefully when this op's queued copy failed."""
        return (self.path,)


_PLAIN = frozenset((torch.Tensor,))


def _stack(region: torch.Tensor, values: Sequence[torch.Tensor]) -> None:
    torch.stack(values, out=region)  # type: ignore[arg-type]


class StackOp(Op):
    """A column stacked into one tensor spec.

    Every value must be exactly of class ``cls`` (a subclass keeps its own class, so
    it is another plan), ``key(value)`` (a dtype, read at C speed) must be
    ``expected`` for every value, and sample 0 must have ``shape`` (``None``:
    numbers); ``torch.stack`` compares the other shapes with it as it copies.
    """

    __slots__ = ("expected", "fill", "key", "shape", "spec", "types")

    def __init__(
        self,
        path: Path,
        spec: TensorSpec,
        cls: type,
        fill: Filler,
        key: Callable[[Any], Any] | None,
        expected: Any,
        shape: tuple[int, ...] | None,
    ):
        super().__init__(path)
        self.spec: TensorSpec = spec
        self.types = frozenset((cls,))
        self.fill: Filler = fill
        self.key: Callable[[Any], Any] | None = key
        self.expected = frozenset((expected,))
        self.shape: tuple[int, ...] | None = shape

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        try:
            if (
                set(map(type, column)) != self.types
                or (self.key is not None and set(map(self.key, column)) != self.expected)
                or (self.shape is not None and column[0].shape != self.shape)
            ):
                raise Mismatch(self.path)
        except (TypeError, AttributeError, RuntimeError):  # the dtype getter on something else; a nested tensor
            raise Mismatch(self.path) from None
        fill.tasks.append((self.fill, self.spec, column, self))


class BlockOp(Op):
    """Plain-tensor fields of one dtype and shape in one container, stacked as one block.

    Field ``j`` is rows ``j * B`` to ``(j + 1) * B`` of the block: one ``torch.stack``
    and one dtype pass for all of them, and still one contiguous tensor per field.
    ``index`` says where the parent's columns of these fields are.
    """

    __slots__ = ("block", "dtype", "index", "pad", "paths", "shape")

    def __init__(
        self,
        path: Path,
        paths: Sequence[Path],
        index: Sequence[int],
        block: TensorSpec,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        pad: int = 0,
    ):
        super().__init__(path)
        self.paths = tuple(paths)
        self.index = tuple(index)
        self.block: TensorSpec = block
        self.dtype = frozenset((dtype,))
        self.shape: tuple[int, ...] = shape
        # Rows stacked after each field so that the next one starts aligned.
        self.pad: tuple[torch.Tensor, ...] = (torch.zeros(shape, dtype=dtype),) * pad

    def run(self, columns: Sequence[Sequence[Any]], fill: Fill) -> None:
        if self.pad:
            values: list[Any] = []
            for column in columns:
                values += column
                values += self.pad
        else:
            values = list(itertools.chain.from_iterable(columns))
        try:
            # Exact classes first: a tensor subclass passes the dtype getter.
            ok = (
                set(map(type, values)) == _PLAIN
                and set(map(TENSOR_DTYPE, values)) == self.dtype
                and all(column[0].shape == self.shape for column in columns)
            )
        except TypeError:
            ok = False
        if not ok:
            raise Mismatch(*self.blame(values))
        fill.tasks.append((_stack, self.block, values, self))

    def blame(self, payload: Any) -> tuple[Path, ...]:
        rows = len(payload) // len(self.paths)
        n = rows - len(self.pad)
        bad = []
        for j, path in enumerate(self.paths):
            column = payload[j * rows : j * rows + n]
            if not all(type(v) is torch.Tensor and v.dtype in self.dtype and v.shape == self.shape for v in column):
                bad.append(path)
        return tuple(bad) or self.paths


class ValueOp(Op):
    """A column of strings, bytes or ``None`` returned as the samples' own list."""

    __slots__ = ("index", "types")
    lists = True

    def __init__(self, path: Path, index: int, cls: type):
        super().__init__(path)
        self.index: int = index
        self.types = frozenset((cls,))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if set(map(type, column)) != self.types:
            raise Mismatch(self.path)
        fill.values[self.index] = column


def _fill_block(region: torch.Tensor, rows: list[Any]) -> None:
    # One numpy assignment for every number field of one type: rows are samples; each
    # field's row is padded to start aligned, and the padding is left as it is.
    region.numpy().reshape(len(rows[0]), -1)[:, : len(rows)].T[...] = rows


def _fill_one_field(region: torch.Tensor, values: list[Any]) -> None:
    # A block of one number field: its values are the block's first row.
    region.numpy()[: len(values)] = values


class NumbersOp(Op):
    """Number fields of one Python type in one mapping, filled as the rows of one block."""

    __slots__ = ("block", "get", "keys", "types")

    def __init__(self, path: Path, cls: type, keys: Sequence[Hashable], block: TensorSpec):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.keys = tuple(keys)
        self.block: TensorSpec = block
        # One C-level call per sample gathers its row (a tuple, or one value).
        self.get = operator.itemgetter(*self.keys)

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        rows = list(map(self.get, column))
        if len(self.keys) == 1:
            if set(map(type, rows)) != self.types:
                raise Mismatch(self.path + self.keys)
            fill.tasks.append((_fill_one_field, self.block, rows, self))
            return
        if set(map(type, itertools.chain.from_iterable(rows))) != self.types:
            raise Mismatch(*self.blame(rows))
        fill.tasks.append((_fill_block, self.block, rows, self))

    def blame(self, payload: Any) -> tuple[Path, ...]:
        # A type that differs, or an int beyond int64 (the copy overflowed).
        if len(self.keys) == 1:
            payload = [(value,) for value in payload]
        bad = [
            (*self.path, key)
            for j, key in enumerate(self.keys)
            if {type(row[j]) for row in payload} != self.types
            or any(type(row[j]) is int and not fits_int64(row[j]) for row in payload)
        ]
        return tuple(bad) or tuple((*self.path, key) for key in self.keys)


class _Fields(Op):
    """A container's fields: single ops by column, block ops by columns.

    Columns come as tuples; a mapping's strings come back as lists, as in
    ``default_collate``, a sequence's as zip's tuples.
    """

    __slots__ = ("blocks", "singles")
    as_lists = False

    def __init__(self, path: Path, singles: Sequence[tuple[int, Op]], blocks: Sequence[BlockOp]):
        super().__init__(path)
        self.singles = tuple((index, op, self.as_lists and op.lists) for index, op in singles)
        self.blocks = tuple(blocks)

    def fields(self, columns: Sequence[Sequence[Any]], fill: Fill) -> None:
        for index, op, as_list in self.singles:
            column = columns[index]
            op.run(list(column) if as_list else column, fill)
        for block in self.blocks:
            block.run([columns[index] for index in block.index], fill)


class MappingOp(_Fields):
    """A mapping of one type and one key set; fields by key, number blocks after.

    Sample 0's keys must be the plan's, in order and of the same types (``True`` is
    not ``1``): the output takes its key order from sample 0, as ``default_collate``.
    ``gathered`` are the keys whose columns the single and block ops index.
    """

    __slots__ = ("gather", "key_types", "keys", "numbers", "single", "sizes", "types")
    as_lists = True

    def __init__(
        self,
        path: Path,
        cls: type,
        keys: Sequence[Hashable],
        gathered: Sequence[Hashable],
        singles: Sequence[tuple[int, Op]],
        blocks: Sequence[BlockOp],
        numbers: Sequence[NumbersOp],
    ):
        super().__init__(path, singles, blocks)
        self.types = frozenset((cls,))
        self.keys = tuple(keys)
        self.key_types = tuple(map(type, self.keys))
        # One C-level call per sample gathers its row; zip turns rows into columns. A
        # single key's column is gathered directly.
        self.gather: Callable[[Any], Any] | None = operator.itemgetter(*gathered) if gathered else None
        self.single = len(gathered) == 1
        self.numbers = tuple(numbers)
        self.sizes = frozenset((len(self.keys),))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        # One type and one size everywhere, and every key found: the key sets agree.
        first = column[0]
        if (
            set(map(type, column)) != self.types
            or set(map(len, column)) != self.sizes
            or tuple(first) != self.keys
            or tuple(map(type, first)) != self.key_types
        ):
            raise Mismatch(self.path)
        try:
            if self.single:
                self.fields((list(map(self.gather, column)),), fill)  # type: ignore[arg-type]
            elif self.gather is not None:
                self.fields(list(zip(*map(self.gather, column), strict=True)), fill)
            for numbers in self.numbers:
                numbers.run(column, fill)
        except KeyError:
            raise Mismatch(self.path) from None


class SequenceOp(_Fields):
    """Sequences (or namedtuples) of one type and length, transposed position by position."""

    __slots__ = ("sizes", "types")

    def __init__(self, path: Path, cls: type, size: int, singles: Sequence[tuple[int, Op]], blocks: Sequence[BlockOp]):
        super().__init__(path, singles, blocks)
        self.types = frozenset((cls,))
        self.sizes = frozenset((size,))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if set(map(type, column)) != self.types or set(map(len, column)) != self.sizes:
            raise Mismatch(self.path)
        # zip's tuples, as default_collate: a column of strings comes back as one.
        self.fields(list(zip(*column, strict=True)), fill)


class DataclassOp(Op):
    """Dataclass instances of one type, field by field."""

    __slots__ = ("children", "types")

    def __init__(self, path: Path, cls: type, children: Sequence[tuple[str, Op]]):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.children = tuple((operator.attrgetter(name), op) for name, op in children)

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if set(map(type, column)) != self.types:
            raise Mismatch(self.path)
        for get, op in self.children:
            op.run(list(map(get, column)), fill)


class CarefulOp(Op):
    """A field planned anew for each batch by the careful planner (ragged, policies).

    ``siblings`` are the keys of the parent mapping, beside which the policy's extra
    outputs go; ``None`` where the parent has no keys to put them beside.
    """

    __slots__ = ("index", "recipe", "siblings")
    lists = True

    def __init__(self, path: Path, index: int, siblings: frozenset[Hashable] | None, recipe: Recipe | None = None):
        super().__init__(path)
        self.index: int = index
        self.siblings: frozenset[Hashable] | None = siblings
        #: The field's sizes-only plan (:mod:`._ragged`), tried first; its output names
        #: were checked against ``siblings`` when it was made.
        self.recipe: Recipe | None = recipe

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if self.recipe is not None and self.recipe.run(column, fill, self.index):
            return
        node, extras = fill.planner.plan(column, self.path)
        if extras:
            if self.siblings is None:
                raise CollateError(
                    f"the policy for this field returns {sorted(extras)}, which need a parent mapping; set their *_key arguments to None",
                    path=self.path,
                )
            for name in extras:
                if name in self.siblings:
                    raise CollateError(
                        f"the extra output {name!r} of field {self.path[-1]!r} clashes with an existing key",
                        path=self.path[:-1],
                    )
        spec = fill.place(node)
        fill.parts[self.index] = Part(spec, tuple((name, fill.place(extra)) for name, extra in extras.items()))
