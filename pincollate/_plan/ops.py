"""The nodes of a cached plan for leaves: what each field's compiled code checks, and its copy.

A node mirrors one node of the cached Layout. Its compiled code (:mod:`pincollate._plan.codegen`)
checks what the plan relies on at C speed (``set(map(type, column))``, one dtype read per
tensor, sample 0's shape; the other shapes are compared by ``torch.stack`` as it copies)
and raises :class:`~pincollate._plan.fill.Mismatch` where the batch differs. Fields that
agree in one container are stacked as blocks: one call for all the plain tensors of one
dtype and shape, one numpy assignment for all the numbers of one type. The nodes of
containers and of parts planned per batch are in :mod:`pincollate._plan.tree_ops`.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .._batch.layout import TensorSpec
from .._types.builtin import fill_numbers, fits_int64
from .fill import Filler

__all__ = [
    "FIRST",
    "HAS_TORCH_FUNCTION",
    "JOIN_BYTES",
    "PLAIN",
    "BlockOp",
    "NumbersOp",
    "Op",
    "StackOp",
    "ValueOp",
    "fill_block",
    "fill_one_field",
]

Path = tuple[Hashable, ...]

#: The first item of a sequence (a shape's leading size, a column's first value), read at C speed.
FIRST: Callable[[Any], Any] = operator.itemgetter(0)


class Op:
    """One node of a cached plan: what its compiled code checks, and where its copy goes.

    ``lists``: whether the node needs its column as a list (it may keep it), where a
    parent would hand it a tuple.
    """

    __slots__ = ("path",)
    lists = False

    def __init__(self, path: Path):
        self.path: Path = path

    def blame(self, payload: Any) -> tuple[Path, ...]:
        """The key paths to plan carefully when this op's copy (in the plan's generated function) failed."""
        return (self.path,)


#: The exact class of a plain tensor column, as ``set(map(type, column))`` reads it.
PLAIN = frozenset((torch.Tensor,))

#: Whether any item of a list has a ``__torch_function__`` of its own (a tensor subclass
#: but one that disables it, as ``nn.Parameter`` does; any object with one; every list while
#: a torch-function mode is on), at C speed: about eight times cheaper than reading each
#: item's class. A list without one holds only what ``torch.stack`` takes as plain tensors,
#: or what it refuses.
HAS_TORCH_FUNCTION: Callable[[Any], bool] = torch._C._has_torch_function


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


#: The largest value (bytes) whose dtype a block's copy checks instead of a read per value:
#: reading a small tensor's dtype costs about what copying it twice does.
JOIN_BYTES = 1024


def _stack_joined(region: torch.Tensor, values: list[torch.Tensor], *, dtype: torch.dtype) -> None:
    """Stack a block's values, then copy them in only if their promoted dtype is the block's.

    ``torch.stack`` into ``out=`` casts whatever it gets; without ``out=`` its result takes
    the promoted dtype of every value (its type-promotion fold). Each field's first value
    has the block's dtype (checked beforehand), and a promotion fold that leaves a dtype
    never comes back to it (``tests/test_ops.py`` checks that over this torch's every
    dtype), so a result of the block's dtype means every value promotes to it within its
    own field: exactly what ``torch.stack`` of that field alone, as ``default_collate``
    does, would give. A CUDA or sparse column stacks, and is refused here.
    """
    stacked = torch.stack(values)
    if stacked.dtype != dtype or not stacked.is_cpu or stacked.layout != torch.strided:
        raise TypeError(f"a block of {dtype} stacked as {stacked.dtype} on {stacked.device}, {stacked.layout}")
    region.copy_(stacked.view(region.shape))


class BlockOp(Op):
    """Plain-tensor fields of one dtype and shape in one container, stacked as one block.

    Field ``j`` is rows ``j * B`` to ``(j + 1) * B`` of the block: one ``torch.stack``
    for all of them, and still one contiguous tensor per field. ``index`` says where the
    parent's columns of these fields are. The dtype of every value is checked by reading
    it, or, for small values (at most :data:`JOIN_BYTES`), by the stack itself
    (:func:`_stack_joined`), which costs an extra copy of the block instead.
    """

    __slots__ = ("block", "dtype", "dtypes", "fill", "index", "joined", "pad", "paths", "shape", "shapes")

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
        self.dtype = dtype
        self.shape: tuple[int, ...] = shape
        self.dtypes = frozenset((dtype,))
        self.shapes = frozenset((torch.Size(shape),))
        self.joined = math.prod(shape) * dtype.itemsize <= JOIN_BYTES
        self.fill: Filler = functools.partial(_stack_joined, dtype=dtype) if self.joined else _stack
        # Rows stacked after each field so that the next one starts aligned.
        self.pad: tuple[torch.Tensor, ...] = (torch.zeros(shape, dtype=dtype, device="cpu"),) * pad

    def blame(self, payload: Any) -> tuple[Path, ...]:
        rows = len(payload) // len(self.paths)
        n = rows - len(self.pad)
        bad = []
        for j, path in enumerate(self.paths):
            column = payload[j * rows : j * rows + n]
            try:
                fits = all(type(v) is torch.Tensor and v.dtype == self.dtype and v.shape == self.shape for v in column)
            except RuntimeError:  # a nested tensor has no shape: the careful walk names it
                fits = False
            if not fits:
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


def fill_block(region: torch.Tensor, rows: list[Any]) -> None:
    # One numpy assignment for every number field of one type: rows are samples; each
    # field's row is padded to start aligned, and the padding is left as it is.
    region.numpy().reshape(len(rows[0]), -1)[:, : len(rows)].T[...] = rows


def fill_one_field(region: torch.Tensor, values: list[Any]) -> None:
    # A block of one number field: its values are the block's first row, filled as any numbers are.
    fill_numbers(region[: len(values)], values)


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
