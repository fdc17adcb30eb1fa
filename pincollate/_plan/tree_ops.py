"""The nodes of a cached plan for containers, and for parts planned per batch.

A container node holds what its compiled code (:mod:`pincollate._plan.codegen`) checks and
gathers: the container class, keys and length, and its children's nodes (the single fields,
the blocks of fields of one dtype and shape, the numbers of one type). A part node holds what a
ragged field's first batch settled (its recipe), by which the generated function reads it; a
part no recipe describes is walked for each batch (:meth:`CarefulOp.run`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from .._batch.layout import Part
from .._errors import EXTRA_NAMES, CollateError
from .._types.kinds import Registered, union_keys, value_at
from .fill import Fill, Mismatch
from .ops import BlockOp, NumbersOp, Op
from .recipe import Recipe

__all__ = ["CarefulOp", "DataclassOp", "MappingOp", "RegisteredOp", "SequenceOp"]

Path = tuple[Hashable, ...]


class _Fields(Op):
    """A container's fields: single ops by column, block ops by columns.

    Columns come as tuples; a mapping's strings come back as lists, as in
    ``default_collate``, a sequence's as zip's tuples.
    """

    __slots__ = ("blocks", "singles")
    as_lists = False

    def __init__(self, path: Path, singles: Sequence[tuple[int, Op]], blocks: Sequence[BlockOp]):
        super().__init__(path)
        self.singles = tuple((index, op, self.as_lists and op.lists) for index, op in singles)
        self.blocks = tuple(blocks)


class MappingOp(_Fields):
    """A mapping of one type and one key set; fields by key, number blocks after.

    Sample 0's keys must be the plan's, in order and of the same types (``True`` is
    not ``1``): the output takes its key order from sample 0, as ``default_collate``.
    ``gathered`` are the keys whose columns the single and block ops index. With
    ``missing`` (``missing="none"``) samples may lack keys, as long as the batch's keys
    in order (:func:`~pincollate._types.kinds.union_keys`) are the plan's; an absent value is
    ``None`` in its column, and its field's op takes that up.
    """

    __slots__ = ("gather", "gathered", "key_types", "keys", "missing", "numbers", "single", "sizes", "types")
    as_lists = True

    def __init__(
        self,
        path: Path,
        cls: type,
        keys: Sequence[Hashable],
        gathered: Sequence[Hashable],
        singles: Sequence[tuple[int, Op]],
        blocks: Sequence[BlockOp],
        numbers: Sequence[NumbersOp],
        missing: bool = False,
    ):
        super().__init__(path, singles, blocks)
        self.missing = missing
        self.gathered = tuple(gathered)
        self.types = frozenset((cls,))
        self.keys = tuple(keys)
        self.key_types = tuple(map(type, self.keys))
        # One C-level call per sample gathers its row; zip turns rows into columns. A
        # single key's column is gathered directly.
        self.gather: Callable[[Any], Any] | None = operator.itemgetter(*gathered) if gathered else None
        self.single = len(gathered) == 1
        self.numbers = tuple(numbers)
        self.sizes = frozenset((len(self.keys),))

    def with_absent(self, column: Sequence[Any]) -> list[Any]:
        """The columns where samples lack keys (``missing="none"``): ``None`` for each absent value."""
        keys = union_keys(column)
        if tuple(keys) != self.keys or tuple(map(type, keys)) != self.key_types:
            raise Mismatch(self.path)
        rows = [tuple(value_at(value, key) for key in self.gathered) for value in column]
        return list(zip(*rows, strict=True))


class SequenceOp(_Fields):
    """Sequences (or namedtuples) of one type and length, transposed position by position."""

    __slots__ = ("sizes", "types")

    def __init__(self, path: Path, cls: type, size: int, singles: Sequence[tuple[int, Op]], blocks: Sequence[BlockOp]):
        super().__init__(path, singles, blocks)
        self.types = frozenset((cls,))
        self.sizes = frozenset((size,))


class DataclassOp(Op):
    """Dataclass instances of one type, field by field."""

    __slots__ = ("children", "types")

    def __init__(self, path: Path, cls: type, children: Sequence[tuple[str, Op]]):
        super().__init__(path)
        self.types = frozenset((cls,))
        self.children = tuple((operator.attrgetter(name), op) for name, op in children)


class RegisteredOp(Op):
    """Instances of a registered container class with one key set (and key types: ``True`` is not ``1``), child by child."""

    __slots__ = ("children", "flatten", "key_types", "keys", "types")

    def __init__(self, path: Path, kind: Registered, keys: Sequence[Hashable], children: Sequence[Op]):
        super().__init__(path)
        self.types = frozenset((kind.cls,))
        self.flatten = kind.flatten
        self.keys = list(keys)
        self.key_types = list(map(type, self.keys))
        self.children = tuple(children)

    def rows(self, column: Sequence[Any]) -> list[list[Any]]:
        """Each value's children, where every value flattens to the plan's keys."""
        rows = []
        for value in column:
            try:
                keys, children = self.flatten(value)
            except Exception:  # the careful planner names the sample
                raise Mismatch(self.path) from None
            if list(keys) != self.keys or list(map(type, keys)) != self.key_types or len(children) != len(self.keys):
                raise Mismatch(self.path)
            rows.append(children)
        return rows


class CarefulOp(Op):
    """A field planned anew for each batch by the careful planner (ragged, policies).

    ``siblings`` are the keys of the parent mapping, beside which the policy's extra
    outputs go; ``None`` where the parent has no keys to put them beside.
    """

    __slots__ = ("index", "recipe", "siblings")
    lists = True

    def __init__(self, path: Path, index: int, siblings: frozenset[Hashable] | None, recipe: Recipe | None = None):
        super().__init__(path)
        self.index: int = index
        self.siblings: frozenset[Hashable] | None = siblings
        #: What the field's first batch settled (:mod:`pincollate._plan.ragged`): the node the code
        #: generator reads the field by; ``None``: walked for every batch. Its output names were
        #: checked against ``siblings`` when it was made.
        self.recipe: Recipe | None = recipe

    def run(self, column: Sequence[Any], fill: Fill) -> None:
        """The field walked for this batch: what a plan's function does not read itself."""
        node, extras = fill.planner.plan(column, self.path, self.siblings is not None)
        if extras:
            if self.siblings is None:
                raise CollateError(
                    f"the policy for this field returns {sorted(extras)}, which need a parent mapping; set their *_key arguments to None",
                    sample=0,  # as the careful walk blames it
                    path=self.path,
                )
            for name in extras:
                if name in self.siblings:
                    raise CollateError(
                        f"the extra output {name!r} of field {self.path[-1]!r} clashes with the key {name!r}{EXTRA_NAMES}",
                        sample=0,
                        path=self.path[:-1],
                    )
        spec = fill.place(node)
        fill.parts[self.index] = Part(spec, tuple((name, fill.place(extra)) for name, extra in extras.items()))
