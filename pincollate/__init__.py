"""pincollate: multimodal batches in one buffer, from Dataset to accelerator.

Examples:
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

from typing import TYPE_CHECKING, Any

# Registrations: the built-in leaf types; how batches cross processes; PIL and torchvision on first sight.
from ._batch import crossing as _crossing  # noqa: F401
from ._batch.batch import Batch, BatchList
from ._batch.layout import Layout
from ._collate.collate import MMCollate, mm_collate
from ._errors import CollateError
from ._integrations import vision as _vision  # noqa: F401
from ._integrations.columns import ColumnCollate
from ._memory.arena import pinned_footprint
from ._memory.shm import SharedMemoryWarning
from ._plan.fallback import RaggedFieldWarning
from ._plan.packing import Concat, Jagged
from ._plan.policies import AsList, Pad, PerSample, Policy, Stack
from ._transfer.meter import InputMeter, InputStats
from ._transfer.prefetch import Prefetcher
from ._transfer.transfer import to_device
from ._transfer.transforms import Normalize
from ._types import builtin as _builtin_leaves  # noqa: F401
from ._types.kinds import register_container
from ._types.leaves import LeafHandler, register_leaf
from ._types.wrap import Wrap

__all__ = [
    "AsList",
    "Batch",
    "BatchList",
    "CollateError",
    "ColumnCollate",
    "Concat",
    "InputMeter",
    "InputStats",
    "Jagged",
    "Layout",
    "LeafHandler",
    "MMCollate",
    "Normalize",
    "Pad",
    "PerSample",
    "Policy",
    "Prefetcher",
    "RaggedFieldWarning",
    "SharedMemoryWarning",
    "Stack",
    "Wrap",
    "mm_collate",
    "pinned_footprint",
    "register_container",
    "register_leaf",
    "to_device",
]

__version__ = "0.1.0"

# Tracebacks name the public home of the one exception type.
CollateError.__module__ = __name__

if TYPE_CHECKING:
    from ._integrations.lightning_monitor import LightningInputMonitor as LightningInputMonitor
    from ._integrations.transformers_monitor import TransformersInputMonitor as TransformersInputMonitor

#: The framework callbacks, each loaded with its framework on first use, so `import pincollate` loads neither.
_LAZY = {
    "LightningInputMonitor": "._integrations.lightning_monitor",
    "TransformersInputMonitor": "._integrations.transformers_monitor",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
