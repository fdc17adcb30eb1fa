"""Making a batch's tensors over its one buffer: alignment, and a storage of its own per tensor.

Every tensor starts on a 64-byte boundary of the buffer. On the CPU each field gets a
storage of its own over exactly its bytes (:func:`carve`), so one field saves or
pickles alone (the items of a per-sample list are views of their column's, see
:class:`~pincollate._batch.list_specs.SplitSpec`); on an accelerator they are views of the
buffer's one storage.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .._memory.arena import is_pinned
from .._memory.ownership import hold, hold_all

__all__ = [
    "ALIGN",
    "START",
    "Bulk",
    "Views",
    "align",
    "carve",
    "carve_many",
    "contiguous_strides",
    "exposed",
    "numpy_dtype",
    "one_storage",
    "pitch",
    "standin_dtype",
]

#: Every tensor starts on a 64-byte boundary: a cache line, and enough for any dtype's
#: ``view`` to be legal.
ALIGN = 64


#: Where a layout's first tensor starts. Not at byte 0: a field's storage of its own would then start
#: at the buffer's address, and torch refuses to save two storages of one address in two dtypes
#: (``torch.save((batch, batch["image"]))``, which pickles the buffer beside the field).
START = ALIGN


def align(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGN`."""
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def pitch(rows: int, row_bytes: int) -> int:
    """The fewest rows, at least ``rows``, whose bytes are a multiple of :data:`ALIGN`.

    Fields stacked as one block each take this many rows, so each starts aligned.

    Examples:
        >>> pitch(8, 12), pitch(32, 4), pitch(3, 0)
        (16, 32, 3)
    """
    if row_bytes == 0:
        return rows
    step = ALIGN // math.gcd(row_bytes, ALIGN)
    return -(-rows // step) * step


def _numpy_dtypes() -> dict[torch.dtype, np.dtype[Any]]:
    """The torch dtypes ``torch.from_numpy`` makes, each with its numpy dtype (this torch's)."""
    found: dict[torch.dtype, np.dtype[Any]] = {}
    names = "bool uint8 int8 int16 uint16 int32 uint32 int64 uint64 float16 float32 float64 complex64 complex128"
    for name in names.split():
        with contextlib.suppress(TypeError):  # an older torch without this dtype
            found[torch.from_numpy(np.zeros(1, name)).dtype] = np.dtype(name)
    return found


_NUMPY = _numpy_dtypes()


#: The numpy dtype ``torch.from_numpy`` turns into a torch dtype, where there is one (``None``
#: else): the table's own lookup, a C call, since every tensor spec asks it.
numpy_dtype: Callable[[torch.dtype], np.dtype[Any] | None] = _NUMPY.get


def _standins() -> dict[torch.dtype, np.dtype[Any]]:
    """Dtypes numpy lacks (bfloat16, float8), each with numpy's unsigned integer of its size.

    A tensor of one is carved as that integer and viewed back: the same storage of its own,
    and a layout's fields of them are made in one pass (:func:`carve_many`) instead of one
    ``torch.frombuffer`` each.
    """
    found: dict[torch.dtype, np.dtype[Any]] = {}
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        dtype = getattr(torch, name, None)
        if isinstance(dtype, torch.dtype) and dtype not in _NUMPY:
            found[dtype] = np.dtype(f"uint{8 * dtype.itemsize}")
    return found


_STANDINS = _standins()


def standin_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    """The numpy integer a tensor of ``dtype`` (one numpy lacks) is carved as, then viewed back."""
    return _STANDINS.get(dtype)


def carve(source: np.ndarray[Any, Any], as_numpy: np.dtype[Any], shape: tuple[int, ...], offset: int) -> torch.Tensor:
    """A tensor of ``shape`` at byte ``offset`` of ``source``, with a storage of its own.

    An array over the bytes, shaped, is the cheapest way there (about 0.7 us). The
    storage's Python object, which torch keeps while the storage lives, holds
    ``source`` (and so the buffer) even after ``share_memory_`` moves its bytes away.
    """
    return hold(torch.from_numpy(np.ndarray(shape, as_numpy, source, offset)), source)


def carve_many(
    source: np.ndarray[Any, Any],
    dtypes: Iterable[np.dtype[Any]],
    shapes: Iterable[tuple[int, ...]],
    offsets: Iterable[int],
) -> list[torch.Tensor]:
    """:func:`carve` for many tensors (a layout's fixed fields), each with a storage of its own.

    Made by ``map`` at C speed, about a third cheaper per tensor than :func:`carve` one
    by one. An empty one should be replaced by ``torch.empty``'s (see :meth:`Views.tensor`).
    """
    arrays = map(np.ndarray, shapes, dtypes, itertools.repeat(source), offsets)
    return hold_all(list(map(torch.from_numpy, arrays)), source)


#: Tensors a Views makes at once, as :func:`carve_many` takes them: their specs' ids, numpy
#: dtypes, shapes and byte offsets.
Bulk = tuple[tuple[int, ...], tuple["np.dtype[Any]", ...], tuple[tuple[int, ...], ...], tuple[int, ...]]


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def exposed(buffer: torch.Tensor) -> torch.Tensor:
    """``buffer`` as a batch hands it to its user (``batch.buffer``).

    In pageable host memory: a tensor with a storage of its own over the same bytes,
    which keeps the buffer alive, so that moving it (``share_memory_``) moves nothing
    the batch's fields read. In pinned memory and on an accelerator the fields are
    views of the buffer's storage, which moves with them: the buffer itself.
    """
    source = _source(buffer)
    if source is None or not buffer.numel():
        return buffer
    return hold(torch.from_numpy(source), source)


def one_storage(buffer: torch.Tensor) -> bool:
    """Whether the tensors over ``buffer`` are views of its one storage (pinned memory, an accelerator's).

    In pageable host memory each has a storage of its own (:class:`Views`).
    """
    return _source(buffer) is None


def _source(buffer: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """An array over ``buffer`` (it holds the buffer) where its tensors get storages of their own.

    That is pageable host memory; pinned memory and an accelerator's keep views.
    """
    if buffer.device.type != "cpu" or is_pinned(buffer):
        return None
    return buffer.detach().numpy()


class Views:
    """What building needs: the buffer's tensors, the values and the parts.

    In pageable host memory every tensor gets a storage of its own over its own bytes
    of the buffer (:func:`carve`), so saving or pickling one field, or a dict of fields
    of several dtypes, writes only those fields. Each such storage's Python object
    keeps the buffer alive for as long as it lives: ``share_memory_`` moves a storage's
    bytes away (and drops what made it) while numpy arrays made from it earlier still
    read the buffer. In pinned memory and on an accelerator the tensors are views of
    the buffer's one storage: torch's pinned allocator keeps a block from being handed
    out again while a non-blocking copy from it runs only for its own storages, so a
    field copied alone (``batch["x"].to("cuda", non_blocking=True)``) stays safe.
    ``made`` holds tensors already made, by spec id, so each is made once: ``bulk``'s
    (a layout's fixed tensors) at once, the others as filling or building asks.
    """

    __slots__ = ("buffer", "made", "parts", "source", "typed", "values")

    def __init__(
        self,
        buffer: torch.Tensor,
        values: Sequence[Any],
        parts: tuple[Any, ...] = (),
        bulk: Bulk | None = None,
        pageable: bool = False,
    ):
        self.buffer: torch.Tensor = buffer
        self.values: Sequence[Any] = values
        self.parts: tuple[Any, ...] = parts  # the layout's Parts
        self.typed: dict[torch.dtype, torch.Tensor] = {}
        # ``pageable``: the caller knows the buffer is plain host memory (no pin to ask about).
        source = self.source = buffer.detach().numpy() if pageable else _source(buffer)
        if bulk is not None and source is not None and bulk[0]:
            ids, dtypes, shapes, offsets = bulk
            self.made: dict[int, torch.Tensor] = dict(
                zip(ids, carve_many(source, dtypes, shapes, offsets), strict=True)
            )
        else:
            self.made = {}

    def tensor(
        self, dtype: torch.dtype, shape: tuple[int, ...], offset: int, strides: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """The contiguous tensor of ``dtype`` and ``shape`` at byte ``offset`` of the buffer.

        ``strides`` are the contiguous ones of ``shape``, where the caller has them.
        """
        source = self.source
        if source is None:  # views of the buffer's storage
            flat = self.typed.get(dtype)
            if flat is None:
                flat = self.typed[dtype] = self.buffer.view(dtype)
            if strides is None:
                strides = contiguous_strides(shape)
            return flat.as_strided(shape, strides, offset // dtype.itemsize)
        count = math.prod(shape)
        if not count:
            # No bytes to read: a storage of its own that cannot share an address (and so
            # a dtype, for torch.save) with the field after it.
            return torch.empty(shape, dtype=dtype, device="cpu")
        as_numpy = _NUMPY.get(dtype)
        if as_numpy is not None:
            return carve(source, as_numpy, shape, offset)
        standin = _STANDINS.get(dtype)
        if standin is not None:  # bfloat16, float8: carved as numpy's integer of their size
            return carve(source, standin, shape, offset).view(dtype)
        return hold(torch.frombuffer(source, dtype=dtype, count=count, offset=offset).view(shape), source)
