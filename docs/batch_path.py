"""Draws docs/batch-path.png: the path of one batch from the Dataset to the GPU.

Run from the repository root: ``.venv/bin/python docs/batch_path.py``.
"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

STAGES = [
    ("Dataset", "samples: dicts of\nimages, ids, audio,\nlabels, strings"),
    ("DataLoader worker", "mm_collate plans the\nstructure once, copies\neach sample into\none ring slot"),
    ("ring slot", "shared memory,\nrecycled: mapped once\nby the main process"),
    ("main process", "the batch: a dict whose\ntensors are all views\nof the slot (a lease)"),
    ("pinned buffer", "one page-locked copy\n(DataLoader pin thread\nor Prefetcher)"),
    ("GPU", "one DMA on a side\nstream, views rebuilt\nfrom the layout"),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(13, 3.2))
    ax.set_xlim(0, len(STAGES) * 2.2)
    ax.set_ylim(0, 3.2)
    ax.axis("off")
    colours = ["#e8eef7", "#dbe9d8", "#fdf0d5", "#e8eef7", "#f6dfe0", "#e6e0f3"]
    for i, ((title, text), colour) in enumerate(zip(STAGES, colours, strict=True)):
        x = 0.15 + i * 2.2
        ax.add_patch(FancyBboxPatch((x, 0.35), 1.8, 2.3, boxstyle="round,pad=0.05", fc=colour, ec="#555555"))
        ax.text(x + 0.9, 2.35, title, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + 0.9, 1.3, text, ha="center", va="center", fontsize=8.5)
        if i:
            ax.add_patch(
                FancyArrowPatch((x - 0.4, 1.5), (x - 0.02, 1.5), arrowstyle="-|>", mutation_scale=14, color="#333333")
            )
    ax.text(
        len(STAGES) * 1.1,
        0.08,
        "one buffer per batch all the way: one slot, one pinned copy, one DMA; the layout (structure, dtypes, shapes, offsets) travels beside it",
        ha="center",
        fontsize=8.5,
        style="italic",
    )
    fig.tight_layout()
    fig.savefig(pathlib.Path(__file__).with_name("batch-path.png"), dpi=110)


if __name__ == "__main__":
    main()
