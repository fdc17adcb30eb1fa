"""Ray Data's collate interface over :class:`~pincollate.ColumnCollate` (imported only when asked for)."""

from __future__ import annotations

from typing import Any, Protocol

from ray.data.collate_fn import NumpyBatchCollateFn

__all__ = ["RayCollate"]


class Columnar(Protocol):
    """What ``RayCollate`` calls: a :class:`~pincollate.ColumnCollate`."""

    def __call__(self, batch: dict[str, Any]) -> Any: ...

    def unpack(self, batch: dict[str, Any]) -> Any: ...


class RayCollate(NumpyBatchCollateFn):  # type: ignore[misc,unused-ignore]
    """``ColumnCollate`` for ``iter_torch_batches``: collates (or, with ``unpack``, unpacks) each batch."""

    def __init__(self, collate: Columnar, unpack: bool = False):
        self.collate = collate
        self.unpack = unpack

    def __call__(self, batch: dict[str, Any]) -> Any:
        return self.collate.unpack(batch) if self.unpack else self.collate(batch)

    def __repr__(self) -> str:
        return f"RayCollate({self.collate!r}, unpack={self.unpack!r})"
