"""Batches as first-class objects: they carry their layout, buffer and non-tensor values.

The top-level container of a collated batch is one of these types:

* a ``dict`` batch is a :class:`Batch` (a ``dict`` subclass),
* a ``list`` batch (tuples come back as lists) is a :class:`BatchList`,
* a namedtuple or dataclass batch is an instance of a subclass of the user's class,
  made once per class by :func:`carrier_class`.

Each carries ``(layout, buffer, values)``, so it moves in one piece:

* ``pin_memory()`` makes one pinned copy of the buffer and rebuilds the views;
  DataLoader's pin thread calls it (torch 2.10 and later look for an object's own
  ``pin_memory()`` before walking it as a container);
* ``to(...)`` takes ``Tensor.to``'s arguments and makes one copy of the buffer; a
  dtype casts the floating-point tensors only;
* ``pickle`` and ``torch.save`` write the buffer once, plus the layout; a loaded
  batch is one buffer again, and ``torch.load(weights_only=True)`` accepts it;
  multiprocessing's pickler sends it as :mod:`pincollate._batch.crossing` says.

A batch whose contents were changed (a key added, a tensor replaced) no longer
matches its layout: it then moves leaf by leaf, correctly, and carries no layout.
Moving is :mod:`pincollate._batch.moving`'s; a carrier class builds the moved batch
(``_pincollate_make``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree

from .._types.build import new_dataclass
from .._types.wrap import Wrap
from .check import Carried, carried, is_batch
from .layout import Layout, Part, PartSpec, Spec, TensorSpec, ValueSpec
from .list_specs import GroupsSpec, ItemsSpec, RowsSpec, SplitSpec
from .moving import batch_pin_memory, batch_to, contents
from .specs import (
    DataclassSpec,
    JaggedSpec,
    ListSpec,
    MappingSpec,
    NamedTupleSpec,
    RegisteredSpec,
    SequenceSpec,
)
from .trees import map_tensors, nested_parts
from .views import Views, exposed, one_storage

__all__ = [
    "Batch",
    "BatchList",
    "allow_loading",
    "carried",
    "carrier_class",
    "carries",
    "is_batch",
    "make_batch",
    "reduce_changed",
]

T = TypeVar("T")


def make_batch(layout: Layout, buffer: torch.Tensor, values: list[Any], views: Views | None = None) -> Any:
    """The batch over ``buffer``: the user's containers, every tensor in it."""
    out = layout.build(buffer, values, views)
    top = _top(layout)
    if not _is_carrier(top):
        # A tensor, or a user's mapping type: nothing to carry the layout on.
        return out
    kind = type(top)
    if kind is MappingSpec:
        batch: Any = Batch(out)
    elif kind is SequenceSpec:
        batch = BatchList(out)
    elif kind is NamedTupleSpec:
        # The values are built already: the user's __new__ (which may change them) runs once.
        batch = tuple.__new__(carrier_class(type(out)), out)
    else:
        batch = new_dataclass(carrier_class(type(out)), {f.name: getattr(out, f.name) for f in dataclasses.fields(out)})
    object.__setattr__(batch, "_pincollate", (layout, buffer, values))
    return batch


def _top(layout: Layout) -> Spec:
    """The spec of the batch's top-level container (a part's node, if the top is one)."""
    root = layout.root
    return layout.parts[root.index].node if type(root) is PartSpec else root


def carries(layout: Layout) -> bool:
    """Whether a batch of ``layout`` is a carrier (it can cross processes as its layout)."""
    return _is_carrier(_top(layout))


def _is_carrier(top: Spec) -> bool:
    kind = type(top)
    if kind is MappingSpec or kind is SequenceSpec:
        return top.cls is None  # type: ignore[attr-defined]
    return kind is NamedTupleSpec or kind is DataclassSpec


def _rebuild(layout: Layout, buffer: torch.Tensor, values: list[Any]) -> Any:
    return make_batch(layout, buffer, values)


# --- the batch types ----------------------------------------------------------------------


def _layout(self: Any) -> Layout | None:
    """The batch's layout, or ``None`` once its contents no longer match it."""
    state = carried(self)
    return None if state is None else state[0]


def _buffer(self: Any) -> torch.Tensor | None:
    """The one ``uint8`` buffer every tensor of the batch lies in, or ``None``."""
    state = carried(self)
    return None if state is None else exposed(state[1])


class _Carrier:
    """What :class:`Batch` and :class:`BatchList` share: the layout they carry, and moving by it."""

    _pincollate: Carried | None = None
    _pincollate_make = staticmethod(make_batch)
    pin_memory = batch_pin_memory
    to = batch_to

    @property
    def layout(self) -> Layout | None:
        """The batch's layout, or ``None`` once its contents no longer match it."""
        return _layout(self)

    @property
    def buffer(self) -> torch.Tensor | None:
        """The one ``uint8`` buffer every tensor of the batch lies in, or ``None``.

        In pageable memory a tensor of its own over the buffer's bytes: moving it
        (``share_memory_``) moves nothing the batch's fields read.
        """
        return _buffer(self)

    def __reduce__(self) -> Any:
        state = carried(self)
        return reduce_changed(self) if state is None else (_rebuild, state)


class Batch(_Carrier, dict[Hashable, Any]):
    """A collated ``dict`` batch whose tensors all lie in one buffer.

    A ``dict`` that carries its layout, so it moves, pins and pickles as one buffer;
    changed (a key added, a tensor replaced), it does all three leaf by leaf.

    Attributes:
        layout: the batch's [Layout][pincollate.Layout], or ``None`` once its contents
            no longer match it.
        buffer: the one ``uint8`` tensor every tensor of the batch lies in, or ``None``
            with ``layout``. In pageable memory it is a tensor of its own over those
            bytes: moving it (``share_memory_``) moves nothing the fields read.

    Methods:
        to: the batch moved or cast as ``Tensor.to`` (same arguments) does each of its
            tensors; a dtype casts the floating-point ones only. One copy of the buffer.
        pin_memory: the batch in pinned memory: one pinned allocation and one copy,
            or the batch itself if it is pinned.

    Examples:
        >>> import torch
        >>> from pincollate import mm_collate
        >>> batch = mm_collate([{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}])
        >>> isinstance(batch, dict), batch.buffer.dtype, batch.layout.nbytes
        (True, torch.uint8, 192)
        >>> batch.to(torch.float16)["x"].dtype, batch.to(torch.float16)["y"].dtype
        (torch.float16, torch.int64)
    """


class BatchList(_Carrier, list[Any]):
    """A collated ``list`` batch whose tensors all lie in one buffer.

    The same attributes and methods as [Batch][pincollate.Batch], for a batch of lists
    or tuples.

    Examples:
        >>> import torch
        >>> from pincollate import BatchList, mm_collate
        >>> batch = mm_collate([[torch.ones(2), 1], [torch.zeros(2), 2]])
        >>> isinstance(batch, BatchList), batch[0].shape, batch[1].tolist()
        (True, torch.Size([2, 2]), [1, 2])
    """


# --- torch's pytree ------------------------------------------------------------------------
# torch.func, torch.export and the walks of torch.distributed see a dict or list subclass as
# one leaf unless it is registered: registered, a batch's fields are its leaves, as a dict's
# or list's are, and a tree rebuilt from them (``tree_map``) is a batch of the same type
# that carries no layout (its tensors are new).


def _flatten_batch(batch: Batch) -> tuple[list[Any], list[Hashable]]:
    return list(batch.values()), list(batch.keys())


def _unflatten_batch(values: Iterable[Any], keys: list[Hashable]) -> Batch:
    return Batch(zip(keys, values, strict=True))


def _flatten_batch_with_keys(batch: Batch) -> tuple[list[tuple[Any, Any]], list[Hashable]]:
    return [(pytree.MappingKey(key), value) for key, value in batch.items()], list(batch.keys())


def _flatten_list(batch: BatchList) -> tuple[list[Any], None]:
    return list(batch), None


def _unflatten_list(values: Iterable[Any], context: None) -> BatchList:
    return BatchList(values)


def _flatten_list_with_keys(batch: BatchList) -> tuple[list[tuple[Any, Any]], None]:
    return [(pytree.SequenceKey(i), value) for i, value in enumerate(batch)], None


def _register_pytree() -> None:
    for cls, flatten, unflatten, with_keys in (
        (Batch, _flatten_batch, _unflatten_batch, _flatten_batch_with_keys),
        (BatchList, _flatten_list, _unflatten_list, _flatten_list_with_keys),
    ):
        if cls not in pytree.SUPPORTED_NODES:  # registered once per process
            pytree.register_pytree_node(
                cls,
                flatten,
                unflatten,
                serialized_type_name=f"pincollate.{cls.__name__}",
                flatten_with_keys_fn=with_keys,
            )


_register_pytree()


#: The carrier classes made so far, and who wants to hear of each new one (:mod:`pincollate._batch.crossing`
#: registers how each crosses to another process).
_carriers: list[type] = [Batch, BatchList]
_carrier_listeners: list[Callable[[type], None]] = []


def on_carrier(listener: Callable[[type], None]) -> None:
    """Call ``listener`` with every carrier class: those made already, and each new one."""
    _carrier_listeners.append(listener)
    for cls in list(_carriers):
        listener(cls)


def carrier_class(cls: type[T]) -> type[T]:
    """A subclass of the namedtuple or dataclass ``cls`` whose instances carry their layout.

    It adds ``pin_memory``, ``to``, ``layout`` and ``buffer``, except where ``cls`` has
    a field of that name: fields beat methods (such a batch is moved with
    :func:`pincollate.to_device`, and DataLoader's pin thread reads the field, as it
    does for ``cls`` itself). Instances pickle as ``cls`` would, rebuilt as the
    subclass, so they cross process boundaries like the original.
    """
    return _carrier_class(cls)  # type: ignore[no-any-return,arg-type]


@functools.cache
def _carrier_class(cls: Any) -> Any:
    fields: tuple[str, ...] = getattr(cls, "_fields", ())
    names = set(fields) if hasattr(cls, "_fields") else {f.name for f in dataclasses.fields(cls)}
    namespace: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": getattr(cls, "__qualname__", cls.__name__),
        "__reduce__": _carrier_reduce,
        "_pincollate": None,
        "_pincollate_make": staticmethod(make_batch),
    }
    if hasattr(cls, "_fields"):
        namespace["__repr__"] = lambda self: cls.__repr__(self)
    for name, attr in (
        ("pin_memory", batch_pin_memory),
        ("to", batch_to),
        ("layout", property(_layout)),
        ("buffer", property(_buffer)),
    ):
        if name not in names:
            namespace[name] = attr
    carrier = type(cls.__name__, (cls,), namespace)
    _carriers.append(carrier)
    for listener in list(_carrier_listeners):
        listener(carrier)
    return carrier


def _carrier_reduce(self: Any) -> Any:
    state = carried(self)
    return reduce_changed(self) if state is None else (_rebuild, state)


def reduce_changed(batch: Any, across: bool = False) -> Any:
    """How a batch whose contents changed pickles: leaf by leaf, as its own type.

    ``across``: to another process through multiprocessing's pickler, which shares each
    storage as it is (views of one storage in several dtypes included): nothing is copied.
    """
    tree = contents(batch) if across else _pickled_contents(batch)
    if isinstance(batch, (Batch, BatchList)):
        return (type(batch), (tree,))
    base = type(batch).__mro__[1]
    if isinstance(batch, tuple):
        return (_rebuild_namedtuple, (base, tree))
    return (_rebuild_dataclass, (base, tree))


def _pickled_contents(batch: Any) -> Any:
    """A changed batch's contents as pickle writes them: leaf by leaf, each tensor as itself.

    Where the batch's tensors are views of its buffer's one storage (pinned memory, a
    device's), a view still there is written as a copy of its own: torch refuses to save
    views of one storage in several dtypes ("Cannot save multiple tensors or storages that
    view the same data as different types"), which every batch of two dtypes would be.
    """
    tree = contents(batch)
    state = getattr(batch, "_pincollate", None)
    if state is None or not one_storage(state[1]):
        return tree  # pageable memory: each tensor has a storage of its own already
    shared = state[1].untyped_storage()
    return map_tensors(tree, functools.partial(_own_copy, shared.device, shared.data_ptr()))


def _own_copy(device: torch.device, address: int, t: torch.Tensor) -> torch.Tensor:
    """``t`` as pickle should write it: a copy of its own where it views the storage at ``address``."""
    if not any(
        part.device == device and part.untyped_storage().data_ptr() == address
        for part in (nested_parts(t) if t.is_nested else (t,))
    ):
        return t
    with torch.no_grad():
        copy = t.clone()
    if t.requires_grad:
        copy.requires_grad_()
    # An attribute of the user's; what the clone holds already (a wrap's metadata, a nested
    # tensor's own values and offsets) is the clone's.
    copy.__dict__.update((name, value) for name, value in t.__dict__.items() if name not in copy.__dict__)
    return copy


def _rebuild_namedtuple(cls: Any, values: tuple[Any, ...]) -> Any:
    return _carrier_class(cls)(*values)


def _rebuild_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    return new_dataclass(carrier_class(cls), fields)


def allow_loading(*objects: Any) -> None:
    """Let ``torch.load(weights_only=True)`` rebuild these classes and functions."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(list(objects))


allow_loading(
    _rebuild,
    Layout,
    Wrap,
    Part,
    TensorSpec,
    ValueSpec,
    ListSpec,
    PartSpec,
    MappingSpec,
    SequenceSpec,
    NamedTupleSpec,
    DataclassSpec,
    RegisteredSpec,
    RowsSpec,
    GroupsSpec,
    JaggedSpec,
    SplitSpec,
    ItemsSpec,
    Batch,
    BatchList,
    _rebuild_namedtuple,
    _rebuild_dataclass,
)
