"""Leaf types: what a sample value becomes in the batch buffer.

Each leaf type has one :class:`LeafHandler` in a registry. Lookup walks the value's
method resolution order and takes the nearest registered class, so a subclass of
torchvision's ``Image`` is an image and a subclass of ``Tensor`` a tensor. PIL and
torchvision register the first time a value of theirs is looked up, so importing
pincollate imports neither, and a broken install only disables its own types.

A handler describes one value (``dtype`` and ``shape`` of its tensor, after
validation) and fills a region with a whole column of values in one call.
Handlers of one *family* may share a column: Python numbers with numpy scalars,
say, as ``default_collate`` allows. The built-in types (tensors, numpy arrays and
scalars, Python numbers, str, bytes, None) register in :mod:`pincollate._types.builtin`.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .wrap import Wrap

#: A copy: ``fill(region, payload)``; the region is a tensor of the buffer, or a tuple of
#: them where one copy writes several tensors (a padded field and its mask).
Filler = Callable[[Any, Any], None]

__all__ = [
    "REGISTRATIONS",
    "LeafHandler",
    "lookup",
    "note_registration",
    "on_first_sight",
    "register_leaf",
    "type_name",
]

Path = tuple[Hashable, ...]


def type_name(value: Any) -> str:
    return type(value).__name__


class LeafHandler:
    """How one leaf type is described and copied.

    Args:
        name: what error messages call the type ("Tensor").
        family: handlers of one family may be mixed in one column.
        describe: ``describe(value, sample, path) -> (dtype, shape)``; validates and
            raises [CollateError][pincollate.CollateError] for values it cannot take. ``None`` for
            leaves that are not tensors (strings), which are returned as a list.
        fill: ``fill(region, values)`` copies values into ``region``, whose first
            dimension indexes the values.
        wrap: ``wrap(value)`` gives the [Wrap][pincollate.Wrap] that turns a plain
            view of the buffer into the value's type again (a tensor subclass and its
            metadata; the built-in handlers use it for torchvision's ``tv_tensors``), or
            ``None`` for a plain tensor.
        key: what must agree across a column for a cached plan to stack it, beside
            the type (a tensor's dtype); read at C speed, so a plain function. A later
            batch of a planned structure is checked by ``key`` (and ``meta``, and what
            ``wrap`` keeps) alone, without ``describe``: put into it whatever
            ``describe`` validates, or leave it ``None`` to have every batch described.
        signature: what of a value decides its place in the buffer (dtype and shape).
        meta: ``meta(value)`` gives what must agree for values to stack beyond dtype
            and shape (a mask's type, say).
        stackable: ``False`` for types kept one per sample even when shapes agree
            (torchvision's ``BoundingBoxes`` must stay 2-D).
        concat: ``concat(region, values)`` writes values concatenated along dim 0
            in one call, or ``None`` (then each value is copied on its own).
        fill_one: ``fill_one(region, [value])`` copies one value into a region of
            the value's own shape; by default ``fill`` on the region with a
            leading dimension of 1.
    """

    __slots__ = (
        "concat",
        "describe",
        "family",
        "fill",
        "fill_one",
        "key",
        "meta",
        "name",
        "signature",
        "stackable",
        "wrap",
    )

    def __init__(
        self,
        name: str,
        family: str,
        describe: Callable[[Any, int, Path], tuple[torch.dtype, tuple[int, ...]]] | None,
        fill: Filler | None,
        *,
        wrap: Callable[[Any], Wrap | None] | None = None,
        key: Callable[[Any], Any] | None = None,
        signature: Callable[[Any], object] | None = None,
        meta: Callable[[Any], object] | None = None,
        stackable: bool = True,
        concat: Filler | None = None,
        fill_one: Filler | None = None,
    ):
        self.name: str = name
        self.family: str = family
        self.describe: Callable[[Any, int, Path], tuple[torch.dtype, tuple[int, ...]]] | None = describe
        self.fill: Filler | None = fill
        self.wrap: Callable[[Any], Wrap | None] | None = wrap
        self.key: Callable[[Any], Any] | None = key
        self.signature: Callable[[Any], object] | None = signature
        self.meta: Callable[[Any], object] | None = meta
        self.stackable: bool = stackable
        self.concat: Filler | None = concat
        self.fill_one: Filler = fill_one if fill_one is not None else functools.partial(_fill_one_by_stack, fill)

    @property
    def is_tensor(self) -> bool:
        return self.describe is not None


def _fill_one_by_stack(fill: Filler | None, region: torch.Tensor, values: list[Any]) -> None:
    assert fill is not None  # only tensor-like handlers are filled
    fill(region.unsqueeze(0), values)


_exact: dict[type, LeafHandler] = {}

#: How many times the user has registered a leaf or a container type: a collate's cached plans
#: (made under the earlier registrations) are dropped when it changes. PIL's and torchvision's
#: handlers, registered on first sight, change no answer a plan holds and count not.
REGISTRATIONS = [0]
#: Set on the thread that registers PIL's or torchvision's types on first sight (another
#: thread's registration meanwhile is the user's, and counts).
_on_first_sight = threading.local()


def note_registration() -> None:
    """A user's registration happened: every collate plans anew."""
    if not getattr(_on_first_sight, "active", False):
        REGISTRATIONS[0] += 1


def register_leaf(cls: type | tuple[type, ...], handler: LeafHandler, /) -> None:
    """Register ``handler`` for values of ``cls`` and its subclasses (one type or a tuple).

    The nearest registered class in a value's method resolution order wins, so a
    handler for a subclass overrides its base's. As torch's ``default_collate_fn_map``
    does for ``default_collate``. A registration reaches collates that already ran:
    they drop their plans and plan again. Register at import of the module that defines
    ``cls``: a ``DataLoader`` worker started by ``spawn`` or ``forkserver`` imports that
    module but runs nothing of ``main()``, and without the handler it collates the values
    as their base class would be.

    Examples:
        >>> import torch
        >>> import pincollate
        >>> class Celsius(float):
        ...     pass
        >>> def describe(value, sample, path):
        ...     return torch.float32, ()
        >>> def fill(region, values):
        ...     region.copy_(torch.tensor([float(v) for v in values]))
        >>> pincollate.register_leaf(Celsius, pincollate.LeafHandler("Celsius", "celsius", describe, fill))
        >>> pincollate.mm_collate([{"t": Celsius(21.5)}, {"t": Celsius(19.0)}])["t"]
        tensor([21.5000, 19.0000])
    """
    if not isinstance(handler, LeafHandler):
        raise TypeError(f"handler must be a LeafHandler, got {type_name(handler)}")
    for each in cls if isinstance(cls, tuple) else (cls,):
        if not isinstance(each, type):
            raise TypeError(f"cls must be a type or a tuple of types, got {each!r}")
        _exact[each] = handler
    _cached_lookup.cache_clear()
    note_registration()


def _find(cls: Any) -> LeafHandler | None:
    for base in cls.__mro__:
        _load_optional(base)
        handler = _exact.get(base)
        if handler is not None:
            return handler
    return None


_cached_lookup = functools.lru_cache(maxsize=1024)(_find)


def lookup(cls: type) -> LeafHandler | None:
    """The handler for values of type ``cls``, or ``None`` if it is not a leaf.

    The exact type wins; otherwise the nearest registered base class in ``cls``'s
    method resolution order, so a subclass of torchvision's ``Image`` is an image.
    Answers are cached per class until the next registration.
    """
    return _cached_lookup(cls)


# --- optional libraries, registered on first sight -------------------------------------

_loaded: set[str] = set()


def _load_optional(cls: type) -> None:
    """Register PIL's or torchvision's types when a class from them is first looked up."""
    root = cls.__module__.partition(".")[0]
    if root in _loaded or root not in _OPTIONAL:
        return
    _loaded.add(root)
    _on_first_sight.active = True
    try:
        _OPTIONAL[root]()
    except Exception as exc:  # a broken install disables its own types only
        warnings.warn(f"pincollate: {root} support is disabled, its import failed: {exc}", RuntimeWarning, stacklevel=4)
    finally:
        _on_first_sight.active = False


def on_first_sight(root: str, register: Callable[[], None]) -> None:
    """Call ``register`` the first time a class from the top-level module ``root`` is looked up.

    PIL and torchvision register their types this way (:mod:`pincollate._integrations.vision`), so that
    importing pincollate imports neither.
    """
    _OPTIONAL[root] = register
    _loaded.discard(root)
    _cached_lookup.cache_clear()


_OPTIONAL: dict[str, Callable[[], None]] = {}
