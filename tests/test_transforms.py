"""Normalize: the device-side image transform the Prefetcher runs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from pincollate import CollateError, Normalize


def test_normalize_matches_torchvision():
    from torchvision.transforms import v2

    images = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ours = Normalize(mean, std)({"image": images})["image"]
    theirs = v2.Normalize(mean, std)(v2.ToDtype(torch.float32, scale=True)(images))
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_normalize_nested_keys_lists_and_channels_last():
    batch = {"inputs": {"pixels": [torch.zeros(2, 3, 4, 4, dtype=torch.uint8)]}, "y": 1}
    out = Normalize([0.5] * 3, [0.5] * 3, keys=["inputs.pixels"], channels_last=True)(batch)
    assert out["inputs"]["pixels"][0].is_contiguous(memory_format=torch.channels_last)
    assert batch["inputs"]["pixels"][0].dtype == torch.uint8  # the input is not changed


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"mean": [0.5], "std": [0.5, 0.5]}, "one value per channel"),
        ({"mean": [0.5], "std": [0.0]}, "std must be positive"),
        ({"mean": [0.5], "std": [1.0], "dtype": torch.int64}, "floating"),
    ],
)
def test_normalize_bad_arguments(kwargs, pattern):
    with pytest.raises(CollateError, match=pattern):
        Normalize(**kwargs)


def test_normalize_reports_missing_key_and_wrong_channels():
    with pytest.raises(CollateError, match="no key 'img'"):
        Normalize([0.5] * 3, [0.5] * 3, keys=["img"])({"image": torch.zeros(3, 2, 2)})
    with pytest.raises(ValueError, match=r"expected images \(\.\.\., 3, H, W\)"):
        Normalize([0.5] * 3, [0.5] * 3)({"image": torch.zeros(1, 2, 2)})


def test_normalize_addresses_a_position_of_tuple_batches_and_keeps_images_images():
    from torchvision import tv_tensors

    from pincollate import mm_collate

    samples = [(tv_tensors.Image(torch.full((3, 2, 2), 255, dtype=torch.uint8)), i) for i in range(2)]
    batch = mm_collate(samples)  # a list: [images, labels]
    out = Normalize([0.5] * 3, [0.5] * 3, keys=0)(batch)
    assert type(out[0]) is tv_tensors.Image and out[0].dtype == torch.float32
    assert out[0].unique().tolist() == [1.0] and out[1].tolist() == [0, 1]
    assert batch[0].dtype == torch.uint8  # the batch given is not changed
    pair = Normalize([0.0] * 3, [1.0] * 3, keys=["0"])((torch.zeros(1, 3, 2, 2), torch.tensor([1])))
    assert isinstance(pair, tuple) and pair[0].dtype == torch.float32
    with pytest.raises(CollateError, match="no position 5 in a batch of 2 entries"):
        Normalize([0.5] * 3, [0.5] * 3, keys=5)(batch)


def test_normalize_reaches_into_namedtuples_dataclasses_and_registered_containers():
    import dataclasses
    from typing import NamedTuple

    from test_kinds import Point

    class Inputs(NamedTuple):
        pixels: torch.Tensor
        ids: torch.Tensor

    @dataclasses.dataclass
    class Example:
        inputs: Inputs
        label: int

    images = torch.full((2, 3, 2, 2), 255, dtype=torch.uint8)
    normalize = Normalize([0.5] * 3, [0.5] * 3, keys=["x.inputs.pixels"])
    batch = {"x": Example(Inputs(images, torch.arange(2)), 1)}
    out = normalize(batch)
    assert torch.equal(out["x"].inputs.pixels, torch.ones(2, 3, 2, 2))
    assert type(out["x"]) is Example and type(out["x"].inputs) is Inputs and out["x"].label == 1
    assert batch["x"].inputs.pixels is images  # the batch given is not changed
    point = Normalize([0.5] * 3, [0.5] * 3, keys=["xy"])(Point(images, None))
    assert type(point) is Point and torch.equal(point.xy, torch.ones(2, 3, 2, 2))
    with pytest.raises(CollateError, match="its keys"):
        Normalize([0.5] * 3, [0.5] * 3, keys=["x.inputs.image"])(batch)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"mean": [], "std": []}, "mean must be finite numbers, one per channel"),
        ({"mean": [0.5], "std": [float("nan")]}, "std must be finite numbers"),
        ({"mean": [0.5], "std": [-1.0]}, "std must be positive"),
        ({"mean": 0.5, "std": 0.5}, "mean must be numbers, one per channel"),
        ({"mean": [0.5], "std": [0.5], "keys": None}, "keys must be a key path or a sequence of them"),
    ],
)
def test_normalize_refuses_settings_that_cannot_normalize(kwargs, says):
    with pytest.raises(CollateError, match=re.escape(says)):
        Normalize(**kwargs)


def test_normalize_takes_means_and_stds_as_arrays_or_tensors():
    norm = Normalize(mean=np.array([0.5, 0.5, 0.5]), std=torch.tensor([0.5, 0.5, 0.5]))
    assert norm.mean == (0.5, 0.5, 0.5) and norm.std == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("value", ["x", None, (torch.zeros(3, 2, 2),)], ids=["str", "none", "tuple"])
def test_normalize_names_the_key_of_a_value_that_is_no_image_tensor(value):
    with pytest.raises(CollateError, match=r"Normalize: expected image tensors, got \w+ at 'image'"):
        Normalize([0.5] * 3, [0.5] * 3)({"image": value})


def test_normalize_takes_a_numpy_int_as_a_position():
    norm = Normalize([0.0] * 3, [1.0] * 3, keys=np.int64(0))
    image = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    out = norm((image, 3))
    assert out[0].dtype == torch.float32 and out[1] == 3
