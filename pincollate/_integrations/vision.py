"""PIL images and torchvision ``tv_tensors`` as leaf types, registered on first sight.

:mod:`pincollate._types.leaves` calls these the first time it looks up a class from PIL or
torchvision, so ``import pincollate`` imports neither.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from .._errors import CollateError
from .._types.builtin import torch_dtype
from .._types.leaves import LeafHandler, lookup, on_first_sight, register_leaf
from .._types.wrap import Wrap

__all__ = ["register_pil", "register_tv_tensors"]

Path = tuple[Hashable, ...]


def register_pil() -> None:
    from PIL import Image

    @functools.cache
    def mode_info(mode: str) -> tuple[torch.dtype, int]:
        probe = np.asarray(Image.new(mode, (1, 1)))
        dtype = torch_dtype(probe.dtype)
        if dtype is None:
            raise TypeError(mode)
        return dtype, Image.getmodebands(mode)

    def describe(value: Any, sample: int, path: Path) -> tuple[torch.dtype, tuple[int, ...]]:
        try:
            dtype, channels = mode_info(value.mode)
        except (TypeError, ValueError) as exc:
            raise CollateError(
                f"PIL images of mode {value.mode!r} are not supported", sample=sample, path=path
            ) from exc
        try:
            # Decoded here, where the sample and key path are known, rather than in the
            # copy: a truncated or corrupt file is named. The copy then reads the pixels.
            value.load()
        except (OSError, SyntaxError, ValueError) as exc:
            raise CollateError(f"cannot read the image: {exc}", sample=sample, path=path) from exc
        width, height = value.size
        return dtype, (channels, height, width)

    def fill(region: torch.Tensor, values: list[Any]) -> None:
        # As torchvision's pil_to_tensor (HWC pixels as CHW), but straight into the
        # slot: PIL's one export, then one transposing copy.
        out = region.numpy()
        for i, image in enumerate(values):
            pixels = np.asarray(image)
            out[i] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)

    def key(value: Any) -> Hashable:
        # numpy would broadcast a 1-band image into 3 bands: mode and size must agree.
        return (value.mode, value.size)

    register_leaf(Image.Image, LeafHandler("PIL.Image", "pil", describe, fill, key=key, signature=key))


def register_tv_tensors() -> None:
    from torchvision import tv_tensors

    # tv_tensors are tensors: described, stacked and copied as plain ones are.
    base: LeafHandler = lookup(torch.Tensor)  # type: ignore[assignment]

    def same_type(value: Any) -> Wrap:
        return Wrap(type(value))

    for cls in (tv_tensors.Mask, tv_tensors.Video, tv_tensors.Image):
        register_leaf(
            cls,
            LeafHandler(
                cls.__name__,
                "tensor",
                base.describe,
                base.fill,
                wrap=same_type,
                key=base.key,
                signature=base.signature,
                concat=base.concat,
                fill_one=base.fill_one,
            ),
        )

    def per_image(value: Any) -> Wrap:
        fields = {name: getattr(value, name) for name in _PER_IMAGE_FIELDS if hasattr(value, name)}
        if "canvas_size" in fields:
            fields["canvas_size"] = tuple(fields["canvas_size"])
        return Wrap(type(value), tuple(sorted(fields.items())))

    # Boxes and key points stay one tensor per image, with their own format and canvas size:
    # torchvision's BoundingBoxes are 2-D by definition, and a stacked batch of either would
    # have one canvas size for images of several.
    kinds = [tv_tensors.BoundingBoxes, getattr(tv_tensors, "KeyPoints", None)]
    for cls in (kind for kind in kinds if kind is not None):
        register_leaf(
            cls,
            LeafHandler(
                cls.__name__,
                "tensor",
                base.describe,
                base.fill,
                wrap=per_image,
                meta=per_image,
                stackable=False,
                concat=base.concat,
                fill_one=base.fill_one,
            ),
        )
    from .._batch.batch import allow_loading

    allow_loading(
        tv_tensors.Image,
        tv_tensors.Video,
        tv_tensors.Mask,
        tv_tensors.BoundingBoxFormat,
        *(kind for kind in kinds if kind is not None),
    )


#: The metadata a box or key point tensor carries per image (those its torchvision release has).
_PER_IMAGE_FIELDS = ("format", "canvas_size", "clamping_mode")

on_first_sight("PIL", register_pil)
on_first_sight("torchvision", register_tv_tensors)
