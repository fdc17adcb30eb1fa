"""Padding's copies: padded values and their masks, written into the batch's buffer.

Used by :class:`~pincollate.Pad` both as the careful planner plans it (any number of
padded dimensions, per value) and as a plan's generated function copies it (one padded
dimension: :func:`pad_1d`, the walk's kernel too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._batch.views import numpy_dtype
from .._types.leaves import LeafHandler

__all__ = [
    "PAD_BYTES",
    "ROW_BYTES",
    "SCATTER_BYTES",
    "TRIANGLE_ROWS",
    "Joined",
    "box",
    "cut",
    "fill_mask",
    "fill_mask_1d",
    "fill_padded",
    "fill_padded_1d",
    "nonempty",
    "pad_1d",
    "valid_1d",
    "valid_into",
]

#: Above this many bytes a padded field is copied row by row (one copy of each value);
#: below it one masked assignment from a concatenation (two copies, one call each).
SCATTER_BYTES = 1 << 18

#: Rows (padded values along the first dimension) shorter than this many bytes on average take the
#: masked assignment whatever the field's size: measured (2 cores, int64 tokens), 256 rows of 4 KiB
#: padded in 341 us that way against 678 us for one ``torch.cat`` of their 512 pieces, rows of 12 KiB
#: alike or better (192 against 315 us), rows of 16 KiB and more faster by the cat (503 against 597 us).
ROW_BYTES = 12 << 10


def box(sizes: tuple[int, ...], full: tuple[int, ...], left: bool) -> tuple[slice, ...]:
    return tuple(slice(f - s, f) if left else slice(0, s) for s, f in zip(sizes, full, strict=True))


def fill_padded(
    region: torch.Tensor,
    entries: list[tuple[int, Any, tuple[int, ...]]],
    *,
    value: Any,
    left: bool,
    handler: LeafHandler,
) -> None:
    region.fill_(value)
    full = tuple(region.shape[1:])
    plain = handler.family == "tensor"
    fill = handler.fill
    assert fill is not None  # tensor handlers fill
    for i, item, shape in entries:
        target = region[i][box(shape, full, left)]
        if plain:
            target.copy_(item)
        else:
            fill(target.unsqueeze(0), [item])


#: Masks of rows up to this long are gathered from a kept triangle (at most this squared, in bytes).
TRIANGLE_ROWS = 1024

_triangles: list[np.ndarray[Any, Any]] = [np.tri(65, 64, -1, dtype=bool)]


def _triangle(size: int) -> np.ndarray[Any, Any]:
    """A kept ``(n + 1, n)`` boolean array, ``n >= size``: row ``k`` is ``k`` Trues, then Falses.

    Only read, never written: threads share it; one that grows it replaces it.
    """
    kept = _triangles[0]
    if kept.shape[1] < size:
        n = 1 << (size - 1).bit_length()
        kept = _triangles[0] = np.tri(n + 1, n, -1, dtype=bool)
    return kept


def valid_1d(lengths: Sequence[int], size: int, left: bool, out: np.ndarray[Any, Any] | None = None) -> Any:
    """``(B, size)``: ``True`` where a value of each length lies, padded on the left or the right.

    ``mask[i, j] = j < length[i]`` (on the left, ``j >= size - length[i]``). Rows up to
    :data:`TRIANGLE_ROWS` long are gathered from a kept triangle (one fancy index, a
    row copy each: half the cost of numpy's broadcast comparison, a sixth of torch's);
    longer ones are that comparison.

    Examples:
        >>> valid_1d([1, 3], 3, left=False).astype(int).tolist()
        [[1, 0, 0], [1, 1, 1]]
        >>> valid_1d([1, 3], 3, left=True).astype(int).tolist()
        [[0, 0, 1], [1, 1, 1]]
    """
    if size <= TRIANGLE_ROWS:
        rows = _triangle(size)[lengths, :size]
        if left:
            rows = rows[:, ::-1]
        if out is None:
            return rows
        out[...] = rows
        return out
    bounds = np.array(lengths, dtype=np.int64)[:, None]
    positions = np.arange(size)
    if left:
        return np.greater_equal(positions, size - bounds, out=out)
    return np.less(positions, bounds, out=out)


def valid_into(lengths: Sequence[int], size: int, left: bool, out: np.ndarray[Any, Any]) -> Any:
    """:func:`valid_1d` written into a mask of another dtype than ``bool`` (1 and 0); returns the ``bool`` mask.

    Examples:
        >>> out = np.empty((2, 3), dtype=np.int64)
        >>> valid_into([1, 3], 3, False, out).dtype, out.tolist()
        (dtype('bool'), [[1, 0, 0], [1, 1, 1]])
    """
    valid = valid_1d(lengths, size, left)
    out[...] = valid
    return valid


def fill_mask_1d(region: torch.Tensor, lengths: Sequence[int], *, left: bool) -> None:
    if region.dtype == torch.bool:
        valid_1d(lengths, region.shape[1], left, out=region.numpy())
    else:
        valid_into(lengths, region.shape[1], left, region.numpy())


def fill_mask(region: torch.Tensor, lengths: list[list[int]], *, left: bool) -> None:
    region.fill_(False)
    full = tuple(region.shape[1:])
    for i, sizes in enumerate(lengths):
        region[i][box(tuple(sizes), full, left)] = True


def fill_padded_1d(
    region: torch.Tensor, payload: tuple[Sequence[torch.Tensor], list[int], int], *, value: Any, left: bool
) -> None:
    """Values padded along one dimension ``dim`` (``payload``: values, their lengths, ``dim``)."""
    values, lengths, dim = payload
    pad_1d(region, values, lengths, dim, value, left, None)


def pad_1d(
    region: torch.Tensor,
    values: Sequence[torch.Tensor],
    lengths: list[int],
    dim: int,
    value: Any,
    left: bool,
    valid: np.ndarray[Any, Any] | None,
) -> None:
    """Padding's one copy kernel along one dimension: ``values`` (of ``lengths`` along ``dim``) into ``region``.

    ``valid`` is the mask of where the values go, where the caller has it (it wrote the
    field's mask); it is computed here where the copy needs it.
    """
    size = region.shape[dim + 1]
    nbytes = region.numel() * region.element_size()
    # Many short rows (a large batch of token ids): the one cat's per-row pieces cost more than
    # the masked assignment's extra passes over the bytes.
    short = dim == 0 and nbytes < ROW_BYTES * len(lengths)
    if (
        dim == 0
        and nbytes > SCATTER_BYTES
        and not short
        and (size * len(lengths) - sum(lengths)) * region.element_size() <= PAD_BYTES
    ):
        # Large rows padded at their end (or start): each value and its padding are
        # consecutive in the buffer, so one torch.cat writes every byte once.
        gaps = [size - length for length in lengths]
        trailing = tuple(region.shape[2:])
        pads = torch.split(_pad_values(region.dtype, value, sum(gaps), trailing), gaps)
        pairs = zip(pads, values, strict=True) if left else zip(values, pads, strict=True)
        torch.cat(nonempty([piece for pair in pairs for piece in pair]), out=region.view(-1, *trailing))
        return
    region.fill_(value)
    if nbytes <= SCATTER_BYTES or short:
        # Row-major order of the valid places is each value's own order, sample by sample.
        if valid is None:
            valid = valid_1d(lengths, size, left)
        if dim == 0 and numpy_dtype(region.dtype) is not None:
            # numpy's boolean assignment: the masked scatter, at half its cost.
            source = values.flat if type(values) is Joined else torch.cat(nonempty(values, lengths))
            region.numpy()[valid] = source.numpy()
            return
        # Padding moves bits: where numpy (float8, complex32) or masked_scatter_ (those, and
        # unsigned ints past uint8) has no kernel for the dtype, an integer of its size does.
        bits = _BITS.get(region.element_size())
        if bits is not None:
            region = region.view(bits)
            if dim == 0:
                region.numpy()[valid] = torch.cat(nonempty(values, lengths)).view(bits).numpy()
                return
        shape = [region.shape[0]] + [1] * (region.dim() - 1)
        shape[dim + 1] = size
        source = torch.cat([v.reshape(-1) for v in values])
        # A left side's mask is a reversed view: negative strides (even along a dimension of one,
        # which numpy calls contiguous), which torch does not take.
        mask = torch.from_numpy(valid if min(valid.strides, default=0) >= 0 else valid.copy())
        region.masked_scatter_(mask.view(shape), source.view(region.dtype))
        return
    for i, (item, length) in enumerate(zip(values, lengths, strict=True)):
        region[i].narrow(dim, size - length if left else 0, length).copy_(item)


#: The signed integer of each element size, which numpy and ``masked_scatter_`` both take.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_NUMEL = torch.Tensor.numel


class Joined(Sequence[torch.Tensor]):
    """Values already concatenated: ``flat`` holds them in order, ``lengths`` their leading sizes.

    What :func:`~pincollate._plan.recipe.concatenated_arrays` makes of read-only arrays.
    A copy that would concatenate the values again takes ``flat`` instead, and a recipe
    reads their shapes from the lengths (:meth:`shapes`); the values themselves, views of
    ``flat``, are made only for what asks for them one by one.
    """

    __slots__ = ("_views", "flat", "lengths")

    def __init__(self, flat: torch.Tensor, lengths: list[int]):
        self.flat = flat
        self.lengths = lengths
        self._views: tuple[torch.Tensor, ...] | None = None

    def shapes(self) -> list[torch.Size]:
        trailing = tuple(self.flat.shape[1:])
        return [torch.Size((n, *trailing)) for n in self.lengths]

    def views(self) -> tuple[torch.Tensor, ...]:
        """The values, each a view of ``flat``: what torch's ``stack`` and ``cat`` take."""
        if self._views is None:
            self._views = self.flat.split_with_sizes(self.lengths)
        return self._views

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: Any) -> Any:
        return self.views()[index]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.views())


def nonempty(values: Sequence[torch.Tensor], lengths: Sequence[int] | None = None) -> list[torch.Tensor]:
    """``values`` less those with no elements, where a 1-D one is among them.

    ``torch.cat`` skips a 1-D empty tensor (an old rule for ``torch.tensor([])``), and the
    check for it leaves cat's fast path: five times slower over a batch's 32 values.
    ``lengths`` (each value's leading size), where the caller has them, say without
    reading every value that none is empty.
    """
    if (lengths is None or 0 in lengths) and values and values[0].dim() == 1 and not all(map(_NUMEL, values)):
        return [v for v in values if v.numel()] or list(values[:1])
    return values if type(values) is list else list(values)


def cut(
    values: Sequence[torch.Tensor], lengths: list[int], dim: int, limit: int
) -> tuple[list[torch.Tensor], list[int]]:
    """``Pad(truncate=True)``'s cut: each value longer than ``limit`` along ``dim`` keeps its first ``limit`` entries.

    Returns the values (a cut one is a view of its value, nothing copied) and their lengths
    along ``dim``, as the careful walk cuts them.

    Examples:
        >>> values, lengths = cut([torch.arange(3), torch.arange(5)], [3, 5], 0, 4)
        >>> [v.tolist() for v in values], lengths
        ([[0, 1, 2], [0, 1, 2, 3]], [3, 4])
    """
    if type(values) is Joined:
        values = values.views()
    if dim == 0:  # a slice: half the cost of narrow's argument parsing
        kept = [value[:limit] if n > limit else value for value, n in zip(values, lengths, strict=True)]
    else:
        kept = [value.narrow(dim, 0, limit) if n > limit else value for value, n in zip(values, lengths, strict=True)]
    return kept, [min(n, limit) for n in lengths]


#: The most padding (bytes) one large padded field takes from a kept tensor of its pad value.
PAD_BYTES = 1 << 22

_pads: dict[tuple[torch.dtype, Any, tuple[int, ...]], torch.Tensor] = {}


def _pad_values(dtype: torch.dtype, value: Any, rows: int, trailing: tuple[int, ...]) -> torch.Tensor:
    """``rows`` rows of ``value``: a view of a tensor kept per dtype, value and row shape, grown as needed.

    Only read, never written: threads may share it, and one that grows it replaces it.
    """
    key = (dtype, repr(value), trailing)  # by its text: -0.0 == 0.0, but its padding keeps its sign
    kept = _pads.get(key)
    if kept is None or kept.shape[0] < rows:
        # Grown to the next power of two rows: a few sizes over a run, at most twice PAD_BYTES.
        kept = _pads[key] = torch.full(
            (1 << max(rows - 1, 0).bit_length(), *trailing), value, dtype=dtype, device="cpu"
        )
    return kept[:rows]
