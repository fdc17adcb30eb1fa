"""The careful walk's item semantics: per-sample lists of items, and one subtree per sample.

:class:`ItemWalk` is the lowest half of the careful planner's walk (:mod:`pincollate._plan.careful`,
:mod:`pincollate._plan.containers`): a sample's list holds its own items, stacked where they agree
(``[img, img]`` and ``[img]`` become ``[stack of 2, stack of 1]``); ``PerSample()``
plans one subtree per sample; ``AsList``/``Stack``/``Concat``/``Jagged`` on lists of
items. It also holds what every half shares: the key-path types, the depth limit,
the container classes kept, and errors that name their sample and path.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._batch.layout import Spec
from .._batch.specs import DataclassSpec, ListSpec, MappingSpec, NamedTupleSpec, RegisteredSpec, SequenceSpec
from .._errors import ITEMS, Attr, CollateError
from .._types.build import container_cls
from .._types.builtin import TENSOR_SHAPE
from .._types.kinds import (
    DATACLASS,
    LISTS,
    MAPPING,
    NAMEDTUPLE,
    SEQUENCE,
    Registered,
    is_namedtuple,
    is_sequence,
    kind_of,
)
from .._types.leaves import LeafHandler, lookup, type_name
from .._types.wrap import Wrap
from .column import MAX_DEPTH, Column, Unpromoted, promote_all, refused_pair, stack_or_list, stacked_class
from .fallback import Fallbacks, two_shapes
from .fill import Fill, Listed, Node, Segment, TensorNode, Tree, Value
from .listed import ItemsRecipe
from .patterns import Renames
from .policies import AsList, Policy, Stack
from .recipe import plain_tensors
from .rows import Groups, Rows, column_for

if TYPE_CHECKING:
    from .patterns import FieldRules

__all__ = [
    "Extras",
    "ItemWalk",
    "Maker",
    "Origins",
    "Path",
    "container_name",
    "dataclass_of",
    "is_scalar",
    "mapping_of",
    "merge",
    "namedtuple_of",
    "registered_of",
    "sequence_of",
]

Path = tuple[Hashable, ...]
Origins = list[tuple[int, Path]] | None
Extras = dict[str, Node]
#: ``refused(i, first, what, first_what, why)``: the error for sample ``i``'s items (``what``: their class
#: or dtype) that torch does not stack with sample ``first``'s (``None``: with those before them), and why.
Refused = Callable[[int, int | None, str, str, str], CollateError]

#: How a container's output spec is made from its children's specs.
Maker = Callable[[list[Spec]], Spec]


def mapping_of(value: Any, keys: Sequence[Hashable]) -> Maker:
    """The output of mappings like ``value``, with ``keys``: of its class where that rebuilds, else a ``dict``."""
    cls = container_cls(type(value), dict)
    return lambda specs: MappingSpec(cls, keys, specs)


def sequence_of(value: Any) -> Maker:
    """The output of sequences like ``value``, transposed: of its class where that rebuilds, else a ``list``."""
    cls = container_cls(type(value), list)
    return lambda specs: SequenceSpec(cls, specs)


def namedtuple_of(cls: type) -> Maker:
    return lambda specs: NamedTupleSpec(cls, specs)


def dataclass_of(cls: type, names: Sequence[str]) -> Maker:
    return lambda specs: DataclassSpec(cls, names, specs)


def registered_of(cls: type, keys: Sequence[Hashable]) -> Maker:
    return lambda specs: RegisteredSpec(cls, keys, specs)


def container_name(value: Any) -> str:
    """What errors call a container: its kind, or its class where that says more."""
    kind = kind_of(value)
    return kind.name if kind is MAPPING or kind is NAMEDTUPLE or kind is SEQUENCE else type_name(value)


class ItemWalk:
    """Items and per-sample subtrees; the walk supplies ``plan`` and ``_column``."""

    rules: FieldRules | None
    renames: Renames
    missing: bool
    default: Policy | None
    fallbacks: Fallbacks

    def plan(
        self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool, keyed: bool = False
    ) -> tuple[Node, Extras]:
        raise NotImplementedError

    def _column(self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler) -> Column:
        raise NotImplementedError

    # errors ----------------------------------------------------------------------

    @staticmethod
    def _blame(i: int, path: Path, origins: Origins) -> tuple[int, Path]:
        if origins is None:
            return i, path
        sample, base = origins[i]
        return sample, base + path[len(base) :] if len(path) >= len(base) else base

    def _error(self, message: str, i: int | None, path: Path, origins: Origins) -> CollateError:
        if i is None:
            return CollateError(message, path=path)
        sample, where = self._blame(i, path, origins)
        return CollateError(message, sample=sample, path=where)

    def _refused(self, path: Path, origins: Origins) -> Refused:
        """The error for sample ``i``'s items (``what``) that torch refuses to stack with sample ``first``'s (``first_what``)."""

        def error(i: int, first: int | None, what: str, first_what: str, why: str) -> CollateError:
            where = "before them" if first is None else f"in sample {self._blame(first, path, origins)[0]}"
            return self._error(
                f"{what} items here do not stack with {first_what} items {where}: {why}", i, path, origins
            )

        return error

    def _no_extras(self, planned: tuple[Node, Extras], path: Path, origins: Origins) -> Node:
        node, extras = planned
        if extras:
            raise self._error(
                f"the policy for this field returns {sorted(extras)}, which need a parent mapping; set their *_key arguments to None",
                0,
                path,
                origins,
            )
        return node

    def _items(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool = True) -> Node:
        """Each value's list holds its own items: stack where they agree, else a list."""
        children = self._item_nodes(values, path, origins, depth)
        merged = merge(children, self._refused(path, origins))
        # A policy for the items ("images.*"), or ragged= where it applies to them, is the user's choice:
        # a packing or padding one takes items of more than numbers and 0-d values within each sample
        # (numbers it reads only as a field's token ids), AsList() or Stack() any list.
        default = self.default
        chosen = (self.rules and self.rules.lookup((*path, ITEMS)) is not None) or (
            default is not None and not (default.numbers_as_sequence and _scalar_items(values))
        )
        if type(merged) is not TensorNode and not chosen:
            samples = [self._blame(i, path, origins)[0] for i in range(len(children))]
            self.fallbacks.report(path, _item_shapes(children, samples), items=True)
            if origins is None:  # a column of the batch's samples: their items as the compiled plan lists them
                return _listed_items(values) or merged
        return merged

    def _per_sample(self, values: Sequence[Any], path: Path, origins: Origins, depth: int) -> Node:
        """``PerSample()``: one subtree per sample, nothing stacked across samples.

        A column of the batch's samples whose subtrees the compiled plan takes
        (:func:`~pincollate._plan.rows.column_for`: mappings of one class and key order, or
        lists, down to tensors of one dtype and rank, numbers of one type and kept values) is
        placed as the compiled plan places it: each place of the subtree one column, its
        tensors in one region. The walk and the compiled plan share that rule and its copies.
        """

        def subtrees() -> Node:
            return Tree(
                ListSpec,
                [self._single(value, path, [self._blame(i, path, origins)], depth) for i, value in enumerate(values)],
            )

        found = column_for(values, depth) if origins is None else None
        if type(found) is not Rows and type(found) is not Groups:
            return subtrees()
        rows = found

        def place(fill: Fill) -> Spec:
            spec = rows.place(values, fill)
            assert spec is not None, "column_for took these very values: their place takes them"
            return spec

        return Listed(place)

    def _single(self, value: Any, path: Path, origin: Origins, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self._error(
                f"nesting deeper than {MAX_DEPTH} levels: is the sample self-referencing?", 0, path, origin
            )
        kind = kind_of(value)
        if kind is MAPPING:
            keys = list(value)
            children = [self._single(value[k], (*path, k), origin, depth + 1) for k in keys]
            return Tree(mapping_of(value, keys), children)
        if type(kind) is Registered:
            assert isinstance(kind, Registered)
            names, values = kind.flatten(value)
            children = [self._single(v, (*path, n), origin, depth + 1) for n, v in zip(names, values, strict=True)]
            return Tree(registered_of(type(value), list(names)), children)
        if is_sequence(value):
            names = [Attr(n) for n in value._fields] if is_namedtuple(value) else list(range(len(value)))
            children = [self._single(v, (*path, n), origin, depth + 1) for n, v in zip(names, value, strict=True)]
            if is_namedtuple(value):
                return Tree(namedtuple_of(type(value)), children)
            return Tree(ListSpec, children)
        handler = lookup(type(value))
        if handler is None or not handler.is_tensor:
            if handler is None and kind is not DATACLASS:
                raise self._error(f"unsupported type {type_name(value)}", 0, path, origin)
            return Value(value)
        # One value: a column of one, its leading 1 dropped.
        node = stack_or_list(self._column([value], path, origin, handler))
        if isinstance(node, TensorNode):
            return _unstack(node)
        assert isinstance(node, Tree) and len(node.children) == 1
        return node.children[0]  # a value that is never stacked (torchvision's boxes): itself

    def _sequence_policy(self, values: Sequence[Any], path: Path, origins: Origins, depth: int, policy: Policy) -> Node:
        """``AsList`` or ``Stack`` on a field whose values are lists of items."""
        children = self._item_nodes(values, path, origins, depth)
        if isinstance(policy, AsList):
            return Tree(ListSpec, children)
        if isinstance(policy, Stack):
            merged = merge(children, self._refused(path, origins))
            if not isinstance(merged, TensorNode):
                raise self._unstacked(children, path, origins)
            return merged
        raise self._error(
            f"{type(policy).__name__}() takes tensors; for lists of items use Concat() or Jagged()", None, path, origins
        )

    def _unstacked(self, children: list[Node], path: Path, origins: Origins) -> CollateError:
        """``Stack()``'s error for items that do not stack: the first sample that differs from sample 0, named."""

        def items(node: Node) -> str:
            if isinstance(node, TensorNode) and node.stackable:
                return f"items that stack to {tuple(node.shape)}"
            if isinstance(node, Value) and node.value is None:
                return "no items (None)"
            return "items of several shapes"

        said = [items(c) for c in children]
        i = next((i for i, what in enumerate(said) if what != said[0] or not what.startswith("items that")), 0)
        first = "" if i == 0 else f", where sample {self._blame(0, path, origins)[0]} has {said[0]}"
        return self._error(
            f"Stack() needs every sample's items to stack to one shape: this sample has {said[i]}{first}",
            i,
            path,
            origins,
        )

    def _item_nodes(self, values: Sequence[Any], path: Path, origins: Origins, depth: int) -> list[Node]:
        children: list[Node] = []
        for i, value in enumerate(values):
            if value is None and self.missing:
                children.append(Value(None))
                continue
            if is_sequence(value) and not is_namedtuple(value):
                sample, where = self._blame(i, path, origins)
                if not value:
                    children.append(Tree(ListSpec, []))
                    continue
                item_origins = [(sample, (*where, j)) for j in range(len(value))]
                child = self._no_extras(
                    self.plan(list(value), (*where, ITEMS), item_origins, depth + 1, True), path, origins
                )
            else:
                child = self._no_extras(
                    self.plan([value], path, [self._blame(i, path, origins)], depth + 1, True), path, origins
                )
                if isinstance(child, Tree) and child.make is ListSpec and len(child.children) == 1:
                    child = child.children[0]
                elif isinstance(child, TensorNode) and child.shape != tuple(getattr(value, "shape", ())):
                    # A stack (or padding) of the one value: it, its leading 1 dropped. A ragged=
                    # Concat() of it is the value already (an empty one too: no 0-d of no bytes).
                    child = _unstack(child)
            children.append(child)
        return children

    def _items_policy(self, values: Sequence[Any], path: Path, origins: Origins, policy: Policy) -> tuple[Node, Extras]:
        """A Concat/Jagged field whose per-sample values are lists of items."""
        flat: list[Any] = []
        flat_origins: list[tuple[int, Path]] = []
        counts: list[int] = []
        for i, value in enumerate(values):
            sample, where = self._blame(i, path, origins)
            if value is None and self.missing:
                counts.append(0)
                continue
            if not is_sequence(value):
                raise self._error(f"expected a list of items, got {type_name(value)}", i, path, origins)
            counts.append(len(value))
            flat.extend(value)
            flat_origins.extend((sample, (*where, j)) for j in range(len(value)))
        if not flat:
            # No sample has an item: the policy gives its empty result.
            return policy.plan(Column.empty(0, path), self.renames.key(path), counts=counts)
        handler = lookup(type(flat[0]))
        if handler is None or not handler.is_tensor:
            raise self._error(
                f"expected tensor items, got {type_name(flat[0])}",
                0,
                (*path, 0),
                None if origins is None else flat_origins,
            )
        column = self._column(flat, path, flat_origins, handler)
        return policy.plan(column, self.renames.key(path), counts=counts)


def _item_shapes(children: list[Node], samples: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """What a warning names of items that did not stack: two items of one sample that
    differ, else each sample's stack (an empty list as ``(0,)``); nothing if they are not tensors.
    """
    stacks: list[tuple[int, tuple[int, ...]]] = []
    for child, sample in zip(children, samples, strict=True):
        if type(child) is TensorNode:
            stacks.append((sample, child.shape))
        elif type(child) is Tree and child.make is ListSpec:
            items = [(sample, item.shape) for item in child.children if type(item) is TensorNode]
            if len(items) != len(child.children):
                return []  # not tensors: strings, mappings, absent values
            if two_shapes(items) is not None:
                return items
            stacks.append((sample, (len(items), *items[0][1]) if items else (0,)))
    return stacks


def _listed_items(values: Sequence[Any]) -> Listed | None:
    """Per-sample lists of plain tensors of one dtype and rank, listed as the compiled plan lists them, or ``None``.

    Each sample's items one unit where they agree (its stack), else one unit each, all in one
    region filled by one ``torch.cat`` (:meth:`~pincollate._plan.listed.ItemsRecipe.units`): the
    walk and the compiled plan share that rule and that copy. What the walk merged first is what
    this places (every sample's items do not stack as one tensor).
    """
    if set(map(type, values)) - LISTS:
        return None  # an absent list (missing="none"), or not a list
    flat = list(itertools.chain.from_iterable(values))
    described = plain_tensors(flat)
    if described is None:
        return None
    recipe = ItemsRecipe(*described, items=True)
    counts, shapes = list(map(len, values)), list(map(TENSOR_SHAPE, flat))

    def place(fill: Fill) -> Spec:
        units, groups, sizes, pieces = recipe.units(flat, counts, shapes)
        return recipe.placed(fill, flat, units, groups, sizes, pieces)

    return Listed(place)


def _unstack(slot: TensorNode) -> TensorNode:
    """A stack of one value, seen as that value (its leading 1 dropped)."""
    return TensorNode(slot.dtype, slot.shape[1:], slot.segments, slot.wrap, stackable=slot.stackable)


def is_scalar(item: Any) -> bool:
    """Whether ``item`` is a number in some form: a Python or numpy number, or a 0-d tensor or array.

    ``ragged=`` leaves such values as they are (they stack), and a plan's guard for one may
    take another in its place.

    Examples:
        >>> is_scalar(3), is_scalar(torch.tensor(1.5)), is_scalar(torch.zeros(2)), is_scalar("3")
        (True, True, False, False)
    """
    handler = lookup(type(item))
    return handler is not None and (handler.family == "number" or (handler.is_tensor and getattr(item, "ndim", 1) == 0))


def _scalar_items(values: Sequence[Any]) -> bool:
    """Whether every item of every list of ``values`` is a number in some form (:func:`is_scalar`)."""
    for value in values:
        if value is None:
            continue
        if not all(map(is_scalar, value if is_sequence(value) and not is_namedtuple(value) else (value,))):
            return False
    return True


def merge(children: list[Node], refused: Refused) -> Node:
    """Stack children that are tensors of one shape into one slot, else list them.

    The stack has the class and dtype ``torch.stack`` gives the children's (a subclass
    beside plain tensors wins; dtypes promote); where torch refuses them together (two
    ``tv_tensors`` kinds; ``uint16`` or ``float8`` beside another dtype), ``refused(i, first,
    what, first_what, why)`` is raised for the first child that differs.
    """
    if not children or not all(isinstance(c, TensorNode) and c.stackable for c in children):
        return Tree(ListSpec, children)
    slots: list[TensorNode] = children  # type: ignore[assignment]
    shape = slots[0].shape
    if any(s.shape != shape for s in slots):
        return Tree(ListSpec, children)
    wrap = _stacked_wrap(slots, refused)
    try:
        dtype = promote_all([slot.dtype for slot in slots])
    except Unpromoted as exc:
        raise refused(exc.index, None, str(exc.dtype), str(exc.before), str(exc)) from None
    assert dtype is not None, "tensors, each of a dtype"
    segments: list[Segment] = []
    numel = slots[0].numel
    for i, s in enumerate(slots):
        for segment in s.segments:
            segment = segment.shifted(i * numel)
            if segments and segment.follows(segments[-1]):
                prev = segments[-1]
                segments[-1] = Segment(
                    prev.start,
                    (prev.shape[0] + segment.shape[0], *prev.shape[1:]),
                    prev.fill,
                    [*prev.payload, *segment.payload],
                    True,
                )
            else:
                segments.append(segment)
    return TensorNode(dtype, (len(slots), *shape), segments, wrap)


def _stacked_wrap(slots: list[TensorNode], refused: Refused) -> Wrap | None:
    """How the stack of ``slots`` is wrapped: as :meth:`Column.joined_class` decides for values."""
    wraps = dict.fromkeys(slot.wrap for slot in slots)
    if len(wraps) == 1:
        return slots[0].wrap
    classes = [torch.Tensor if slot.wrap is None else slot.wrap.cls for slot in slots]
    try:
        cls = stacked_class(classes)
    except TypeError:  # every __torch_function__ declined: two tv_tensors kinds, say
        i, partner = refused_pair(classes)
        why = "torch.stack refuses the two classes together"
        raise refused(i, partner, classes[i].__name__, classes[partner].__name__, why) from None
    for wrap in wraps:
        if wrap is not None and wrap.cls is cls and not wrap.meta:
            return wrap
    return None if cls is None or cls is torch.Tensor else Wrap(cls)
