"""torchvision: FakeData through v2 transforms, and a Faster R-CNN training step with per-sample targets."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from pincollate import MMCollate, PerSample, mm_collate
from samples import assert_one_buffer, assert_same

torchvision = pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402


def test_fakedata_with_v2_transforms_matches_default_collate():
    transform = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    dataset = torchvision.datasets.FakeData(size=8, image_size=(3, 16, 16), num_classes=4, transform=transform)
    for workers in (0, 2):
        ours = list(DataLoader(dataset, batch_size=4, collate_fn=mm_collate, num_workers=workers))
        theirs = list(DataLoader(dataset, batch_size=4, num_workers=0))
        assert len(ours) == len(theirs) == 2
        for a, b in zip(ours, theirs, strict=True):
            assert_same(list(a), list(b))
            assert_one_buffer(a)


class _Boxes(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        n = i % 3 + 1
        xy = torch.rand(n, 2, generator=g) * 40
        return {
            "image": torch.rand(3, 64, 64, generator=g),
            "target": {"boxes": torch.cat([xy, xy + 16], dim=1), "labels": torch.randint(1, 3, (n,), generator=g)},
        }


def test_a_detection_training_step_takes_per_sample_targets():
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3)
    model.train()
    loader = DataLoader(_Boxes(), batch_size=2, collate_fn=MMCollate(fields={"target": PerSample()}))
    batch = next(iter(loader))
    targets = batch["target"]
    assert isinstance(targets, list) and [t["boxes"].shape[0] for t in targets] == [1, 2]
    assert_one_buffer(batch)
    for i, target in enumerate(targets):
        assert_same(target, _Boxes()[i]["target"])  # each image's own boxes and labels
    losses = model(list(batch["image"]), targets)
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
