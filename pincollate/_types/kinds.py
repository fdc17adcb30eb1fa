"""Container kinds: how each container type is recognised, named, taken apart and rebuilt.

One registry for every stage that walks a tree: planning (the template and the careful
walk), a plan's signature, the layout's specs, the batch's consistency check, moving
trees and transforms. Four kinds are built in, in this order of precedence: a
**mapping** (any ``Mapping``; children by key), a **namedtuple** and a **dataclass**
(children by field: an :class:`~pincollate._errors.Attr` in key paths), a **sequence**
(any other ``Sequence`` but ``str``, ``bytes`` and ``bytearray``; children by position).
A class registered with :func:`register_container` comes before all four: its children
are named by its ``flatten``'s keys, and a batch of it is ``unflatten`` of the collated
children.
"""

from __future__ import annotations

import collections.abc as abc
import copy
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .._errors import Attr, CollateError
from .build import make_mapping, new_dataclass
from .leaves import lookup, note_registration, type_name

__all__ = [
    "DATACLASS",
    "EXACT_KEYS",
    "LISTS",
    "MAPPING",
    "NAMEDTUPLE",
    "SEQUENCE",
    "Kind",
    "Registered",
    "is_dataclass",
    "is_namedtuple",
    "is_sequence",
    "kind_of",
    "register_container",
    "registered",
    "union_keys",
    "value_at",
]

Flatten = Callable[[Any], tuple[Sequence[Hashable], Sequence[Any]]]
Unflatten = Callable[[Sequence[Hashable], Sequence[Any]], Any]


class Kind:
    """One kind of container: a value's children with their key-path names, and the value rebuilt.

    ``rebuild`` keeps the value's own class (what moving a tree needs); what a collated
    batch of the kind is made as (``default_collate``'s rules: tuples become lists, say)
    is the layout's specs' business.
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<container kind {self.name}>"

    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        """The key-path element of each child, and the children, in order."""
        raise NotImplementedError

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        """A value of ``value``'s class with ``children`` (named ``keys``) in place of its own."""
        raise NotImplementedError

    def keys(self, value: Any) -> list[Hashable]:
        return self.flatten(value)[0]

    def children(self, value: Any) -> list[Any]:
        return self.flatten(value)[1]


class _Mapping(Kind):
    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        if type(value) is dict:
            return list(value.keys()), list(value.values())
        # By key, as default_collate and the walk read a mapping: a dict subclass's values()
        # passes over its __getitem__ (one that decodes on access, say).
        keys = list(value.keys())
        return keys, [value[key] for key in keys]

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        pairs = dict(zip(keys, children, strict=True))
        return pairs if type(value) is dict else make_mapping(type(value), pairs)


class _NamedTuple(Kind):
    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        return [Attr(name) for name in value._fields], list(value)

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        return type(value)(*children)


class _Dataclass(Kind):
    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        names = [field.name for field in dataclasses.fields(value)]
        return [Attr(name) for name in names], [getattr(value, name) for name in names]

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        return new_dataclass(type(value), {str(key): child for key, child in zip(keys, children, strict=True)})


class _Sequence(Kind):
    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        return list(range(len(value))), list(value)

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        if isinstance(value, list):
            clone = copy.copy(value)  # a list subclass keeps its attributes
            clone[:] = children
            return clone
        if isinstance(value, tuple):
            return type(value)(children)
        # Another Sequence type (a range, a user's class) need not build from its items.
        return value


class Registered(Kind):
    """A user's container class, registered with :func:`register_container`."""

    __slots__ = ("cls", "unflatten", "user_flatten")

    def __init__(self, cls: type, flatten: Flatten, unflatten: Unflatten):
        super().__init__(cls.__qualname__)
        self.cls = cls
        self.user_flatten = flatten
        self.unflatten = unflatten

    def flatten(self, value: Any) -> tuple[list[Hashable], list[Any]]:
        keys, children = self.user_flatten(value)
        return list(keys), list(children)

    def rebuild(self, value: Any, keys: list[Hashable], children: list[Any]) -> Any:
        return self.build(keys, children)

    def build(self, keys: list[Hashable], children: list[Any]) -> Any:
        """``unflatten(keys, children)``; what it raises is a ``CollateError`` naming the class."""
        try:
            return self.unflatten(keys, children)
        except CollateError:
            raise
        except Exception as exc:
            raise CollateError(f"unflatten of {self.cls.__qualname__} failed: {exc!r}") from exc


MAPPING: Kind = _Mapping("mapping")
NAMEDTUPLE: Kind = _NamedTuple("namedtuple")
DATACLASS: Kind = _Dataclass("dataclass")
SEQUENCE: Kind = _Sequence("sequence")
#: The exact classes of a per-sample list of items (token ids, a prompt's images, a target's objects).
LISTS = frozenset((list, tuple))

_registered: dict[type, Registered] = {}
_CLASSES_KEPT = 4096
#: The kind of each class seen so far (``None``: not a container); cleared by a registration.
_by_class: dict[type, Kind | None] = {}


def kind_of(value: Any) -> Kind | None:
    """The container kind of ``value``, or ``None`` for anything else (leaves included).

    Examples:
        >>> import collections
        >>> [kind_of(v).name for v in ({}, collections.OrderedDict(), [1], (1,), range(2))]
        ['mapping', 'mapping', 'sequence', 'sequence', 'sequence']
        >>> kind_of("text") is None and kind_of(1) is None
        True
    """
    cls = type(value)
    try:
        return _by_class[cls]
    except KeyError:
        pass
    kind = _classify(value)
    if not isinstance(value, type):  # a class is no instance of its dataclass kind
        if len(_by_class) >= _CLASSES_KEPT:
            _by_class.clear()  # classes made on the fly (a namedtuple per sample): start again
        _by_class[cls] = kind
    return kind


def _classify(value: Any) -> Kind | None:
    found = _registered.get(type(value))
    if found is not None:
        return found
    if isinstance(value, abc.Mapping):
        return MAPPING
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return NAMEDTUPLE
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return DATACLASS
    if isinstance(value, abc.Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return SEQUENCE
    return None


#: Key types whose equal keys of one type are the same key: a plan may build its output
#: with its own key objects. Others (a float, where -0.0 == 0.0; a tuple, where (True,) ==
#: (1,)) are each sample's own: the careful walk keeps them.
EXACT_KEYS = frozenset((str, int, bool, bytes, type(None)))


def value_at(mapping: Any, key: Hashable) -> Any:
    """``mapping[key]``, or ``None`` where ``mapping`` lacks ``key`` (``missing="none"``).

    Read by ``[]``, as ``default_collate`` reads it: ``get`` of a dict subclass passes over its
    ``__getitem__`` (one that decodes on access, say).

    Example:
        >>> value_at({"a": 1}, "a"), value_at({"a": 1}, "b")
        (1, None)
    """
    if type(mapping) is dict:
        return mapping.get(key)
    return mapping[key] if key in mapping else None  # noqa: SIM401  (get() passes over a subclass's __getitem__)


def union_keys(column: Sequence[Any]) -> list[Hashable]:
    """The keys of a column of mappings some of which lack some keys (``missing="none"``).

    The first present mapping's keys in its order, then each later one's new keys in
    theirs: the order of a collated batch's keys. ``None`` entries (absent mappings) are
    skipped.

    Examples:
        >>> union_keys([{"ids": 1}, None, {"ids": 2, "pixels": 3}, {"audio": 4}])
        ['ids', 'pixels', 'audio']
    """
    first = next(value for value in column if value is not None)
    keys = list(first.keys())
    seen: abc.Set[Hashable] = first.keys()
    for value in column:
        if value is not None and value.keys() != seen:
            extra = [key for key in value if key not in seen]
            if extra:
                keys.extend(extra)
                seen = set(keys)
    return keys


def is_namedtuple(value: Any) -> bool:
    return kind_of(value) is NAMEDTUPLE


def is_sequence(value: Any) -> bool:
    """A sequence whose items a collate transposes: a list, a tuple (a namedtuple too), another ``Sequence``."""
    kind = kind_of(value)
    return kind is SEQUENCE or kind is NAMEDTUPLE


def is_dataclass(value: Any) -> bool:
    """A dataclass instance (not the class)."""
    return kind_of(value) is DATACLASS


def registered(cls: type) -> Registered:
    """The registration of ``cls``, for rebuilding a collated batch of it.

    Raises:
        CollateError: ``cls`` is not registered in this process (a layout made elsewhere).
    """
    found = _registered.get(cls)
    if found is None:
        raise CollateError(
            f"{cls.__qualname__} is no registered container in this process: call "
            "pincollate.register_container for it here too (at import of the module that defines it)"
        )
    return found


def register_container(cls: type, flatten: Flatten, unflatten: Unflatten) -> None:
    """Collate, check and move instances of ``cls`` as containers of their children.

    ``flatten(value)`` returns ``(keys, children)``: the children (tensors, numbers,
    other containers, ...) and a hashable key naming each in key paths, in errors and
    in field patterns. ``unflatten(keys, children)`` builds an instance from them. A
    collated batch of ``cls`` is ``unflatten(keys, collated children)``; every sample of
    a batch must be exactly of ``cls`` with the same keys. Register in the module that
    defines ``cls``, so every process that unpickles a batch of it has it registered.
    ``unflatten`` should only build: it runs again whenever a batch is rebuilt (moved,
    pinned, unpickled), so a change it makes to the children is made again each time;
    what it raises is a ``CollateError``. A registration (or a new one for the same class)
    reaches collates that already ran: they drop their plans and plan again.

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, register_container
        >>> class Pair:
        ...     def __init__(self, image, label):
        ...         self.image, self.label = image, label
        >>> register_container(Pair, lambda p: (["image", "label"], [p.image, p.label]), lambda keys, v: Pair(*v))
        >>> batch = MMCollate(pin_memory=False)([Pair(torch.zeros(3), 1), Pair(torch.ones(3), 2)])
        >>> type(batch).__name__, batch.image.shape, batch.label.tolist()
        ('Pair', torch.Size([2, 3]), [1, 2])

    Raises:
        CollateError: ``cls`` is not a class, or is a leaf type (a tensor, an array, a
            number, str, bytes, a registered leaf).
    """
    if not isinstance(cls, type):
        raise CollateError(f"register_container takes a class, got {type_name(cls)}")
    if lookup(cls) is not None:
        raise CollateError(f"{cls.__qualname__} is a leaf type; it cannot be registered as a container")
    if not callable(flatten) or not callable(unflatten):
        raise CollateError("register_container needs flatten(value) -> (keys, children) and unflatten(keys, children)")
    _registered[cls] = Registered(cls, flatten, unflatten)
    _by_class.clear()  # the cache may hold this class under a built-in kind
    note_registration()  # and every collate's plans: they read its children by the old flatten
