"""Leaf types: what a sample value becomes in the batch buffer.

Each leaf type has one :class:`LeafHandler` in a registry. Lookup walks the value's
method resolution order and takes the nearest registered class, so a subclass of
torchvision's ``Image`` is an image and a subclass of ``Tensor`` a tensor. PIL and
torchvision register the first time a value of theirs is looked up, so importing
pincollate imports neither, and a broken install only disables its own types.

A handler describes one value (``dtype`` and ``shape`` of its tensor, after
validation) and fills a region with a whole column of values in one call.
Handlers of one *family* may share a column: Python numbers with numpy scalars,
say, as ``default_collate`` allows.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch

from ._errors import CollateError
from ._fill import Filler
from ._layout import Wrap
from ._ops import ARRAY_DTYPE, TENSOR_DTYPE

__all__ = [
    "LeafHandler",
    "describe_tensor",
    "fill_numbers",
    "lookup",
    "on_first_sight",
    "register_leaf",
    "torch_dtype",
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
            raises :class:`CollateError` for values it cannot take. ``None`` for
            leaves that are not tensors (strings), which are returned as a list.
        fill: ``fill(region, values)`` copies values into ``region``, whose first
            dimension indexes the values.
        wrap: ``wrap(value)`` gives the :class:`~pincollate._layout.Wrap` that turns a
            plain view into a value's type (a tensor subclass and its metadata), or
            ``None`` for a plain tensor.
        key: what must agree across a column for a cached plan to stack it, beside
            the type (a tensor's dtype); read at C speed, so a plain function.
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


def register_leaf(cls: type | tuple[type, ...], handler: LeafHandler, /) -> None:
    """Register ``handler`` for values of ``cls`` and its subclasses (one type or a tuple).

    The nearest registered class in a value's method resolution order wins, so a
    handler for a subclass overrides its base's. As torch's ``default_collate_fn_map``
    does for ``default_collate``.

    Example:
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


# --- tensors -------------------------------------------------------------------------


def describe_tensor(value: torch.Tensor, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    if value.is_nested:
        raise CollateError(
            "nested tensors are not supported; pass their components as a list", sample=sample, path=path
        )
    if value.is_quantized:
        raise CollateError(
            "quantized tensors are not supported; pass their dequantize() or int_repr()", sample=sample, path=path
        )
    if value.layout != torch.strided:
        raise CollateError(
            f"sparse or non-strided tensors ({value.layout}) are not supported", sample=sample, path=path
        )
    if value.device.type != "cpu":
        raise CollateError(f"expected a CPU tensor, got one on {value.device}", sample=sample, path=path)
    return value.dtype, tuple(value.shape)


def _fill_tensors(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    torch.stack(values, out=region)


def _concat_tensors(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    torch.cat(values, out=region)


def _copy_tensor(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    region.copy_(values[0])


def _tensor_signature(value: torch.Tensor) -> Hashable:
    return (value.dtype, value.shape)


def _subclass_wrap(value: torch.Tensor) -> Wrap | None:
    # A tensor subclass comes back as its class, as torch.stack gives it.
    cls = type(value)
    return None if cls is torch.Tensor else Wrap(cls)


register_leaf(
    torch.Tensor,
    LeafHandler(
        "Tensor",
        "tensor",
        describe_tensor,
        _fill_tensors,
        wrap=_subclass_wrap,
        key=TENSOR_DTYPE,
        signature=_tensor_signature,
        concat=_concat_tensors,
        fill_one=_copy_tensor,
    ),
)


# --- numpy ---------------------------------------------------------------------------

# default_collate rejects string, bytes, unicode and object arrays with this test.
_NP_REJECTED = re.compile(r"[SaUO]")


@functools.cache
def torch_dtype(np_dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype
    except TypeError:
        return None


def _describe_array(value: np.ndarray, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    if _NP_REJECTED.search(value.dtype.str) is not None:
        raise CollateError(
            f"numpy arrays of dtype {value.dtype} (strings or objects) cannot be collated", sample=sample, path=path
        )
    dtype = torch_dtype(value.dtype)
    if dtype is None:
        raise CollateError(f"numpy dtype {value.dtype} has no torch equivalent", sample=sample, path=path)
    return dtype, value.shape


def _fill_arrays(region: torch.Tensor, values: list[np.ndarray]) -> None:
    # np.stack reads memmaps and read-only arrays without torch's "not writable"
    # warning, and casts to the promoted dtype.
    np.stack(values, out=region.numpy())


def _concat_arrays(region: torch.Tensor, values: list[np.ndarray]) -> None:
    np.concatenate(values, out=region.numpy())


def _array_signature(value: np.ndarray) -> Hashable:
    return (value.dtype, value.shape)


register_leaf(
    np.ndarray,
    LeafHandler(
        "ndarray",
        "ndarray",
        _describe_array,
        _fill_arrays,
        key=ARRAY_DTYPE,
        signature=_array_signature,
        concat=_concat_arrays,
    ),
)


# --- numbers -------------------------------------------------------------------------


def _describe_np_scalar(value: np.generic, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    dtype = torch_dtype(value.dtype)
    if dtype is None or _NP_REJECTED.search(value.dtype.str) is not None:
        raise CollateError(f"numpy scalar of dtype {value.dtype} cannot be collated", sample=sample, path=path)
    return dtype, ()


def _describe_bool(value: bool, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    return torch.bool, ()


def _describe_int(value: int, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    return torch.int64, ()


def _describe_float(value: float, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    # default_collate makes float64 of Python floats: one rule for every float.
    return torch.float64, ()


def _describe_complex(value: complex, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    return torch.complex128, ()


def fill_numbers(region: torch.Tensor, values: list[Any]) -> None:
    # One numpy assignment is ten times cheaper than torch.tensor(values).
    region.numpy()[...] = values


register_leaf(bool, LeafHandler("bool", "number", _describe_bool, fill_numbers))
register_leaf(int, LeafHandler("int", "number", _describe_int, fill_numbers))
register_leaf(float, LeafHandler("float", "number", _describe_float, fill_numbers))
register_leaf(complex, LeafHandler("complex", "number", _describe_complex, fill_numbers))
register_leaf((np.bool_, np.number), LeafHandler("numpy scalar", "number", _describe_np_scalar, fill_numbers))

# --- values kept as a list -----------------------------------------------------------

register_leaf(str, LeafHandler("str", "str", None, None))
register_leaf(bytes, LeafHandler("bytes", "bytes", None, None))
register_leaf(type(None), LeafHandler("None", "None", None, None))


# --- optional libraries, registered on first sight -------------------------------------

_loaded: set[str] = set()


def _load_optional(cls: type) -> None:
    """Register PIL's or torchvision's types when a class from them is first looked up."""
    root = cls.__module__.partition(".")[0]
    if root in _loaded or root not in _OPTIONAL:
        return
    _loaded.add(root)
    try:
        _OPTIONAL[root]()
    except Exception as exc:  # a broken install disables its own types only
        warnings.warn(f"pincollate: {root} support is disabled, its import failed: {exc}", RuntimeWarning, stacklevel=4)


def on_first_sight(root: str, register: Callable[[], None]) -> None:
    """Call ``register`` the first time a class from the top-level module ``root`` is looked up.

    PIL and torchvision register their types this way (:mod:`._vision`), so that
    importing pincollate imports neither.
    """
    _OPTIONAL[root] = register
    _loaded.discard(root)
    _cached_lookup.cache_clear()


_OPTIONAL: dict[str, Callable[[], None]] = {}
