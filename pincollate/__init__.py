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

# Registrations: the built-in leaf types; how batches cross processes; PIL and torchvision on first sight.
from . import _builtin_leaves, _crossing, _vision  # noqa: F401
from ._arena import pinned_footprint
from ._batch import Batch, BatchList
from ._collate import MMCollate, mm_collate
from ._columns import ColumnCollate
from ._errors import CollateError
from ._kinds import register_container
from ._layout import Layout
from ._leaves import LeafHandler, register_leaf
from ._packing import Concat, Jagged
from ._policies import AsList, Pad, PerSample, Policy, Stack
from ._prefetch import Prefetcher
from ._shm import SharedMemoryWarning
from ._transfer import to_device
from ._transforms import Normalize

__all__ = [
    "AsList",
    "Batch",
    "BatchList",
    "CollateError",
    "ColumnCollate",
    "Concat",
    "Jagged",
    "Layout",
    "LeafHandler",
    "MMCollate",
    "Normalize",
    "Pad",
    "PerSample",
    "Policy",
    "Prefetcher",
    "SharedMemoryWarning",
    "Stack",
    "mm_collate",
    "pinned_footprint",
    "register_container",
    "register_leaf",
    "to_device",
]

__version__ = "0.1.0"

# Tracebacks name the public home of the one exception type.
CollateError.__module__ = __name__
