"""Plan once per structure, copy many times: the fast path for dict samples.

Most multimodal samples are a flat ``dict`` of tensors, numbers and strings. For
those, the layout depends only on sample 0's keys, types, dtypes and shapes (its
*signature*). A signature seen twice gets a compiled plan: a list of fields with
their offsets, filled column by column with only C-speed checks (one type, one
dtype per column; ``torch.stack`` compares the shapes). Anything unexpected (a
ragged column, a mixed dtype) returns ``None`` and the batch goes to the general
planner, which gives the same result or the precise error. A plan that fails
is dropped for good, so ragged data does not pay for two plans every batch.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .arena import Kind, allocate
from .batch import Batch
from .layout import _align, _contiguous_strides

__all__ = ["CompiledPlans"]

_NUMBER_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool}
_KEPT = (str, bytes)
_DEAD = object()
_DTYPE = torch.Tensor.dtype.__get__


def signature(first: Any) -> tuple | None:
    """Sample 0's structure, or ``None`` if it is not a flat dict of plain leaves."""
    if type(first) is not dict:
        return None
    sig: list[Hashable] = []
    for key, value in first.items():
        cls = type(value)
        if cls is torch.Tensor:
            sig.append((key, cls, value.dtype, value.shape))
        elif cls in _NUMBER_DTYPES or cls in _KEPT:
            sig.append((key, cls))
        else:
            return None
    return tuple(sig)


class _Plan:
    """A compiled flat-dict plan: tensor fields, number groups, kept fields.

    Number fields of one Python type are laid out as the rows of one block, so a
    group costs one type check, one numpy assignment and one ``unbind``, however
    many fields it has.
    """

    __slots__ = ("keys", "kept", "nbytes", "numbers", "tensors")

    def __init__(self, sig: tuple, batch_size: int):
        self.keys = [entry[0] for entry in sig]
        self.tensors: list[tuple[Hashable, torch.dtype, tuple[int, ...], tuple[int, ...], int]] = []
        self.kept: list[tuple[Hashable, type]] = []
        groups: dict[type, list[Hashable]] = {}
        offset = 0
        for entry in sig:
            key, cls = entry[0], entry[1]
            if cls is torch.Tensor:
                dtype, shape = entry[2], (batch_size, *entry[3])
                numel = 1
                for size in shape:
                    numel *= size
                self.tensors.append((key, dtype, shape, _contiguous_strides(shape), offset // dtype.itemsize))
                offset = _align(offset + numel * dtype.itemsize)
            elif cls in _KEPT:
                self.kept.append((key, cls))
            else:
                groups.setdefault(cls, []).append(key)
        self.numbers: list[tuple[type, list[Hashable], torch.dtype, int]] = []
        for cls, keys in groups.items():
            dtype = _NUMBER_DTYPES[cls]
            self.numbers.append((cls, keys, dtype, offset // dtype.itemsize))
            offset = _align(offset + len(keys) * batch_size * dtype.itemsize)
        self.nbytes = offset

    def run(self, batch: Sequence[dict], kind: Kind) -> Batch | None:
        # Same keys in every sample, at C speed: every sample a dict of the same
        # length here, and a missing key raises KeyError while columns are gathered
        # (one missing and one extra key keep the length, and still fail there).
        if set(map(type, batch)) != {dict} or set(map(len, batch)) != {len(self.keys)}:
            return None
        try:
            return self._fill(batch, kind)
        except KeyError:
            return None

    def _fill(self, batch: Sequence[dict], kind: Kind) -> Batch | None:
        n = len(batch)
        buffer = allocate(self.nbytes, kind)
        typed: dict[torch.dtype, torch.Tensor] = {}
        out: dict[Hashable, Any] = {}
        with torch.no_grad():
            for key, dtype, shape, strides, offset in self.tensors:
                column = [sample[key] for sample in batch]
                # One C-level pass checks both: the descriptor raises TypeError for
                # anything that is not a tensor, and the dtypes must all agree.
                try:
                    dtypes = set(map(_DTYPE, column))
                except TypeError:
                    return None
                if len(dtypes) != 1:
                    return None
                flat = typed.get(dtype)
                if flat is None:
                    flat = typed[dtype] = buffer.view(dtype)
                view = flat.as_strided(shape, strides, offset)
                try:
                    torch.stack(column, out=view)
                except (RuntimeError, TypeError, ValueError):
                    return None
                out[key] = view
            for cls, keys, dtype, offset in self.numbers:
                rows = [[sample[key] for key in keys] for sample in batch]
                if set(map(type, itertools.chain.from_iterable(rows))) != {cls}:
                    return None
                flat = typed.get(dtype)
                if flat is None:
                    flat = typed[dtype] = buffer.view(dtype)
                block = flat.as_strided((len(keys), n), (n, 1), offset)
                try:
                    block.numpy().T[...] = rows
                except (OverflowError, TypeError, ValueError):
                    return None
                out.update(zip(keys, block.unbind(0)))
            for key, cls in self.kept:
                column = [sample[key] for sample in batch]
                types = set(map(type, column))
                if len(types) != 1 or types.pop() is not cls:
                    return None
                out[key] = column
        result = Batch((key, out[key]) for key in self.keys)
        result.buffer = buffer
        return result


class CompiledPlans:
    """A small cache of compiled plans keyed by (signature, batch size)."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, batch: Sequence[Any], kind: Kind) -> Batch | None:
        """Collate ``batch`` with a compiled plan, or ``None`` to use the planner."""
        sig = signature(batch[0])
        if sig is None:
            return None
        key = (sig, len(batch))
        with self._lock:
            entry = self._plans.get(key)
            if entry is None:
                # First sighting: remember it, let the planner handle this batch.
                self._plans[key] = 1
                if len(self._plans) > self.capacity:
                    self._plans.popitem(last=False)
                return None
            if entry is _DEAD:
                return None
            if entry == 1:
                entry = self._plans[key] = _Plan(sig, len(batch))
        out = entry.run(batch, kind)
        if out is None:
            with self._lock:
                self._plans[key] = _DEAD
        return out
