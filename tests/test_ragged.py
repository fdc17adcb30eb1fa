"""Ragged fields planned once (the recipes: _ragged, _listed, _packed, _recipe): the careful planner's results, faster."""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from pincollate import AsList, CollateError, Concat, Jagged, MMCollate, Pad, PerSample, RaggedFieldWarning, Stack
from pincollate._batch.trees import tensors
from pincollate._batch.views import ALIGN
from pincollate._plan import template as template_module
from pincollate._plan.careful import Planner
from pincollate._plan.listed import ItemsRecipe, ListRecipe
from pincollate._plan.packed import ConcatRecipe
from pincollate._plan.ragged import MixedNumbers, PadRecipe
from pincollate._plan.recipe import Arrays, NumberLists, array_tensors
from pincollate._plan.rows import PerSampleRecipe
from samples import UserTensor, assert_identical, assert_one_buffer, assert_same_outcome, careful_walk


def _ids(lengths: list[int], dtype: torch.dtype = torch.int64, trailing: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return [
        {"ids": torch.arange(n * max(1, torch.Size(trailing).numel()), dtype=dtype).reshape(n, *trailing) + 7, "y": i}
        for i, n in enumerate(lengths)
    ]


def _items(counts: list[list[int]]) -> list[dict[str, Any]]:
    return [
        {"ids": [torch.full((n, 3), float(10 * i + j)) for j, n in enumerate(sample)]}
        for i, sample in enumerate(counts)
    ]


def _whole_images(counts: list[int | None]) -> list[dict[str, Any]]:
    """Whole images as items, ``counts[i]`` of them in sample ``i`` (no key where ``None``)."""
    return [
        {"y": i} if k is None else {"y": i, "ids": [torch.full((3, 2, 2), float(10 * i + j)) for j in range(k)]}
        for i, k in enumerate(counts)
    ]


def _lists(lengths: list[int], kind: type = int, container: type = list) -> list[dict[str, Any]]:
    """Token ids as Python lists (or tuples), as ``datasets`` and tokenizers give them."""
    return [{"ids": container(kind(7 * i + j) for j in range(n)), "y": i} for i, n in enumerate(lengths)]


def _items_missing(counts: list[list[int] | None]) -> list[dict[str, Any]]:
    """Per-sample lists of items, absent (no key) where ``None``: text-only samples beside image ones."""
    return [
        {"y": i}
        if sample is None
        else {"y": i, "ids": [torch.full((n, 3), float(10 * i + j)) for j, n in enumerate(sample)]}
        for i, sample in enumerate(counts)
    ]


def _targets(counts: list[int]) -> list[dict[str, Any]]:
    """Detection samples: an image and a target dict of ``n`` boxes and labels (torchvision's format)."""
    return [
        {
            "image": torch.full((3, 4, 4), i, dtype=torch.uint8),
            "ids": {"boxes": torch.arange(4.0 * n).reshape(n, 4) + i, "labels": torch.arange(n) + 10 * i},
        }
        for i, n in enumerate(counts)
    ]


def _coco(counts: list[int], **overrides: Callable[[int], Any]) -> list[dict[str, Any]]:
    """Detection samples as torchvision's references give them: a target of tensors, an int id, a file name.

    ``overrides`` replace a target key's value, by sample index.
    """
    samples = _targets(counts)
    for i, (sample, n) in enumerate(zip(samples, counts, strict=True)):
        target = sample["ids"]
        target["image_id"] = 100 + i
        target["area"] = torch.full((n,), 2.5 * i)
        target["iscrowd"] = torch.zeros(n, dtype=torch.int64)
        target["scale"] = 0.5 + i
        target["flipped"] = i % 2 == 1
        target["file"] = f"{i:06d}.jpg" if i != 1 else None
        for key, make in overrides.items():
            target[key] = make(i)
    return samples


def _objects(counts: list[int], **overrides: Callable[[int, int], Any]) -> list[dict[str, Any]]:
    """Detection samples whose target is a list of per-object dicts (a box, a label, a nested part).

    ``overrides`` replace an object key's value, by sample and object index.
    """
    samples = []
    for i, n in enumerate(counts):
        objects = []
        for j in range(n):
            obj: dict[str, Any] = {
                "box": torch.arange(4.0) + 10 * i + j,
                "label": 3 * i + j,
                "crowd": j % 2 == 0,
                "part": {"keypoints": torch.full((j + 1, 3), float(j)), "name": f"p{j}"},
                "polygon": [1.5 * j, 2.5, 3.5] if j % 2 else (0.5,),
            }
            for key, make in overrides.items():
                obj[key] = make(i, j)
            objects.append(obj)
        samples.append({"image": torch.full((3, 4, 4), i, dtype=torch.uint8), "ids": objects})
    return samples


def _pil(sizes: list[tuple[int, int]], mode: str = "RGB") -> list[dict[str, Any]]:
    """PIL images of several sizes (width, height), as a dataset without a transform gives them."""
    from PIL import Image

    bands = Image.getmodebands(mode)
    return [
        {
            "ids": Image.fromarray(
                (np.arange(h * w * bands).reshape(h, w, bands) * (i + 1) % 251).astype(np.uint8).squeeze(-1)
                if bands == 1
                else (np.arange(h * w * bands).reshape(h, w, bands) * (i + 1) % 251).astype(np.uint8),
                mode,
            ),
            "y": i,
        }
        for i, (w, h) in enumerate(sizes)
    ]


def _jpeg(truncated: bool, size: tuple[int, int] = (32, 32)) -> Any:
    import io

    from PIL import Image

    stream = io.BytesIO()
    Image.effect_noise(size, 40).convert("RGB").save(stream, "JPEG")
    data = stream.getvalue()
    return Image.open(io.BytesIO(data[: len(data) * 2 // 3] if truncated else data))


def _numbers(values: list[Any]) -> list[dict[str, Any]]:
    return [{"ids": value, "y": i} for i, value in enumerate(values)]


def _boxes(counts: list[int], targets: bool = False) -> list[dict[str, Any]]:
    """torchvision's detection samples: boxes with their own canvas size, a mask, labels."""
    from torchvision import tv_tensors

    samples = []
    for i, n in enumerate(counts):
        boxes = tv_tensors.BoundingBoxes(
            torch.arange(4.0 * n).reshape(n, 4) + i, format="XYXY", canvas_size=(32 + i, 48 - i)
        )
        if targets:
            mask = tv_tensors.Mask(torch.full((n, 2, 3), i, dtype=torch.uint8))
            samples.append({"ids": {"boxes": boxes, "masks": mask, "labels": torch.arange(n) + i}})
        else:
            samples.append({"ids": boxes, "y": i})
    return samples


def _images(sizes: list[int], cls: Any = None) -> list[dict[str, Any]]:
    """Images of several heights, as torchvision's ``tv_tensors.Image`` (or a user's subclass)."""
    if cls is None:
        from torchvision import tv_tensors

        cls = tv_tensors.Image
    return [{"ids": torch.full((3, h, 4), i, dtype=torch.uint8).as_subclass(cls), "y": i} for i, h in enumerate(sizes)]


def _absent(samples: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    """``samples`` with sample ``i``'s field absent (``missing="none"``)."""
    del samples[i]["ids"]
    return samples


def _arrays(lengths: list[int], dtype: str = "float32", trailing: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Numpy arrays, as soundfile or librosa give waveforms."""
    return [
        {"ids": np.arange(n * int(np.prod(trailing)), dtype=dtype).reshape(n, *trailing) + i, "y": i}
        for i, n in enumerate(lengths)
    ]


def _read_only(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Read-only arrays, as an object store (Ray Data's rows) hands them out: torch.from_numpy would warn."""
    for sample in samples:
        sample["ids"].flags.writeable = False
    return samples


def _audio(lengths: list[int]) -> list[dict[str, Any]]:
    return [{"ids": torch.randn(2, n, generator=torch.Generator().manual_seed(n))} for n in lengths]


# Each case: the collate's settings, the recipe class it gets, and batches of one field.
#: The cases without a policy whose first batch lists a field whose values differ in shape: warned once.
LISTED = {
    "list-read-only-arrays",
    "items",
    "items-differing-lengths",
    "list-arrays",
    "list-flat",
    "list-missing",
    "list-no-policy",
    "list-rows-of-3",
    "list-subclass",
    "list-tv-images",
}

CASES: dict[str, tuple[dict[str, Any], type, list[Callable[[], list[Any]]]]] = {
    "pad-right": (
        {"fields": {"ids": Pad()}},
        PadRecipe,
        [lambda: _ids([3, 1, 4]), lambda: _ids([2, 6]), lambda: _ids([2, 2])],
    ),
    "pad-left-value": (
        {"fields": {"ids": Pad(value=-1, side="left")}},
        PadRecipe,
        [lambda: _ids([3, 1, 4]), lambda: _ids([5, 1])],
    ),
    "pad-multiple-of": (
        {"fields": {"ids": Pad(multiple_of=8)}},
        PadRecipe,
        [lambda: _ids([3, 9]), lambda: _ids([16, 1])],
    ),
    "pad-max-length": (
        {"fields": {"ids": Pad(max_length=10)}},
        PadRecipe,
        [lambda: _ids([3, 9]), lambda: _ids([10, 1])],
    ),
    "pad-no-extras": (
        {"fields": {"ids": Pad(lengths_key=None, mask_key=None)}},
        PadRecipe,
        [lambda: _ids([3, 1]), lambda: _ids([4, 2, 1])],
    ),
    "pad-rows-of-3": (
        {"fields": {"ids": Pad()}},
        PadRecipe,
        [lambda: _ids([3, 1], trailing=(3,)), lambda: _ids([2, 5], trailing=(3,))],
    ),
    "pad-dim-1": (
        {"fields": {"ids": Pad(dims=[-1], mask_key=None)}},
        PadRecipe,
        [lambda: _audio([5, 9]), lambda: _audio([7, 3, 4])],
    ),
    "pad-large-rows": (
        {"fields": {"ids": Pad(dims=[1])}},
        PadRecipe,
        [lambda: _audio([40000, 70000]), lambda: _audio([9000, 50000])],
    ),
    "pad-renamed": (
        {"fields": {"ids": Pad()}, "rename": {"ids": "input_ids"}},
        PadRecipe,
        [lambda: _ids([3, 1]), lambda: _ids([2, 5])],
    ),
    "pad-ragged-default": ({"ragged": Pad()}, PadRecipe, [lambda: _ids([3, 1]), lambda: _ids([2, 5])]),
    "list-no-policy": ({}, ListRecipe, [lambda: _ids([3, 1, 4]), lambda: _ids([2, 2]), lambda: _ids([0, 5])]),
    "list-rows-of-3": (
        {},
        ListRecipe,
        [lambda: _ids([3, 1], torch.float32, (3,)), lambda: _ids([0, 2, 7], torch.float32, (3,))],
    ),
    "list-flat": ({}, ListRecipe, [lambda: _audio([5, 9]), lambda: _audio([2, 2]), lambda: _audio([1, 3, 8])]),
    "aslist": ({"fields": {"ids": AsList()}}, ListRecipe, [lambda: _ids([3, 1]), lambda: _ids([2, 2])]),
    "persample-tensors": ({"fields": {"ids": PerSample()}}, ListRecipe, [lambda: _ids([3, 1]), lambda: _ids([4, 4])]),
    "pad-number-lists": (
        {"fields": {"ids": Pad()}},
        NumberLists,
        [lambda: _lists([3, 1, 4]), lambda: _lists([0, 6]), lambda: _lists([2, 2])],
    ),
    "pad-number-tuples-left": (
        {"fields": {"ids": Pad(value=-1, side="left")}},
        NumberLists,
        [lambda: _lists([3, 1], container=tuple), lambda: _lists([5, 2], container=tuple)],
    ),
    "pad-float-lists": (
        {"fields": {"ids": Pad()}},
        NumberLists,
        [lambda: _lists([3, 1], float), lambda: _lists([2, 4], float)],
    ),
    "pad-bool-lists": (
        {"fields": {"ids": Pad()}},
        NumberLists,
        [lambda: _lists([3, 1], bool), lambda: _lists([2, 4], bool)],
    ),
    "concat-number-lists": (
        {"fields": {"ids": Concat()}},
        NumberLists,
        [lambda: _lists([3, 1, 4]), lambda: _lists([2, 0])],
    ),
    "pad-large-rows-end": (
        {"fields": {"ids": Pad(value=-3)}},
        PadRecipe,
        [lambda: _ids([40000, 70000, 0]), lambda: _ids([9000, 50000])],
    ),
    "pad-large-rows-start": (
        {"fields": {"ids": Pad(side="left")}},
        PadRecipe,
        [lambda: _ids([9000, 5000], trailing=(3,)), lambda: _ids([20000, 1], trailing=(3,))],
    ),
    "pad-arrays": (
        {"fields": {"ids": Pad()}},
        Arrays,
        [lambda: _arrays([3, 1, 4]), lambda: _arrays([0, 6]), lambda: _arrays([70000, 9000])],
    ),
    "pad-arrays-rows-of-3": (
        {"fields": {"ids": Pad(side="left")}},
        Arrays,
        [lambda: _arrays([3, 1], "int16", (3,)), lambda: _arrays([2, 5], "int16", (3,))],
    ),
    "list-arrays": ({}, Arrays, [lambda: _arrays([3, 1, 4], "float64"), lambda: _arrays([2, 2], "float64")]),
    "pad-read-only-arrays": (
        {"fields": {"ids": Pad()}},
        Arrays,
        [
            lambda: _read_only(_arrays([3, 1, 4], "int64")),
            lambda: _arrays([0, 6], "int64"),
            lambda: _read_only(_arrays([2, 5], "int64")),
        ],
    ),
    "pad-left-read-only-rows-of-3": (
        {"fields": {"ids": Pad(side="left", mask_key="m")}},
        Arrays,
        [lambda: _read_only(_arrays([3, 1], trailing=(3,))), lambda: _read_only(_arrays([2, 6], trailing=(3,)))],
    ),
    "concat-read-only-arrays": (
        {"fields": {"ids": Concat()}},
        Arrays,
        [lambda: _read_only(_arrays([3, 1])), lambda: _read_only(_arrays([2, 0, 5]))],
    ),
    "list-read-only-arrays": (
        {},
        Arrays,
        [lambda: _read_only(_arrays([3, 1, 4])), lambda: _read_only(_arrays([2, 2]))],
    ),
    "concat-arrays": ({"fields": {"ids": Concat()}}, Arrays, [lambda: _arrays([3, 1]), lambda: _arrays([2, 0, 5])]),
    "concat-items-missing": (
        {"fields": {"ids": Concat()}, "missing": "none"},
        ConcatRecipe,
        [
            lambda: _items_missing([[2, 1], None, [3]]),
            lambda: _items_missing([None, [1, 1, 4]]),
            lambda: _items_missing([[2], [1]]),
            lambda: _items_missing([None, [], [5]]),
        ],
    ),
    "jagged": ({"fields": {"ids": Jagged()}}, ConcatRecipe, [lambda: _ids([3, 1, 4]), lambda: _ids([2, 6, 0])]),
    "jagged-rows-of-3": (
        {"fields": {"ids": Jagged()}},
        ConcatRecipe,
        [lambda: _ids([3, 1], torch.float32, (3,)), lambda: _ids([2, 6], torch.float32, (3,))],
    ),
    "jagged-items": (
        {"fields": {"ids": Jagged()}},
        ConcatRecipe,
        [lambda: _items([[2, 1], [3]]), lambda: _items([[], [1, 1, 4]])],
    ),
    "pad-missing": (
        {"fields": {"ids": Pad(value=-1)}, "missing": "none"},
        PadRecipe,
        [
            lambda: _absent(_ids([3, 1, 4]), 1),
            lambda: _absent(_ids([2, 6]), 0),
            lambda: _ids([2, 2]),
            lambda: _absent(_ids([5, 1, 2]), 2),
        ],
    ),
    "pad-missing-rows-of-3": (
        {"fields": {"ids": Pad()}, "missing": "none"},
        PadRecipe,
        [lambda: _absent(_ids([3, 1], trailing=(3,)), 1), lambda: _absent(_ids([2, 5, 1], trailing=(3,)), 0)],
    ),
    "pad-missing-dim-1": (
        {"fields": {"ids": Pad(dims=[-1], mask_key=None)}, "missing": "none"},
        PadRecipe,
        [lambda: _absent(_audio([5, 9, 4]), 1), lambda: _absent(_audio([7, 3]), 0)],
    ),
    "list-missing": (
        {"missing": "none"},
        ListRecipe,
        [
            lambda: _absent(_ids([3, 1, 4]), 1),
            lambda: _absent(_ids([2, 2, 2]), 0),  # the others agree: still a list, as the careful planner gives
            lambda: _ids([2, 2]),
            lambda: _absent(_ids([5, 1, 2]), 2),
        ],
    ),
    "aslist-missing": (
        {"fields": {"ids": AsList()}, "missing": "none"},
        ListRecipe,
        [lambda: _absent(_audio([5, 9, 4]), 1), lambda: _absent(_audio([7, 3]), 0)],
    ),
    "list-tv-images": ({}, ListRecipe, [lambda: _images([3, 1, 4]), lambda: _images([2, 2]), lambda: _images([5, 1])]),
    "list-subclass": (
        {},
        ListRecipe,
        [lambda: _images([3, 1], UserTensor), lambda: _images([2, 2], UserTensor), lambda: _images([1, 6], UserTensor)],
    ),
    "list-tv-boxes": ({}, ListRecipe, [lambda: _boxes([3, 0, 5]), lambda: _boxes([2, 2]), lambda: _boxes([1, 4])]),
    "list-tv-boxes-missing": (
        {"missing": "none"},
        ListRecipe,
        [lambda: _absent(_boxes([3, 1, 2]), 1), lambda: _boxes([2, 2]), lambda: _absent(_boxes([0, 4]), 0)],
    ),
    "aslist-tv-boxes": ({"fields": {"ids": AsList()}}, ListRecipe, [lambda: _boxes([3, 1]), lambda: _boxes([2, 2])]),
    "persample-tv-targets": (
        {"fields": {"ids": PerSample()}},
        PerSampleRecipe,
        [lambda: _boxes([3, 0, 5], True), lambda: _boxes([2, 2], True), lambda: _boxes([0, 1], True)],
    ),
    "items": (
        {"sequences": "items"},
        ItemsRecipe,
        [
            lambda: _items([[2, 2], [3], [1, 4]]),  # stacked, stacked, listed
            lambda: _items([[2, 2], [2, 2]]),  # every sample stacked alike: one tensor
            lambda: _items([[2, 2], [2]]),  # stacked alike but for their counts: a list
            lambda: _items([[1], [], [5, 5, 5]]),  # an empty list
            lambda: _items([[3], [3], [3]]),
            lambda: _items([[0, 2], [0, 0]]),  # items with no rows
        ],
    ),
    "aslist-items": (
        {"fields": {"ids": AsList()}},
        ItemsRecipe,
        [
            lambda: _items([[2, 2], [3], [1, 4]]),
            lambda: _items([[2, 2], [2, 2]]),  # every sample alike: still a list per sample
            lambda: _items([[1], [], [5, 5, 5]]),
        ],
    ),
    "stack-items": (
        {"fields": {"ids": Stack()}},
        ItemsRecipe,
        [lambda: _items([[2, 2], [2, 2]]), lambda: _items([[3], [3], [3]]), lambda: _items([[1, 1, 1], [1, 1, 1]])],
    ),
    "items-differing-lengths": ({}, ItemsRecipe, [lambda: _items([[2, 2], [3]]), lambda: _items([[1, 4], [2], []])]),
    "persample-mappings": (
        {"fields": {"ids": PerSample()}},
        PerSampleRecipe,
        [lambda: _targets([3, 0, 5]), lambda: _targets([2, 2]), lambda: _targets([0, 0, 1, 7])],
    ),
    "persample-coco-targets": (
        {"fields": {"ids": PerSample()}},
        PerSampleRecipe,
        [
            lambda: _coco([3, 0, 5]),
            lambda: _coco([2, 2]),
            lambda: _coco([0, 1, 4, 1], file=lambda i: b"raw"),  # bytes among the plain values
            lambda: _coco([1, 2], image_id=lambda i: 2**63 - 1 - i),  # int64's largest
        ],
    ),
    "persample-object-lists": (
        {"fields": {"ids": PerSample()}},
        PerSampleRecipe,
        [
            lambda: _objects([3, 0, 2]),
            lambda: _objects([1, 4]),
            lambda: _objects([0, 0, 0]),  # no objects anywhere: a list of empty lists
            lambda: _objects([2, 1], label=lambda i, j: -(2**63) + j),
        ],
    ),
    "persample-label-lists": (
        {"fields": {"ids": PerSample()}},
        PerSampleRecipe,
        [
            lambda: [{"ids": [1, 2, 3]}, {"ids": []}, {"ids": (4,)}],
            lambda: [{"ids": [5]}, {"ids": [6, 7]}],
        ],
    ),
    "numbers-mixed": (
        {},
        MixedNumbers,
        [
            lambda: _numbers([1, 2.5, 3]),  # an int first: what torch infers, float32
            lambda: _numbers([2.5, 1]),  # a float first: float64
            lambda: _numbers([True, 2, False]),
            lambda: _numbers([4, 5]),  # one type in this batch
            lambda: _numbers([1.5, True]),
        ],
    ),
    "concat": ({"fields": {"ids": Concat()}}, ConcatRecipe, [lambda: _ids([3, 1, 4]), lambda: _ids([2, 6])]),
    "concat-items": (
        {"fields": {"ids": Concat()}},
        ConcatRecipe,
        [lambda: _items([[2, 1], [3]]), lambda: _items([[], [1, 1, 4]])],
    ),
    "concat-stacked-items": (
        {"fields": {"ids": Concat(items="stack")}},
        ConcatRecipe,
        [lambda: _whole_images([2, 1, 3]), lambda: _whole_images([0, 4]), lambda: _whole_images([1, 1])],
    ),
    "concat-stacked-items-missing": (
        {"fields": {"ids": Concat(items="stack")}, "missing": "none"},
        ConcatRecipe,
        [lambda: _whole_images([2, None, 1]), lambda: _whole_images([None, 3])],
    ),
    "concat-stacked-one-each": (
        {"fields": {"ids": Concat(items="stack")}},
        ConcatRecipe,
        [lambda: _ids([2, 2, 2], trailing=(3,)), lambda: _ids([4, 4], trailing=(3,))],
    ),
}


@pytest.fixture
def careful_only(monkeypatch):
    """A collate whose ragged fields are planned carefully for every batch: the reference."""

    def make(**settings: Any) -> MMCollate:
        return MMCollate(pin_memory=False, **settings)

    monkeypatch.setattr(template_module, "part_recipe", lambda *args: None)
    return make


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_recipe_gives_what_the_careful_planner_gives(name, monkeypatch):
    settings, _, builds = CASES[name]
    collate = MMCollate(pin_memory=False, **settings)
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        outs = [collate(build()) for build in builds for _ in range(2)]
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as careful_warned:
        warnings.simplefilter("always")
        patch.setattr(template_module, "part_recipe", lambda *args: None)
        careful = MMCollate(pin_memory=False, **settings)
        expected = [careful(build()) for build in builds for _ in range(2)]
    for ours, theirs in zip(outs, expected, strict=True):
        assert_identical(ours, theirs)
        assert_one_buffer(ours)
    # The same warnings too: a field without a policy listed once, in the same words.
    assert [(w.category, str(w.message)) for w in ours_warned] == [(w.category, str(w.message)) for w in careful_warned]
    assert len(ours_warned) == (name in LISTED)
    assert all(w.category is RaggedFieldWarning for w in ours_warned)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_planned_ragged_field_is_not_walked_again(name, monkeypatch):
    settings, recipe_class, builds = CASES[name]
    collate = MMCollate(pin_memory=False, **settings)
    with pytest.warns(RaggedFieldWarning) if name in LISTED else contextlib.nullcontext():
        collate(builds[0]())
    recipes = [op.recipe for _, op, _ in collate._plans.last.op.singles if getattr(op, "recipe", None)]
    assert [type(recipe) for recipe in recipes] == [recipe_class]

    walk = Planner.plan

    def walked(planner: Planner, column: Any, path: Any, keyed: bool = False) -> Any:
        # PerSample() lists all empty (no object in any image): nothing to read, the walk's.
        if not (recipe_class is PerSampleRecipe and all(value == [] for value in column)):
            raise AssertionError("the careful planner ran for a field its plan describes")
        return walk(planner, column, path, keyed)

    monkeypatch.setattr(Planner, "plan", walked)
    for build in builds:
        collate(build())


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_tensor_of_a_recipe_starts_aligned_and_the_batch_keeps_its_layout(name):
    settings, _, builds = CASES[name]
    collate = MMCollate(pin_memory=False, **settings)
    for i, build in enumerate(builds):
        with pytest.warns(RaggedFieldWarning) if i == 0 and name in LISTED else contextlib.nullcontext():
            batch = collate(build())
        assert batch.layout is not None and batch.buffer is not None
        base = batch.buffer.data_ptr()
        assert all((t.data_ptr() - base) % ALIGN == 0 for t in tensors(batch) if t.numel())
        again = pickle.loads(pickle.dumps(batch))
        assert_identical(again, batch)
        assert again.layout == batch.layout
        stream = io.BytesIO()
        torch.save(batch, stream)
        stream.seek(0)
        assert_identical(torch.load(stream), batch)


def test_a_batch_the_recipe_does_not_describe_is_planned_carefully(careful_only):
    collate = MMCollate(pin_memory=False, fields={"ids": Pad(max_length=4, truncate=True)}, missing="none")
    reference = careful_only(fields={"ids": Pad(max_length=4, truncate=True)}, missing="none")
    batches = [
        _ids([3, 1]),  # planned: a recipe
        _ids([9, 2]),  # longer than max_length: cut by the recipe, as the careful planner cuts it
        _ids([3, 1], dtype=torch.int32),  # another dtype
        [{"ids": torch.arange(3), "y": 0}, {"ids": None, "y": 1}],  # a missing value
        [{"ids": torch.arange(3), "y": 0}, {"ids": torch.arange(3).as_subclass(_Sub), "y": 1}],  # a subclass
        _ids([2, 3]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))


class _Sub(torch.Tensor):
    pass


def test_number_lists_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    import enum

    import numpy as np

    class Token(enum.IntEnum):
        A = 5

    collate = MMCollate(pin_memory=False, fields={"ids": Pad()}, missing="none")
    reference = careful_only(fields={"ids": Pad()}, missing="none")
    batches = [
        _lists([3, 1]),  # planned: a recipe for int64
        [{"ids": [1, 2.5], "y": 0}, {"ids": [3], "y": 1}],  # a float among the ints: float32
        [{"ids": [True, False], "y": 0}, {"ids": [True], "y": 1}],  # bools only: a bool tensor
        [{"ids": [True, 4], "y": 0}, {"ids": [5], "y": 1}],  # bools among ints: int64, as torch.tensor
        [{"ids": [Token.A, 1], "y": 0}, {"ids": [2], "y": 1}],  # an int subclass
        [{"ids": [1.5, 2.0], "y": 0}, {"ids": [np.float64(3.0)], "y": 1}],  # a float subclass
        [{"ids": [1, 2], "y": 0}, {"ids": None, "y": 1}],  # a missing value
        _lists([2, 5]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))


def test_arrays_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    read_only = _arrays([3, 1])
    for sample in read_only:
        sample["ids"].flags.writeable = False
    swapped = _arrays([2, 4])
    for sample in swapped:
        sample["ids"] = sample["ids"].astype(sample["ids"].dtype.newbyteorder())
    # torch.from_numpy warns of a read-only array once per process (so a warning filter
    # cannot tell here): the recipe must not convert one.
    assert array_tensors([s["ids"] for s in read_only]) is None
    collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
    reference = careful_only(fields={"ids": Pad()})
    batches = [
        _arrays([3, 1]),  # planned: a recipe for float32 arrays
        _arrays([3, 1], "float64"),  # another dtype
        read_only,  # torch.from_numpy would warn
        swapped,  # the other byte order
        [{"ids": np.arange(4.0, dtype="float32")[::-1], "y": 0}, {"ids": np.ones(2, "float32"), "y": 1}],  # reversed
        _arrays([2, 5]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))
    mixed = [{"ids": np.ones(2, "float32"), "y": 0}, {"ids": torch.ones(3), "y": 1}]  # a tensor among arrays
    with pytest.raises(CollateError) as fresh:
        reference(mixed)
    with pytest.raises(CollateError) as warm:
        collate(mixed)
    assert str(warm.value) == str(fresh.value)


def test_per_sample_mappings_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    boxed = _targets([2, 1])
    for sample in boxed:
        sample["ids"]["boxes"] = tv_tensors.BoundingBoxes(sample["ids"]["boxes"], format="XYXY", canvas_size=(4, 4))
    reordered = _targets([1, 2])
    reordered[1]["ids"] = {"labels": reordered[1]["ids"]["labels"], "boxes": reordered[1]["ids"]["boxes"]}
    named = _targets([2, 1])
    for sample in named:
        sample["ids"]["name"] = "cat"
    collate = MMCollate(pin_memory=False, fields={"ids": PerSample()})
    reference = careful_only(fields={"ids": PerSample()})
    batches = [
        _targets([3, 1]),  # planned: a recipe
        boxed,  # torchvision's boxes keep their type: the careful planner
        reordered,  # another key order in one sample
        named,  # a key the plan's targets lack
        [{"image": torch.zeros(3, 4, 4, dtype=torch.uint8), "ids": [1, 2]}] * 2,  # not mappings
        _targets([2, 5]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))


def test_per_sample_targets_whose_columns_change_are_planned_carefully(careful_only):
    collate = MMCollate(pin_memory=False, fields={"ids": PerSample()})
    reference = careful_only(fields={"ids": PerSample()})
    batches = [
        _coco([3, 1]),  # planned: a recipe
        _coco([2, 2], image_id=lambda i: [7, 7.5][i]),  # an int and a float: each its own dtype
        _coco([2, 2], image_id=lambda i: torch.tensor(i)),  # a tensor where ints were
        _coco([2, 2], image_id=lambda i: np.int64(i)),  # a numpy scalar
        _coco([2, 2], flipped=lambda i: i),  # ints where bools were
        _coco([2, 2], file=lambda i: 3),  # a number among the plain values
        _coco([2, 2], area=lambda i: torch.zeros(i + 1, dtype=torch.float64)),  # another dtype
        _coco([1, 3]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))


def test_per_sample_object_lists_whose_columns_change_are_planned_carefully(careful_only):
    collate = MMCollate(pin_memory=False, fields={"ids": PerSample()})
    reference = careful_only(fields={"ids": PerSample()})
    reordered = _objects([2, 1])
    reordered[0]["ids"][1] = dict(reversed(list(reordered[0]["ids"][1].items())))
    batches = [
        _objects([3, 1]),  # planned: a recipe
        _objects([2, 2], label=lambda i, j: [1, 1.5][j]),  # an int and a float among the objects
        _objects([2, 2], box=lambda i, j: torch.zeros(4, dtype=torch.float64)),  # another dtype
        _objects([2, 2], box=lambda i, j: torch.zeros(2, 2)),  # another rank
        _objects([1, 2], part=lambda i, j: None),  # None where a dict was
        _objects([1, 2], polygon=lambda i, j: "none"),  # a str where lists were
        reordered,  # one object's keys in another order
        [{"image": torch.zeros(3, 4, 4, dtype=torch.uint8), "ids": {"a": torch.zeros(1)}}] * 2,  # not lists
        [{"image": torch.zeros(3, 4, 4, dtype=torch.uint8), "ids": [torch.zeros(1), 1]}] * 2,  # mixed items
        _objects([0, 3]),
    ]
    for batch in batches:
        assert_identical(collate(batch), reference(batch))


@pytest.mark.parametrize("settings", [{}, {"fields": {"ids": AsList()}}], ids=["no-policy", "aslist"])
def test_pil_images_of_several_sizes_are_walked_as_the_careful_walk_takes_them(settings):
    # No recipe: a column of PIL images is walked for each batch (a recipe ran it 1.03-1.06x faster).
    collate = MMCollate(pin_memory=False, **settings)
    reference = careful_walk(**settings)
    for batch in (
        _pil([(3, 2), (5, 4), (1, 1)]),
        _pil([(4, 4), (4, 4)]),  # every size agrees: one stacked tensor (no policy)
        _pil([(2, 3), (3, 2)], mode="L"),  # one band
        _pil([(7, 1), (1, 7), (2, 2)]),
    ):
        assert_same_outcome(collate, reference, batch)


def test_pil_images_that_cannot_be_collated_are_named_warm_as_fresh(careful_only):
    collate = MMCollate(pin_memory=False)
    reference = careful_only()
    batches = [
        _pil([(3, 2), (5, 4)]),
        [*_pil([(3, 2)]), *_pil([(2, 2)], mode="L")],  # two modes
        _pil([(6, 1), (2, 9)]),
    ]
    with pytest.warns(RaggedFieldWarning, match=r"\['ids'\] holds values of different shapes"):
        for batch in batches:
            assert_identical(collate(batch), reference(batch))
    refused = {
        "a tensor among the images": [*_pil([(3, 2)]), {"ids": torch.zeros(3, 2, 3, dtype=torch.uint8), "y": 1}],
        "a truncated file": [{"ids": _jpeg(False, (24, 16)), "y": 0}, {"ids": _jpeg(True), "y": 1}],
    }
    for why, batch in refused.items():
        with pytest.raises(CollateError) as fresh:
            reference(batch)
        with pytest.raises(CollateError) as warm:
            collate(batch)
        assert str(warm.value) == str(fresh.value), why
        assert warm.value.sample == 1 and warm.value.path == ("ids",), why
    assert_identical(collate(_pil([(1, 3), (3, 1)])), reference(_pil([(1, 3), (3, 1)])))


def test_items_under_a_rule_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    for settings in (
        {"fields": {"ids": Stack()}},  # items that do not stack: the careful error
        {"fields": {"ids": AsList()}, "ragged": Pad()},  # a ragged= policy applies to each sample's items
        {"fields": {"ids": AsList(), "ids.*": Pad()}},  # a rule names the items
    ):
        collate = MMCollate(pin_memory=False, **settings)
        reference = careful_only(**settings)
        for batch in (_items([[2, 2], [2, 2]]), _items([[2, 3], [1]]), _items([[4], [4, 4]])):
            assert_same_outcome(collate, reference, batch)


def test_mixed_numbers_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    collate = MMCollate(pin_memory=False)
    reference = careful_only()
    collate(_numbers([1, 2.5]))  # planned: a recipe
    for batch in (_numbers([1, 2.5j]), _numbers([1, np.float32(2.5)]), _numbers([1.5, "2"]), _numbers([1, 2**64])):
        assert_same_outcome(collate, reference, batch)
    assert_identical(collate(_numbers([3, 0.5])), reference(_numbers([3, 0.5])))


def test_an_int_beyond_int64_in_a_warm_per_sample_target_gets_the_careful_error(careful_only):
    collate = MMCollate(pin_memory=False, fields={"ids": PerSample()})
    collate(_coco([3, 1]))
    huge = _coco([2, 2], image_id=lambda i: [1, 2**64][i])
    with pytest.raises(CollateError) as fresh:
        careful_only(fields={"ids": PerSample()})(huge)
    with pytest.raises(CollateError) as warm:
        collate(huge)
    assert str(warm.value) == str(fresh.value)
    assert_identical(collate(_coco([2, 5])), careful_only(fields={"ids": PerSample()})(_coco([2, 5])))


def test_number_lists_the_careful_planner_refuses_get_its_error(careful_only):
    import numpy as np

    collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
    collate(_lists([3, 1]))
    for batch in (
        [{"ids": [1, 2**70], "y": 0}, {"ids": [3], "y": 1}],  # beyond int64
        [{"ids": [1, np.int64(2)], "y": 0}, {"ids": [3], "y": 1}],  # a numpy int is no Python number
        [{"ids": [1, "2"], "y": 0}, {"ids": [3], "y": 1}],
    ):
        with pytest.raises(CollateError) as fresh:
            careful_only(fields={"ids": Pad()})(batch)
        with pytest.raises(CollateError) as warm:
            collate(batch)
        assert str(warm.value) == str(fresh.value)


def test_a_value_the_recipe_cannot_take_gets_the_careful_error():
    collate = MMCollate(pin_memory=False, fields={"ids": Pad(max_length=4)})
    collate(_ids([3, 1]))
    with pytest.raises(CollateError) as info:
        collate(_ids([3, 9]))
    assert info.value.sample == 1 and info.value.path == ("ids",)
    nested = torch.nested.nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
    with pytest.raises(CollateError, match="nested tensors are not supported") as info:
        collate([{"ids": torch.arange(2), "y": 0}, {"ids": nested, "y": 1}])
    assert info.value.sample == 1


def test_extras_that_clash_with_a_key_are_left_to_the_careful_error():
    collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
    with pytest.raises(CollateError, match="clashes"):
        collate([{"ids": torch.arange(i + 1), "ids_mask": 0} for i in range(2)])


def test_large_rows_padded_at_one_end_are_written_by_one_concatenation(monkeypatch):
    # The fast path of fill_padded_1d: bypassed, the results (tested above) would not change.
    from pincollate._plan import padding as _padding

    calls = []
    real = _padding._pad_values

    def counted(*args: Any) -> torch.Tensor:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(_padding, "_pad_values", counted)
    collate = MMCollate(pin_memory=False, fields={"ids": Pad(value=-3)})
    collate(_ids([40000, 70000, 0]))
    assert len(calls) == 1
    collate(_ids([3, 1]))  # small: one masked scatter instead
    assert len(calls) == 1


def test_int_lists_are_read_by_numpy(monkeypatch):
    # The fast path of number_tensor: bypassed (torch.tensor of the list), results would not change.
    from pincollate._plan import recipe as _recipe

    calls = []
    real = np.array

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_recipe.np, "array", counted)
    assert _recipe.number_tensor([[1, 2, True], [3]]).tolist() == [1, 2, 1, 3]
    assert calls == [np.int64]
    assert _recipe.number_tensor([[1.5], [2]]).dtype == torch.float32  # a float: torch.tensor's inference
    assert calls == [np.int64]


@pytest.mark.parametrize(
    "fields",
    [{}, {"ids": Pad()}, {"ids": Pad(mask_key="m")}, {"ids": Concat()}, {"ids": Jagged()}, {"ids": AsList()}],
    ids=["list", "pad", "pad-mask", "concat", "jagged", "aslist"],
)
@pytest.mark.parametrize("odd", ["sparse", "meta"])
def test_a_warm_recipe_leaves_device_and_layout_to_its_copy_and_gets_the_careful_error(fields, odd):
    # The recipes read no value's device or layout (_recipe.Recipe.shapes); the copy refuses
    # such a value and its op (CarefulOp) has the batch planned again. Without that owner
    # (tasks left with None in _tree_ops.CarefulOp.run) the error is "cannot copy values".
    bad = torch.arange(2).to_sparse() if odd == "sparse" else torch.empty(2, dtype=torch.int64, device="meta")
    batch = [{"ids": torch.arange(3), "y": 0}, {"ids": bad, "y": 1}]
    warm = MMCollate(pin_memory=False, fields=fields)
    with pytest.warns(RaggedFieldWarning) if not fields else contextlib.nullcontext():  # no policy: a list
        warm(_ids([3, 1]))
    warm(_ids([2, 5]))
    with pytest.raises(CollateError) as fresh_error:
        MMCollate(pin_memory=False, fields=fields)(batch)
    with pytest.raises(CollateError) as warm_error:
        warm(batch)
    assert str(warm_error.value) == str(fresh_error.value)
    assert warm_error.value.sample == 1 and warm_error.value.path == ("ids",)
    with pytest.warns(RaggedFieldWarning) if not fields else contextlib.nullcontext():
        fresh = MMCollate(pin_memory=False, fields=fields)(_ids([4, 2]))
    assert_identical(warm(_ids([4, 2])), fresh)


@pytest.mark.parametrize("odd", ["sparse", "meta"])
def test_warm_per_sample_targets_leave_device_and_layout_to_their_copy(odd):
    bad = torch.arange(2).to_sparse() if odd == "sparse" else torch.empty(2, dtype=torch.int64, device="meta")
    batch = _targets([2, 1])
    batch[1]["ids"]["labels"] = bad
    warm = MMCollate(pin_memory=False, fields={"ids": PerSample()})
    warm(_targets([1, 3]))
    with pytest.raises(CollateError) as fresh_error:
        MMCollate(pin_memory=False, fields={"ids": PerSample()})(batch)
    with pytest.raises(CollateError) as warm_error:
        warm(batch)
    assert str(warm_error.value) == str(fresh_error.value)


def test_transposed_lists_of_one_length_are_left_to_the_careful_planner(careful_only):
    # sequences="transpose": lists are items only where their lengths differ (the recipe);
    # lists of one length are transposed, position by position, as default_collate does.
    collate = MMCollate(pin_memory=False)
    reference = careful_only()
    with pytest.warns(RaggedFieldWarning):  # the items of ['ids'], and position 0 of transposed lists
        for batch in (_items([[2, 2], [3]]), _items([[2, 1], [3, 3]]), _items([[1], [2, 2, 2]]), _items([[2], [2]])):
            assert_identical(collate(batch), reference(batch))
    assert type(collate(_items([[2, 1], [3, 3]]))["ids"]) is list and len(collate(_items([[2, 1], [3, 3]]))["ids"]) == 2


def test_items_the_recipe_does_not_describe_are_planned_carefully(careful_only):
    collate = MMCollate(pin_memory=False, sequences="items", missing="none")
    reference = careful_only(sequences="items", missing="none")
    batches = [
        _items([[2, 2], [3]]),  # planned: a recipe
        [{"ids": [torch.zeros(2, 3)]}, {"ids": None}],  # a missing list
        [{"ids": [torch.zeros(2, 3)]}, {"ids": [torch.zeros(2, 3, dtype=torch.int64)]}],  # two dtypes: promoted
        [{"ids": [torch.zeros(2, 3)]}, {"ids": [torch.zeros(3)]}],  # two ranks
        [{"ids": [torch.zeros(2, 3)]}, {"ids": [1, 2]}],  # numbers, not tensors
        _items([[1, 1], [4]]),
    ]
    with pytest.warns(RaggedFieldWarning, match="lists of items that do not stack"):
        for batch in batches:
            assert_identical(collate(batch), reference(batch))


def test_a_field_rule_on_items_is_applied_by_the_careful_planner():
    # A rule for the items ("ids.*") pads each sample's items: no item recipe for the field.
    collate = MMCollate(pin_memory=False, sequences="items", fields={"ids.*": Pad(lengths_key=None, mask_key=None)})
    out = collate(_items([[2, 3], [1]]))
    assert not any(getattr(op, "recipe", None) for _, op, _ in collate._plans.last.op.singles)
    assert [tuple(t.shape) for t in out["ids"]] == [(2, 3, 3), (1, 1, 3)]


def test_a_subclass_with_a_copy_of_its_own_keeps_the_careful_walk():
    # A registered leaf handler whose fill is its own (here: it doubles every value) is not
    # bypassed by the list recipe, which copies as plain tensors are copied.
    from pincollate import LeafHandler, register_leaf
    from pincollate._types.leaves import lookup

    class Doubled(torch.Tensor):
        pass

    base = lookup(torch.Tensor)

    def doubled(region: torch.Tensor, values: list[Any]) -> None:
        torch.stack([v.as_subclass(torch.Tensor) * 2 for v in values], out=region)

    register_leaf(
        Doubled,
        LeafHandler("Doubled", "tensor", base.describe, doubled, wrap=lambda v: None, key=base.key),
    )
    collate = MMCollate(pin_memory=False)
    batches = [[{"x": torch.ones(n).as_subclass(Doubled)} for n in counts] for counts in ([1, 2], [3, 1])]
    with pytest.warns(RaggedFieldWarning):
        for batch in batches:
            assert [t.tolist() for t in collate(batch)["x"]] == [[2.0] * len(s["x"]) for s in batch]


def test_a_small_padded_field_is_filled_by_numpy_and_its_mask_computed_once(monkeypatch):
    # The small path of padding.pad_1d: one numpy boolean assignment (of their bits for
    # dtypes numpy lacks; torch's masked scatter only for a dimension other than the first),
    # the mask computed once for values and mask output. Bypassed, the results (tested
    # above) would not change.
    from pincollate._plan import padding as _padding

    scatters, masks = [], []
    real_scatter, real_valid = torch.Tensor.masked_scatter_, _padding.valid_1d
    monkeypatch.setattr(torch.Tensor, "masked_scatter_", lambda *a: scatters.append(1) or real_scatter(*a))
    monkeypatch.setattr(_padding, "valid_1d", lambda *a, **k: masks.append(1) or real_valid(*a, **k))
    collate = MMCollate(pin_memory=False, fields={"ids": Pad(mask_key="ids_mask")})
    collate(_ids([3, 1]))
    # A warm batch is made by the plan's generated function, which calls the mask's kernel itself.
    counted = _padding.valid_1d
    monkeypatch.setitem(collate._plans.last.compiled.run.__globals__, "valid_1d", counted)
    scatters.clear(), masks.clear()
    out = collate(_ids([2, 5]))
    assert out["ids_mask"].sum().item() == 7
    assert scatters == [] and masks == [1]
    # A value of length 0 is left out of the concatenation (torch.cat's slow path), the row all padding.
    out = collate(_ids([2, 0, 3]))
    assert out["ids"].tolist() == [[7, 8, 0], [0, 0, 0], [7, 8, 9]] and out["ids_lengths"].tolist() == [2, 0, 3]
    bfloat16 = MMCollate(pin_memory=False, fields={"ids": Pad(mask_key="ids_mask")})
    bfloat16(_ids([3, 1], dtype=torch.bfloat16))  # no numpy dtype: numpy's assignment of int16 bits
    assert scatters == []
    columns = MMCollate(pin_memory=False, fields={"ids": Pad()})
    out = columns([{"ids": torch.ones(2, n, dtype=torch.bfloat16)} for n in (3, 1)])  # padded along dim 1
    assert scatters == [1] and out["ids"].sum().item() == 8


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("size", [1, 3, 64, 65, 700, 1024, 1025, 3000])
def test_valid_1d_gathers_short_rows_from_the_triangle_and_compares_long_ones(size, left, monkeypatch):
    # Both paths of _padding.valid_1d against the definition, with and without ``out``;
    # a triangle grown for a long row still serves short ones.
    from pincollate._plan import padding as _padding

    generator = torch.Generator().manual_seed(size)
    lengths = [0, size, *torch.randint(0, size + 1, (9,), generator=generator).tolist()]
    positions = np.arange(size)[None, :]
    bounds = np.array(lengths)[:, None]
    expected = positions >= size - bounds if left else positions < bounds
    grown = []
    real_tri = np.tri
    monkeypatch.setattr(np, "tri", lambda *a, **k: grown.append(a) or real_tri(*a, **k))
    assert (_padding.valid_1d(lengths, size, left) == expected).all()
    out = np.ones((len(lengths), size), dtype=bool)
    assert _padding.valid_1d(lengths, size, left, out=out) is out and (out == expected).all()
    short = [0, 2, 3]
    assert _padding.valid_1d(short, 3, left).tolist() == [
        [j >= 3 - n if left else j < n for j in range(3)] for n in short
    ]
    # Rows up to TRIANGLE_ROWS long come from one kept triangle, grown to a power of two.
    on_triangle = size <= _padding.TRIANGLE_ROWS
    assert _padding._triangles[0].shape[1] >= (size if on_triangle else 0)
    assert all(shape[1] <= _padding.TRIANGLE_ROWS for shape in grown)


def test_concatenations_get_no_empty_one_dimensional_piece(monkeypatch):
    # An empty 1-D tensor sends torch.cat off its fast path (_padding.nonempty); the lists,
    # items and Concat leave them out. Given one, the results would not change.
    from pincollate._plan import listed as _listed

    seen = []
    real = _listed.concat_tensors

    def checked(region: torch.Tensor, pieces: list[torch.Tensor]) -> None:
        seen.append(len(pieces))
        assert all(piece.numel() for piece in pieces) or len(pieces) == 1
        real(region, pieces)

    def checked_cat(pieces: list[torch.Tensor], *, out: torch.Tensor) -> None:
        checked(out, pieces)

    monkeypatch.setattr(_listed, "concat_tensors", checked)
    for settings in ({"fields": {"ids": AsList()}}, {"fields": {"ids": Concat()}}):
        collate = MMCollate(pin_memory=False, **settings)
        before = len(seen)
        collate(_ids([1, 2, 1])), collate(_ids([1, 2, 1, 1]))  # a plan for each batch size
        for plan in collate._plans._plans.values():
            if "cat" in plan.compiled.run.__globals__:  # their generated functions concatenate
                monkeypatch.setitem(plan.compiled.run.__globals__, "cat", checked_cat)
        del seen[before:]  # the batches that planned
        for lengths in ([3, 0, 2], [0, 4, 0, 1]):
            collate(_ids(lengths))
    items = MMCollate(pin_memory=False, sequences="items", fields={"ids": AsList()})
    before = len(seen)
    items(_items([[1], [2]]))  # the plan, whose generated function concatenates
    monkeypatch.setitem(items._plans.last.compiled.run.__globals__, "cat", checked_cat)
    del seen[before:]
    for counts in ([[0, 2], [1]], [[0], [3, 0]]):
        items(_items(counts))
    assert len(seen) == 6


@pytest.mark.parametrize("policy", [Jagged(), Concat(), Pad()], ids=["jagged", "concat", "pad"])
def test_a_ragged_policy_is_for_tensors_and_token_lists_and_a_warm_collate_keeps_to_it_when_a_dtype_changes(policy):
    # ragged= applies to fields of tensors and to token ids as Python lists (lengths that agree
    # too), never to a sample's items, whatever their dtype: a warm collate as the careful walk.
    collate = MMCollate(pin_memory=False, ragged=policy)
    reference = careful_walk(ragged=policy)
    for batch in (
        _items([[1, 2], [3, 1]]),  # lists of one length: transposed, each position a field
        _lists([3, 2]),
        _lists([3, 2], kind=float),
        _lists([2, 4]),
        _items([[2, 1], [3]]),
        [{"ids": [t.double() for t in sample["ids"]]} for sample in _items([[2, 1], [3]])],
        _ids([3, 1]),
        _ids([3, 1], dtype=torch.float16),
    ):
        assert_same_outcome(collate, reference, batch)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as integers: equality where float8 and complex32 have no comparison of their own."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32, torch.uint16, torch.uint32])
@pytest.mark.parametrize("shapes", [[(2,), (3,)], [(2, 3), (4, 3)], [(3, 2), (3, 4)]], ids=["1d", "rows", "dim1"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_fills_dtypes_without_a_scatter_kernel_by_their_bits(dtype, shapes, side):
    # float8, complex32 and unsigned ints past uint8 have no masked_scatter_ (nor, some, numpy) kernel.
    values = [(torch.arange(math.prod(shape)).reshape(shape) % 5 + 1).to(dtype) for shape in shapes]
    full = [max(sizes) for sizes in zip(*shapes, strict=True)]
    padded = 0 if shapes[0][0] != shapes[1][0] else 1  # the one dimension whose sizes differ
    lengths = [shape[padded] for shape in shapes]
    expected = torch.zeros(len(values), *full, dtype=dtype)
    mask = torch.zeros(len(values), full[padded], dtype=torch.bool)
    for i, (value, shape) in enumerate(zip(values, shapes, strict=True)):
        place = tuple(slice(f - s, f) if side == "left" else slice(0, s) for s, f in zip(shape, full, strict=True))
        expected[i][place] = value
        mask[i][place[padded]] = True
    batch = [{"x": value} for value in values]
    collate = MMCollate(pin_memory=False, fields={"x": Pad(side=side)})
    for out in (collate(batch), collate(batch), careful_walk(fields={"x": Pad(side=side)})(batch)):
        assert out["x"].dtype == dtype and torch.equal(_bits(out["x"]), _bits(expected))
        if dtype is torch.complex32:
            assert torch.equal(torch.view_as_real(out["x"]).float(), torch.view_as_real(expected).float())
        assert out["x_lengths"].tolist() == lengths and torch.equal(out["x_mask"], mask)
        assert_one_buffer(out)


@pytest.mark.parametrize(
    "settings, build",
    [
        ({}, lambda n: torch.nn.Parameter(torch.arange(float(n)))),
        ({"fields": {"x": AsList()}}, lambda n: torch.nn.Parameter(torch.arange(float(n)))),
        ({"fields": {"x": PerSample()}}, lambda n: {"w": torch.nn.Parameter(torch.arange(float(n))), "id": n}),
        ({"fields": {"x": PerSample()}}, lambda n: [torch.nn.Parameter(torch.arange(float(n)))] * (n - 1)),
    ],
    ids=["none", "aslist", "persample-dict", "persample-list"],
)
def test_ragged_parameters_are_listed_as_plain_tensors_as_stack_gives_them(settings, build):
    # torch.stack gives a Parameter column a plain tensor (its __torch_function__ is off): listed, each
    # sample's value is a plain tensor too, warm or careful.
    collate, reference = MMCollate(pin_memory=False, **settings), careful_walk(**settings)
    for lengths in ([3, 2], [1, 4, 2], [3, 2]):
        batch = [{"x": build(n)} for n in lengths]
        out = assert_same_outcome(collate, reference, batch)
        assert all(type(t) is torch.Tensor for t in tensors(out))
        assert_one_buffer(out)
        assert_identical(pickle.loads(pickle.dumps(out)), out)


def test_read_only_arrays_are_concatenated_once_and_copied_from_there(monkeypatch):
    # concatenated_arrays hands Pad and Concat one flat copy (Joined); Pad's small path and
    # Concat copy from it instead of concatenating the values again (nonempty + torch.cat).
    from pincollate._plan import padding

    def again(*args: Any) -> None:
        raise AssertionError("the values were concatenated a second time")

    for fields in ({"ids": Pad()}, {"ids": Concat()}):
        reference = MMCollate(pin_memory=False, fields=fields)
        expected = [reference(_read_only(_arrays(lengths))) for lengths in ([3, 1, 4], [2, 5])]
        with monkeypatch.context() as patch:
            patch.setattr(padding, "nonempty", again)
            collate = MMCollate(pin_memory=False, fields=fields)
            for lengths, want in zip(([3, 1, 4], [2, 5]), expected, strict=True):
                assert_identical(collate(_read_only(_arrays(lengths))), want)


def _route(values: list[Any], **settings: Any) -> tuple[str, str | None] | None:
    """The route the careful walk takes with ``values`` as field ``x`` of a collate made with ``settings``."""
    route = MMCollate(pin_memory=False, **settings)._planner.route(values, ("x",), keyed=True)
    return None if route is None else (route.kind, None if route.policy is None else type(route.policy).__name__)


ROUTES: dict[str, tuple[dict[str, Any], list[Any], tuple[str, str | None] | None]] = {
    "ragged tensors": ({}, [torch.zeros(2), torch.zeros(3)], ("leaves", None)),
    "a field's Pad": ({"fields": {"x": Pad()}}, [torch.zeros(2), torch.zeros(3)], ("leaves", "Pad")),
    "ragged= on tensors": ({"ragged": Pad()}, [torch.zeros(2), torch.zeros(3)], ("leaves", "Pad")),
    # ragged= is for fields that can be ragged: 0-d values and numbers just stack.
    "ragged= on 0-d tensors": ({"ragged": Pad()}, [torch.tensor(1), torch.tensor(2)], ("leaves", None)),
    "ragged= on numbers": ({"ragged": Pad()}, [1, 2.5], ("leaves", None)),
    "token ids under Pad": ({"fields": {"x": Pad()}}, [[1, 2], [3]], ("number lists", "Pad")),
    # ... and under ragged=, as a field of tensors is: in every batch, lengths that agree too.
    "token ids under ragged=": ({"ragged": Pad()}, [[1, 2], [3]], ("number lists", "Pad")),
    "token ids of one length under ragged=": ({"ragged": Concat()}, [[1, 2], [3, 4]], ("number lists", "Concat")),
    "token ids under ragged=AsList()": ({"ragged": AsList()}, [[1, 2], [3]], ("items", None)),
    "PerSample mappings": ({"fields": {"x": PerSample()}}, [{"a": 1}, {"a": 2}], ("per sample", "PerSample")),
    "lists of items": ({}, [[torch.zeros(2)], [torch.zeros(2)] * 2], ("items", None)),
    "AsList on lists": ({"fields": {"x": AsList()}}, [[torch.zeros(2)], []], ("items", "AsList")),
    "Concat on lists": ({"fields": {"x": Concat()}}, [[torch.zeros(2)], []], ("packed items", "Concat")),
    "arrays": ({}, [np.zeros(2), np.zeros(3)], ("leaves", None)),
    # No recipe runs these: a mapping, strings, tensors beside arrays, a refused column.
    "mappings": ({}, [{"a": 1}, {"a": 2}], None),
    "strings": ({}, ["a", "b"], None),
    "tensors beside arrays": ({}, [torch.zeros(2), np.zeros(2)], None),
    "refused": ({"fields": {"x": Pad()}}, ["a", "b"], None),
}


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_the_careful_walk_says_which_route_a_part_takes(name):
    settings, values, expected = ROUTES[name]
    assert _route(values, **settings) == expected


def test_a_routes_walk_warns_of_nothing_and_the_batch_warns_once():
    collate = MMCollate(pin_memory=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert collate._planner.route([torch.zeros(2), torch.zeros(3)], ("x",)) == ("leaves", None)
        assert caught == []
        collate([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])  # its recipe lists it, and warns
        collate([{"x": torch.zeros(4)}, {"x": torch.zeros(3)}])
    assert [w.category for w in caught] == [RaggedFieldWarning]
    # Warnings as errors: the route is still found (a recipe runs the field), and the batch raises.
    strict = MMCollate(pin_memory=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RaggedFieldWarning)
        assert strict._planner.route([torch.zeros(2), torch.zeros(3)], ("x",)) == ("leaves", None)
        with pytest.raises(RaggedFieldWarning):
            strict([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])


def test_a_part_gets_the_recipe_of_the_walks_route_and_none_where_the_walk_refuses():
    # Token ids: read as sequences under a field's Pad() and under ragged=Pad(); items of
    # numbers under ragged=AsList() (which the walk applies to each item: no recipe runs that).
    for settings in ({"fields": {"x": Pad()}}, {"ragged": Pad()}):
        collate = MMCollate(pin_memory=False, **settings)
        collate([{"x": [1, 2]}, {"x": [3]}])
        (recipe,) = [op.recipe for op in _careful_ops(collate)]
        assert type(recipe) is NumberLists and type(recipe.inner) is PadRecipe
    collate = MMCollate(pin_memory=False, ragged=AsList())
    collate([{"x": [1, 2]}, {"x": [3]}])
    assert [op.recipe for op in _careful_ops(collate)] == [None]
    # Where the walk refuses the first batch, no recipe: each batch is walked, and says why.
    collate = MMCollate(pin_memory=False, fields={"x": Pad()})
    with pytest.raises(CollateError, match="Pad"):
        collate([{"x": "a"}, {"x": "b"}])
    assert collate._plans.planned == 0


def _careful_ops(collate: MMCollate) -> list[Any]:
    from pincollate._plan.cache import _nodes
    from pincollate._plan.tree_ops import CarefulOp

    return [op for op in _nodes(collate._plans.last.op) if type(op) is CarefulOp]


@pytest.mark.parametrize("settings", [{"fields": {"x": Pad()}}, {"ragged": Pad()}], ids=["field", "ragged"])
def test_a_padded_field_that_turns_0_d_beside_an_absent_value_gets_the_walks_result(settings):
    collate = MMCollate(pin_memory=False, missing="none", **settings)
    reference = careful_walk(missing="none", **settings)
    for batch in (
        [{"x": torch.ones(2)}, {"x": torch.ones(3)}],
        [{"x": torch.tensor(1.0)}, {"x": None}],  # Pad()'s error, or (ragged=) a list: never an IndexError
        [{"x": torch.ones(1)}, {"x": None}],
    ):
        assert_same_outcome(collate, reference, batch)


# --- a value's memory: what no copy reads is still checked ------------------------------------


#: Per policy: the collate's settings, a value without elements, and a sample holding a value.
_UNREAD: dict[str, tuple[dict[str, Any], tuple[int, ...], Callable[[Any], dict]]] = {
    "AsList rows": ({"fields": {"x": AsList()}}, (0, 3), lambda value: {"x": value}),
    "AsList 1-D": ({"fields": {"x": AsList()}}, (0,), lambda value: {"x": value}),
    "no policy": ({}, (0, 3), lambda value: {"x": value}),
    "Pad": ({"fields": {"x": Pad()}}, (0,), lambda value: {"x": value}),
    "Concat 1-D": ({"fields": {"x": Concat()}}, (0,), lambda value: {"x": value}),
    "Jagged 1-D": ({"fields": {"x": Jagged()}}, (0,), lambda value: {"x": value}),
    "PerSample": ({"fields": {"t": PerSample()}}, (0, 3), lambda value: {"t": {"b": value}}),
    "items": ({"sequences": "items"}, (0, 3), lambda value: {"x": [value, torch.ones(1, 3)]}),
}


@pytest.mark.parametrize("memory", ["sparse", "meta"])
@pytest.mark.parametrize("name", sorted(_UNREAD))
def test_a_value_without_elements_in_sparse_or_meta_memory_is_refused_by_a_warm_plan_as_by_the_walk(name, memory):
    # No copy reads a value without elements: the plan's guard reads its memory, and the walk names it.
    settings, shape, sample = _UNREAD[name]
    trailing = shape[1:]
    good = [sample(torch.ones(2, *trailing)), sample(torch.ones(4, *trailing))]
    bad = torch.zeros(shape).to_sparse() if memory == "sparse" else torch.empty(shape, device="meta")
    expected = "sparse or non-strided" if memory == "sparse" else "expected a CPU tensor"
    for compiled in (False, True):
        collate = MMCollate(pin_memory=False, compile=compiled, **settings)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RaggedFieldWarning)
            for _ in range(3):  # walked, planned, warm
                collate(good)
            with pytest.raises(CollateError, match=rf"sample 0 at \[.*\]: {expected}"):
                collate([sample(bad), good[1]])


def test_a_sparse_value_that_a_recipe_reshapes_is_refused_with_its_sample_and_path():
    # Values of one rank whose trailing sizes differ are listed flat: reshaped before any copy reads them.
    good = [{"x": torch.ones(2, 3)}, {"x": torch.ones(3, 2)}]
    bad = [{"x": torch.ones(2, 3)}, {"x": torch.ones(3, 2).to_sparse()}]
    collate = MMCollate(pin_memory=False, fields={"x": AsList()})
    for _ in range(3):
        collate(good)
    with pytest.raises(CollateError, match=r"sample 1 at \['x'\]: sparse or non-strided"):
        collate(bad)


@pytest.mark.parametrize("policy", [Pad(), Concat(), Jagged(), Pad(max_length=2, truncate=True)], ids=repr)
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_ragged_reads_token_lists_as_a_field_rule_does_in_every_batch(policy, compile):
    # ragged= is a policy for every field: token ids as Python lists are read as sequences, as
    # fields={"ids": policy} reads them, never left a per-sample list without a word. Lists of
    # one length too, so a long-lived collate gives the same keys in every batch.
    by_ragged = MMCollate(pin_memory=False, ragged=policy, compile=compile)
    by_field = MMCollate(pin_memory=False, fields={"ids": policy, "pair": policy}, compile=compile)
    batches = [
        [{"ids": [1, 2, 3], "pair": [0.5, 1.5], "y": 0}, {"ids": [4, 5], "pair": [2.5, 3.5], "y": 1}],
        [{"ids": [6, 7], "pair": [0.0, 1.0], "y": 2}, {"ids": [8, 9], "pair": [1.0, 2.0], "y": 3}],  # one length
        [{"ids": [1.5], "pair": [0.0, 0.0], "y": 4}, {"ids": [2.0, 3.0, 4.0], "pair": [1.0, 1.0], "y": 5}],
        [{"ids": [], "pair": [1.0, 2.0], "y": 6}, {"ids": [], "pair": [3.0, 4.0], "y": 7}],  # all empty
    ]
    reference = careful_walk(ragged=policy)
    keys = list(reference(batches[0]))
    for samples in batches * 2:  # a warm collate as a fresh one
        with warnings.catch_warnings():
            warnings.simplefilter("error", RaggedFieldWarning)  # nothing is listed
            got = by_ragged(samples)
            assert list(got) == keys  # the same keys in every batch
            assert_identical(dict(got), dict(reference(samples)))
            if samples[0]["ids"] or isinstance(policy, Pad):
                assert_identical(dict(got), dict(by_field(samples)))
            else:
                # Lists all empty: sequences of no token (a field's own Concat or Jagged may read
                # them as lists of no items; ragged= applies to no sample's items).
                ids = got["ids"].values() if got["ids"].is_nested else got["ids"]
                assert ids.numel() == 0 and "ids_counts" not in got


def test_ragged_as_list_keeps_token_lists_listed_without_a_warning():
    # A ragged= policy that reads no sequences (AsList()) leaves lists as lists: the user's choice.
    collate = MMCollate(pin_memory=False, ragged=AsList())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RaggedFieldWarning)
        batch = collate([{"ids": [1, 2, 3]}, {"ids": [4, 5]}])
    assert [t.tolist() for t in batch["ids"]] == [[1, 2, 3], [4, 5]]


class _TokenList(list):
    """A list class of the user's, registered as a container."""


def test_ragged_reads_lists_as_the_walk_whatever_batch_the_plan_was_made_from():
    # A plan made from a batch whose lists the walk does not read (a numpy scalar beside ints: the
    # first batch here, the suite compiling at first sight), or from a registered list class, must
    # not transpose or flatten a later batch the walk pads.
    from pincollate import register_container

    register_container(_TokenList, lambda v: (list(range(len(v))), list(v)), lambda keys, values: _TokenList(values))
    numbers = [{"x": [1, 2]}, {"x": [3, 4]}]
    scalars = [{"x": [1, 2]}, {"x": [np.int64(3), np.int64(4)]}]
    registered = [{"x": _TokenList([1, 2])}, {"x": _TokenList([3, 4])}]
    empty = [{"x": []}, {"x": []}]  # sequences of no token
    for policy in (Pad(), Concat(), Jagged(), Pad(max_length=4, truncate=True)):
        for first in (scalars, empty):
            collate, reference = MMCollate(pin_memory=False, ragged=policy), careful_walk(ragged=policy)
            for batch in (first, numbers, scalars, empty, numbers, registered, registered, numbers, empty):
                assert_same_outcome(collate, reference, batch)


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_ragged_never_reads_a_samples_items_as_token_ids(compile):
    # Boxes as lists of four numbers: each sample's stack, as without ragged=, never padded as tokens.
    collate = MMCollate(pin_memory=False, ragged=Pad(), compile=compile)
    batch = [{"boxes": [[0, 0, 4, 4], [1, 1, 2, 2]], "ids": [1, 2, 3]}, {"boxes": [[2, 2, 3, 3]], "ids": [4]}]
    for _ in range(3):
        out = collate(batch)
        assert [b.tolist() for b in out["boxes"]] == [[[0, 0, 4, 4], [1, 1, 2, 2]], [[2, 2, 3, 3]]]
        assert out["ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and out["ids_lengths"].tolist() == [3, 1]
    # A list at a tuple's position is no mapping's field (no key for the extras): never read as
    # token ids, its lists listed with the warning, as without ragged=.
    with pytest.warns(RaggedFieldWarning, match=r"\[0\] holds lists of items that do not stack"):
        out = collate([([1, 2], 0), ([3], 1)])
    assert [t.tolist() for t in out[0]] == [[1, 2], [3]] and out[1].tolist() == [0, 1]


@pytest.mark.filterwarnings("ignore:BComplex32 support is experimental")
@pytest.mark.parametrize(
    "dtype, value",
    [
        ("float8_e8m0fnu", 0),  # no zero: 0 would pad as 2**-127
        ("float8_e8m0fnu", -1),  # no sign: -1 would pad as 1
        ("float8_e4m3fn", 70000.0),  # saturates at 448
        ("float8_e4m3fn", float("inf")),  # no inf
        ("float32", 2**1100),  # past what torch converts
        ("float16", 1e-10),  # rounds to zero
        ("bcomplex32", 0),  # no fill kernel
    ],
)
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_a_pad_value_the_dtype_cannot_hold_is_refused_naming_the_field(dtype, value, compile):
    dtype = getattr(torch, dtype, None)
    if dtype is None:
        pytest.skip("a dtype this torch lacks")
    size = dtype.itemsize
    column = [torch.zeros(2 * size, dtype=torch.uint8).view(dtype), torch.zeros(size, dtype=torch.uint8).view(dtype)]
    collate = MMCollate(pin_memory=False, fields={"x": Pad(value=value)}, compile=compile)
    with pytest.raises(CollateError, match=r"at \['x'\]: (pad value .* does not fit|Pad\(\) does not pad values of)"):
        collate([{"x": value} for value in column])


def test_ragged_reads_token_lists_after_a_plan_made_from_lists_it_does_not_read():
    # A long-lived collate that planned lists of numpy scalars or 0-d tensors (transposed, as
    # default_collate) must pad a later batch of Python ints as the walk does.
    python_ids = [{"ids": [1, 2]}, {"ids": [3, 4]}]
    for warm in (
        [{"ids": [np.int64(1), np.int64(2)]}, {"ids": [np.int64(3), np.int64(4)]}],
        [{"ids": [torch.tensor(1), torch.tensor(2)]}, {"ids": [torch.tensor(3), torch.tensor(4)]}],
    ):
        collate, reference = MMCollate(pin_memory=False, ragged=Pad()), careful_walk(ragged=Pad())
        for batch in (warm, warm, python_ids, warm, python_ids):
            assert_same_outcome(collate, reference, batch)
        assert list(collate(python_ids)) == ["ids", "ids_lengths", "ids_mask"]


@pytest.mark.parametrize("policy", [Pad(), Concat()], ids=["pad", "concat"])
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_ragged_leaves_tabular_samples_to_default_collate(policy, compile):
    # The batch's samples are no field: tuples of numbers are transposed, as default_collate does.
    batch = [(0.5, 1), (0.25, 0)]
    collate = MMCollate(pin_memory=False, ragged=policy, compile=compile)
    for _ in range(3):
        assert_identical(collate(batch), default_collate(batch))


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_ragged_warns_of_lists_of_numpy_scalars_it_leaves_listed(compile):
    # Lists of numpy scalars are no token ids (Python numbers are): a sample's items, listed where
    # they differ in length with the warning, never silenced by a ragged= that does not apply.
    collate = MMCollate(pin_memory=False, ragged=Pad(), compile=compile)
    batch = [{"ids": [np.int64(1), np.int64(2), np.int64(3)]}, {"ids": [np.int64(4)]}]
    with pytest.warns(RaggedFieldWarning, match=r"\['ids'\] holds lists of items that do not stack"):
        out = collate(batch)
    assert [t.tolist() for t in out["ids"]] == [[1, 2, 3], [4]]


def test_ragged_reads_token_lists_after_a_plan_made_from_lists_of_lists_or_pairs():
    # Boxes as lists of lists, [label, ids] pairs, (ids, label) pairs: planned as positions, a later
    # batch of token ids at the same key must still be padded as the walk pads it.
    ids = [{"b": [1, 2]}, {"b": [3, 4]}]
    for warm in (
        [{"b": [[1, 2], [3, 4]]}, {"b": [[5, 6], [7, 8]]}],
        [{"b": [0, [1, 2]]}, {"b": [1, [3, 4]]}],
        [{"b": ([], 0)}, {"b": ([], 1)}],
        [{"b": ([np.int64(7)], 0)}, {"b": ([np.int64(8)], 1)}],
    ):
        for policy in (Pad(lengths_key=None, mask_key=None), Concat(offsets_key=None), Jagged()):
            collate, reference = MMCollate(pin_memory=False, ragged=policy), careful_walk(ragged=policy)
            for batch in (warm, warm, ids, warm, ids):
                assert_same_outcome(collate, reference, batch)


@pytest.mark.parametrize("policy", [Pad(), Concat(), Jagged()], ids=["pad", "concat", "jagged"])
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_boxes_as_lists_of_numbers_are_never_token_ids_whatever_their_counts(policy, compile):
    # One count in every sample: transposed as default_collate does; counts that differ: each
    # sample's stack. Never box k of every sample padded together, never an error.
    collate = MMCollate(pin_memory=False, ragged=policy, compile=compile)
    same = [{"boxes": [[1, 2, 3, 4], [5, 6, 7, 8]]}, {"boxes": [[1, 2, 3, 4], [5, 6, 7, 9]]}]
    other = [{"boxes": [[1, 2, 3, 4], [5, 6, 7, 8]]}, {"boxes": [[1, 2, 3, 4]]}]
    for _ in range(2):
        assert_identical(collate(same)["boxes"], default_collate(same)["boxes"])
        assert [t.tolist() for t in collate(other)["boxes"]] == [[[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4]]]


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_an_empty_tensor_beside_item_lists_under_ragged_concat_stays_empty(compile):
    # Concat() of the one value is the value: no leading dimension to drop (it had read a 0-d
    # tensor of no bytes: uninitialised memory).
    collate = MMCollate(pin_memory=False, sequences="items", ragged=Concat(offsets_key=None), compile=compile)
    out = collate([{"a": [1]}, {"a": torch.tensor([], dtype=torch.int64)}])["a"]
    assert out[1].shape == (0,) and out[1].dtype == torch.int64
    out = collate([{"a": []}, {"a": torch.zeros(0, 3)}])["a"]
    assert out[1].shape == (0, 3)
    out = collate([{"a": [1]}, {"a": torch.tensor([[5, 6]])}])["a"]  # a (1, 2) value stays (1, 2)
    assert out[1].tolist() == [[5, 6]]


def test_under_ragged_a_field_of_tensor_lists_keeps_its_plan_and_a_field_of_number_lists_is_walked(monkeypatch):
    # Lists of tensors of one dimension or more: the plan's guards refuse a number where they stood,
    # so the field is not walked again; lists of numbers in any form are walked for each batch.
    walked: list = []
    walk = Planner.plan

    def counted(planner: Planner, column: Any, path: Any, keyed: bool = False) -> Any:
        walked.append(path)
        return walk(planner, column, path, keyed)

    collate = MMCollate(pin_memory=False, ragged=Pad(lengths_key=None, mask_key=None))
    batch = [{"crops": [torch.ones(2), torch.ones(2)], "ids": [np.int64(1)]} for _ in range(2)]
    collate(batch)
    monkeypatch.setattr(Planner, "plan", counted)
    for _ in range(3):
        collate(batch)
    assert ("crops",) not in walked and walked.count(("ids",)) == 3
