"""Padding's copies: padded values and their masks, written into the batch's buffer.

Used by :class:`~pincollate.Pad` both as the careful planner plans it (any number of
padded dimensions, per value) and as a settled recipe runs it (one padded dimension:
one ``masked_scatter_`` for a whole small field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._leaves import LeafHandler

__all__ = [
    "PAD_BYTES",
    "SCATTER_BYTES",
    "box",
    "fill_mask",
    "fill_mask_1d",
    "fill_padded",
    "fill_padded_1d",
    "valid_1d",
]

#: Above this many bytes a padded field is copied row by row (one copy of each value);
#: below it one ``masked_scatter_`` over a concatenation (two copies, one call each).
SCATTER_BYTES = 1 << 18


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


def valid_1d(lengths: Sequence[int], size: int, left: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, size)``: ``True`` where a value of each length lies, padded on the left or the right.

    ``mask[i, j] = j < length[i]`` (on the left, ``j >= size - length[i]``): one
    comparison instead of a slice assignment per row.
    """
    positions = torch.arange(size).unsqueeze(0)
    bounds = torch.tensor(lengths, dtype=torch.int64).unsqueeze(1)
    if left:
        return torch.ge(positions, size - bounds, out=out)
    return torch.lt(positions, bounds, out=out)


def fill_mask_1d(region: torch.Tensor, lengths: Sequence[int], *, left: bool) -> None:
    valid_1d(lengths, region.shape[1], left, out=region)


def fill_mask(region: torch.Tensor, lengths: list[list[int]], *, left: bool) -> None:
    region.fill_(False)
    full = tuple(region.shape[1:])
    for i, sizes in enumerate(lengths):
        region[i][box(tuple(sizes), full, left)] = True


def fill_padded_1d(
    region: torch.Tensor, payload: tuple[Sequence[torch.Tensor], list[int], int], *, value: Any, left: bool
) -> None:
    values, lengths, dim = payload
    size = region.shape[dim + 1]
    nbytes = region.numel() * region.element_size()
    if (
        dim == 0
        and nbytes > SCATTER_BYTES
        and (size * len(lengths) - sum(lengths)) * region.element_size() <= PAD_BYTES
    ):
        # Large rows padded at their end (or start): each value and its padding are
        # consecutive in the buffer, so one torch.cat writes every byte once.
        gaps = [size - length for length in lengths]
        trailing = tuple(region.shape[2:])
        pads = torch.split(_pad_values(region.dtype, value, sum(gaps), trailing), gaps)
        pairs = zip(pads, values, strict=True) if left else zip(values, pads, strict=True)
        torch.cat([piece for pair in pairs for piece in pair], out=region.view(-1, *trailing))
        return
    region.fill_(value)
    if nbytes <= SCATTER_BYTES:
        # Row-major order of the valid places is each value's own order, sample by sample.
        valid = valid_1d(lengths, size, left)
        shape = [region.shape[0]] + [1] * (region.dim() - 1)
        shape[dim + 1] = size
        source = torch.cat(list(values)) if dim == 0 else torch.cat([v.reshape(-1) for v in values])
        region.masked_scatter_(valid.view(shape), source)
        return
    for i, (item, length) in enumerate(zip(values, lengths, strict=True)):
        region[i].narrow(dim, size - length if left else 0, length).copy_(item)


#: The most padding (bytes) one large padded field takes from a kept tensor of its pad value.
PAD_BYTES = 1 << 22

_pads: dict[tuple[torch.dtype, Any, tuple[int, ...]], torch.Tensor] = {}


def _pad_values(dtype: torch.dtype, value: Any, rows: int, trailing: tuple[int, ...]) -> torch.Tensor:
    """``rows`` rows of ``value``: a view of a tensor kept per dtype, value and row shape, grown as needed.

    Only read, never written: threads may share it, and one that grows it replaces it.
    """
    key = (dtype, value, trailing)
    kept = _pads.get(key)
    if kept is None or kept.shape[0] < rows:
        # Grown to the next power of two rows: a few sizes over a run, at most twice PAD_BYTES.
        kept = _pads[key] = torch.full((1 << max(rows - 1, 0).bit_length(), *trailing), value, dtype=dtype)
    return kept[:rows]
