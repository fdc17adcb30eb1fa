"""Multimodal datasets: deterministic, built in or shipped in a package, nothing downloaded.

Each builds a map-style ``Dataset`` whose item ``i`` is the same on every call and in
every process, so benchmarks and tests compare methods on identical samples. The
synthetic ones serve the benchmark; :func:`DigitsDataset` (real handwritten digits
shipped inside scikit-learn) serves the notebooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from ._digits import DigitsDataset

__all__ = [
    "SCENARIOS",
    "AudioDataset",
    "DetectionDataset",
    "DigitsDataset",
    "InMemory",
    "ManyLeafDataset",
    "NestedDataset",
    "RaggedDataset",
    "TokenListDataset",
    "VLMDataset",
    "VideoDataset",
]


def _gen(index: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class _ManyLeafDataset(Dataset[Any]):
    def __init__(self, length: int = 512, fields: int = 40, image_size: int = 64):
        self.length = length
        self.fields = fields
        self.image_size = image_size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 1)
        sample: dict[str, Any] = {
            "image": torch.randint(0, 256, (3, self.image_size, self.image_size), dtype=torch.uint8, generator=g)
        }
        for j in range(self.fields):
            kind = j % 4
            if kind == 0:
                sample[f"feat{j}"] = torch.randn(8, generator=g)
            elif kind == 1:
                sample[f"ids{j}"] = torch.randint(0, 1000, (4,), generator=g)
            elif kind == 2:
                sample[f"score{j}"] = float(torch.rand((), generator=g))
            else:
                sample[f"count{j}"] = int(torch.randint(0, 100, (), generator=g))
        sample["label"] = index % 10
        sample["caption"] = f"sample {index}"
        return sample


class _NestedDataset(Dataset[Any]):
    def __init__(self, length: int = 512, features: int = 24, crops: int = 8):
        self.length = length
        self.features = features
        self.crops = crops

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 6)
        return {
            "image": torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=g),
            "feats": {f"f{j}": torch.randn(8, generator=g) for j in range(self.features)},
            "crops": [torch.randn(3, 8, 8, generator=g) for _ in range(self.crops)],
            "ids": torch.randint(0, 1000, (16,), generator=g),
            "label": index % 10,
        }


class _RaggedDataset(Dataset[Any]):
    seed = 7

    def __init__(self, length: int = 512, max_tokens: int = 512):
        self.length = length
        self.max_tokens = max_tokens

    def __len__(self) -> int:
        return self.length

    def _tokens(self, index: int) -> torch.Tensor:
        g = _gen(index, self.seed)
        n = int(torch.randint(16, self.max_tokens + 1, (), generator=g))
        return torch.randint(0, 32000, (n,), generator=g)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"tokens": self._tokens(index), "label": index % 10}


class _TokenListDataset(_RaggedDataset):
    seed = 8

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self._tokens(index).tolist(), "label": index % 10}


class _VideoDataset(Dataset[Any]):
    def __init__(self, length: int = 64, frames: int = 16, size: int = 160):
        self.length = length
        self.frames = frames
        self.size = size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 2)
        f, s = self.frames, self.size
        return {
            "video": torch.randint(0, 256, (f, 3, s, s), dtype=torch.uint8, generator=g),
            "flow": torch.randn(f, 2, s, s, generator=g).to(torch.float16),
            "label": index % 400,
        }


class _VLMDataset(Dataset[Any]):
    def __init__(self, length: int = 256, max_tokens: int = 256, max_images: int = 4, patch_dim: int = 588):
        self.length = length
        self.max_tokens = max_tokens
        self.max_images = max_images
        self.patch_dim = patch_dim

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 3)
        tokens = int(torch.randint(16, self.max_tokens + 1, (), generator=g))
        images = int(torch.randint(1, self.max_images + 1, (), generator=g))
        patches = [
            torch.randn(int(torch.randint(4, 17, (), generator=g)) * 4, self.patch_dim, generator=g).to(torch.bfloat16)
            for _ in range(images)
        ]
        return {"input_ids": torch.randint(0, 32000, (tokens,), generator=g), "pixel_values": patches}


class _AudioDataset(Dataset[Any]):
    def __init__(self, length: int = 256, rate: int = 16000):
        self.length = length
        self.rate = rate

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 4)
        samples = int(torch.randint(self.rate // 2, 2 * self.rate + 1, (), generator=g))
        return {"audio": torch.randn(1, samples, generator=g), "label": index % 35}


class _DetectionDataset(Dataset[Any]):
    def __init__(self, length: int = 256, size: int = 128, max_boxes: int = 20):
        self.length = length
        self.size = size
        self.max_boxes = max_boxes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = _gen(index, 5)
        n = int(torch.randint(0, self.max_boxes + 1, (), generator=g))
        xy = torch.rand(n, 2, generator=g) * (self.size - 8)
        wh = torch.rand(n, 2, generator=g) * 32 + 4
        return {
            "image": torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g),
            "boxes": torch.cat([xy, xy + wh], dim=1),
            "labels": torch.randint(0, 80, (n,), generator=g),
        }


class _InMemory(Dataset[Any]):
    def __init__(self, dataset: Dataset[Any]):
        self.items: list[Any] = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


def ManyLeafDataset(length: int = 512, fields: int = 40, image_size: int = 64) -> Dataset[Any]:
    """An image plus ``fields`` small tensor and number fields: a typical multimodal record.

    Examples:
        >>> sample = ManyLeafDataset(4)[0]
        >>> len(sample), sample["image"].shape
        (43, torch.Size([3, 64, 64]))
    """
    return _ManyLeafDataset(length, fields, image_size)


def NestedDataset(length: int = 512, features: int = 24, crops: int = 8) -> Dataset[Any]:
    """A many-leaf record with nesting: an image, a dict of 24 small features, 8 crops, ids, a label.

    Examples:
        >>> sample = NestedDataset(4)[0]
        >>> len(sample["feats"]), len(sample["crops"]), sample["crops"][0].shape
        (24, 8, torch.Size([3, 8, 8]))
    """
    return _NestedDataset(length, features, crops)


def RaggedDataset(length: int = 512, max_tokens: int = 512) -> Dataset[Any]:
    """Token ids of 16 to 512 per sample and a label: ragged, with no policy asked for."""
    return _RaggedDataset(length, max_tokens)


def TokenListDataset(length: int = 512, max_tokens: int = 512) -> Dataset[Any]:
    """Token ids of 16 to 512 per sample as a Python list (as ``datasets`` and tokenizers give them), and a label.

    Examples:
        >>> sample = TokenListDataset(4)[0]
        >>> type(sample["input_ids"]).__name__, type(sample["input_ids"][0]).__name__
        ('list', 'int')
    """
    return _TokenListDataset(length, max_tokens)


def VideoDataset(length: int = 64, frames: int = 16, size: int = 160) -> Dataset[Any]:
    """Few, large leaves: a uint8 video clip and a float16 optical-flow tensor (over 1 MB each)."""
    return _VideoDataset(length, frames, size)


def VLMDataset(length: int = 256, max_tokens: int = 256, max_images: int = 4, patch_dim: int = 588) -> Dataset[Any]:
    """Token ids of varying length and a varying number of variable-resolution patch tensors."""
    return _VLMDataset(length, max_tokens, max_images, patch_dim)


def AudioDataset(length: int = 256, rate: int = 16000) -> Dataset[Any]:
    """Mono waveforms of 0.5 to 2 seconds at 16 kHz, with a label."""
    return _AudioDataset(length, rate)


def DetectionDataset(length: int = 256, size: int = 128, max_boxes: int = 20) -> Dataset[Any]:
    """Images with a different number of boxes (and labels) per image."""
    return _DetectionDataset(length, size, max_boxes)


def InMemory(dataset: Dataset[Any]) -> Dataset[Any]:
    """Another dataset's items, built once up front.

    Benchmarks use it so that workers spend their time collating and sending,
    not generating random data; forked workers share the items copy-on-write.
    """
    return _InMemory(dataset)


class _Repeat(Dataset[Any]):
    """``dataset`` read round and round to ``length`` samples: a long run over few stored samples."""

    def __init__(self, dataset: Dataset[Any], length: int):
        self.dataset = dataset
        self.length = length
        self.stored = len(dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % self.stored]


#: name -> (dataset, batch size)
SCENARIOS: dict[str, tuple[Callable[..., Dataset[Any]], int]] = {
    "manyleaf": (ManyLeafDataset, 32),
    "nested": (NestedDataset, 32),
    "video": (VideoDataset, 8),
    "ragged": (RaggedDataset, 32),
    "tokens": (TokenListDataset, 32),
    "vlm": (VLMDataset, 16),
    "audio": (AudioDataset, 32),
    "detection": (DetectionDataset, 32),
}
