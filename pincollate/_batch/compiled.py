"""A layout's build compiled: one generated function that makes the output tree of a layout without parts.

A cached plan's layout is shared by every batch of its structure and rebuilt for each of
them (collated, unpickled, moved). Walking its spec tree costs a Python call per node;
the generated function builds the same tree as one expression over the tensors a
:class:`~pincollate._batch.views.Views` made at once (dict and list displays for plain
mappings and lists). Where the tensors were not made at once (pinned memory, an
accelerator) it builds by walking the specs, as any layout does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .._generate import Writer, text
from .._types.build import make_mapping, make_sequence, new_dataclass
from .layout import PartSpec, Spec, TensorSpec, ValueSpec
from .specs import DataclassSpec, MappingSpec, NamedTupleSpec, SequenceSpec
from .views import Views

__all__ = ["compile_build", "expression", "inlines_parts"]

#: Deeper than this, a node is built by its spec: a generated expression stays well within
#: the parser's nesting limit.
_MOST_DEPTH = 32

#: The expressions of a layout's parts, by index: the node's, and each extra output's name and expression.
Parts = dict[int, tuple[str, tuple[tuple[str, str], ...]]]


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
    w.line(1, f"return {expression(w, root, bulk)}")
    names = {"make_mapping": make_mapping, "make_sequence": make_sequence, "new_dataclass": new_dataclass}
    run, _, _ = w.compile("views", "build", text(type(root).__name__), names)
    return run


def inlines_parts(spec: Spec, depth: int = 0) -> bool:
    """Whether :func:`expression` builds every part placeholder under ``spec`` from its ``parts`` (inline).

    Mappings, sequences, namedtuples and dataclasses are expressions of their children; any
    other node (a registered class, a subtree too deep for one expression) builds itself from
    its views, where a part needs the layout's parts.
    """
    kind = type(spec)
    if kind is PartSpec:
        return True
    if depth < _MOST_DEPTH and kind in (MappingSpec, SequenceSpec, NamedTupleSpec, DataclassSpec):
        return all(inlines_parts(child, depth + 1) for child in spec.children)  # type: ignore[attr-defined]
    return not any(type(found) is PartSpec for found in _walk(spec))


def _walk(spec: Spec) -> Iterator[Spec]:
    yield spec
    for child in spec.children_specs():
        yield from _walk(child)


def expression(
    w: Writer, spec: Spec, bulk: frozenset[int], parts: Parts | None = None, depth: int = 0, cls: type | None = None
) -> str:
    """The expression that builds ``spec`` from ``made`` (the tensors made at once) and ``values``.

    ``parts``: the expressions of the layout's parts (by index: the node's, then each extra
    output's name and expression), where the code that runs it has them as locals. ``cls``:
    the class a namedtuple or dataclass ``spec`` is built as, in place of its own (its
    carrier subclass, at a batch's top).
    """
    kind = type(spec)
    if kind is TensorSpec and id(spec) in bulk:
        tensor = f"made[{w.const(id(spec))}]"
        wrap = spec.wrap  # type: ignore[attr-defined]
        return tensor if wrap is None else f"{w.const(wrap)}({tensor})"
    if kind is ValueSpec:
        return f"values[{spec.index}]"  # type: ignore[attr-defined]
    if kind is PartSpec and parts is not None:
        return parts[spec.index][0]  # type: ignore[attr-defined]
    if depth < _MOST_DEPTH and kind is MappingSpec:
        pairs = []
        for key, child in zip(spec.keys, spec.children, strict=True):  # type: ignore[attr-defined]
            pairs.append(f"{w.const(key)}: {expression(w, child, bulk, parts, depth + 1)}")
            if type(child) is PartSpec and parts is not None:  # its extras right after its key
                pairs.extend(f"{w.const(name)}: {extra}" for name, extra in parts[child.index][1])
        cls = spec.cls  # type: ignore[attr-defined]
        return f"{{{', '.join(pairs)}}}" if cls is None else f"make_mapping({w.const(cls)}, {{{', '.join(pairs)}}})"
    if depth < _MOST_DEPTH and kind is SequenceSpec:
        items = ", ".join(expression(w, child, bulk, parts, depth + 1) for child in spec.children)  # type: ignore[attr-defined]
        cls = spec.cls  # type: ignore[attr-defined]
        return f"[{items}]" if cls is None else f"make_sequence({w.const(cls)}, [{items}])"
    if depth < _MOST_DEPTH and kind is NamedTupleSpec:
        items = ", ".join(expression(w, child, bulk, parts, depth + 1) for child in spec.children)  # type: ignore[attr-defined]
        return f"{w.const(cls or spec.cls)}({items})"  # type: ignore[attr-defined]
    if depth < _MOST_DEPTH and kind is DataclassSpec:
        fields = ", ".join(
            f"{w.const(name)}: {expression(w, child, bulk, parts, depth + 1)}"
            for name, child in zip(spec.names, spec.children, strict=True)  # type: ignore[attr-defined]
        )
        return f"new_dataclass({w.const(cls or spec.cls)}, {{{fields}}})"  # type: ignore[attr-defined]
    # Every other node (a tensor made on its own, a registered class, lists of
    # per-sample values, a subtree too deep for one expression) builds itself.
    return f"{w.const(spec)}.build(views)"
