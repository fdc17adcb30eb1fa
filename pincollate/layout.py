"""The plan of a batch: a tree of output nodes over one flat buffer.

Planning (``collate``) builds this tree from the samples; nothing here looks at
sample values. The tree has three jobs, kept apart:

* :meth:`Layout.__init__` gives every tensor node an aligned byte offset,
* :meth:`Layout.fill` copies each sample leaf once, straight into its region,
* :meth:`Layout.build` turns the tree into the user's containers, every tensor a
  view of the buffer.

A :class:`TensorNode` is filled by one or more :class:`Segment` s. Each segment is a
contiguous region written by one call (a ``torch.stack`` into ``out=``, a numpy
assignment, a pad), so a key stacked across 32 samples costs one call, not 32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .arena import ALIGN

__all__ = ["ContainerNode", "FillError", "Layout", "ListNode", "Node", "Segment", "TensorNode", "ValueNode"]

Filler = Callable[[torch.Tensor, Any], None]


def _align(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


@functools.lru_cache(maxsize=4096)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class Segment:
    """One fill call: ``fill(region, payload)`` where ``region`` has ``shape``.

    ``start`` counts elements from the start of the owning node. A *stacking*
    segment's payload is a list of values, one per index of the region's first
    dimension, so two adjacent stacking segments of one fill and one value shape
    merge into one call.
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


class Node:
    """A node of the output tree."""

    __slots__ = ()

    def tensors(self) -> Iterator[TensorNode]:
        return iter(())

    def build(self, views: _Views) -> Any:
        raise NotImplementedError


class TensorNode(Node):
    """An output tensor: ``dtype``, ``shape`` and the segments that fill it.

    ``wrap``, when set, turns the plain view into the output (a torchvision
    ``tv_tensors`` subclass with its metadata, say). ``unchecked``, when set, is the
    key path of a node planned optimistically: its values' shapes were left for
    the fill to check, and a failed fill means "plan this path carefully".
    ``stackable=False`` keeps item semantics from stacking it with its siblings.
    """

    __slots__ = ("dtype", "offset", "segments", "shape", "stackable", "unchecked", "wrap")

    def __init__(
        self,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        segments: list[Segment],
        wrap: Callable[[torch.Tensor], Any] | None = None,
        unchecked: tuple[Any, ...] | None = None,
        stackable: bool = True,
    ):
        self.stackable = stackable
        self.dtype = dtype
        self.shape = shape
        self.segments = segments
        self.wrap = wrap
        self.unchecked = unchecked
        self.offset = -1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def tensors(self) -> Iterator[TensorNode]:
        yield self

    def build(self, views: _Views) -> Any:
        view = views.node(self)
        return view if self.wrap is None else self.wrap(view)


class ListNode(Node):
    """A Python list of child outputs (per-sample values that do not stack)."""

    __slots__ = ("children",)

    def __init__(self, children: list[Node]):
        self.children = children

    def tensors(self) -> Iterator[TensorNode]:
        for child in self.children:
            yield from child.tensors()

    def build(self, views: _Views) -> list[Any]:
        return [child.build(views) for child in self.children]


class ValueNode(Node):
    """A value returned as it is: the list of strings of a batch, say."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def build(self, views: _Views) -> Any:
        return self.value


class ContainerNode(Node):
    """A container rebuilt by ``make`` from its children's outputs, in order."""

    __slots__ = ("children", "make")

    def __init__(self, make: Callable[[list[Any]], Any], children: list[Node]):
        self.make = make
        self.children = children

    def tensors(self) -> Iterator[TensorNode]:
        for child in self.children:
            yield from child.tensors()

    def build(self, views: _Views) -> Any:
        return self.make([child.build(views) for child in self.children])


class FillError(Exception):
    """A segment's fill failed; ``node`` is the tensor node it was filling."""

    def __init__(self, node: TensorNode, error: Exception):
        super().__init__(str(error))
        self.node = node
        self.error = error


class _Views:
    """Typed, strided views into one flat ``uint8`` buffer, one per node reused."""

    __slots__ = ("buffer", "nodes", "typed")

    def __init__(self, buffer: torch.Tensor):
        self.buffer = buffer
        self.typed: dict[torch.dtype, torch.Tensor] = {}
        self.nodes: dict[int, torch.Tensor] = {}

    def node(self, node: TensorNode) -> torch.Tensor:
        view = self.nodes.get(id(node))
        if view is None:
            view = self.nodes[id(node)] = self.region(node.dtype, node.offset, 0, node.shape)
        return view

    def region(self, dtype: torch.dtype, offset: int, start: int, shape: tuple[int, ...]) -> torch.Tensor:
        flat = self.typed.get(dtype)
        if flat is None:
            flat = self.typed[dtype] = self.buffer.view(dtype)
        # as_strided on a typed flat view is the cheapest way to make a view (no
        # intermediate slice); offsets are aligned, so the division is exact.
        return flat.as_strided(shape, _contiguous_strides(shape), offset // dtype.itemsize + start)


class Layout:
    """A planned batch: every tensor node placed at an aligned offset in one buffer.

    Example:
        >>> import torch
        >>> seg = Segment(0, (2, 3), lambda region, xs: torch.stack(xs, out=region), [torch.ones(3)] * 2)
        >>> layout = Layout(TensorNode(torch.float32, (2, 3), [seg]))
        >>> layout.nbytes
        64
        >>> buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
        >>> layout.fill(buffer)
        >>> layout.build(buffer).sum().item()
        6.0
    """

    __slots__ = ("nbytes", "root", "tensor_nodes")

    def __init__(self, root: Node):
        self.root = root
        self.tensor_nodes = list(root.tensors())
        offset = 0
        for node in self.tensor_nodes:
            node.offset = offset
            offset = _align(offset + node.nbytes)
        self.nbytes = offset

    def fill(self, buffer: torch.Tensor) -> None:
        """Copy every sample leaf into its region of ``buffer``.

        Raises:
            FillError: a copy failed; it names the node.
        """
        self._fill(_Views(buffer))

    def build(self, buffer: torch.Tensor) -> Any:
        """Return the output tree, every tensor a view of ``buffer``."""
        return self.root.build(_Views(buffer))

    def materialize(self, buffer: torch.Tensor) -> Any:
        """:meth:`fill` then :meth:`build`, sharing the views they both need."""
        views = _Views(buffer)
        self._fill(views)
        return self.root.build(views)

    def _fill(self, views: _Views) -> None:
        with torch.no_grad():
            for node in self.tensor_nodes:
                for segment in node.segments:
                    if segment.start == 0 and segment.shape == node.shape:
                        region = views.node(node)
                    else:
                        region = views.region(node.dtype, node.offset, segment.start, segment.shape)
                    try:
                        segment.fill(region, segment.payload)
                    except Exception as exc:
                        raise FillError(node, exc) from exc
