"""Distributed training with pincollate: run with ``torchrun --nproc_per_node 2 examples/ddp_train.py``.

Each rank reads its shard through a ``DistributedSampler``, collates in DataLoader
workers with ``mm_collate`` (one shared-memory buffer per batch) and moves batches
with a ``Prefetcher`` to its own device (one copy per batch on a side stream with
CUDA; a passthrough on CPU). The backend is nccl on GPUs and gloo on CPU.

``--out DIR`` writes each rank's seen sample ids and losses as JSON, which the
test suite uses to check that ranks saw disjoint samples and the model trained.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import pincollate


class Blobs(Dataset):
    """Two-class images: the class is the sign of the mean brightness offset."""

    def __init__(self, n: int = 256):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        label = i % 2
        image = (torch.rand(3, 16, 16, generator=g) * 128 + 64 * label).to(torch.uint8)
        return {"image": image, "label": label, "id": i}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda") if cuda else torch.device("cpu")
    torch.manual_seed(0)

    dataset = Blobs()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=pincollate.mm_collate,
        pin_memory=cuda,
    )
    batches = pincollate.Prefetcher(loader, device=device, transform=pincollate.Normalize([0.5] * 3, [0.25] * 3))

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    seen: list[int] = []
    losses: list[float] = []
    for epoch in range(args.epochs):
        batches.set_epoch(epoch)
        for batch in batches:
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"].to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if epoch == 0:
                seen.extend(batch["id"].tolist())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps({"seen": seen, "losses": losses, "world": world}))
    print(f"rank {rank}/{world}: {len(seen)} samples in epoch 0, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
