"""The Layout: a batch's structure over one flat buffer, holding no sample values.

A Layout is a tree of specs. Containers (mappings, sequences, namedtuples,
dataclasses and lists, in :mod:`pincollate._batch.specs`) hold their
children; :class:`TensorSpec` is a tensor at an aligned byte offset of the buffer;
:class:`ValueSpec` is a non-tensor output (a list of strings, say) kept beside the
buffer by index. Specs are immutable, compare by value, pickle small and hold only
dtypes, shapes, offsets, keys and classes, so one Layout can be cached per sample
structure, carried by every batch, saved with it, and rebuilt on any device:

    outputs = layout.build(buffer, values)

A cached template may hold :class:`~pincollate._batch.specs.PartSpec` placeholders for
fields planned anew for each batch (ragged ones); a batch's Layout then carries
those parts. The container specs live in :mod:`pincollate._batch.specs`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._types.wrap import Wrap
from .views import START, Bulk, Views, align, carve, contiguous_strides, numpy_dtype

__all__ = ["Layout", "Part", "PartSpec", "Spec", "TensorSpec", "ValueSpec", "bulk_of"]


class Spec:
    """A node of a Layout. Subclasses list their fields in ``_fields``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in self._fields)})"

    def children_specs(self) -> tuple[Spec, ...]:
        return ()

    def build(self, views: Views) -> Any:
        raise NotImplementedError


class TensorSpec(Spec):
    """A contiguous tensor of ``dtype`` and ``shape`` at byte ``offset`` of the buffer.

    Fields stacked by one call (a block) are each a spec at their own aligned offset;
    the block's op fills them all through one spec covering the block.
    """

    __slots__ = ("_at", "_numpy", "_strides", "dtype", "offset", "shape", "wrap")
    _fields = ("dtype", "shape", "offset", "wrap")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], offset: int, wrap: Wrap | None = None):
        if offset % dtype.itemsize:
            raise ValueError(f"offset {offset} is not aligned for {dtype}")
        self.dtype: torch.dtype = dtype
        self.shape: tuple[int, ...] = tuple(shape)
        self.offset: int = offset
        self.wrap: Wrap | None = wrap
        self._strides: tuple[int, ...] = contiguous_strides(self.shape)
        self._at: int = offset // dtype.itemsize
        # Where the fast path applies: bytes to read, in a dtype numpy has.
        self._numpy: np.dtype[Any] | None = numpy_dtype(dtype) if math.prod(self.shape) else None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def of(self, buffer: torch.Tensor) -> torch.Tensor:
        """This tensor's plain view of the flat ``uint8`` ``buffer``."""
        return buffer.view(self.dtype).as_strided(self.shape, self._strides, self._at)

    def region(self, views: Views) -> torch.Tensor:
        """The plain tensor, made once per batch."""
        made = views.made.get(id(self))
        if made is None:
            made = views.made[id(self)] = self._make(views)
        return made

    def build(self, views: Views) -> Any:
        made = views.made.get(id(self))
        if made is None:
            made = self._make(views)
        return made if self.wrap is None else self.wrap(made)

    def _make(self, views: Views) -> torch.Tensor:
        source = views.source
        if source is None or self._numpy is None:
            return views.tensor(self.dtype, self.shape, self.offset, self._strides)
        return carve(source, self._numpy, self.shape, self.offset)  # Views.tensor's common case


class ValueSpec(Spec):
    """A non-tensor output, ``values[index]``: kept beside the buffer, returned as it is."""

    __slots__ = ("index",)
    _fields = ("index",)

    def __init__(self, index: int):
        self.index: int = index

    def build(self, views: Views) -> Any:
        return views.values[self.index]


class PartSpec(Spec):
    """A placeholder for the part of a batch planned anew for each batch."""

    __slots__ = ("index",)
    _fields = ("index",)

    def __init__(self, index: int):
        self.index: int = index

    def build(self, views: Views) -> Any:
        return views.parts[self.index].node.build(views)


class Part(Spec):
    """A per-batch part: its node and the extra outputs its policy adds beside it."""

    __slots__ = ("extras", "node")
    _fields = ("node", "extras")

    def __init__(self, node: Spec, extras: tuple[tuple[str, Spec], ...] = ()):
        self.node: Spec = node
        self.extras: tuple[tuple[str, Spec], ...] = tuple(extras)

    def children_specs(self) -> tuple[Spec, ...]:
        return (self.node, *(spec for _, spec in self.extras))


def _walk(spec: Spec) -> Iterator[Spec]:
    yield spec
    for child in spec.children_specs():
        yield from _walk(child)


def bulk_of(root: Spec) -> Bulk:
    """The tensors of ``root`` (not of its parts) that a :class:`Views` makes at once.

    Those with bytes, in a dtype numpy has; the others are made one by one.
    """
    specs = [spec for spec in _walk(root) if type(spec) is TensorSpec and spec._numpy is not None]
    return (
        tuple(map(id, specs)),
        tuple(spec._numpy for spec in specs),  # type: ignore[misc]
        tuple(spec.shape for spec in specs),
        tuple(spec.offset for spec in specs),
    )


def _recast(spec: Spec, cast: Any) -> Spec:
    """``spec`` with every tensor spec replaced by ``cast(spec)``."""
    if isinstance(spec, TensorSpec):
        return cast(spec)  # type: ignore[no-any-return]
    if isinstance(spec, (ValueSpec, PartSpec)):
        return spec
    fields = []
    for value in spec._key():
        if isinstance(value, Spec):
            value = _recast(value, cast)
        elif isinstance(value, tuple) and value and isinstance(value[0], Spec):
            value = tuple(_recast(child, cast) for child in value)
        elif (
            isinstance(value, tuple)
            and value
            and isinstance(value[0], tuple)
            and len(value[0]) == 2
            and isinstance(value[0][1], Spec)
        ):
            value = tuple((name, _recast(child, cast)) for name, child in value)
        fields.append(value)
    return type(spec)(*fields)


class Layout:
    """A batch's structure over one buffer of ``nbytes`` bytes.

    The containers, keys, and for every tensor its dtype, shape and byte offset in the
    buffer; no sample values. A batch carries it (``batch.layout``), and
    [MMCollate.plan][pincollate.MMCollate.plan] gives it without making the batch.
    ``root`` is the output tree's spec; ``parts`` fill its placeholders (policy
    outputs placed anew for each batch). A batch of per-sample lists made by a plan's
    generated function makes its layout's parts when they are first asked for.

    Attributes:
        nbytes: the size of the buffer the layout fills, in bytes.

    Examples:
        >>> import torch
        >>> import pincollate
        >>> samples = [{"x": torch.ones(2, 3), "y": 1}, {"x": torch.zeros(2, 3), "y": 2}]
        >>> collate = pincollate.MMCollate(pin_memory=False)
        >>> layout = collate.plan(samples)
        >>> layout.nbytes, [(t.dtype, t.shape, t.offset) for t in layout.tensors()]
        (192, [(torch.float32, (2, 2, 3), 64), (torch.int64, (2,), 128)])
        >>> batch = collate(samples)
        >>> batch.layout == layout
        True
        >>> again = layout.build(batch.buffer.clone())  # the same tree over a copy of the bytes
        >>> again["x"].equal(batch["x"]), again["y"].tolist()
        (True, [1, 2])
    """

    __slots__ = ("_builder", "_built", "_bulk", "_deferred", "_parts", "nbytes", "root")

    def __init__(
        self,
        root: Spec,
        nbytes: int,
        parts: Sequence[Part] | None = (),
        bulk: Bulk | None = None,
        deferred: tuple[Callable[..., Sequence[Part]], tuple[Any, ...]] | None = None,
    ):
        self.root: Spec = root
        self.nbytes: int = nbytes
        self._parts: tuple[Part, ...] | None = None if parts is None else tuple(parts)
        #: ``(make, arguments)``: the parts are ``make(*arguments)``, made when first asked for. A
        #: compiled plan makes a batch without them; moving, pickling or checking it asks.
        self._deferred = deferred
        self._bulk: Bulk | None = bulk  # the root's, where the caller has it (a cached plan)
        # A layout without parts (a cached plan's, shared by its batches) builds by generated code
        # when it is built again (unpickled, moved); a plan's own function builds its batches itself.
        self._builder: Callable[[Views], Any] | None = None
        self._built = False

    @property
    def parts(self) -> tuple[Part, ...]:
        """The parts that fill the root's placeholders (policy outputs placed anew for each batch)."""
        parts = self._parts
        if parts is None:
            assert self._deferred is not None, "a layout without parts has no deferred ones"
            make, arguments = self._deferred
            # Kept after: a thread that asks at the same time makes equal parts from it.
            parts = self._parts = tuple(make(*arguments))
        return parts

    def bulk(self) -> Bulk:
        """The root's tensors a :class:`Views` makes at once (:func:`bulk_of`), found once."""
        if self._bulk is None:
            self._bulk = bulk_of(self.root)
        return self._bulk

    def build(self, buffer: torch.Tensor, values: Sequence[Any] = (), views: Views | None = None) -> Any:
        """The output tree over ``buffer`` (a flat ``uint8`` tensor), every tensor in it.

        ``views`` are those the fill made already, if it made any.
        """
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.nbytes:
            raise ValueError(
                f"expected a flat uint8 buffer of at least {self.nbytes} bytes, got {buffer.dtype} of shape {tuple(buffer.shape)}"
            )
        if views is None:
            views = Views(buffer, values, self.parts, self.bulk())
        else:
            views.parts = self.parts
        if self.parts:
            return self.root.build(views)
        if self._builder is None and not self._built:
            # Built once (a batch the careful walk planned, a column batch): the specs build it, as
            # generating the build would cost more than it saves. Built again: generated.
            self._built = True
            return self.root.build(views)
        return self.builder()(views)

    def builder(self) -> Callable[[Views], Any]:
        """The generated build of a layout without parts (made once): the output tree from its views."""
        builder = self._builder
        if builder is None:
            from .compiled import compile_build  # it builds on the specs, which build on this module

            builder = self._builder = compile_build(self.root, self.bulk()[0])
        return builder

    def tensors(self) -> list[TensorSpec]:
        """Every tensor spec, in buffer order."""
        found = [spec for top in (self.root, *self.parts) for spec in _walk(top) if isinstance(spec, TensorSpec)]
        found.sort(key=lambda spec: spec.offset)
        return found

    def cast(self, dtype: torch.dtype) -> Layout:
        """This layout with its floating-point tensors as ``dtype``, placed anew.

        Returns ``self`` when nothing changes.
        """
        specs = self.tensors()
        if not any(spec.dtype.is_floating_point and spec.dtype != dtype for spec in specs):
            return self
        placed: dict[int, TensorSpec] = {}
        offset = START
        for spec in specs:
            new_dtype = dtype if spec.dtype.is_floating_point else spec.dtype
            placed[id(spec)] = TensorSpec(new_dtype, spec.shape, offset, spec.wrap)
            offset = align(offset + placed[id(spec)].nbytes)

        def cast(spec: TensorSpec) -> TensorSpec:
            return placed[id(spec)]

        parts = tuple(_recast(part, cast) for part in self.parts)
        return Layout(_recast(self.root, cast), offset, parts)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        return type(other) is Layout and (self.nbytes, self.root, self.parts) == (other.nbytes, other.root, other.parts)

    def __hash__(self) -> int:
        return hash((self.nbytes, self.root, self.parts))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Layout, (self.root, self.nbytes, self.parts))

    def __repr__(self) -> str:
        return f"Layout(nbytes={self.nbytes}, tensors={len(self.tensors())}, parts={len(self.parts)})"
