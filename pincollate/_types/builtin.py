"""The built-in leaf types: tensors, numpy arrays and scalars, Python numbers, str, bytes, None.

Each registers its :class:`~pincollate._types.leaves.LeafHandler` when this module is
imported (the package imports it). Tensors and arrays stack with one call per column
(concatenated where a policy asks); numbers go through numpy into their region in
one assignment; str, bytes and None are kept as per-sample lists.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from .._errors import CollateError
from .leaves import LeafHandler, register_leaf
from .wrap import Wrap

#: The dtype getters, called at C speed by ``map``.
TENSOR_DTYPE: Callable[[Any], Any] = torch.Tensor.dtype.__get__  # type: ignore[attr-defined]
TENSOR_SHAPE: Callable[[Any], Any] = torch.Tensor.shape.__get__  # type: ignore[attr-defined]
ARRAY_DTYPE: Callable[[Any], Any] = np.ndarray.dtype.__get__

__all__ = [
    "ARRAY_DTYPE",
    "BUILTIN",
    "KEPT_VALUES",
    "NARROW",
    "NUMBERS",
    "NUMBER_TYPES",
    "TENSOR_DTYPE",
    "TENSOR_SHAPE",
    "builtin",
    "concat_tensors",
    "describe_plain",
    "describe_tensor",
    "describe_tensors",
    "fill_numbers",
    "fits_float64",
    "fits_int64",
    "ints_fit_float64",
    "number_dtype",
    "numbers_tensor",
    "plain_memory",
    "stack_tensors",
    "tensor_refusal",
    "torch_dtype",
]

Path = tuple[Hashable, ...]


# --- tensors -------------------------------------------------------------------------


#: What a tensor on an accelerator is told: batches are collated on the CPU and moved whole.
_ON_DEVICE = " (return CPU tensors from the dataset; move the batch with batch.to(device) or the Prefetcher)"


#: A tensor class's ``__torch_dispatch__`` where it defines none: torch's own, which turns dispatch off.
_NO_DISPATCH = torch.Tensor.__torch_dispatch__


def tensor_refusal(value: torch.Tensor) -> str | None:
    """Why a tensor cannot be collated (nested, quantized, sparse, off the CPU, a wrapper subclass);
    ``None`` where it can."""
    if value.is_nested:
        return "nested tensors are not supported; pass their components as a list"
    if type(value).__torch_dispatch__ is not _NO_DISPATCH:
        # A wrapper subclass (MaskedTensor, a tensor of tensors) answers every op itself: a copy
        # into a view of the buffer copies what its dispatch gives (one inner tensor, or an error).
        return (
            f"{type(value).__name__} is a wrapper tensor subclass (it defines __torch_dispatch__): its data is not "
            "a storage of its own that the batch's buffer could hold; pass its inner tensors, or stack it in "
            "a collate of your own"
        )
    if value.is_quantized:
        return "quantized tensors are not supported; pass their dequantize() or int_repr()"
    if value.layout != torch.strided:
        return f"sparse or non-strided tensors ({value.layout}) are not supported; pass their to_dense()"
    if value.device.type != "cpu":
        why = " (a meta tensor has no data)" if value.device.type == "meta" else _ON_DEVICE
        return f"expected a CPU tensor, got one on {value.device}{why}"
    return None


def describe_tensor(value: torch.Tensor, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
    refusal = tensor_refusal(value)
    if refusal is not None:
        raise CollateError(refusal, sample=sample, path=path)
    return value.dtype, tuple(value.shape)


_TENSOR_LAYOUT: Callable[[Any], Any] = torch.Tensor.layout.__get__  # type: ignore[attr-defined]
_TENSOR_IS_CPU: Callable[[Any], Any] = torch.Tensor.is_cpu.__get__  # type: ignore[attr-defined]
_STRIDED = {torch.strided}
_TRUE = {True}
_TENSOR_TYPE = {torch.Tensor}
#: The dtypes of quantized tensors (those this torch has): describe_tensor refuses them.
_QUANTIZED = frozenset(
    dtype
    for dtype in (getattr(torch, name, None) for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4"))
    if isinstance(dtype, torch.dtype)
)


def plain_memory(values: Sequence[Any]) -> bool:
    """Whether every tensor of ``values`` is strided and in CPU memory, read at C speed: what a copy into the buffer reads.

    A sparse, meta or accelerator tensor is refused by the copy that reads it; one without
    elements is read by no copy, so a plan's guard asks this of such values.

    Examples:
        >>> plain_memory([torch.zeros(2), torch.zeros(0)]), plain_memory([torch.zeros(0, device="meta")])
        (True, False)
    """
    return set(map(_TENSOR_LAYOUT, values)) <= _STRIDED and set(map(_TENSOR_IS_CPU, values)) <= _TRUE


def describe_tensors(values: Sequence[Any]) -> tuple[list[torch.dtype], list[tuple[int, ...]]] | None:
    """The dtypes and shapes of tensors that ``describe_tensor`` takes without a word, read at C speed.

    ``None`` where any value is something else (no tensor, ``None``, a nested, quantized,
    sparse or accelerator tensor), or there are none. A nested tensor has no shape (reading it
    raises); a quantized one has a quantized dtype. The values' classes are the caller's to check.
    """
    if not values:
        return None
    try:
        # Comprehensions, not map() of the descriptors' __get__: an attribute read in a loop costs
        # about 75 ns, a descriptor called through map about 100 (the values are tensors: the caller's check).
        if {v.layout for v in values} != _STRIDED or {v.is_cpu for v in values} != _TRUE:
            return None  # sparse, meta or accelerator memory
        dtypes = [v.dtype for v in values]
        if not _QUANTIZED.isdisjoint(dtypes):
            return None
        sizes = [v.shape for v in values]
    except (RuntimeError, AttributeError, TypeError):
        return None
    first = sizes[0]
    if sizes.count(first) == len(sizes):  # one shape (a column that stacks): one tuple
        return dtypes, [tuple(first)] * len(sizes)
    return dtypes, list(map(tuple, sizes))


def describe_plain(values: Sequence[Any]) -> tuple[list[torch.dtype], list[tuple[int, ...]]] | None:
    """:func:`describe_tensors` of a column of plain tensors (exactly ``torch.Tensor``); ``None`` else.

    A subclass, ``None`` or a tensor ``describe_tensor`` refuses: it then names it, value by value.
    """
    if set(map(type, values)) != _TENSOR_TYPE:
        return None
    return describe_tensors(values)


def stack_tensors(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    torch.stack(values, out=region)


def concat_tensors(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    torch.cat(values, out=region)


def _copy_tensor(region: torch.Tensor, values: list[torch.Tensor]) -> None:
    region.copy_(values[0])


def _tensor_signature(value: torch.Tensor) -> Hashable:
    return (value.dtype, value.shape)


def _subclass_wrap(value: torch.Tensor) -> Wrap | None:
    # A tensor subclass comes back as its class, as torch.stack gives it; one that turns
    # __torch_function__ off (nn.Parameter) is a plain tensor to torch.stack.
    cls = type(value)
    if cls is torch.Tensor or getattr(cls, "__torch_function__", None) is torch._C._disabled_torch_function_impl:
        return None
    return Wrap(cls)


#: The handlers this module registers for plain tensors and Python numbers, by class: where
#: one of them is still the registered one, its values are described at C speed (a user who
#: registers another handler for the class has every value described by it).
BUILTIN: dict[type, LeafHandler] = {}


def builtin(cls: type, handler: LeafHandler | None) -> bool:
    """Whether ``handler`` (the one registered for ``cls``) is this module's own for ``cls``."""
    return handler is not None and BUILTIN.get(cls) is handler


def _register(cls: type, handler: LeafHandler) -> None:
    BUILTIN[cls] = handler
    register_leaf(cls, handler)


_register(
    torch.Tensor,
    LeafHandler(
        "Tensor",
        "tensor",
        describe_tensor,
        stack_tensors,
        wrap=_subclass_wrap,
        key=TENSOR_DTYPE,
        signature=_tensor_signature,
        concat=concat_tensors,
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
        # An object array is most often rows of nested lists (Arrow's list<list<...>>, say).
        hint = "; for nested lists, pass each row's items as a list of arrays" if value.dtype == object else ""
        raise CollateError(
            f"numpy arrays of dtype {value.dtype} (strings or objects) cannot be collated{hint}",
            sample=sample,
            path=path,
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


_register(
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


#: The dtype of a column of exact Python numbers of one type: :func:`number_dtype`'s answer
#: for it, without asking torch (an ``int`` column must fit ``int64``).
NUMBERS: dict[type, torch.dtype] = {int: torch.int64, float: torch.float64, bool: torch.bool}
#: The exact Python number types (a column of several becomes one tensor by :func:`number_dtype`).
NUMBER_TYPES = frozenset(NUMBERS)
#: The values every collate keeps as they are, never in the buffer: a str, bytes, ``None``.
KEPT_VALUES = frozenset((str, bytes, type(None)))


def number_dtype(values: Sequence[Any]) -> torch.dtype:
    """The dtype ``default_collate`` gives a column of numbers: one rule, used everywhere.

    A column that starts with a Python float (or a subclass other than numpy's ``float64``)
    is ``float64`` (``complex128`` where a complex number follows: ``default_collate`` would
    drop its imaginary part or raise); one that starts with an int or bool, or a numpy
    scalar, takes the dtype torch infers for the whole column, as ``torch.tensor`` /
    ``torch.as_tensor`` do there.
    """
    first = next(v for v in values if v is not None)
    present = [v for v in values if v is not None]
    classes = set(map(type, present))
    if len(classes) == 1:  # one exact Python type, read at C speed
        cls = classes.pop()
        if cls is float or cls is bool:
            return NUMBERS[cls]
        if cls is int and min(present) >= -(2**63) and max(present) < 2**63:
            return torch.int64  # what torch.tensor infers where every int fits
    if float in classes and classes <= NUMBER_TYPES:
        # Floats beside ints or bools (JSON's numbers): a float first makes float64; an int or a
        # bool first, what torch.tensor infers for them all, the default float dtype (an int too
        # large for a float raises there, and here).
        if type(first) is float:
            return torch.float64
        if not ints_fit_float64(present):
            raise OverflowError("int too large to convert to float")
        return torch.get_default_dtype()
    if isinstance(first, float) and not isinstance(first, np.generic):
        # numpy's float64 is a float too, but default_collate takes a column that starts with
        # a numpy scalar as numpy's: torch.as_tensor of them all (complex beside it stays complex).
        return torch.complex128 if any(isinstance(v, (complex, np.complexfloating)) for v in present) else torch.float64
    if isinstance(first, complex):
        return torch.complex128
    if isinstance(first, int):
        return torch.tensor(present, device="cpu").dtype
    if isinstance(first, np.generic) and len({type(v) for v in present}) == 1:
        # One numpy scalar type (uint64 too, which torch.as_tensor of scalars refuses): its dtype.
        found = torch_dtype(first.dtype)
        if found is not None:
            return found
    return torch.as_tensor(present, device="cpu").dtype


_INTS = frozenset((int, bool))


def numbers_tensor(numbers: list[Any], types: set[type] | None = None) -> torch.Tensor:
    """``torch.tensor(numbers)`` on the CPU: its dtype, its values and its errors.

    Python ints (bools among them) are read by numpy, which reads a list of ints five
    times faster than ``torch.tensor`` does, into the ``int64`` torch would infer.
    ``types``: the numbers' exact classes, where the caller has them.
    """
    types = set(map(type, numbers)) if types is None else types
    if int in types and types <= _INTS:
        try:
            return torch.from_numpy(np.array(numbers, dtype=np.int64))
        except OverflowError:
            pass  # an int beyond int64: torch.tensor's own error
    return torch.tensor(numbers, device="cpu")


def fits_int64(value: int) -> bool:
    """Whether a Python int fits the ``int64`` a column of ints becomes."""
    return -(2**63) <= value < 2**63


#: The largest magnitude a Python int may have and still convert to a finite ``float64``.
_FLOAT64_INT_LIMIT = 2**1024 - 2**970


def fits_float64(value: Any) -> bool:
    """Whether a number converts to ``float64`` (an int too large for a float does not), at Python speed."""
    return type(value) is not int or -_FLOAT64_INT_LIMIT < value < _FLOAT64_INT_LIMIT


def ints_fit_float64(values: Sequence[Any]) -> bool:
    """Whether every number of ``values`` converts to ``float64``, as :func:`fits_float64` of each, at C speed.

    Examples:
        >>> ints_fit_float64([0.5, 2**1000, True]), ints_fit_float64([0.5, -(2**1100)])
        (True, False)
    """
    ints = [value for value in values if type(value) is int]
    return not ints or (min(ints) > -_FLOAT64_INT_LIMIT and max(ints) < _FLOAT64_INT_LIMIT)


#: Number dtypes a Python number may overflow to inf in (numpy warns there; torch.tensor does not).
NARROW = frozenset((torch.float16, torch.float32, torch.complex64))


def fill_numbers(region: torch.Tensor, values: list[Any]) -> None:
    # One numpy assignment is ten times cheaper than torch.tensor(values).
    try:
        array = region.numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16, where it is the default dtype): torch reads them
        region.copy_(torch.tensor(values, dtype=region.dtype, device="cpu"))
        return
    if region.dtype in NARROW:
        with np.errstate(over="ignore"):  # past the range is inf, as torch.tensor makes it, unwarned
            array[...] = values
        return
    array[...] = values


_register(bool, LeafHandler("bool", "number", _describe_bool, fill_numbers))
_register(int, LeafHandler("int", "number", _describe_int, fill_numbers))
_register(float, LeafHandler("float", "number", _describe_float, fill_numbers))
register_leaf(complex, LeafHandler("complex", "number", _describe_complex, fill_numbers))
register_leaf((np.bool_, np.number), LeafHandler("numpy scalar", "number", _describe_np_scalar, fill_numbers))

# --- values kept as a list -----------------------------------------------------------

register_leaf(str, LeafHandler("str", "str", None, None))
register_leaf(bytes, LeafHandler("bytes", "bytes", None, None))
register_leaf(type(None), LeafHandler("None", "None", None, None))
