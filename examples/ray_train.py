"""Ray Train with pincollate: a multimodal dataset with a ragged field, 2 workers on a local cluster.

Ray Data holds the samples (an image, token ids of different lengths, a label); each Ray Train
worker reads its shard with ``collate.iter_torch_batches`` (Ray's iterator, the batch kept whole),
and ``ColumnCollate`` turns each batch of columns into one buffer: the images, the padded ids,
their mask and the labels, every tensor a view of it, as a ``pincollate.Batch``. On a GPU,
``Prefetcher`` moves each batch in one copy; here (CPU) it hands them over.

Run it with the repository's environment::

    .venv/bin/python examples/ray_train.py            # 2 CPU workers on a local Ray cluster

``--pack`` collates on the data side instead (``map_batches``): each batch crosses Ray's object
store as one buffer and the trainer unpacks it with one copy.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np
import ray
import torch
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

import pincollate

VOCAB = 64


def samples(count: int) -> list[dict[str, Any]]:
    """Images whose class is their brightness band, and token ids that spell the class, of varying length."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        label = i % 4
        image = (rng.random((1, 8, 8)) * 0.2 + 0.25 * label).astype(np.float32)
        ids = rng.integers(16 * label, 16 * label + 16, size=int(rng.integers(3, 12)))
        out.append({"image": image, "ids": ids, "label": label})
    return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(64, 16)
        self.ids = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(32, 4)

    def forward(self, image: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).float()
        pooled = (self.ids(ids) * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(torch.cat([self.image(image.flatten(1)), pooled], dim=1))


def train_loop(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = train.torch.prepare_model(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad(mask_key="mask", lengths_key=None)})
    shard = train.get_dataset_shard("train")
    device = train.torch.get_device()
    for epoch in range(config["epochs"]):
        losses = []
        kinds = set()
        if config["pack"]:  # collated on the data side: one packed row per batch
            batches = collate.iter_torch_batches(shard, batch_size=1, unpack=True)
        else:
            batches = collate.iter_torch_batches(shard, batch_size=16)
        for batch in pincollate.Prefetcher(batches, device=device):
            kinds.add(type(batch).__name__)
            loss = nn.functional.cross_entropy(model(batch["image"], batch["ids"], batch["mask"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        metrics = {"epoch": epoch, "loss": sum(losses) / len(losses), "batches": len(losses)}
        train.report(metrics)
        rank = train.get_context().get_world_rank()
        with open(pathlib.Path(config["log"]) / f"rank{rank}.jsonl", "a") as log:
            # What reached the loop: a pincollate.Batch, not the plain dict Ray's own finalize step makes.
            log.write(json.dumps({"rank": rank, **metrics, "kinds": sorted(kinds)}) + "\n")


def fit(epochs: int = 4, pack: bool = False, workers: int = 2, count: int = 256) -> list[dict[str, Any]]:
    """Train on the running Ray cluster; returns each rank's metrics per epoch."""
    dataset = ray.data.from_items(samples(count))
    if pack:
        collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad(mask_key="mask", lengths_key=None)})
        dataset = dataset.map_batches(collate.pack, batch_size=16)
    log = tempfile.mkdtemp(prefix="pincollate-ray-")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"epochs": epochs, "pack": pack, "log": log},
        # Half a CPU per training worker leaves room on a small cluster for Ray Data's own
        # tasks (map_batches), which would otherwise wait for a CPU the workers hold.
        scaling_config=ScalingConfig(
            num_workers=workers, use_gpu=torch.cuda.is_available(), resources_per_worker={"CPU": 0.5}
        ),
        datasets={"train": dataset},
        run_config=RunConfig(storage_path=log),
    )
    try:
        trainer.fit()
        logs = sorted(pathlib.Path(log).glob("rank*.jsonl"))
        rows = [json.loads(line) for path in logs for line in path.read_text().splitlines()]
    finally:
        shutil.rmtree(log, ignore_errors=True)
    return sorted(rows, key=lambda row: (row["epoch"], row["rank"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--pack", action="store_true", help="collate on the data side (map_batches)")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        for row in fit(args.epochs, args.pack):
            print(f"epoch {row['epoch']} rank {row['rank']}: {row['batches']} batches, loss {row['loss']:.3f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
