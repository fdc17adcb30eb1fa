"""A layout's build compiled: one generated function that makes the output tree of a layout without parts.

A cached plan's layout is shared by every batch of its structure and rebuilt for each of
them (collated, unpickled, moved). Walking its spec tree costs a Python call per node;
the generated function builds the same tree as one expression over the tensors a
:class:`~pincollate._batch.views.Views` made at once (dict and list displays for plain
mappings and lists). Where the tensors were not made at once (pinned memory, an
accelerator) it builds by walking the specs, as any layout does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._generate import Writer, text
from .._types.build import make_mapping, make_sequence
from .layout import Spec, TensorSpec, ValueSpec
from .specs import MappingSpec, NamedTupleSpec, SequenceSpec
from .views import Views

__all__ = ["compile_build"]

#: Deeper than this, a node is built by its spec: a generated expression stays well within
#: the parser's nesting limit.
_MOST_DEPTH = 32


def compile_build(root: Spec, bulk_ids: tuple[int, ...]) -> Callable[[Views], Any]:
    """The function ``build(views)`` that returns ``root.build(views)``, generated for ``root``.

    ``bulk_ids`` are the ids of the tensor specs a Views makes at once (the layout's bulk).
    """
    w = Writer()
    bulk = frozenset(bulk_ids)
    w.line(1, "if views.source is None:  # not made at once: pinned memory or an accelerator")
    w.line(2, f"return {w.const(root)}.build(views)")
    w.line(1, "made = views.made")
    w.line(1, "values = views.values")
    w.line(1, f"return {_expression(w, root, bulk, 0)}")
    names = {"make_mapping": make_mapping, "make_sequence": make_sequence}
    run, _, _ = w.compile("views", "build", text(type(root).__name__), names)
    return run


def _expression(w: Writer, spec: Spec, bulk: frozenset[int], depth: int) -> str:
    kind = type(spec)
    if kind is TensorSpec and id(spec) in bulk:
        tensor = f"made[{id(spec)}]"
        wrap = spec.wrap  # type: ignore[attr-defined]
        return tensor if wrap is None else f"{w.const(wrap)}({tensor})"
    if kind is ValueSpec:
        return f"values[{spec.index}]"  # type: ignore[attr-defined]
    if depth < _MOST_DEPTH and kind is MappingSpec:
        pairs = ", ".join(
            f"{w.const(key)}: {_expression(w, child, bulk, depth + 1)}"
            for key, child in zip(spec.keys, spec.children, strict=True)  # type: ignore[attr-defined]
        )
        cls = spec.cls  # type: ignore[attr-defined]
        return f"{{{pairs}}}" if cls is None else f"make_mapping({w.const(cls)}, {{{pairs}}})"
    if depth < _MOST_DEPTH and kind is SequenceSpec:
        items = ", ".join(_expression(w, child, bulk, depth + 1) for child in spec.children)  # type: ignore[attr-defined]
        cls = spec.cls  # type: ignore[attr-defined]
        return f"[{items}]" if cls is None else f"make_sequence({w.const(cls)}, [{items}])"
    if depth < _MOST_DEPTH and kind is NamedTupleSpec:
        items = ", ".join(_expression(w, child, bulk, depth + 1) for child in spec.children)  # type: ignore[attr-defined]
        return f"{w.const(spec.cls)}({items})"  # type: ignore[attr-defined]
    # Every other node (a tensor made on its own, a dataclass, a registered class, lists of
    # per-sample values) builds itself.
    return f"{w.const(spec)}.build(views)"
