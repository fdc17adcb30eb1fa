"""Moving any batch: a pincollate batch by its layout, any other tree span by span.

A pincollate batch moves itself (one copy of its buffer, views rebuilt from its
layout). Any other tree (another collate's output, a batch whose contents were
changed) is moved by :mod:`pincollate._batch.spans`: each storage once, only the span its leaves use.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from .._batch.batch import is_batch
from .._batch.moving import batch_pin_memory, batch_to
from .._batch.spans import pin_spans, spans_to_device

__all__ = ["pin", "to_device"]

T = TypeVar("T")


def pin(tree: T) -> T:
    """Pin every tensor of ``tree``: one pinned allocation and one copy per storage.

    Storages already pinned are left as they are, so pinning twice copies nothing.
    A pincollate batch pins itself: one pinned copy of its buffer.
    """
    if is_batch(tree):
        return batch_pin_memory(tree)  # checks the batch against its layout, once
    return pin_spans(tree)


def to_device(tree: T, device: torch.device | str, non_blocking: bool = True) -> T:
    """Copy every tensor of ``tree`` to ``device``, one copy per storage span.

    A pincollate batch moves in one copy of its buffer, rebuilt from its layout.
    Leaves of any other tree that view one storage move in one copy and are rebuilt
    on the device with their sizes, strides and offsets. A
    storage much larger than what its leaves use is copied leaf by leaf instead.
    Non-tensor leaves pass through.

    Args:
        tree: any nested batch (mappings, sequences, namedtuples, dataclasses).
        device: the target device.
        non_blocking: asynchronous copies; honoured only from pinned memory on
            MPS, where a non-blocking copy from pageable memory is unsafe.

    Examples:
        >>> import torch
        >>> from pincollate import mm_collate, to_device
        >>> batch = mm_collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])
        >>> to_device(batch, "cpu")["x"].tolist()
        [[1.0, 1.0], [0.0, 0.0]]
    """
    device = torch.device(device)
    if is_batch(tree):
        return batch_to(tree, device, non_blocking=non_blocking)  # checks the batch against its layout, once
    return spans_to_device(tree, device, non_blocking)
