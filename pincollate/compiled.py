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

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from .arena import Kind, allocate
from .batch import Batch
from .layout import _align, _contiguous_strides

__all__ = ["CompiledPlans"]

_NUMBER_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool}
_KEPT = (str, bytes)
_DEAD = object()


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
    __slots__ = ("fields", "keys", "nbytes")

    def __init__(self, sig: tuple, batch_size: int):
        self.fields: list[tuple[Hashable, type, torch.dtype | None, tuple[int, ...], tuple[int, ...], int]] = []
        offset = 0
        for entry in sig:
            key, cls = entry[0], entry[1]
            if cls in _KEPT:
                self.fields.append((key, cls, None, (), (), 0))
                continue
            if cls is torch.Tensor:
                dtype, shape = entry[2], (batch_size, *entry[3])
            else:
                dtype, shape = _NUMBER_DTYPES[cls], (batch_size,)
            numel = 1
            for size in shape:
                numel *= size
            self.fields.append((key, cls, dtype, shape, _contiguous_strides(shape), offset // dtype.itemsize))
            offset = _align(offset + numel * dtype.itemsize)
        self.keys = [entry[0] for entry in sig]
        self.nbytes = offset

    def run(self, batch: Sequence[dict], kind: Kind) -> Batch | None:
        key_set = batch[0].keys()
        for sample in batch:
            if type(sample) is not dict or sample.keys() != key_set:
                return None
        buffer = allocate(self.nbytes, kind)
        typed: dict[torch.dtype, torch.Tensor] = {}
        out = Batch()
        with torch.no_grad():
            for key, cls, dtype, shape, strides, offset in self.fields:
                column = [sample[key] for sample in batch]
                types = set(map(type, column))
                if len(types) != 1 or types.pop() is not cls:
                    return None
                if dtype is None:
                    out[key] = column
                    continue
                flat = typed.get(dtype)
                if flat is None:
                    flat = typed[dtype] = buffer.view(dtype)
                view = flat.as_strided(shape, strides, offset)
                if cls is torch.Tensor:
                    if len({value.dtype for value in column}) != 1:
                        return None
                    try:
                        torch.stack(column, out=view)
                    except (RuntimeError, TypeError, ValueError):
                        return None
                else:
                    try:
                        view.numpy()[...] = column
                    except (OverflowError, TypeError, ValueError):
                        return None
                out[key] = view
        out.buffer = buffer
        return out


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
