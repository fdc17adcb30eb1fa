"""pincollate: multimodal batches in one buffer, from Dataset to accelerator.

Example:
    >>> import torch
    >>> import pincollate
    >>> loader = torch.utils.data.DataLoader(
    ...     [{"image": torch.zeros(3, 8, 8), "label": i} for i in range(4)],
    ...     batch_size=2,
    ...     collate_fn=pincollate.mm_collate,
    ... )
    >>> next(iter(loader))["image"].shape
    torch.Size([2, 3, 8, 8])
"""

from .arena import pinned_footprint
from .batch import Batch, BatchList
from .collate import MMCollate, mm_collate
from .errors import CollateError
from .packing import Concat, Jagged
from .policies import AsList, Pad, Policy, Stack
from .prefetch import Prefetcher
from .transfer import to_device
from .transforms import Normalize

__all__ = [
    "AsList",
    "Batch",
    "BatchList",
    "CollateError",
    "Concat",
    "Jagged",
    "MMCollate",
    "Normalize",
    "Pad",
    "Policy",
    "Prefetcher",
    "Stack",
    "mm_collate",
    "pinned_footprint",
    "to_device",
]

__version__ = "0.1.0"
