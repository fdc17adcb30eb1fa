"""Leave a Prefetcher's iterator unfinished while its staging thread is inside torch, and exit.

``python exit_unfinished.py stats|nostats held|break``.

Run by tests/test_prefetch.py: the process must exit 0 with nothing on stderr. Pinning is
stood in for (no accelerator here), so the staging thread runs as it does on CUDA.
"""

import sys

import torch

from pincollate import Prefetcher
from pincollate._memory import arena

#: The unfinished iterator, kept until the interpreter exits ("held").
kept = []


class Busy:
    """Batches that each take a while of torch's own (GIL-free) work to make."""

    def __iter__(self):
        while True:
            x = torch.ones(600, 600)
            for _ in range(20):
                x = x @ x / 600
            yield {"x": x}


def main(stats: str, how: str) -> None:
    arena.set_pinned_allocator(lambda nbytes: torch.empty(nbytes, dtype=torch.uint8), lambda tensor: False)
    prefetcher = Prefetcher(Busy(), device="cpu", pin_memory=True, stats=stats == "stats")
    if how == "held":
        kept.append(iter(prefetcher))
        next(kept[0])
    else:
        for _ in prefetcher:
            break  # the iterator is dropped; its thread is still inside the loader
    print("exiting with the staging thread inside torch")


if __name__ == "__main__":
    main(*sys.argv[1:])
