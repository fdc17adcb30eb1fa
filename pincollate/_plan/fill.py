"""Filling a batch: what to copy where, decided per batch and kept apart from the Layout.

Two things queue fill work in a :class:`Fill`, and both end in its one task list:

* the **ops** of a cached plan (:mod:`pincollate._plan.ops`), which gather each field's column from
  the samples, check it at C speed and queue one copy;
* **planned nodes** of the careful planner (:mod:`pincollate._plan.careful`) for fields planned anew
  for each batch: :class:`TensorNode` (a tensor filled by :class:`Segment` s),
  :class:`Value` and :class:`Tree`, turned into specs by :meth:`Fill.place`.

:meth:`Fill.execute` then copies everything into the batch's buffer. A copy of a
cached plan that fails raises :class:`Mismatch` naming the key paths, and the batch
is planned again.
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
    "Owner",
    "Regions",
    "Segment",
    "Target",
    "TensorNode",
    "Tree",
    "Value",
]

Path = tuple[Hashable, ...]


class Target(Protocol):
    """Where a queued copy writes: a :class:`~pincollate._batch.layout.TensorSpec`, or :class:`Regions`."""

    def region(self, views: Views) -> Any: ...


class Regions:
    """Several tensors one copy writes (a padded field and its mask): their regions, as a tuple."""

    __slots__ = ("specs",)

    def __init__(self, *specs: TensorSpec):
        self.specs = specs

    def region(self, views: Views) -> tuple[torch.Tensor, ...]:
        return tuple(spec.region(views) for spec in self.specs)


class Owner(Protocol):
    """What queued a copy of a cached plan (an op of :mod:`pincollate._plan.ops`): it names the paths to blame."""

    def blame(self, payload: Any) -> tuple[Path, ...]: ...


class ColumnPlanner(Protocol):
    """The careful planner (:class:`~pincollate._plan.careful.Planner`), as the fill calls it."""

    def plan(self, values: Sequence[Any], path: Path) -> tuple[Node, dict[str, Node]]: ...


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
    """One batch's fill work: queued copies, non-tensor values and per-batch parts.

    ``offset`` is where the next per-batch tensor goes; after the ops ran it is the
    batch's buffer size.
    """

    __slots__ = ("bulk", "offset", "parts", "planner", "tasks", "values")

    def __init__(self, planner: ColumnPlanner, nvalues: int, nparts: int, offset: int, bulk: Bulk | None = None):
        self.bulk: Bulk | None = bulk  # the plan's fixed tensors, made at once
        self.planner: ColumnPlanner = planner
        self.tasks: list[tuple[Filler, Target, Any, Owner | None]] = []
        self.values: list[Any] = [None] * nvalues
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
                self.tasks.append((segment.fill, region, segment.payload, None))
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
            Mismatch: a cached plan's copy failed (a shape that differs, say).
        """
        views = Views(buffer, self.values, bulk=self.bulk, pageable=pageable)
        # Copies into the buffer are never part of a graph (``out=`` refuses one). The
        # switch itself, not torch.no_grad(): a context manager object per batch costs
        # more than a small batch's copy.
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            for fill, spec, payload, owner in self.tasks:
                region = spec.region(views)
                try:
                    fill(region, payload)
                except Exception as exc:
                    if owner is not None:
                        raise Mismatch(*owner.blame(payload)) from exc
                    raise CollateError(f"cannot copy values into the batch: {exc}") from exc
        finally:
            torch._C._set_grad_enabled(grad)
        return views
