"""Ray Data's collate interface over :class:`~pincollate.ColumnCollate` (imported only when asked for).

Ray's ``iter_torch_batches`` hands each collated batch to a *finalize* step before the
loop sees it (``ray.data._internal.utils.torch_utils.DefaultFinalizeFn``). That step asks
``ray.data.collate_fn.is_tensor_batch_type`` whether the batch is a tensor, a sequence of
tensors, or a mapping whose values are all tensors (or all sequences of them), and if so
rebuilds it with ``move_tensors_to_device``: a mapping becomes a new plain ``dict``,
``{k: t.to(device)}``, even for ``device="cpu"``. A :class:`~pincollate.Batch` whose
columns are all tensors is such a mapping, so it would reach the loop as a ``dict``,
without its layout or its one-copy ``to()``; on an accelerator each column would be copied
on its own. Ray passes anything else through as it is.

So :class:`RayBatches` (what :meth:`ColumnCollate.iter_torch_batches
<pincollate.ColumnCollate.iter_torch_batches>` returns) has :class:`RayCollate` hand Ray
each batch inside a :class:`Sealed` (none of those types), and opens it again where the
loop takes it: the batch is collated in Ray's threads as before, and arrives whole.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch
from ray.data.collate_fn import ArrowBatchCollateFn, NumpyBatchCollateFn

__all__ = ["RayBatches", "RayCollate", "RayUnpack", "Sealed", "ray_collate"]


class Columnar(Protocol):
    """What ``RayCollate`` calls: a :class:`~pincollate.ColumnCollate`."""

    def __call__(self, batch: Any) -> Any: ...

    def unpack(self, batch: dict[str, Any]) -> Any: ...


class Sealed:
    """A collated batch on its way through Ray's iterator: no tensor, sequence or mapping, so Ray passes it on."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any):
        self.batch = batch


def rebuilt_by_ray(batch: Any) -> bool:
    """Whether Ray's finalize step rebuilds ``batch``, as Ray 2.60's ``is_tensor_batch_type`` decides."""

    def tensors(value: Any) -> bool:
        return isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in value)

    if isinstance(batch, torch.Tensor) or tensors(batch):
        return True
    if isinstance(batch, (list, tuple)):
        return all(map(tensors, batch))
    if isinstance(batch, Mapping):
        values = list(batch.values())
        return all(isinstance(v, torch.Tensor) for v in values) or all(map(tensors, values))
    return False


class _Handing:
    """What both of Ray's collate classes do with a batch once it is collated or unpacked.

    With ``sealed`` each batch goes out in a :class:`Sealed`, for :class:`RayBatches` to open.
    Without it the batch goes out as it is, and a batch that Ray's finalize step would turn
    into a plain ``dict`` is warned of once.
    """

    unpack = False

    def __init__(self, collate: Columnar, sealed: bool = False):
        self.collate = collate
        self.sealed = sealed
        self._warned = False

    def take(self, batch: Any) -> Any:
        raise NotImplementedError

    def __call__(self, batch: Any) -> Any:
        out = self.take(batch)
        if self.sealed:
            return Sealed(out)
        if not self._warned and rebuilt_by_ray(out):
            self._warned = True
            warnings.warn(
                "pincollate: Ray's iter_torch_batches rebuilds a batch whose columns are all tensors as a plain "
                "dict (its finalize step), so the loop gets no pincollate.Batch and a device move copies each "
                "column; iterate collate.iter_torch_batches(dataset, ...) instead to keep the Batch",
                UserWarning,
                stacklevel=2,
            )
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.collate!r}, sealed={self.sealed!r})"


class RayCollate(_Handing, ArrowBatchCollateFn):  # type: ignore[misc,unused-ignore]
    """``ColumnCollate`` for ``iter_torch_batches``, as an ``ArrowBatchCollateFn``.

    Ray hands it each batch as its Arrow table, which the collate reads from Arrow's
    buffers (:mod:`pincollate._integrations.arrow`), not converted to numpy row by row.
    """

    def take(self, batch: Any) -> Any:
        return self.collate(batch)


class RayUnpack(_Handing, NumpyBatchCollateFn):  # type: ignore[misc,unused-ignore]
    """``ColumnCollate.unpack`` for ``iter_torch_batches``: each row a batch ``pack`` made.

    A packed row is one ``uint8`` array and a pickled layout, which Ray's numpy
    conversion hands over whole.
    """

    unpack = True

    def take(self, batch: Any) -> Any:
        return self.collate.unpack(batch)


def ray_collate(collate: Columnar, unpack: bool = False, sealed: bool = False) -> RayCollate | RayUnpack:
    """Ray's collate class for ``collate``: collating Arrow tables, or (``unpack``) unpacking packed rows."""
    return (RayUnpack if unpack else RayCollate)(collate, sealed)


class RayBatches:
    """The batches of a Ray ``Dataset`` or ``DataIterator``, each collated whole (a ``pincollate.Batch``).

    Each ``for`` over it is one pass of Ray's ``iter_torch_batches``, on the CPU: collated
    in Ray's threads (``prefetch_batches`` ahead), its batches opened here. Leaving a loop
    early closes Ray's iterator at once.
    """

    def __init__(self, data: Any, collate: Columnar, unpack: bool, options: dict[str, Any]):
        self.data = data
        self.collate = collate
        self.unpack = unpack
        self.options = options

    def __iter__(self) -> Iterator[Any]:
        collate_fn = ray_collate(self.collate, unpack=self.unpack, sealed=True)
        batches = iter(self.data.iter_torch_batches(collate_fn=collate_fn, device="cpu", **self.options))
        try:
            for sealed in batches:
                yield sealed.batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"RayBatches({self.collate!r}, unpack={self.unpack!r}, {self.options!r})"
