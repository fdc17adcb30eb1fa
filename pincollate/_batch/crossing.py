"""How a batch crosses to another process through multiprocessing's pickler.

A batch in a slot of this worker's ring crosses as the slot's index and its layout's
key (:mod:`pincollate._memory.ring`, :mod:`pincollate._memory.receiver`); any other batch as its layout and buffer: the
buffer in shared memory as torch shares a tensor, or, where /dev/shm has no room for
it (:mod:`pincollate._memory.shm`), as a memfd or as its bytes inside the pickle; pickled for a new
process's launch (spawn, forkserver), as its bytes inside the pickle. Every carrier class
(:mod:`pincollate._batch.batch`) registers :func:`reduce_across` with the pickler as it is made.
"""

from __future__ import annotations

from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .._errors import CollateError
from .._memory import receiver as _receiver
from .._memory import ring as _ring
from .._memory import shm as _shm
from .._memory.arena import Kind, PinMode, allocate, resolve_kind
from .batch import _rebuild, make_batch, on_carrier, reduce_changed
from .check import carried
from .layout import Layout

__all__ = ["reduce_across"]


def reduce_across(batch: Any) -> Any:
    """How a batch crosses to another process through multiprocessing's pickler.

    A batch in a slot of this worker's ring crosses as the slot's index and its
    layout (:mod:`pincollate._memory.ring`); any other batch as its layout and buffer, the buffer in
    shared memory as torch shares a tensor, or, where /dev/shm has no room for it
    (:mod:`pincollate._memory.shm`), as its bytes inside the pickle.
    """
    state = carried(batch)
    if state is None:
        return reduce_changed(batch, across=True)
    layout, buffer, values = state
    if get_spawning_popen() is not None and buffer.device.type == "cpu":
        # Pickled for a new process's launch (a spawned Process's arguments, a spawned DataLoader
        # worker's dataset): shared memory crosses there as a descriptor that must stay open until
        # the launch, after the pickle (and any storage made for it) is gone. Its bytes cross.
        made = _shm.outside(buffer)
        data = buffer[: layout.nbytes].numpy().tobytes()
        return (_from_pipe, (layout, data, values, "auto" if made is None else made[0], _shm.take_notice()))
    crossing = _ring.send(buffer, layout)
    if crossing is not None:
        header, index, generation, storage, sent = crossing
        return (_from_slot, (header, index, generation, storage, sent, values, _shm.take_notice()))
    made = _shm.outside(buffer)
    pin = "auto" if made is None else made[0]
    if made is not None and made[1] is not None:
        return (_from_memfd, (layout, DupFd(made[1]), values, pin, _shm.take_notice()))
    if _ring.is_slot(buffer):
        # Sent before: a slot has one receiver, so a second send carries a copy.
        buffer = buffer[: layout.nbytes].clone()
    if not buffer.untyped_storage().is_shared() and (get_worker_info() is not None or not _shm.room_for(layout.nbytes)):
        # A worker's batch outside shared memory was put there for want of room: it is
        # not moved into /dev/shm now, in the queue's feeder thread, where a failure
        # would lose the batch without a word (the loader would wait for it until its timeout).
        data = buffer[: layout.nbytes].numpy().tobytes()
        return (_from_pipe, (layout, data, values, pin, _shm.take_notice()))
    if buffer.device.type == "cpu" and layout.nbytes and not buffer.untyped_storage().is_shared():
        # A storage of its own over the same bytes: a multiprocessing queue moves what it
        # sends into shared memory (share_memory_), and it moves this one, not the buffer
        # the batch's fields read: the batch stays whole where it is.
        buffer = torch.frombuffer(buffer[: layout.nbytes].detach().numpy(), dtype=torch.uint8)
    return (_rebuild, (layout, buffer, values))


def _from_slot(
    header: _ring.Header,
    index: int,
    generation: int,
    storage: Any,
    sent: tuple[int, Layout | None],
    values: list[Any],
    notice: tuple[Any, str] | None = None,
) -> Any:
    _shm.warn_once(notice)
    key, layout = sent
    if layout is None:  # crossed before: kept by this process's receiver of the ring
        layout = _receiver.layout(header[0], key, None)
    buffer = _receiver.lease(header, index, generation, storage, layout.nbytes)
    if sent[1] is not None:
        _receiver.layout(header[0], key, layout)  # the ring's receiver exists now: keep it
    return make_batch(layout, buffer, values)


def _landing(pin: PinMode) -> Kind:
    """Where a batch that crossed outside /dev/shm lands: pinned where its collate would pin here."""
    try:
        kind = resolve_kind(pin)
    except CollateError:  # pin_memory=True in a process that cannot pin: the pin thread says so
        return "plain"
    return "plain" if kind == "shared" else kind


def _from_pipe(layout: Layout, data: bytes, values: list[Any], pin: PinMode, notice: tuple[Any, str] | None) -> Any:
    """A batch that crossed as its bytes: one buffer again."""
    _shm.warn_once(notice)
    buffer = allocate(layout.nbytes, _landing(pin))
    if layout.nbytes:
        buffer[: layout.nbytes].numpy()[...] = np.frombuffer(data, dtype=np.uint8)
    return make_batch(layout, buffer, values)


def _from_memfd(layout: Layout, fd: Any, values: list[Any], pin: PinMode, notice: tuple[Any, str] | None) -> Any:
    """A batch that crossed as a memfd: mapped here, or copied once into pinned memory."""
    _shm.warn_once(notice)
    mapped = _shm.map_memfd(fd.detach(), layout.nbytes)
    if _landing(pin) != "pinned":
        return make_batch(layout, mapped, values)
    buffer = allocate(layout.nbytes, "pinned")
    buffer[: layout.nbytes].copy_(mapped)
    return make_batch(layout, buffer, values)


def _register(cls: type) -> None:
    ForkingPickler.register(cls, reduce_across)


on_carrier(_register)
