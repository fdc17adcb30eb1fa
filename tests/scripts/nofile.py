"""Collate a 120-leaf dataset in 2 workers under a low open-file limit; print the outcome.

Usage: python nofile.py {default,mm} LIMIT
"""

import resource
import sys

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import pincollate


class ManyLeaves(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {f"f{j}": torch.full((4,), float(i)) for j in range(120)}


def main() -> None:
    method, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    collate = default_collate if method == "default" else pincollate.mm_collate
    loader = DataLoader(ManyLeaves(), batch_size=8, num_workers=2, collate_fn=collate, timeout=60)
    try:
        total = sum(float(batch["f0"].sum()) for batch in loader)
    except Exception as error:  # the outcome is what this script reports
        print(f"FAILED {type(error).__name__}: " + " | ".join(str(error).splitlines()[-3:])[:400])
        return
    print(f"OK {total}")


if __name__ == "__main__":
    main()
