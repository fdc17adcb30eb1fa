"""One loader case for a small /dev/shm; prints one JSON line with the outcome.

Run inside a private mount namespace whose /dev/shm is a small tmpfs (see
tests/test_shm.py). Every batch is compared with what the same collate gives in
the main process, which needs no shared memory.

Usage: python small_shm.py CASE [MiB] [WORKERS] [pipe]
  CASE: epoch | persistent | keep | ragged | kill | default
  pipe: as on a system without memfd_create, what does not fit crosses by pipe
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import pincollate
from pincollate import MMCollate, Pad
from pincollate._memory.shm import SharedMemoryWarning, shm_free, shm_total

BATCH = 4
BATCHES = 4


class Big(Dataset):
    """Samples of ``mib / BATCH`` MiB each, their values set by their index."""

    def __init__(self, mib: float, ragged: bool = False):
        self.numel = int(mib * 2**20 / BATCH)
        self.ragged = ragged

    def __len__(self) -> int:
        return BATCH * BATCHES

    def __getitem__(self, i: int) -> dict:
        if self.ragged:
            n = self.numel // 8 - 1000 * (i % 5)
            return {"ids": torch.arange(n, dtype=torch.int64) * (i + 1), "label": i}
        return {"x": (torch.arange(self.numel, dtype=torch.int32) % 251 + i).to(torch.uint8), "label": i}


def expected(dataset: Big, collate, index: int) -> dict:
    return collate([dataset[index * BATCH + j] for j in range(BATCH)])


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    case = sys.argv[1]
    mib = float(sys.argv[2]) if len(sys.argv) > 2 else 24
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    if "pipe" in sys.argv[4:]:
        from pincollate._memory import shm as _shm

        _shm._memfd = lambda nbytes: None  # the workers are forked: they see it too
    out: dict = {"case": case, "mib": mib, "workers": workers, "shm_mib": (shm_total() or 0) >> 20}
    out["transport"] = "pipe" if "pipe" in sys.argv[4:] else "memfd"
    dataset = Big(mib, ragged=case == "ragged")
    if case == "ragged":
        collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
        reference = MMCollate(pin_memory=False, fields={"ids": Pad()})
    elif case == "default":
        collate = reference = default_collate
    else:
        collate = pincollate.mm_collate
        reference = default_collate
    epochs = 3 if case == "persistent" else 1
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=case == "persistent",
        # default_collate sometimes hangs instead of failing there: do not wait long for it.
        timeout=20 if case == "default" else 120,
    )
    start = time.perf_counter()
    good = count = 0
    kept = []
    iterator = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(epochs):
                iterator = iter(loader)
                for index, batch in enumerate(iterator):
                    if case == "kill" and index == 1:
                        # Worker 0 now waits for its one slot, which kept batch 0 holds.
                        time.sleep(0.5)
                        os.kill(iterator._workers[0].pid, signal.SIGKILL)
                    count += 1
                    good += same(batch, expected(dataset, reference, index))
                    if case in ("keep", "kill", "default"):
                        kept.append((index, batch))
                del iterator
            out["ok"] = good == count == BATCHES * epochs
        except Exception as error:  # the outcome is what this script reports
            out["ok"] = False
            out["error"] = f"{type(error).__name__}: " + " | ".join(str(error).splitlines()[-3:])[:300]
        finally:
            iterator = None  # its workers shut down
    out["seconds"] = round(time.perf_counter() - start, 2)
    # What the consumer kept is still its own, after every later batch (and a dead worker).
    out["kept_intact"] = all(same(b, expected(dataset, reference, i)) for i, b in kept)
    out["batches"] = count
    shm_warnings = [str(w.message) for w in caught if issubclass(w.category, SharedMemoryWarning)]
    out["warnings"] = len(shm_warnings)
    out["warning"] = shm_warnings[0] if shm_warnings else None
    del loader, kept, iterator
    batch = None
    gc.collect()
    time.sleep(0.2)
    out["shm_left_mib"] = round(((shm_total() or 0) - (shm_free() or 0)) / 2**20, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
