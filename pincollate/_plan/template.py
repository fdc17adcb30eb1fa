"""Planning a cached plan: one batch of a new structure into a template and its ops.

Every field whose values all agree (one type, dtype and shape; mappings with one key
set; sequences of one length) gets a slot at a fixed offset of the template and an op
(:mod:`pincollate._plan.ops`) that gathers and checks its column for every later batch. What
the slot holds is the careful walk's (:meth:`~pincollate._plan.careful.Planner.column`: its
description of the values, their stack's dtype and class, a number column's dtype) and so is
each container's output (:func:`~pincollate._plan.items.mapping_of` and its kin); the template
decides only which fields are fixed and where they lie. Fields of one dtype and shape in one
mapping share a block (one stack for all of them); Python numbers of one type share one.
Fields that do not agree become *parts*, each read by the generated function by the recipe of
the walk's route (:func:`~pincollate._plan.ragged.part_recipe`) where one fits, else walked for
each batch.
:mod:`pincollate._plan.cache` caches what this makes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._batch.layout import PartSpec, Spec, TensorSpec, ValueSpec
from .._batch.views import START, align, pitch
from .._errors import Attr, CollateError
from .._types.builtin import (
    KEPT_VALUES,
    NUMBERS,
    TENSOR_SHAPE,
    builtin,
    fill_numbers,
)
from .._types.kinds import (
    DATACLASS,
    EXACT_KEYS,
    MAPPING,
    NAMEDTUPLE,
    SEQUENCE,
    Registered,
    kind_of,
    union_keys,
    value_at,
)
from .._types.leaves import lookup
from .column import MAX_DEPTH
from .fill import TensorNode
from .items import dataclass_of, mapping_of, namedtuple_of, registered_of, sequence_of
from .ops import BlockOp, NumbersOp, Op, StackOp, ValueOp
from .patterns import Settings
from .ragged import part_recipe
from .tree_ops import CarefulOp, DataclassOp, MappingOp, RegisteredOp, SequenceOp

if TYPE_CHECKING:
    from .careful import Planner

__all__ = ["Template"]

Path = tuple[Hashable, ...]

#: The most padding bytes a field of a block may take to start aligned.
_MOST_PADDING = 4096


class Template:
    """Plans one batch into a cached template: slots where values agree, parts elsewhere."""

    def __init__(self, settings: Settings, careful: set[Path], planner: Planner):
        self.planner = planner
        self.careful = careful  # the paths planned for each batch; it grows as planning finds more
        self.rules = settings.rules
        self.renames = settings.renames
        self.default = settings.default
        self.missing = settings.missing
        self.items = settings.items
        self.compiled = settings.compiled
        self.offset = START
        self.nvalues = 0
        self.nparts = 0
        #: Mappings two of whose parts may give an extra output of one name: planned again as parts.
        self.clashing: set[Path] = set()
        #: The paths this plan walks for each batch (``careful`` also holds other structures').
        self.own: set[Path] = set()

    def take(self, nbytes: int) -> int:
        offset = self.offset
        self.offset = align(offset + nbytes)
        return offset

    def part(
        self, path: Path, siblings: frozenset[Hashable] | None, column: Sequence[Any] | None = None
    ) -> tuple[Spec, Op]:
        """A field planned for each batch: read by its recipe where ``column`` gets one, else walked."""
        self.careful.add(path)
        self.own.add(path)
        index = self.nparts
        self.nparts += 1
        recipe = None
        if column is not None and len(path) <= MAX_DEPTH and self.compiled:
            # The careful walk takes the column once: its route (branch and policy) is what
            # the recipe describes, so the two never choose apart.
            recipe = part_recipe(self.planner, column, path, siblings is not None)
            if recipe is not None and not recipe.fits_beside(siblings):
                recipe = None  # the careful planner says what clashes
        return PartSpec(index), CarefulOp(path, index, siblings, recipe)

    def per_batch(self, path: Path) -> bool:
        """Whether ``path`` is planned anew for each batch: learnt as careful, or under a policy."""
        return path in self.careful or bool(self.rules and self.rules.lookup(path) is not None)

    def fixed(self, path: Path) -> bool:
        """Whether ``path``'s policy takes tensors that agree as they are (``Stack()``).

        Such a field gets a fixed slot, as with no policy; a later batch that does not
        agree plans it carefully, where the policy names the sample and the shapes.
        """
        policy = self.rules.lookup(path) if self.rules and path not in self.careful else None
        return policy is not None and policy.fixed_when_uniform

    def number(self, column: Sequence[Any], path: Path) -> torch.dtype | None:
        """The dtype the careful walk gives a column of Python numbers of one type, which a block can take.

        ``None`` where the walk refuses the column (an int past ``int64``) or the path is
        planned for each batch: a part, which the walk of each batch takes.
        """
        cls = type(column[0])
        if not builtin(cls, lookup(cls)) or self.per_batch(path) or set(map(type, column)) != {cls}:
            return None
        try:
            return self.planner.column(column, path).dtype
        except CollateError:
            return None

    def plan(self, column: Sequence[Any], path: Path, siblings: frozenset[Hashable] | None) -> tuple[Spec, Op]:
        if len(path) > MAX_DEPTH or (self.missing and any(v is None for v in column)):
            return self.part(path, siblings, column)
        first = column[0]
        cls = type(first)
        if self.per_batch(path):
            handler = lookup(cls)
            if not (self.fixed(path) and handler is not None and handler.family in ("tensor", "ndarray")):
                return self.part(path, siblings, column)
            if set(map(type, column)) != {cls}:
                return self.part(path, siblings, column)
            return self.leaves(column, path, siblings, handler)
        if set(map(type, column)) != {cls}:
            return self.part(path, siblings, column)
        n = len(column)
        if cls in NUMBERS and builtin(cls, lookup(cls)):
            dtype = self.number(column, path)
            if dtype is None:
                return self.part(path, siblings, column)
            spec = TensorSpec(dtype, (n,), self.take(n * dtype.itemsize))
            return spec, StackOp(path, spec, cls, fill_numbers, None, None, None)
        handler = lookup(cls)
        if handler is not None:
            if not handler.is_tensor:
                if cls not in KEPT_VALUES:
                    return self.part(path, siblings, column)
                index = self.nvalues
                self.nvalues += 1
                return ValueSpec(index), ValueOp(path, index, cls)
            return self.leaves(column, path, siblings, handler)
        kind = kind_of(first)
        if self.planner.may_read_ragged_numbers(column, siblings is not None):
            # Lists that ragged= may read as sequences (token ids) in some batch, of one length or
            # not, a registered list class too: walked as the walk reads each batch's.
            return self.part(path, siblings, column)
        if kind is MAPPING:
            return self.mapping(column, path, siblings)
        if kind is NAMEDTUPLE or (kind is SEQUENCE and not self.items):
            if set(map(len, column)) != {len(first)}:
                return self.part(path, siblings, column)
            names = kind.keys(first)
            specs, singles, blocks = self.fields(list(zip(*column, strict=True)), path, names, None)
            op = SequenceOp(path, cls, len(names), singles, blocks)
            return (namedtuple_of(cls) if kind is NAMEDTUPLE else sequence_of(first))(specs), op
        if kind is DATACLASS:
            fields = [f.name for f in dataclasses.fields(first)]
            planned = [self.plan([getattr(v, name) for v in column], (*path, Attr(name)), None) for name in fields]
            return dataclass_of(cls, fields)([spec for spec, _ in planned]), DataclassOp(
                path, cls, [(name, op) for name, (_, op) in zip(fields, planned, strict=True)]
            )
        if type(kind) is Registered:
            assert isinstance(kind, Registered)
            return self.registered(column, path, siblings, kind)
        return self.part(path, siblings, column)

    def registered(
        self, column: Sequence[Any], path: Path, siblings: frozenset[Hashable] | None, kind: Registered
    ) -> tuple[Spec, Op]:
        """A registered container class: one key set across the batch, each child planned by its key."""
        try:
            flat = [kind.flatten(value) for value in column]
            hash(tuple(flat[0][0]))
        except Exception:  # a flatten that fails or gives unhashable keys: the careful planner names the sample
            return self.part(path, siblings, column)
        keys = list(flat[0][0])
        if any(list(names) != keys or len(children) != len(keys) for names, children in flat):
            return self.part(path, siblings, column)
        columns = zip(*(children for _, children in flat), strict=True)
        planned = [self.plan(list(child), (*path, key), None) for key, child in zip(keys, columns, strict=True)]
        spec = registered_of(kind.cls, keys)([child for child, _ in planned])
        return spec, RegisteredOp(path, kind, keys, [op for _, op in planned])

    def leaves(
        self, column: Sequence[Any], path: Path, siblings: frozenset[Hashable] | None, handler: Any
    ) -> tuple[Spec, Op]:
        # The ragged= policy applies to every field of tensors (its extras, a mask say,
        # are there in every batch), so such fields are planned per batch.
        if not handler.stackable or handler.key is None or self.default is not None:
            return self.part(path, siblings, column)
        first = column[0]
        if handler.family == "tensor" and _shapes_differ(column):
            return self.part(path, siblings, column)  # ragged: no need to describe each value
        stacked = self.stacked(column, path)
        if stacked is None:
            return self.part(path, siblings, column)
        key = handler.key
        if handler.meta is not None or (stacked.wrap is not None and stacked.wrap.meta):
            # What must agree for values to stack (meta), and what the stack keeps of them (a
            # wrap's metadata, an audio rate say), are the plan's too: checked beside the key.
            key = functools.partial(_key_and_meta, handler)
        keys = set(map(key, column))
        if len(keys) != 1:
            return self.part(path, siblings, column)
        spec = TensorSpec(stacked.dtype, stacked.shape, self.take(stacked.nbytes), stacked.wrap)
        # The exact class is checked for every value: a subclass (an Image, a user's
        # tensor type) passes the dtype getter but must keep its own class.
        first_shape = getattr(first, "shape", None) if handler.family in ("tensor", "ndarray") else None
        return spec, StackOp(path, spec, type(first), handler.fill, key, keys.pop(), first_shape)

    def stacked(self, column: Sequence[Any], path: Path) -> TensorNode | None:
        """The careful walk's stack of ``column`` where its values agree in dtype too, else ``None``.

        The walk's description of the values and its rule for what stacks (one shape,
        metadata that agrees) and as what (dtype, class): the plan keeps that node's slot.
        One dtype besides: a later batch's guard reads it, where the walk would promote.
        """
        try:
            described = self.planner.column(column, path)
            if not described.uniform or len(set(described.dtypes)) != 1:
                return None
            return described.stacked()
        except Exception:  # the walk of each batch names the sample and the reason
            return None

    def uniform_tensors(self, column: Sequence[Any], path: Path) -> tuple[torch.dtype, tuple[int, ...]] | None:
        """The dtype and shape of one field of a block: plain tensors the walk stacks as they are, else ``None``."""
        if type(column[0]) is not torch.Tensor or self.default is not None or self.per_batch(path):
            return None
        if not builtin(torch.Tensor, lookup(torch.Tensor)):
            return None  # a handler of the user's describes each value: no block over it
        if set(map(type, column)) != {torch.Tensor} or _shapes_differ(column):
            return None
        stacked = self.stacked(column, path)
        return None if stacked is None else (stacked.dtype, stacked.shape[1:])

    def fields(
        self,
        columns: Sequence[Sequence[Any]],
        path: Path,
        names: Sequence[Hashable],
        siblings: frozenset[Hashable] | None,
    ) -> tuple[list[Spec], list[tuple[int, Op]], list[BlockOp]]:
        """A container's fields: plain tensors of one dtype and shape share a block."""
        specs: list[Spec | None] = [None] * len(names)
        singles: list[tuple[int, Op]] = []
        groups: dict[tuple[torch.dtype, tuple[int, ...]], list[int]] = {}
        for j, name in enumerate(names):
            uniform = self.uniform_tensors(columns[j], (*path, name)) if len(names) > 1 else None
            if uniform is not None:
                groups.setdefault(uniform, []).append(j)
        n = len(columns[0]) if columns else 0
        for (dtype, shape), members in list(groups.items()):
            row = math.prod(shape) * dtype.itemsize
            # Each field of a block starts aligned: rows of padding where its bytes need
            # them, unless that wastes more than it saves (then one stack per field).
            if len(members) == 1 or row == 0 or (pitch(n, row) - n) * row > _MOST_PADDING:
                del groups[(dtype, shape)]
        blocked = {j for members in groups.values() for j in members}
        for j, name in enumerate(names):
            if j not in blocked:
                specs[j], op = self.plan(columns[j], (*path, name), siblings)
                singles.append((j, op))
        blocks = []
        for (dtype, shape), members in groups.items():
            rows = pitch(n, math.prod(shape) * dtype.itemsize)
            field = rows * math.prod(shape) * dtype.itemsize
            block = TensorSpec(dtype, (len(members) * rows, *shape), self.take(len(members) * field))
            for k, j in enumerate(members):
                specs[j] = TensorSpec(dtype, (n, *shape), block.offset + k * field)
            blocks.append(BlockOp(path, [(*path, names[j]) for j in members], members, block, dtype, shape, rows - n))
        return specs, singles, blocks  # type: ignore[return-value]

    def mapping(self, column: Sequence[Any], path: Path, siblings: frozenset[Hashable] | None) -> tuple[Spec, Op]:
        first = column[0]
        first_keys = first.keys()
        if any(v.keys() != first_keys for v in column):
            if not self.missing:
                return self.part(path, siblings, column)
            keys = union_keys(column)  # absent keys are None in their columns
        else:
            keys = list(first_keys)
        if not EXACT_KEYS.issuperset(map(type, keys)):
            return self.part(path, siblings, column)  # the careful walk keeps each sample's own keys
        numbers: dict[tuple[type, torch.dtype], list[Hashable]] = {}
        gathered: list[Hashable] = []
        for key in keys:
            child = [value_at(v, key) for v in column]
            dtype = self.number(child, (*path, key)) if type(child[0]) in NUMBERS else None
            if dtype is not None:
                numbers.setdefault((type(child[0]), dtype), []).append(key)
            else:
                gathered.append(key)
        columns = list(zip(*([value_at(v, key) for key in gathered] for v in column), strict=True))
        names = self.renames.outputs(path, keys)
        if self.renames.twice(keys, names) is not None:
            return self.part(path, siblings, column)  # two keys renamed alike: the careful walk refuses it
        # An extra output takes neither a key's name nor its new one (the walk's rule).
        specs, singles, blocks = self.fields(columns, path, gathered, frozenset((*keys, *names)))
        children = dict(zip(gathered, specs, strict=True))
        if self._extras_may_clash(path, [key for key in gathered if type(children[key]) is PartSpec]):
            self.clashing.add(path)
        number_ops = []
        n = len(column)
        for (cls, dtype), group in numbers.items():
            rows = pitch(n, dtype.itemsize)  # each field's row starts aligned
            offset = self.take(len(group) * rows * dtype.itemsize)
            if len(group) == 1:  # one field: its own tensor is the block (one tensor made, not two)
                block = children[group[0]] = TensorSpec(dtype, (n,), offset)
            else:
                block = TensorSpec(dtype, (len(group) * rows,), offset)
                for j, key in enumerate(group):
                    children[key] = TensorSpec(dtype, (n,), offset + j * rows * dtype.itemsize)
            number_ops.append(NumbersOp(path, cls, group, block))
        spec = mapping_of(first, names)([children[key] for key in keys])
        return spec, MappingOp(path, type(first), keys, gathered, singles, blocks, number_ops, self.missing)

    def _extras_may_clash(self, path: Path, parts: Sequence[Hashable]) -> bool:
        """Whether two of a mapping's parts (its keys ``parts``) may give extra outputs of one name.

        Each part checks its extras against the mapping's keys, not against another part's: a
        policy with a fixed extra name (``ragged=Pad(mask_key="mask")``) on two fields would put
        one mask over the other. Such a mapping is walked for each batch, which names the clash
        where it happens. Read from the policies, so a part that takes its policy only in some
        batches counts too.
        """
        seen: set[str] = set()
        for key in parts:
            child = (*path, key)
            policy = self.rules.lookup(child) if self.rules else None
            if policy is None:
                policy = self.default
            if policy is None:
                continue
            names = policy.extra_names(self.renames.key(child) if self.renames else key)
            if not seen.isdisjoint(names):
                return True
            seen.update(names)
        return False


def _shapes_differ(column: Sequence[Any]) -> bool:
    """Whether a column of tensors holds more than one shape (read at C speed)."""
    try:
        return len(set(map(TENSOR_SHAPE, column))) > 1
    except (TypeError, RuntimeError):  # not all tensors, or a nested one: described one by one
        return False


def _key_and_meta(handler: Any, value: Any) -> tuple[Any, Any, Any]:
    """A handler's key, meta and wrap of ``value``: what a plan of a leaf with metadata checks."""
    meta = handler.meta(value) if handler.meta is not None else None
    return handler.key(value), meta, handler.wrap(value) if handler.wrap is not None else None
