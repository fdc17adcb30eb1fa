"""``MMCollate``: plan a batch, allocate its one buffer, fill it, return views.

The walk mirrors ``default_collate``: mappings by key, namedtuples and sequences by
position (transposed), leaves by type through the registry in :mod:`.leaves`. Where
``default_collate`` gives up it does not: tensors of unequal shape and lists of
unequal length come back as per-sample lists, each stacked where its parts agree.
"""

from __future__ import annotations

import collections.abc as abc
import copy
import dataclasses
import threading
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal

import torch

from .arena import PinMode, allocate, resolve_kind
from .batch import Batch, BatchList, pinnable
from .compiled import CompiledPlans
from .containers import rebuild_dataclass, rebuild_mapping
from .errors import CollateError, format_path
from .layout import ContainerNode, FillError, Layout, ListNode, Node, Segment, TensorNode, ValueNode
from .leaves import LeafHandler, lookup, type_name
from .policies import AsList, Column, FieldRules, Policy, Stack, stack_or_list

__all__ = ["MMCollate", "mm_collate"]

Path = tuple[Hashable, ...]
Origins = list[tuple[int, Path]] | None

#: Deeper than this is taken for a self-referencing sample.
MAX_DEPTH = 100


def _container_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if _is_namedtuple(value):
        return "namedtuple"
    if _is_sequence(value):
        return "sequence"
    return type_name(value)


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _is_sequence(value: Any) -> bool:
    return isinstance(value, abc.Sequence) and not isinstance(value, (str, bytes, bytearray))


def _is_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


class _Planner:
    """One batch's walk. Collects leaves into columns and columns into nodes."""

    def __init__(self, collate: MMCollate):
        self.careful = collate._careful
        self.missing = collate.missing == "none"
        self.rules = collate._rules
        self.default = collate.ragged
        # Extra outputs (lengths, masks, offsets) that the policy of the field just
        # planned asks for; _child hands them to the parent mapping, which places them
        # beside the field, and containers without keys refuse them.
        self._pending_extras: dict[str, Node] = {}
        # ids of the containers of sample 0 on the current path: a cycle shows there.
        self._open: dict[int, Path] = {}

    # errors ----------------------------------------------------------------------

    @staticmethod
    def _blame(i: int, path: Path, origins: Origins) -> tuple[int, Path]:
        if origins is None:
            return i, path
        sample, base = origins[i]
        return sample, base + path[len(base) :] if len(path) >= len(base) else base

    def _error(self, message: str, i: int | None, path: Path, origins: Origins) -> CollateError:
        if i is None:
            return CollateError(message, path=path)
        sample, where = self._blame(i, path, origins)
        return CollateError(message, sample=sample, path=where)

    # dispatch --------------------------------------------------------------------

    def plan(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        if depth > MAX_DEPTH:
            raise self._error(f"nesting deeper than {MAX_DEPTH} levels: is the sample self-referencing?", 0, path, origins)
        policy = self.rules.lookup(path) if self.rules else None
        first = next((v for v in values if v is not None), None) if self.missing else values[0]
        handler = lookup(type(first))
        if handler is not None and (handler.is_tensor or (first is None and self.missing)):
            return self._leaves(values, path, origins, handler, policy)
        if policy is not None and _is_sequence(first) and not _is_namedtuple(first):
            if policy.takes_items:
                return self._items_policy(values, path, origins, policy)
            return self._sequence_policy(values, path, origins, depth, policy)
        if handler is not None:
            return self._objects(values, path, origins, handler)
        container = self._container(first, items)
        if container is not None:
            if policy is not None:
                raise self._error(f"{type(policy).__name__}() applies to tensors and lists of items, not to a {_container_name(first)}", None, path, origins)
            self._enter(first, path, origins)
            try:
                return container(values, path, origins, depth, items)
            finally:
                del self._open[id(first)]
        i = next(i for i, v in enumerate(values) if v is first)
        raise self._error(
            f"unsupported type {type_name(first)}: expected a tensor, numpy array, number, str, bytes, None, "
            "PIL image, mapping, sequence, namedtuple or dataclass",
            i,
            path,
            origins,
        )

    def _container(self, first: Any, items: bool) -> Callable[..., Node] | None:
        if isinstance(first, Mapping):
            return self._mapping
        if _is_namedtuple(first):
            return self._namedtuple
        if _is_dataclass(first):
            return self._dataclass
        if _is_sequence(first):
            return self._items if items else self._sequence
        return None

    def _with_extras(self, node: Node, extras: dict[str, Node], path: Path, origins: Origins) -> Node:
        if extras:
            raise self._error(
                f"the policy for this field returns {sorted(extras)}, which need a parent mapping; "
                "set their *_key arguments to None",
                0,
                path,
                origins,
            )
        return node

    # leaves ----------------------------------------------------------------------

    def _column(self, values: list[Any], path: Path, origins: Origins, handler: LeafHandler) -> Column:
        family = handler.family
        dtypes: list[torch.dtype | None] = []
        shapes: list[tuple[int, ...] | None] = []
        metas: list[Hashable] | None = [] if handler.meta is not None else None
        first_type = None
        for i, value in enumerate(values):
            if value is None and self.missing:
                dtypes.append(None)
                shapes.append(None)
                if metas is not None:
                    metas.append(None)
                continue
            h = lookup(type(value))
            if h is None or h.family != family:
                expected = handler.name if family != "number" else "a number"
                raise self._error(f"expected {expected}, got {type_name(value)}", i, path, origins)
            if first_type is None:
                first_type = type(value)
                handler = h
            sample, where = self._blame(i, path, origins)
            dtype, shape = h.describe(value, sample, where)
            dtypes.append(dtype)
            shapes.append(shape)
            if metas is not None:
                metas.append(h.meta(value) if h.meta is not None else None)
        column = Column(values, path, handler, dtypes, shapes, metas, origins)
        if family == "number" and first_type is float:
            # default_collate makes float64 of a column that starts with a Python float.
            column.dtype = torch.complex128 if column.dtype.is_complex else torch.float64
        return column

    def _leaves(self, values: list[Any], path: Path, origins: Origins, handler: LeafHandler, policy: Policy | None) -> Node:
        if not handler.is_tensor:
            # Every value is None (missing="none").
            return ValueNode([None] * len(values))
        if policy is None and self.default is None and path not in self.careful:
            node = _optimistic(values, path)
            if node is not None:
                return node
        column = self._column(values, path, origins, handler)
        if policy is None:
            policy = self.default
        if policy is None:
            return stack_or_list(column)
        node, extras = policy.plan(column, path[-1] if path else None)
        self._pending_extras = extras
        return node

    def _objects(self, values: list[Any], path: Path, origins: Origins, handler: LeafHandler) -> Node:
        for i, value in enumerate(values):
            h = lookup(type(value))
            if h is not handler and not (value is None and self.missing):
                raise self._error(f"expected {handler.name}, got {type_name(value)}", i, path, origins)
        # default_collate returns the batch's own list of strings.
        return ValueNode(values)

    # containers ------------------------------------------------------------------

    def _child(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool) -> tuple[Node, dict[str, Node]]:
        self._pending_extras = {}
        node = self.plan(values, path, origins, depth + 1, items)
        extras, self._pending_extras = self._pending_extras, {}
        return node, extras

    def _enter(self, value: Any, path: Path, origins: Origins) -> None:
        seen = self._open.get(id(value))
        if seen is not None:
            raise self._error(f"the sample refers to itself: this object is also at {format_path(seen)}", 0, path, origins)
        self._open[id(value)] = path

    def _mapping(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        first = values[0] if not self.missing else next(v for v in values if v is not None)
        keys = list(first.keys())
        first_keys = first.keys()
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if not isinstance(value, Mapping):
                raise self._error(f"expected a mapping, got {_container_name(value)} ({type_name(value)})", i, path, origins)
            if value.keys() != first_keys:
                missing = [k for k in keys if k not in value]
                extra = [k for k in value.keys() if k not in first_keys]
                if self.missing:
                    keys.extend(extra)
                    first_keys = set(keys)
                    continue
                detail = "; ".join(
                    part
                    for part in (
                        f"missing keys {missing}" if missing else "",
                        f"extra keys {extra}" if extra else "",
                    )
                    if part
                )
                raise self._error(f"keys differ from sample {self._blame(0, path, origins)[0]}: {detail} (pass missing='none' to allow absent keys)", i, path, origins)
        out_keys: list[Hashable] = []
        children: list[Node] = []
        # Fields with no policy try the optimistic plan first, without the generic
        # dispatch: a many-field sample spends most of its planning here.
        quick = not self.rules and self.default is None and not self.missing
        careful = self.careful
        for key in keys:
            if self.missing:
                column = [None if v is None else v.get(key) for v in values]
            else:
                column = [v[key] for v in values]
            child_path = (*path, key)
            if quick and child_path not in careful:
                node = _optimistic(column, child_path)
                if node is not None:
                    out_keys.append(key)
                    children.append(node)
                    continue
            node, extras = self._child(column, child_path, origins, depth, items)
            out_keys.append(key)
            children.append(node)
            for name, extra in extras.items():
                if name in keys or name in out_keys:
                    raise self._error(f"the extra output {name!r} of field {key!r} clashes with an existing key", 0, path, origins)
                out_keys.append(name)
                children.append(extra)
        return ContainerNode(_mapping_maker(first, out_keys, top=depth == 0), children)

    def _field(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        """A child of a container that has no keys to put a policy's extras beside."""
        node, extras = self._child(values, path, origins, depth, items)  # type: ignore[arg-type]
        return self._with_extras(node, extras, path, origins)

    def _same_type(self, values: list[Any], path: Path, origins: Origins) -> type:
        cls = type(values[0])
        for i, value in enumerate(values):
            if type(value) is not cls:
                raise self._error(f"expected {cls.__name__}, got {type_name(value)}", i, path, origins)
        return cls

    def _namedtuple(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        cls = self._same_type(values, path, origins)
        # zip's tuples, as default_collate (a column of strings stays a tuple).
        children = [self._field(column, (*path, name), origins, depth, items) for name, column in zip(cls._fields, zip(*values))]
        target = pinnable(cls) if depth == 0 else cls
        return ContainerNode(lambda outs: target(*outs), children)

    def _dataclass(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool) -> Node:
        self._same_type(values, path, origins)
        first = values[0]
        names = [f.name for f in dataclasses.fields(first)]
        children = [self._field([getattr(v, name) for v in values], (*path, name), origins, depth, items) for name in names]
        return ContainerNode(lambda outs: rebuild_dataclass(first, zip(names, outs)), children)

    def _sequence(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool = False) -> Node:
        for i, value in enumerate(values):
            if value is None and self.missing:
                continue
            if not _is_sequence(value) or _is_namedtuple(value):
                raise self._error(f"expected a sequence, got {_container_name(value)} ({type_name(value)})", i, path, origins)
        first = values[0]
        size = len(first) if first is not None else -1
        if any(value is None or len(value) != size for value in values):
            # default_collate raises here; per-sample item lists are what such data means.
            return self._items(values, path, origins, depth)
        # zip's tuples, as default_collate: a column of strings comes back as one.
        children = [self._field(column, (*path, j), origins, depth, False) for j, column in enumerate(zip(*values))]
        return ContainerNode(_sequence_maker(first, top=depth == 0), children)

    # item semantics ----------------------------------------------------------------

    def _items(self, values: list[Any], path: Path, origins: Origins, depth: int, items: bool = True) -> Node:
        """Each value's list holds its own items: stack where they agree, else a list."""
        return _merge(self._item_nodes(values, path, origins, depth))

    def _sequence_policy(self, values: list[Any], path: Path, origins: Origins, depth: int, policy: Policy) -> Node:
        """``AsList`` or ``Stack`` on a field whose values are lists of items."""
        children = self._item_nodes(values, path, origins, depth)
        if isinstance(policy, AsList):
            return ListNode(children)
        if isinstance(policy, Stack):
            merged = _merge(children)
            if not isinstance(merged, TensorNode):
                shapes = [tuple(c.shape) if isinstance(c, TensorNode) else type(c).__name__ for c in children]
                raise self._error(f"Stack() needs every sample's items to stack to one shape, got {shapes}", None, path, origins)
            return merged
        raise self._error(f"{type(policy).__name__}() takes tensors; for lists of items use Concat() or Jagged()", None, path, origins)

    def _item_nodes(self, values: list[Any], path: Path, origins: Origins, depth: int) -> list[Node]:
        children: list[Node] = []
        for i, value in enumerate(values):
            if value is None and self.missing:
                children.append(ValueNode(None))
                continue
            if _is_sequence(value) and not _is_namedtuple(value):
                sample, where = self._blame(i, path, origins)
                item_origins = [(sample, (*where, j)) for j in range(len(value))]
                if not value:
                    children.append(ListNode([]))
                    continue
                child, extras = self._child(list(value), (*where, 0), item_origins, depth, True)
            else:
                child, extras = self._child([value], path, [self._blame(i, path, origins)], depth, True)
                if isinstance(child, ListNode) and len(child.children) == 1:
                    child = child.children[0]
                elif isinstance(child, TensorNode):
                    child = _unstack(child)
            self._with_extras(child, extras, path, origins)
            children.append(child)
        return children

    def _items_policy(self, values: list[Any], path: Path, origins: Origins, policy: Policy) -> Node:
        """A Concat/Jagged field whose per-sample values are lists of items."""
        flat: list[Any] = []
        flat_origins: list[tuple[int, Path]] = []
        counts: list[int] = []
        for i, value in enumerate(values):
            sample, where = self._blame(i, path, origins)
            if value is None and self.missing:
                counts.append(0)
                continue
            if not _is_sequence(value):
                raise self._error(f"expected a list of items, got {type_name(value)}", i, path, origins)
            counts.append(len(value))
            flat.extend(value)
            flat_origins.extend((sample, (*where, j)) for j in range(len(value)))
        if not flat:
            raise self._error(f"{type(policy).__name__}() got no items", None, path, origins)
        handler = lookup(type(flat[0]))
        if handler is None or not handler.is_tensor:
            raise self._error(f"expected tensor items, got {type_name(flat[0])}", 0, (*path, 0), None if origins is None else flat_origins)
        column = self._column(flat, path, flat_origins, handler)
        node, extras = policy.plan(column, path[-1] if path else None, counts=counts)  # type: ignore[call-arg]
        self._pending_extras = extras
        return node


_fill_tensor = lookup(torch.Tensor).fill
_NUMBERS = {int: (torch.int64, lookup(int).fill), float: (torch.float64, lookup(float).fill), bool: (torch.bool, lookup(bool).fill)}


def _optimistic(values: list[Any], path: Path) -> TensorNode | None:
    """The common case at C speed: plain tensors of one dtype, or numbers of one type.

    Tensor shapes are not compared here: ``torch.stack`` compares them while it
    fills, and a mismatch sends this path to careful planning (see
    ``MMCollate.__call__``). ``None`` means "plan carefully now".
    """
    types = set(map(type, values))
    if len(types) != 1:
        return None
    cls = types.pop()
    n = len(values)
    if cls is torch.Tensor:
        first = values[0]
        if len({v.dtype for v in values}) != 1 or first.layout != torch.strided or first.is_nested or first.device.type != "cpu":
            return None
        shape = (n, *first.shape)
        return TensorNode(first.dtype, shape, [Segment(0, shape, _fill_tensor, values, stacking=True)], unchecked=path)
    number = _NUMBERS.get(cls)
    if number is None:
        return None
    dtype, fill = number
    return TensorNode(dtype, (n,), [Segment(0, (n,), fill, values, stacking=True)], unchecked=path)


def _unstack(node: TensorNode) -> TensorNode:
    """A stack of one value, seen as that value (its leading 1 dropped)."""
    return TensorNode(node.dtype, node.shape[1:], node.segments, node.wrap, stackable=node.stackable)


def _merge(children: list[Node]) -> Node:
    """Stack children that are tensors of one shape into one node, else list them."""
    if not children or not all(isinstance(c, TensorNode) and c.stackable for c in children):
        return ListNode(children)
    tensors: list[TensorNode] = children  # type: ignore[assignment]
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        return ListNode(children)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype is not dtype:
            dtype = torch.promote_types(dtype, t.dtype)
    segments = []
    numel = tensors[0].numel
    for i, t in enumerate(tensors):
        for segment in t.segments:
            segment = segment.shifted(i * numel)
            if segments and segment.follows(segments[-1]):
                prev = segments[-1]
                segments[-1] = type(prev)(prev.start, (prev.shape[0] + segment.shape[0], *prev.shape[1:]), prev.fill, [*prev.payload, *segment.payload], True)
            else:
                segments.append(segment)
    return TensorNode(dtype, (len(tensors), *shape), segments, tensors[0].wrap)


def _mapping_maker(first: Mapping, keys: list[Hashable], top: bool) -> Callable[[list[Any]], Any]:
    cls = type(first)
    if cls is dict:
        target = Batch if top else dict
        return lambda outs: target(zip(keys, outs))

    return lambda outs: rebuild_mapping(first, dict(zip(keys, outs)))


def _sequence_maker(first: Sequence, top: bool) -> Callable[[list[Any]], Any]:
    cls = type(first)
    if isinstance(first, tuple) or cls is list:
        # Tuples come back as lists, as in default_collate.
        return BatchList if top else list

    def make(outs: list[Any]) -> Any:
        try:
            if isinstance(first, abc.MutableSequence):
                clone = copy.copy(first)
                for i, out in enumerate(outs):
                    clone[i] = out
                return clone
            return cls(outs)  # type: ignore[call-arg]
        except TypeError:
            return outs

    return make


class MMCollate:
    """A multimodal collate function that builds each batch in one buffer.

    Use an instance as a DataLoader's ``collate_fn``. Wherever torch's
    ``default_collate`` succeeds the result is the same (container types, dtypes,
    shapes, values; a top-level dict comes back as :class:`~pincollate.Batch`, a
    ``dict`` subclass). Every output tensor is a view of one ``uint8`` buffer:
    shared memory inside a DataLoader worker (one file descriptor per batch),
    pinned memory in the main process when ``pin_memory`` asks for it.

    Args:
        pin_memory: ``"auto"`` pins in the main process when an accelerator with
            pinned memory is present; ``True`` requires it; ``False`` never pins.
            Workers never pin and never touch CUDA.
        sequences: ``"transpose"`` treats lists like ``default_collate`` (position by
            position), falling back to item semantics when lengths differ;
            ``"items"`` treats every list as that sample's items (several images of
            one prompt): stacked where they agree, else kept as a list.
        fields: policies for key-path patterns, e.g. ``{"input_ids": Pad()}``; see
            :class:`~pincollate.policies.FieldRules`.
        ragged: the policy for fields no pattern names (``None``: stack when the
            values agree, else a list).
        missing: ``"error"`` (keys must agree across samples) or ``"none"`` (absent
            keys become ``None``; empty for ``Pad``/``Concat``/``Jagged``).

    Example:
        >>> import torch
        >>> from pincollate import MMCollate
        >>> collate = MMCollate(pin_memory=False)
        >>> batch = collate([{"img": torch.zeros(3, 2, 2), "label": 1}, {"img": torch.ones(3, 2, 2), "label": 0}])
        >>> batch["img"].shape, batch["label"].tolist()
        (torch.Size([2, 3, 2, 2]), [1, 0])
        >>> batch["img"].untyped_storage().data_ptr() == batch["label"].untyped_storage().data_ptr()
        True
    """

    def __init__(
        self,
        pin_memory: PinMode = "auto",
        *,
        sequences: Literal["transpose", "items"] = "transpose",
        fields: Mapping[str, Policy] | None = None,
        ragged: Policy | None = None,
        missing: Literal["error", "none"] = "error",
    ):
        if pin_memory not in (True, False, "auto"):
            raise CollateError(f"pin_memory must be True, False or 'auto', got {pin_memory!r}")
        if sequences not in ("transpose", "items"):
            raise CollateError(f"sequences must be 'transpose' or 'items', got {sequences!r}")
        if missing not in ("error", "none"):
            raise CollateError(f"missing must be 'error' or 'none', got {missing!r}")
        if ragged is not None and not isinstance(ragged, Policy):
            raise CollateError(f"ragged must be a policy or None, got {type_name(ragged)}")
        self.pin_memory = pin_memory
        self.sequences = sequences
        self.fields = dict(fields or {})
        self.ragged = ragged
        self.missing = missing
        self._rules = FieldRules(self.fields)
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        # Key paths whose values once failed the optimistic plan (ragged, mixed):
        # planned carefully from then on. Only ever grows, so no lock is needed.
        self._careful: set[Path] = set()
        # Flat dict samples with no field policies: compiled plans per structure.
        plain = not self._rules and ragged is None and missing == "error" and sequences == "transpose"
        self._compiled = CompiledPlans() if plain else None

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("pin_memory", "sequences", "fields", "ragged", "missing")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("pin_memory"), **state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"MMCollate(pin_memory={self.pin_memory!r}, sequences={self.sequences!r}, "
            f"fields={self.fields!r}, ragged={self.ragged!r}, missing={self.missing!r})"
        )

    def plan(self, batch: Sequence[Any]) -> Layout:
        """Plan ``batch`` without copying anything: its layout in one buffer."""
        if isinstance(batch, (str, bytes)) or not isinstance(batch, abc.Sequence):
            raise CollateError(f"expected a sequence of samples, got {type_name(batch)}")
        if len(batch) == 0:
            raise CollateError("empty batch: there are no samples to collate")
        planner = _Planner(self)
        samples = list(batch)
        planner._pending_extras = {}
        root = planner.plan(samples, (), None, 0, self.sequences == "items")
        planner._with_extras(root, planner._pending_extras, (), None)
        if self._rules:
            self._report_unmatched()
        return Layout(root)

    def _report_unmatched(self) -> None:
        with self._lock:
            for pattern in self._rules.patterns:
                if pattern not in self._rules.matched and pattern not in self._reported:
                    self._reported.add(pattern)
                    warnings.warn(f"pincollate: field pattern {pattern!r} matched no key path in this batch", UserWarning, stacklevel=3)

    def __call__(self, batch: Sequence[Any]) -> Any:
        """Collate ``batch`` (a sequence of samples) into one buffer."""
        kind = resolve_kind(self.pin_memory)
        if self._compiled is not None and batch and isinstance(batch, abc.Sequence):
            out = self._compiled.run(batch, kind)
            if out is not None:
                return out
        while True:
            layout = self.plan(batch)
            buffer = allocate(layout.nbytes, kind)
            try:
                out = layout.materialize(buffer)
                break
            except FillError as failure:
                path = failure.node.unchecked
                if path is None:
                    raise CollateError(f"cannot copy values into the batch: {failure.error}") from failure.error
                # Plan this path carefully from now on; the replan either handles
                # the values (ragged shapes) or raises an error naming the sample.
                # Each retry adds a path that is never optimistic again, so this ends.
                self._careful.add(path)
        if isinstance(out, (Batch, BatchList)):
            out.buffer = buffer
        return out


#: The default instance: ``DataLoader(dataset, collate_fn=pincollate.mm_collate)``.
mm_collate = MMCollate()
