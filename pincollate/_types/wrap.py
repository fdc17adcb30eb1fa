"""How a plain view of the buffer becomes a tensor subclass again (``tv_tensors``, a user's own)."""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = ["Wrap", "rewrap"]


def rewrap(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out`` as ``like``'s tensor subclass, with its metadata (a box format, a canvas size).

    torchvision 0.27 and later give each ``tv_tensors`` class a ``wrap(tensor, like=...)``;
    0.26 and earlier only the module's ``tv_tensors.wrap``. Any other subclass is made
    with ``as_subclass``; a plain tensor stays plain.
    """
    cls = type(like)
    if cls is torch.Tensor:
        return out
    wrap = getattr(cls, "wrap", None)
    if wrap is not None:
        try:
            return wrap(out, like=like)  # type: ignore[no-any-return]
        except TypeError:  # a wrap() of another signature (a user's own)
            pass
    tv_tensors = sys.modules.get("torchvision.tv_tensors")  # loaded wherever a tv_tensor exists
    if tv_tensors is not None and isinstance(like, tv_tensors.TVTensor):
        return tv_tensors.wrap(out, like=like)  # type: ignore[no-any-return]
    return out.as_subclass(cls)


class Wrap:
    """How a plain view of the buffer becomes a tensor subclass again: what a leaf handler's ``wrap`` returns.

    A batch's tensors are views of one buffer, so a subclass (torchvision's ``tv_tensors``,
    a user's own) is made again over its view, with the metadata every value of the column
    shares. Where the values' metadata differs, their stack is the class alone, without
    metadata, as ``torch.stack`` gives it; a handler whose ``meta`` returns the metadata
    keeps such values apart, one per sample (as the example's does).

    Args:
        cls: the tensor subclass made.
        meta: keyword metadata as ``(name, value)`` pairs, hashable (a box format and
            canvas size). With metadata, ``cls._wrap(view, **meta)`` builds the output
            (torchvision's classes have it; a class of your own defines it); without,
            ``view.as_subclass(cls)``.

    Examples:
        A waveform class that carries its sample rate, registered with the rate as its
        metadata:

        >>> import torch
        >>> import pincollate
        >>> class Wave(torch.Tensor):
        ...     @classmethod
        ...     def _wrap(cls, view, rate):
        ...         out = view.as_subclass(cls)
        ...         out.rate = rate
        ...         return out
        >>> def wave(values, rate):
        ...     return Wave._wrap(torch.tensor(values), rate)
        >>> def describe(value, sample, path):
        ...     return value.dtype, tuple(value.shape)
        >>> def fill(region, values):
        ...     torch.stack(values, out=region)
        >>> handler = pincollate.LeafHandler(
        ...     "Wave",
        ...     "tensor",
        ...     describe,
        ...     fill,
        ...     wrap=lambda v: pincollate.Wrap(Wave, (("rate", v.rate),)),
        ...     meta=lambda v: v.rate,  # waves of two rates never stack
        ... )
        >>> pincollate.register_leaf(Wave, handler)
        >>> out = pincollate.mm_collate([{"a": wave([1.0, 2.0], 16000)}, {"a": wave([3.0, 4.0], 16000)}])["a"]
        >>> type(out).__name__, out.rate, out.shape
        ('Wave', 16000, torch.Size([2, 2]))
        >>> [w.rate for w in pincollate.mm_collate([{"a": wave([1.0], 16000)}, {"a": wave([2.0], 8000)}])["a"]]
        [16000, 8000]
    """

    __slots__ = ("cls", "meta", "names")

    def __init__(self, cls: type, meta: tuple[tuple[str, Any], ...] = ()):
        self.cls: type = cls
        self.meta: tuple[tuple[str, Any], ...] = meta
        #: The names of its metadata: the attributes a tensor it makes holds.
        self.names: frozenset[str] = frozenset(name for name, _ in meta)

    def __call__(self, view: torch.Tensor) -> torch.Tensor:
        if self.meta:
            return self.cls._wrap(view, **dict(self.meta))  # type: ignore[attr-defined,no-any-return]
        return view.as_subclass(self.cls)

    def fits(self, obj: Any) -> bool:
        """Whether ``obj`` is what this wrap makes: its exact class and the same metadata.

        A tensor re-wrapped over the same bytes with other metadata (a box with another
        canvas size) is not the output this wrap made, and must not be rebuilt as it.
        """
        if type(obj) is not self.cls:
            return False
        for name, value in self.meta:
            found = getattr(obj, name, None)
            if (tuple(found) if isinstance(found, list) else found) != value:
                return False
        return True

    def __eq__(self, other: object) -> bool:
        return type(other) is Wrap and self.cls is other.cls and self.meta == other.meta

    def __hash__(self) -> int:
        return hash((self.cls, self.meta))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Wrap, (self.cls, self.meta))

    def __repr__(self) -> str:
        return f"Wrap({self.cls.__name__}{', ' if self.meta else ''}{', '.join(f'{k}={v!r}' for k, v in self.meta)})"
