"""Filling a walked batch: what the careful walk copies where, kept apart from the Layout.

The careful planner (:mod:`pincollate._plan.careful`) plans the values it walks into nodes:
:class:`TensorNode` (a tensor filled by :class:`Segment` s), :class:`Value`, :class:`Tree` and
:class:`Listed`, which :meth:`Fill.place` turns into specs at the next offsets, queueing their
copies; :meth:`Fill.execute` then copies them into the batch's buffer. A plan's generated
function makes its own copies; it walks a part no recipe describes into a :class:`Fill`.
:class:`Mismatch` is how a batch that does not fit a cached plan says so, naming the key paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch

from .._batch.layout import Part, Spec, TensorSpec, ValueSpec
from .._batch.views import Bulk, Views, align
from .._errors import CollateError
from .._types.leaves import Filler
from .._types.wrap import Wrap

__all__ = [
    "ColumnPlanner",
    "Fill",
    "Filler",
    "Listed",
    "Mismatch",
    "Node",
    "Segment",
    "Target",
    "TensorNode",
    "Tree",
    "Value",
]

Path = tuple[Hashable, ...]


class Target(Protocol):
    """Where a queued copy writes: a :class:`~pincollate._batch.layout.TensorSpec`."""

    def region(self, views: Views) -> Any: ...


class ColumnPlanner(Protocol):
    """The careful planner (:class:`~pincollate._plan.careful.Planner`), as the fill calls it."""

    def plan(self, values: Sequence[Any], path: Path, keyed: bool = False) -> tuple[Node, dict[str, Node]]: ...


class Mismatch(Exception):
    """A batch does not fit its cached plan at these key paths: plan it again."""

    def __init__(self, *paths: Path):
        super().__init__(paths)
        self.paths: tuple[Path, ...] = paths


# --- planned nodes (careful planning, one batch) ---------------------------------------


class Segment:
    """One fill call: ``fill(region, payload)`` where ``region`` has ``shape``.

    ``start`` counts elements from the start of the owning slot. A *stacking*
    segment's payload is a list of values, one per index of the region's first
    dimension, so two adjacent stacking segments with one fill merge into one call.
    """

    __slots__ = ("fill", "payload", "shape", "stacking", "start")

    def __init__(self, start: int, shape: tuple[int, ...], fill: Filler, payload: Any, stacking: bool = False):
        self.start: int = start
        self.shape: tuple[int, ...] = shape
        self.fill: Filler = fill
        self.payload: Any = payload
        self.stacking: bool = stacking

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


class TensorNode:
    """A planned tensor: ``dtype``, ``shape`` and the segments that fill it.

    ``stackable=False`` keeps item semantics from stacking it with its siblings.
    """

    __slots__ = ("dtype", "segments", "shape", "stackable", "wrap")

    def __init__(
        self,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        segments: list[Segment],
        wrap: Wrap | None = None,
        stackable: bool = True,
    ):
        self.dtype: torch.dtype = dtype
        self.shape: tuple[int, ...] = shape
        self.segments: list[Segment] = segments
        self.wrap: Wrap | None = wrap
        self.stackable: bool = stackable

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
        self.value: Any = value


class Tree:
    """A planned container: ``make(child specs)`` gives its spec."""

    __slots__ = ("children", "make")

    def __init__(self, make: Callable[[list[Spec]], Spec], children: list[Node]):
        self.make: Callable[[list[Spec]], Spec] = make
        self.children: list[Node] = children


class Listed:
    """A planned per-sample list placed by ``place(fill)``, which returns its spec and queues its copies.

    What a column of the batch's tensors listed in one region becomes
    (:func:`~pincollate._plan.column.listed`): the compiled plan's size rule and copy, run by the walk.
    """

    __slots__ = ("place",)

    def __init__(self, place: Callable[[Fill], Spec]):
        self.place: Callable[[Fill], Spec] = place


Node = TensorNode | Value | Tree | Listed


# --- the per-batch fill ----------------------------------------------------------------


class Fill:
    """One walked batch's (or walked part's) fill work: queued copies, non-tensor values and parts.

    ``offset`` is where the next tensor goes; after the walk placed everything it is the
    end of what it placed.
    """

    __slots__ = ("bulk", "offset", "parts", "planner", "tasks", "values")

    def __init__(self, planner: ColumnPlanner, nparts: int, offset: int):
        #: Tensors :meth:`execute` makes at once (a layout's fixed ones), where the caller knows them.
        self.bulk: Bulk | None = None
        self.planner: ColumnPlanner = planner
        self.tasks: list[tuple[Filler, Target, Any]] = []
        self.values: list[Any] = []
        self.parts: list[Part] = [None] * nparts  # type: ignore[list-item]
        self.offset: int = offset

    def place(self, node: Node) -> Spec:
        """Turn a planned node into specs at the next offsets, queueing its copies."""
        if type(node) is TensorNode:
            offset = self.offset
            self.offset = align(offset + node.nbytes)
            itemsize = node.dtype.itemsize
            spec = TensorSpec(node.dtype, node.shape, offset, node.wrap)
            for segment in node.segments:
                # A segment that fills the whole slot writes into the slot's own view.
                whole = segment.start == 0 and segment.shape == node.shape
                region = spec if whole else TensorSpec(node.dtype, segment.shape, offset + segment.start * itemsize)
                self.tasks.append((segment.fill, region, segment.payload))
            return spec
        if type(node) is Value:
            self.values.append(node.value)
            return ValueSpec(len(self.values) - 1)
        if type(node) is Listed:
            return node.place(self)
        return node.make([self.place(child) for child in node.children])  # type: ignore[union-attr]

    def execute(self, buffer: torch.Tensor, pageable: bool = False) -> Views:
        """Run every queued copy into ``buffer``; returns the views it made, for building.

        ``pageable``: the caller knows ``buffer`` is plain host memory (a ``"plain"`` kind's).

        Raises:
            CollateError: a copy failed (what the walk checked let through: a value that changed).
        """
        views = Views(buffer, self.values, bulk=self.bulk, pageable=pageable)
        # Copies into the buffer are never part of a graph (``out=`` refuses one). The
        # switch itself, not torch.no_grad(): a context manager object per batch costs
        # more than a small batch's copy.
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            for fill, spec, payload in self.tasks:
                region = spec.region(views)
                try:
                    fill(region, payload)
                except Exception as exc:
                    raise CollateError(f"cannot copy values into the batch: {exc}") from exc
        finally:
            torch._C._set_grad_enabled(grad)
        return views
