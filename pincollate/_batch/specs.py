"""The container specs of a Layout, and how the user's containers are rebuilt.

Each spec builds its output from its children's: mappings keep the samples' mapping
type, sequences come back as lists (tuples too, as in ``default_collate``),
namedtuples and dataclasses keep their class.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from .._types.build import make_mapping, make_sequence, new_dataclass
from .._types.kinds import registered
from .layout import PartSpec, Spec, TensorSpec
from .views import Views

__all__ = [
    "DataclassSpec",
    "JaggedSpec",
    "ListSpec",
    "MappingSpec",
    "NamedTupleSpec",
    "RegisteredSpec",
    "SequenceSpec",
    "jagged",
]


class ListSpec(Spec):
    """A Python list of children: per-sample values that do not stack."""

    __slots__ = ("children",)
    _fields = ("children",)

    def __init__(self, children: Sequence[Spec]):
        self.children: tuple[Spec, ...] = tuple(children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def build(self, views: Views) -> Any:
        return [child.build(views) for child in self.children]


class MappingSpec(Spec):
    """A mapping of ``keys`` to children, of type ``cls`` (``None`` for ``dict``).

    A :class:`PartSpec` child puts its part's extras right after its key.
    """

    __slots__ = ("_fast", "children", "cls", "keys")
    _fields = ("cls", "keys", "children")

    def __init__(self, cls: type | None, keys: Sequence[Hashable], children: Sequence[Spec]):
        self.cls: type | None = cls
        self.keys: tuple[Hashable, ...] = tuple(keys)
        self.children: tuple[Spec, ...] = tuple(children)
        self._fast = _fast_pairs(self.keys, self.children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def pairs(self, views: Views) -> dict[Hashable, Any]:
        fast = self._fast
        if fast is not None:
            tensor_keys, ids, others, ordered = fast
            try:
                # The plain tensors a Views made at once, by one C-level pass; the rest built.
                out: dict[Hashable, Any] = dict(zip(tensor_keys, map(views.made.__getitem__, ids), strict=True))
            except KeyError:  # not made at once: pinned memory, or a mapping within a part
                pass
            else:
                for key, child in others:
                    out[key] = child.build(views)
                return out if ordered else {key: out[key] for key in self.keys}
        out = {}
        for key, child in zip(self.keys, self.children, strict=True):
            if type(child) is PartSpec:
                part = views.parts[child.index]
                out[key] = part.node.build(views)
                for name, extra in part.extras:
                    out[name] = extra.build(views)
            else:
                out[key] = child.build(views)
        return out

    def build(self, views: Views) -> Any:
        return make_mapping(self.cls, self.pairs(views))


def _fast_pairs(
    keys: tuple[Hashable, ...], children: tuple[Spec, ...]
) -> tuple[tuple[Hashable, ...], tuple[int, ...], tuple[tuple[Hashable, Spec], ...], bool] | None:
    """How :meth:`MappingSpec.pairs` builds at once: its plain tensors' keys and spec ids, the other
    children, and whether the tensors' keys come first; ``None`` with a part among the children
    (its extras go right after its key) or fewer than four plain tensors (nothing to gain).
    """
    if any(type(child) is PartSpec for child in children):
        return None
    plain = [type(child) is TensorSpec and child.wrap is None and child._numpy is not None for child in children]
    if sum(plain) < 4:
        return None
    tensors = [(key, id(child)) for key, child, is_plain in zip(keys, children, plain, strict=True) if is_plain]
    others = tuple((key, child) for key, child, is_plain in zip(keys, children, plain, strict=True) if not is_plain)
    ordered = all(plain[: len(tensors)])
    return tuple(key for key, _ in tensors), tuple(ident for _, ident in tensors), others, ordered


class SequenceSpec(Spec):
    """A transposed sequence: a list (``cls`` ``None``) or the samples' sequence type."""

    __slots__ = ("children", "cls")
    _fields = ("cls", "children")

    def __init__(self, cls: type | None, children: Sequence[Spec]):
        self.cls: type | None = cls
        self.children: tuple[Spec, ...] = tuple(children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def build(self, views: Views) -> Any:
        return make_sequence(self.cls, [child.build(views) for child in self.children])


class NamedTupleSpec(Spec):
    """A namedtuple of type ``cls``, one child per field."""

    __slots__ = ("children", "cls")
    _fields = ("cls", "children")

    def __init__(self, cls: type, children: Sequence[Spec]):
        self.cls: type = cls
        self.children: tuple[Spec, ...] = tuple(children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def build(self, views: Views) -> Any:
        return self.cls(*(child.build(views) for child in self.children))


class RegisteredSpec(Spec):
    """An instance of a class registered with :func:`~pincollate.register_container`.

    Built as its registration's ``unflatten(keys, children)``, looked up when built, so a
    layout made in one process builds in another that registered the class too.
    """

    __slots__ = ("children", "cls", "keys")
    _fields = ("cls", "keys", "children")

    def __init__(self, cls: type, keys: Sequence[Hashable], children: Sequence[Spec]):
        self.cls: type = cls
        self.keys: tuple[Hashable, ...] = tuple(keys)
        self.children: tuple[Spec, ...] = tuple(children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def build(self, views: Views) -> Any:
        return registered(self.cls).build(list(self.keys), [child.build(views) for child in self.children])


class DataclassSpec(Spec):
    """A dataclass of type ``cls``, one child per field in ``names``."""

    __slots__ = ("children", "cls", "names")
    _fields = ("cls", "names", "children")

    def __init__(self, cls: type, names: Sequence[str], children: Sequence[Spec]):
        self.cls: type = cls
        self.names: tuple[str, ...] = tuple(names)
        self.children: tuple[Spec, ...] = tuple(children)

    def children_specs(self) -> tuple[Spec, ...]:
        return self.children

    def build(self, views: Views) -> Any:
        return new_dataclass(
            self.cls, {name: child.build(views) for name, child in zip(self.names, self.children, strict=True)}
        )


class JaggedSpec(Spec):
    """A ``torch.nested`` jagged tensor over two tensors of the buffer: values and offsets.

    ``min_seqlen`` and ``max_seqlen`` are known when the batch is planned; the nested
    tensor carries them, so attention kernels need not read the offsets back from the
    device (a host synchronisation per batch).
    """

    __slots__ = ("max_seqlen", "min_seqlen", "offsets", "values")
    _fields = ("values", "offsets", "min_seqlen", "max_seqlen")

    def __init__(
        self, values: TensorSpec, offsets: TensorSpec, min_seqlen: int | None = None, max_seqlen: int | None = None
    ):
        self.values: TensorSpec = values
        self.offsets: TensorSpec = offsets
        self.min_seqlen: int | None = min_seqlen
        self.max_seqlen: int | None = max_seqlen

    def children_specs(self) -> tuple[Spec, ...]:
        return (self.values, self.offsets)

    def build(self, views: Views) -> Any:
        return jagged(self.values.build(views), self.offsets.build(views), self.min_seqlen, self.max_seqlen)


def jagged(values: torch.Tensor, offsets: torch.Tensor, min_seqlen: int | None, max_seqlen: int | None) -> torch.Tensor:
    """``torch.nested.nested_tensor_from_jagged`` with the sequence lengths it may cache."""
    _quiet_fx_notice()
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min_seqlen, max_seqlen=max_seqlen)


class _FxNotice(logging.Filter):
    """Drops torch's note to its own tracing code, logged the first time a nested tensor is made.

    The note ("is_fx_tracing will return true for both ...") asks torch-internal
    callers to pick another function; nothing in it is for a user of ``Jagged()``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("is_fx_tracing will return true")


@functools.cache
def _quiet_fx_notice() -> None:
    logging.getLogger("torch.fx._symbolic_trace").addFilter(_FxNotice())
