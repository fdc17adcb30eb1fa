"""scikit-learn's handwritten digits as a multimodal dataset, for the notebooks (see :mod:`.datasets`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = ["DigitsDataset"]


class _DigitsDataset(Dataset[Any]):
    def __init__(self, split: str, test_fraction: float, seed: int):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
        targets = torch.tensor(digits.target)
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
        cut = int(len(images) * (1 - test_fraction))
        self.ids = order[:cut] if split == "train" else order[cut:]
        self.images = images
        self.targets = targets

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = int(self.ids[index])
        image = self.images[i]
        return {
            "id": i,
            "image": image.unsqueeze(0),
            "ink": torch.nonzero(image.flatten() > 0.25).squeeze(1),
            "label": int(self.targets[i]),
        }


def DigitsDataset(split: str = "train", test_fraction: float = 0.25, seed: int = 0) -> Dataset[Any]:
    """scikit-learn's 1,797 handwritten digits (8x8 scans, shipped inside scikit-learn).

    Each sample is multimodal: ``image`` (1x8x8 float in [0, 1]), ``ink`` (the raster
    positions of the inked pixels: a sequence of about 15 to 35 ids, different per digit),
    ``label`` and ``id``. ``split`` is ``"train"`` or ``"test"``, drawn once with
    ``seed``. Needs scikit-learn (``pip install scikit-learn``).

    Examples:
        >>> train = DigitsDataset("train")
        >>> sample = train[0]
        >>> len(train), tuple(sample["image"].shape), sample["ink"].dtype
        (1347, (1, 8, 8), torch.int64)
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return _DigitsDataset(split, test_fraction, seed)
