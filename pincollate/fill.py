"""Filling a batch: what to copy where, decided per batch and kept apart from the Layout.

Two things produce fill work, and both end in the same task list:

* the **ops** of a cached plan (:mod:`.plans`), one per field of the cached Layout,
  which gather that field's column from the samples, check it at C speed against
  what the plan expects (one type, one dtype) and queue one copy;
* **planned nodes** of the careful planner (:mod:`.planner`) for fields planned anew
  for each batch: :class:`Slot` (a tensor filled by :class:`Segment` s),
  :class:`Value` and :class:`Tree`, turned into specs by :meth:`Fill.place`.

A queued copy that fails, or a column that does not match its op, raises
:class:`Mismatch` naming the key paths, and the batch is planned again.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import CollateError
from .layout import Part, Spec, TensorSpec, ValueSpec, Wrap, align

if TYPE_CHECKING:
    from .planner import Planner

__all__ = ["Fill", "Filler", "Mismatch", "Op", "Segment", "Slot", "Tree", "Value"]

Path = tuple[Hashable, ...]
Filler = Callable[[torch.Tensor, Any], None]

_TENSOR_DTYPE = torch.Tensor.dtype.__get__  # type: ignore[attr-defined]
_ARRAY_DTYPE = np.ndarray.dtype.__get__  # type: ignore[attr-defined]


class Mismatch(Exception):
    """A batch does not fit its cached plan at these key paths: plan it again."""

    def __init__(self, *paths: Path):
        super().__init__(paths)
        self.paths = paths


# --- planned nodes (careful planning, one batch) ---------------------------------------


class Segment:
    """One fill call: ``fill(region, payload)`` where ``region`` has ``shape``.

    ``start`` counts elements from the start of the owning slot. A *stacking*
    segment's payload is a list of values, one per index of the region's first
    dimension, so two adjacent stacking segments with one fill merge into one call.
    """

    __slots__ = ("fill", "payload", "shape", "stacking", "start")

    def __init__(self, start: int, shape: tuple[int, ...], fill: Filler, payload: Any, stacking: bool = False):
        self.start = start
        self.shape = shape
        self.fill = fill
        self.payload = payload
        self.stacking = stacking

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shifted(self, by: int) -> Segment:
        return Segment(self.start + by, self.shape, self.fill, self.payload, self.stacking)

    def follows(self, other: Segment) -> bool:
        """Whether this segment can be appended to ``other`` as one fill call."""
        return (
            self.stacking
            and other.stacking
            and self.fill is other.fill
            and self.shape[1:] == other.shape[1:]
            and other.start + other.numel == self.start
        )


class Slot:
    """A planned tensor: ``dtype``, ``shape`` and the segments that fill it.

    ``stackable=False`` keeps item semantics from stacking it with its siblings.
    """

    __slots__ = ("dtype", "segments", "shape", "stackable", "wrap")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], segments: list[Segment], wrap: Wrap | None = None, stackable: bool = True):
        self.dtype = dtype
        self.shape = shape
        self.segments = segments
        self.wrap = wrap
        self.stackable = stackable

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class Value:
    """A planned non-tensor output, returned as it is."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class Tree:
    """A planned container: ``make(child specs)`` gives its spec."""

    __slots__ = ("children", "make")

    def __init__(self, make: Callable[[list[Spec]], Spec], children: list[Node]):
        self.make = make
        self.children = children


Node = Slot | Value | Tree


# --- the per-batch fill ----------------------------------------------------------------


class Fill:
    """One batch's fill work: queued copies, non-tensor values and per-batch parts.

    ``offset`` is where the next per-batch tensor goes; after the ops ran it is the
    batch's buffer size.
    """

    __slots__ = ("offset", "parts", "planner", "tasks", "values")

    def __init__(self, planner: Planner, nvalues: int, nparts: int, offset: int):
        self.planner = planner
        self.tasks: list[tuple[Filler, TensorSpec, Any, Path | None]] = []
        self.values: list[Any] = [None] * nvalues
        self.parts: list[Part] = [None] * nparts  # type: ignore[list-item]
        self.offset = offset

    def place(self, node: Node) -> Spec:
        """Turn a planned node into specs at the next offsets, queueing its copies."""
        if type(node) is Slot:
            offset = self.offset
            self.offset = align(offset + node.nbytes)
            itemsize = node.dtype.itemsize
            for segment in node.segments:
                region = TensorSpec(node.dtype, segment.shape, offset + segment.start * itemsize)
                self.tasks.append((segment.fill, region, segment.payload, None))
            return TensorSpec(node.dtype, node.shape, offset, node.wrap)
        if type(node) is Value:
            self.values.append(node.value)
            return ValueSpec(len(self.values) - 1)
        return node.make([self.place(child) for child in node.children])  # type: ignore[union-attr]

    def execute(self, buffer: torch.Tensor) -> None:
        """Run every queued copy into ``buffer``.

        Raises:
            Mismatch: a cached plan's copy failed (a shape that differs, say).
        """
        typed: dict[torch.dtype, torch.Tensor] = {}
        with torch.no_grad():
            for fill, spec, payload, path in self.tasks:
                flat = typed.get(spec.dtype)
                if flat is None:
                    flat = typed[spec.dtype] = buffer.view(spec.dtype)
                region = flat.as_strided(spec.shape, spec._strides, spec._at)
                try:
                    fill(region, payload)
                except Exception as exc:
                    if path is not None:
                        raise Mismatch(path) from exc
                    raise CollateError(f"cannot copy values into the batch: {exc}") from exc


# --- ops: a cached plan's per-field work -------------------------------------------------


class Op:
    """One node of a cached plan: gathers its column from the samples and queues copies."""

    __slots__ = ("path",)

    def __init__(self, path: Path):
        self.path = path

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        raise NotImplementedError


def _one(values: Any, expected: frozenset[Any]) -> bool:
    return set(values) == expected


class StackOp(Op):
    """A column stacked into one tensor spec; ``key(column)`` must give one value."""

    __slots__ = ("expected", "fill", "key", "spec", "types")

    def __init__(self, path: Path, spec: TensorSpec, cls: type, fill: Filler, key: Callable[[Any], Any] | None, expected: Any):
        super().__init__(path)
        self.spec = spec
        self.types = frozenset((cls,))
        self.fill = fill
        self.key = key
        self.expected = frozenset((expected,))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        # Type and dtype in two C-level passes; torch.stack checks the shapes.
        if set(map(type, column)) != self.types or (self.key is not None and set(map(self.key, column)) != self.expected):
            raise Mismatch(self.path)
        fill.tasks.append((self.fill, self.spec, column, self.path))


def tensor_key(value: Any) -> Any:
    return _TENSOR_DTYPE(value)


def array_key(value: Any) -> Any:
    return _ARRAY_DTYPE(value)


class ValueOp(Op):
    """A column of strings, bytes or ``None`` returned as the samples' own list."""

    __slots__ = ("index", "types")

    def __init__(self, path: Path, index: int, cls: type):
        super().__init__(path)
        self.index = index
        self.types = frozenset((cls,))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if set(map(type, column)) != self.types:
            raise Mismatch(self.path)
        fill.values[self.index] = column


def _fill_block(region: torch.Tensor, rows: list[list[Any]]) -> None:
    # One numpy assignment for every number field of one type: rows are samples.
    region.numpy().T[...] = rows


class NumbersOp(Op):
    """Number fields of one Python type in one mapping, filled as the rows of one block."""

    __slots__ = ("block", "keys", "types")

    def __init__(self, path: Path, cls: type, keys: Sequence[Hashable], block: TensorSpec):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.keys = tuple(keys)
        self.block = block

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        keys = self.keys
        rows = [[sample[key] for key in keys] for sample in column]
        if set(map(type, itertools.chain.from_iterable(rows))) != self.types:
            bad = [(*self.path, key) for j, key in enumerate(keys) if {type(row[j]) for row in rows} != self.types]
            raise Mismatch(*bad)
        fill.tasks.append((_fill_block, self.block, rows, (*self.path, keys[0]) if len(keys) == 1 else self.path))


class MappingOp(Op):
    """A mapping of one type and one key set; children by key, number blocks after."""

    __slots__ = ("children", "numbers", "sizes", "types")

    def __init__(self, path: Path, cls: type, children: Sequence[tuple[Hashable, Op]], numbers: Sequence[NumbersOp]):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.children = tuple(children)
        self.numbers = tuple(numbers)
        self.sizes = frozenset((len(self.children) + sum(len(op.keys) for op in self.numbers),))

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        # One type and one size everywhere, and every key found: the key sets agree.
        if set(map(type, column)) != self.types or set(map(len, column)) != self.sizes:
            raise Mismatch(self.path)
        try:
            for key, op in self.children:
                op.run([sample[key] for sample in column], fill)
            for numbers in self.numbers:
                numbers.run(column, fill)
        except KeyError:
            raise Mismatch(self.path) from None


class SequenceOp(Op):
    """Sequences of one type and length, transposed position by position."""

    __slots__ = ("children", "sizes", "types")

    def __init__(self, path: Path, cls: type, children: Sequence[Op]):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.sizes = frozenset((len(children),))
        self.children = tuple(children)

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        if set(map(type, column)) != self.types or set(map(len, column)) != self.sizes:
            raise Mismatch(self.path)
        # zip's tuples, as default_collate: a column of strings comes back as one.
        for op, position in zip(self.children, zip(*column), strict=True):
            op.run(position, fill)


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

    __slots__ = ("index", "siblings")

    def __init__(self, path: Path, index: int, siblings: frozenset[Hashable] | None):
        super().__init__(path)
        self.index = index
        self.siblings = siblings

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        node, extras = fill.planner.plan(column, self.path)
        if extras:
            if self.siblings is None:
                raise CollateError(
                    f"the policy for this field returns {sorted(extras)}, which need a parent mapping; set their *_key arguments to None",
                    path=self.path,
                )
            for name in extras:
                if name in self.siblings:
                    raise CollateError(f"the extra output {name!r} of field {self.path[-1]!r} clashes with an existing key", path=self.path[:-1])
        spec = fill.place(node)
        fill.parts[self.index] = Part(spec, tuple((name, fill.place(extra)) for name, extra in extras.items()))
