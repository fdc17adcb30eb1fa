"""The benchmark's methods per scenario: the collates users write or pick, beside ours."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, default_collate

from .._collate.collate import MMCollate
from .._memory.arena import accelerator_can_pin
from .._plan.packing import Concat
from .._plan.policies import AsList, Pad

__all__ = [
    "Collate",
    "Images",
    "TimmStylePrefetcher",
    "audio_by_hand",
    "detection_by_hand",
    "hf_padding_collator",
    "methods",
    "padding_bytes",
    "per_leaf_pinned_stack",
    "ragged_by_hand",
    "ragged_hf",
    "tensordict_consolidate",
    "tokens_by_hand",
    "tokens_hf",
    "vlm_by_hand",
    "vlm_hf",
]

Collate = Callable[[list[Any]], Any]


def per_leaf_pinned_stack(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each field stacked into its own fresh tensor, pinned where possible (the vLLM change)."""
    pin = accelerator_can_pin()
    out: dict[str, Any] = {}
    for key, first in samples[0].items():
        values = [s[key] for s in samples]
        if isinstance(first, torch.Tensor):
            target = torch.empty((len(values), *first.shape), dtype=first.dtype, pin_memory=pin)
            out[key] = torch.stack(values, out=target)
        elif isinstance(first, (int, float)):
            out[key] = torch.tensor(values, dtype=torch.float64 if isinstance(first, float) else None)
        else:
            out[key] = values
    return out


def tensordict_consolidate(samples: list[dict[str, Any]]) -> Any:
    """``default_collate`` then ``TensorDict(...).consolidate()``: one storage, two copies."""
    from tensordict import TensorDict

    batch = default_collate(samples)
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return TensorDict(tensors, batch_size=[len(samples)]).consolidate()


def vlm_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ids = [s["input_ids"] for s in samples]
    lengths = torch.tensor([len(t) for t in ids])
    patches = [p for s in samples for p in s["pixel_values"]]
    rows = torch.tensor([0] + [sum(p.shape[0] for p in s["pixel_values"]) for s in samples]).cumsum(0).to(torch.int32)
    return {
        "input_ids": pad_sequence(ids, batch_first=True),
        "attention_mask": torch.arange(int(lengths.max()))[None, :] < lengths[:, None],
        "pixel_values": torch.cat(patches),
        "pixel_values_offsets": rows,
    }


def audio_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    waves = [s["audio"].transpose(0, 1) for s in samples]
    return {
        "audio": pad_sequence(waves, batch_first=True).transpose(1, 2),
        "audio_lengths": torch.tensor([w.shape[0] for w in waves]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


def ragged_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [s["tokens"] for s in samples]
    return {
        "tokens": pad_sequence(tokens, batch_first=True),
        "tokens_lengths": torch.tensor([len(t) for t in tokens]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


@functools.cache
def hf_padding_collator() -> Any:
    """Hugging Face's ``DataCollatorWithPadding``, over a word-level tokenizer built offline.

    What users of ``transformers`` pick for token ids; padding needs only the tokenizer's
    pad token, so a two-word vocabulary does. ``None`` without ``transformers``.
    """
    try:
        from tokenizers import Tokenizer, models
        from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast
    except ImportError:
        return None
    words = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")  # type: ignore[no-untyped-call]
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")


def ragged_hf(samples: list[dict[str, Any]]) -> Any:
    """``DataCollatorWithPadding``: ids padded, an int64 attention mask, ``label`` as ``labels``."""
    return hf_padding_collator()([{"input_ids": s["tokens"], "label": s["label"]} for s in samples])


def vlm_hf(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``DataCollatorWithPadding`` for the text, the image items concatenated by hand."""
    out = dict(hf_padding_collator()([{"input_ids": s["input_ids"]} for s in samples]))
    patches = [p for s in samples for p in s["pixel_values"]]
    rows = torch.tensor([0] + [sum(p.shape[0] for p in s["pixel_values"]) for s in samples]).cumsum(0).to(torch.int32)
    out["pixel_values"] = torch.cat(patches)
    out["pixel_values_offsets"] = rows
    return out


def tokens_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ids = [torch.tensor(s["input_ids"]) for s in samples]
    lengths = torch.tensor([len(s["input_ids"]) for s in samples])
    return {
        "input_ids": pad_sequence(ids, batch_first=True),
        "attention_mask": torch.arange(int(lengths.max()))[None, :] < lengths[:, None],
        "labels": torch.tensor([s["label"] for s in samples]),
    }


def tokens_hf(samples: list[dict[str, Any]]) -> Any:
    """``DataCollatorWithPadding`` on what it was made for: token ids as Python lists."""
    return hf_padding_collator()(samples)


def detection_by_hand(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "image": torch.stack([s["image"] for s in samples]),
        "boxes": [s["boxes"] for s in samples],
        "labels": [s["labels"] for s in samples],
    }


def methods(scenario: str) -> dict[str, Collate | None]:
    """The methods compared in a scenario; the first is the baseline."""
    if scenario == "nested":
        return {"default_collate": default_collate, "mm_collate": MMCollate()}
    if scenario in ("manyleaf", "video"):
        table: dict[str, Collate | None] = {
            "default_collate": default_collate,
            "per-leaf pinned stack": per_leaf_pinned_stack,
            "tensordict": tensordict_consolidate if _has_tensordict() else None,
            # Every worker batch in a fresh shared buffer: what the workers' ring saves.
            "mm_collate, no ring": MMCollate(worker_slots=0),
            "mm_collate": MMCollate(),
        }
        return table
    ours = {
        "vlm": MMCollate(
            fields={
                "input_ids": Pad(mask_key="attention_mask", lengths_key=None),
                "pixel_values": Concat(counts_key=None, item_offsets_key=None),
            }
        ),
        "audio": MMCollate(fields={"audio": Pad(dims=[-1], mask_key=None)}),
        # Boxes and labels per image, listed as the hand-written collate lists them.
        "detection": MMCollate(fields={"boxes": AsList(), "labels": AsList()}),
        # The same outputs as the hand-written collate: padded tokens, their lengths, labels.
        "ragged": MMCollate(fields={"tokens": Pad(mask_key=None)}),
        # What DataCollatorWithPadding gives: padded ids, their mask, "labels".
        "tokens": MMCollate(
            fields={"input_ids": Pad(mask_key="attention_mask", lengths_key=None)}, rename={"label": "labels"}
        ),
    }[scenario]
    by_hand = {
        "vlm": vlm_by_hand,
        "audio": audio_by_hand,
        "detection": detection_by_hand,
        "ragged": ragged_by_hand,
        "tokens": tokens_by_hand,
    }[scenario]
    table = {"pad/cat by hand": by_hand}
    hf = {"ragged": ragged_hf, "vlm": vlm_hf, "tokens": tokens_hf}.get(scenario)
    if hf is not None and hf_padding_collator() is not None:
        table["HF DataCollatorWithPadding"] = hf
    table["mm_collate"] = ours
    return table


def _has_tensordict() -> bool:
    try:
        import tensordict  # noqa: F401
    except ImportError:
        return False
    return True


def padding_bytes(scenario: str, collate: Collate, batches: list[list[Any]]) -> float | None:
    if scenario not in ("vlm", "audio"):
        return None
    key = "input_ids" if scenario == "vlm" else "audio"
    total = 0
    for batch in batches:
        out = collate(batch)
        padded = out[key]
        real = sum(s[key].numel() for s in batch)
        total += (padded.numel() - real) * padded.element_size()
    return total / len(batches)


class TimmStylePrefetcher:
    """timm's ``PrefetchLoader`` pattern, from its published behaviour.

    Per-leaf ``non_blocking`` copies of ``(input, target)`` and the normalisation on a
    side stream made per epoch; the consumer's stream waits on the whole side stream.
    """

    def __init__(self, loader: Any, mean: list[float], std: list[float], device: torch.device):
        self.loader = loader
        self.device = device
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255

    def __iter__(self) -> Any:
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        first = True
        current: Any = None
        for images, targets in self.loader:
            with torch.cuda.stream(stream):
                images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
                targets = targets.to(self.device, non_blocking=True)
            if not first:
                yield current
            first = False
            torch.cuda.current_stream().wait_stream(stream)
            current = (images, targets)
        if current is not None:
            yield current


class Images(Dataset[Any]):
    def __init__(self, n: int):
        self.images = [torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], i % 1000
