"""Transforms for the device side of the pipeline, run in the prefetch stream."""

from __future__ import annotations

import collections.abc as abc
import copy
import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from .._errors import CollateError
from .._types.kinds import MAPPING, NAMEDTUPLE, SEQUENCE, kind_of
from .._types.wrap import rewrap

__all__ = ["Normalize"]


class Normalize:
    """Turn image tensors into normalised floats on the device: ``(x * scale - mean) / std``.

    Integer images are scaled to ``[0, 1]`` first (``uint8`` by 1/255), as
    torchvision's ``ToDtype(..., scale=True)`` does. A torchvision ``Image`` stays an
    ``Image``. Works on batches of mappings and sequences (``(image, label)`` tuples
    of torchvision datasets and timm); the batch is copied shallowly, never changed
    in place.

    Args:
        mean: per-channel means (channel dim is ``-3``: ``(..., C, H, W)``).
        std: per-channel standard deviations.
        keys: where the images are: key paths, dot-separated for nested mappings,
            where a segment of digits (or an int) is a position in a sequence:
            ``"image"``, ``"inputs.pixels"``, ``0`` for ``(image, label)`` batches.
        dtype: the floating dtype of the result.
        channels_last: return ``channels_last`` memory format (4-D images).

    Examples:
        >>> import torch
        >>> from pincollate import Normalize
        >>> norm = Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
        >>> out = norm({"image": torch.full((1, 3, 2, 2), 255, dtype=torch.uint8), "label": 3})
        >>> out["image"].unique().tolist(), out["label"]
        ([1.0], 3)
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        keys: Sequence[str | int] | str | int = ("image",),
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
    ):
        for name, given in (("mean", mean), ("std", std)):
            try:
                values = [float(v) for v in given]  # a list, tuple, array or tensor of numbers
            except (TypeError, ValueError):
                raise CollateError(f"Normalize: {name} must be numbers, one per channel, got {given!r}") from None
            if isinstance(given, (str, bytes)) or not values or not all(map(math.isfinite, values)):
                raise CollateError(f"Normalize: {name} must be finite numbers, one per channel, got {given!r}")
        if len(mean) != len(std):
            raise CollateError(f"Normalize: mean and std need one value per channel, got {len(mean)} and {len(std)}")
        if any(s <= 0 for s in std):
            raise CollateError(f"Normalize: std must be positive, got {list(std)}")
        if isinstance(keys, numbers.Integral):
            keys = int(keys)  # numpy's ints too
        if not isinstance(keys, (str, int)) and (
            not isinstance(keys, abc.Sequence) or not all(isinstance(k, (str, numbers.Integral)) for k in keys)
        ):
            raise CollateError(f"Normalize: keys must be a key path or a sequence of them, got {keys!r}")
        if not dtype.is_floating_point:
            raise CollateError(f"Normalize: dtype must be floating point, got {dtype}")
        if isinstance(keys, (str, int)):
            keys = (keys,)
        self.mean: tuple[float, ...] = tuple(float(m) for m in mean)
        self.std: tuple[float, ...] = tuple(float(s) for s in std)
        self.keys: tuple[tuple[str, ...], ...] = tuple(tuple(str(k).split(".")) for k in keys)
        self.dtype: torch.dtype = dtype
        self.channels_last: bool = channels_last
        self._constants: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def __repr__(self) -> str:
        keys = [".".join(k) for k in self.keys]
        return f"Normalize(mean={list(self.mean)}, std={list(self.std)}, keys={keys}, dtype={self.dtype}, channels_last={self.channels_last})"

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, self.dtype)
        if key not in self._constants:
            shape = (len(self.mean), 1, 1)
            mean = torch.tensor(self.mean, dtype=self.dtype, device=device).view(shape)
            std = torch.tensor(self.std, dtype=self.dtype, device=device).view(shape)
            self._constants[key] = (mean, std)
        return self._constants[key]

    def normalize(self, image: torch.Tensor) -> torch.Tensor:
        """Normalise one image tensor ``(..., C, H, W)``."""
        if not isinstance(image, torch.Tensor):
            raise CollateError(f"Normalize: expected image tensors, got {type(image).__name__}")
        if image.dim() < 3 or image.shape[-3] != len(self.mean):
            raise CollateError(
                f"Normalize: expected images (..., {len(self.mean)}, H, W), got shape {tuple(image.shape)}"
            )
        mean, std = self._stats(image.device)
        out = image.to(self.dtype)
        if not image.dtype.is_floating_point:
            out = out / (torch.iinfo(image.dtype).max if image.dtype != torch.bool else 1)
        out = (out - mean) / std
        if self.channels_last and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        return rewrap(out, image)  # a torchvision tv_tensor keeps its type

    def __call__(self, batch: Any) -> Any:
        """A shallow copy of ``batch`` with the images at ``keys`` normalised."""
        for path in self.keys:
            batch = _replace(batch, path, self.normalize)
        return batch


def _replace(tree: Any, path: tuple[str, ...], fn: Any, full: tuple[str, ...] | None = None) -> Any:
    full = path if full is None else full
    head = path[0]
    kind = kind_of(tree)
    if kind is None:
        raise CollateError(f"Normalize: no key {'.'.join(full)!r} in the batch, a {type(tree).__name__}")
    keys, children = kind.flatten(tree)
    if kind is SEQUENCE or (kind is NAMEDTUPLE and head.lstrip("-").isdigit()):
        if not head.lstrip("-").isdigit():
            raise CollateError(f"Normalize: no key {'.'.join(full)!r} in the batch, a {type(tree).__name__}")
        index = int(head)
        if not -len(keys) <= index < len(keys):
            raise CollateError(f"Normalize: no position {index} in a batch of {len(keys)} entries ({'.'.join(full)!r})")
        index %= len(keys)
    elif head in keys:  # a key, or a field's name (an Attr is its name as a str)
        index = keys.index(head)
    else:
        raise CollateError(f"Normalize: no key {'.'.join(full)!r} in the batch (its keys: {keys})")
    value = children[index]
    if len(path) == 1:
        try:
            children[index] = [fn(v) for v in value] if isinstance(value, list) else fn(value)
        except CollateError as exc:
            raise CollateError(f"{exc} at {'.'.join(full)!r}") from None
    else:
        children[index] = _replace(value, path[1:], fn, full)
    if kind is MAPPING and isinstance(tree, abc.MutableMapping):
        # A shallow copy: the batch given is never changed in place (a Batch stays one).
        clone = copy.copy(tree)
        clone[keys[index]] = children[index]
        return clone
    out = kind.rebuild(tree, keys, children)
    if out is tree:  # a Sequence type that cannot be built from its items
        raise CollateError(f"Normalize: a {type(tree).__name__} cannot be rebuilt with {'.'.join(full)!r} replaced")
    return out
