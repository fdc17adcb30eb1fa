"""torchdata (StatefulDataLoader resumed, nodes), timm (create_loader, Mixup, a model step), webdataset."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch.utils.data import DataLoader

import pincollate
from pincollate import Batch, MMCollate, Normalize, Pad, mm_collate
from samples import TreeDataset, assert_one_buffer, assert_same

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*set_vital.*:UserWarning"),
]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumed_mid_epoch_equals_an_uninterrupted_run(workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dataset = TreeDataset("multimodal-dict", repeat=8)
    whole = list(stateful.StatefulDataLoader(dataset, batch_size=4, collate_fn=mm_collate, num_workers=workers))
    first = stateful.StatefulDataLoader(dataset, batch_size=4, collate_fn=mm_collate, num_workers=workers)
    iterator = iter(first)
    head = [next(iterator) for _ in range(3)]
    state = first.state_dict()
    del iterator
    resumed = stateful.StatefulDataLoader(dataset, batch_size=4, collate_fn=mm_collate, num_workers=workers)
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert len(head) + len(tail) == len(whole)
    for a, b in zip(head + tail, whole, strict=True):
        assert_same(a, b)
        assert_one_buffer(a)


def test_torchdata_nodes_batch_then_collate():
    nodes = pytest.importorskip("torchdata.nodes")
    dataset = TreeDataset("multimodal-dict", repeat=2)
    source = nodes.IterableWrapper(dataset[i] for i in range(len(dataset)))
    node = nodes.Mapper(nodes.Batcher(source, batch_size=4), mm_collate)
    batches = list(nodes.Loader(node))
    assert len(batches) == 2 and all(isinstance(b, Batch) for b in batches)
    assert_same(batches[0], mm_collate([dataset[i] for i in range(4)]))


def test_input_meter_over_torchdata_nodes():
    nodes = pytest.importorskip("torchdata.nodes")
    dataset = TreeDataset("multimodal-dict", repeat=2)
    source = nodes.IterableWrapper(dataset[i] for i in range(len(dataset)))
    meter = pincollate.InputMeter(nodes.Loader(nodes.Mapper(nodes.Batcher(source, batch_size=4), mm_collate)))
    batches = list(meter)
    assert (meter.epoch.batches, meter.epoch.samples) == (2, 8)
    assert meter.epoch.batch_bytes == sum(b.layout.nbytes for b in batches)


class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.new("RGB", (32, 32), color=(i * 20, 10, 200)), i % 4


def test_timm_loader_mixup_and_a_model_step():
    timm = pytest.importorskip("timm")
    from timm.data import Mixup, create_loader

    loader = create_loader(
        _Images(),
        input_size=(3, 32, 32),
        batch_size=4,
        is_training=False,
        use_prefetcher=False,
        num_workers=0,
        collate_fn=mm_collate,
    )
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [0, 1, 2, 3]
    normalized = Normalize([0.5] * 3, [0.5] * 3, keys=0)([images, labels])
    mixed, soft = Mixup(mixup_alpha=1.0, num_classes=4)(normalized[0], normalized[1])
    assert soft.shape == (4, 4)
    model = timm.create_model("resnet18", pretrained=False, num_classes=4)
    loss = torch.nn.functional.cross_entropy(model(mixed), soft)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # webdataset leaves its tar stream to the GC
def test_webdataset_shard_written_here(tmp_path):
    wds = pytest.importorskip("webdataset")
    shard = tmp_path / "shard-000000.tar"
    with wds.TarWriter(str(shard)) as sink:
        for i in range(8):
            buffer = io.BytesIO()
            torch.save(torch.full((2, 3), float(i)), buffer)
            sink.write(
                {
                    "__key__": f"s{i:03d}",
                    "pth": buffer.getvalue(),
                    "json": json.dumps({"ids": list(range(i % 3 + 1)), "label": i % 2}),
                }
            )
    dataset = (
        wds.WebDataset(str(shard), shardshuffle=False)
        .decode()
        .to_tuple("pth", "json")
        .map(lambda s: {"x": s[0], **s[1]})
    )
    collate = MMCollate(fields={"ids": Pad()})
    batches = list(DataLoader(dataset, batch_size=4, collate_fn=collate))
    assert len(batches) == 2
    assert batches[0]["x"][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert batches[0]["ids_lengths"].tolist() == [1, 2, 3, 1] and batches[0]["label"].tolist() == [0, 1, 0, 1]
    assert_one_buffer(batches[0])
