"""Ragged PIL images planned once: a dataset without a transform, images of several sizes.

Under no policy (or ``AsList()``/``PerSample()``) a column of PIL images whose sizes
differ is a per-sample list of ``(C, H, W)`` tensors, each over its own bytes of one
region; under no policy a batch whose images all agree is one stacked tensor, as the
careful planner gives both. :class:`ImagesRecipe` settles the image class once; for
each batch it reads every image's mode and size (decoding it, so that a truncated file
is named by the careful planner) and queues one copy that converts them all.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch

from .._batch.layout import Part
from .._batch.list_specs import SplitSpec
from .._batch.views import ALIGN
from .._errors import CollateError
from .._types.leaves import LeafHandler, lookup
from .fallback import FieldFallback
from .fill import Fill
from .recipe import Recipe, place

__all__ = ["ImagesRecipe", "images_recipe"]

_MODE: Any = operator.attrgetter("mode")


class ImagesRecipe(Recipe):
    """PIL images of one class and one mode: stacked where this batch's sizes agree (``stacks``), else listed."""

    __slots__ = ("describe", "fallback", "fill_images", "stacks")

    def __init__(self, cls: type, handler: LeafHandler, stacks: bool, fallback: FieldFallback | None = None):
        super().__init__(torch.uint8, 3, cls)
        assert handler.describe is not None and handler.fill is not None  # the PIL handler has both
        self.describe = handler.describe
        self.fill_images = handler.fill
        self.stacks = stacks
        #: Where images of several sizes are listed with no policy: warned once.
        self.fallback = fallback

    def run(self, column: Sequence[Any], fill: Fill, index: int) -> bool:
        if set(map(type, column)) != self.types or len(set(map(_MODE, column))) != 1:
            return False  # not all images of the class, or modes that may not stack: carefully
        try:
            # Decodes each image: a file that cannot be read is the careful planner's to name.
            described = [self.describe(image, i, ()) for i, image in enumerate(column)]
        except CollateError:
            return False
        dtype = described[0][0]
        shapes = [shape for _, shape in described]
        if self.stacks and shapes.count(shapes[0]) == len(shapes):
            stacked = place(fill, dtype, (len(shapes), *shapes[0]))
            fill.tasks.append((self.fill_images, stacked, column, None))
            fill.parts[index] = Part(stacked)
            return True
        if self.stacks and self.fallback is not None and not self.fallback.done:
            self.fallback(enumerate(shapes))
        step = ALIGN // dtype.itemsize  # each image starts aligned
        counts = [math.prod(shape) for shape in shapes]
        sizes = [size for count in counts for size in (count, -count % step)]
        region = place(fill, dtype, (sum(sizes),))
        fill.tasks.append((self._fill_list, region, (column, sizes, shapes), None))
        fill.parts[index] = Part(SplitSpec(region, sizes, shapes))
        return True

    def _fill_list(self, region: torch.Tensor, payload: tuple[Sequence[Any], list[int], list[tuple[int, ...]]]) -> None:
        images, sizes, shapes = payload
        start = 0
        for image, count, gap, shape in zip(images, sizes[0::2], sizes[1::2], shapes, strict=True):
            # The handler's own conversion, into this image's bytes as a stack of one.
            self.fill_images(region[start : start + count].view(1, *shape), [image])
            start += count + gap


def images_recipe(column: Sequence[Any], stacks: bool, fallback: FieldFallback | None = None) -> Recipe | None:
    """An :class:`ImagesRecipe` for a column of PIL images of one class, or ``None``."""
    cls = type(column[0]) if column else None
    handler = lookup(cls) if cls is not None else None
    if handler is None or handler.family != "pil" or set(map(type, column)) != {cls}:
        return None
    return ImagesRecipe(cls, handler, stacks, fallback)  # type: ignore[arg-type]
