"""One field's values across the batch, described: the column every policy plans from.

The careful planner (:mod:`pincollate._plan.careful`) reads each value's dtype, shape and metadata
once, through the leaf registry (:mod:`pincollate._types.leaves`), into a :class:`Column`; a policy
(:mod:`pincollate._plan.policies`) or the default, :func:`stack_or_list`, turns it into a planned
node. A column knows whom to blame for each value (sample index and key path), the
promoted dtype, whether its values stack, and the class a stack of them has.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .._batch.specs import ListSpec
from .._errors import CollateError
from .._types.builtin import builtin
from .._types.leaves import LeafHandler, lookup, type_name
from .._types.wrap import Wrap
from .fill import Fill, Listed, Node, Segment, TensorNode, Tree, Value
from .listed import ListRecipe
from .padding import Joined
from .recipe import kept_tensors

__all__ = [
    "MAX_DEPTH",
    "Column",
    "Path",
    "Unpromoted",
    "listed",
    "plain_stack",
    "promote_all",
    "refused_pair",
    "stack_node",
    "stack_or_list",
    "stacked_class",
]

Path = tuple[Hashable, ...]

#: Deeper than this is taken for a self-referencing sample.
MAX_DEPTH = 100

_PLAIN = {torch.Tensor}


class Unpromoted(Exception):
    """:func:`promote_all` met a dtype torch promotes with nothing before it: at ``index``, ``dtype`` after ``before``."""

    def __init__(self, message: str, index: int, dtype: torch.dtype, before: torch.dtype):
        super().__init__(message)
        self.index, self.dtype, self.before = index, dtype, before


def promote_all(dtypes: Sequence[torch.dtype | None]) -> torch.dtype | None:
    """The dtype ``torch.stack`` gives values of ``dtypes`` (``None`` skipped; ``None`` where none is left).

    Raises:
        Unpromoted: torch promotes a dtype with nothing before it (``uint16``-``uint64`` with
            signed ints, ``float8`` with any other).

    Examples:
        >>> promote_all([torch.int32, None, torch.float16])
        torch.float16
    """
    promoted: torch.dtype | None = None
    for i, dtype in enumerate(dtypes):
        if dtype is None or dtype is promoted:
            continue
        if promoted is None:
            promoted = dtype
            continue
        try:
            promoted = torch.promote_types(promoted, dtype)
        except RuntimeError as exc:
            raise Unpromoted(str(exc), i, dtype, promoted) from None
    return promoted


class Column:
    """The values of one tensor-like field: one per sample, or per item of a list.

    ``dtypes[i]``/``shapes[i]`` describe ``values[i]``; ``None`` values (missing
    entries, with ``missing="none"``) have ``None`` there. ``origin(i)`` gives the
    sample index and key path to blame for value ``i``.
    """

    def __init__(
        self,
        values: Sequence[Any],
        path: Path,
        handler: LeafHandler,
        dtypes: list[torch.dtype | None],
        shapes: list[tuple[int, ...] | None],
        metas: list[Hashable] | None,
        origins: list[tuple[int, Path]] | None,
    ):
        self.values: Sequence[Any] = values
        self.path: Path = path
        self.handler: LeafHandler = handler
        self.dtypes: list[torch.dtype | None] = dtypes
        self.shapes: list[tuple[int, ...] | None] = shapes
        self.metas: list[Hashable] | None = metas
        self.origins: list[tuple[int, Path]] | None = origins
        #: Plain tensors, every one present, described at C speed (:func:`~pincollate._types.builtin.describe_plain`).
        self.plain = False
        #: The first value whose class never stacks (``BoundingBoxes``) where the first value's
        #: class stacks (a plain tensor before boxes): its index and handler. Set by the describer.
        self.unstackable: tuple[int, LeafHandler] | None = None
        # Read once each, on first use. Not functools.cached_property: up to Python 3.11 it takes one
        # lock per property for every instance, and a DataLoader forking its workers while another
        # thread holds it leaves each worker's first walk waiting on it for good.
        self._known: dict[int, tuple[int, ...]] | None = None
        self._present: list[int] | None = None
        self._dtype: torch.dtype | None = None

    @classmethod
    def empty(cls, n: int, path: Path) -> Column:
        """``n`` absent values (none at all for ``n == 0``): what a packing policy makes empty."""
        tensor = lookup(torch.Tensor)
        assert tensor is not None
        return cls([None] * n, path, tensor, [None] * n, [None] * n, None, None)

    def subset(self, indices: Sequence[int]) -> Column:
        """The values at ``indices`` (present ones, say), each still blamed on its own sample."""
        metas = None if self.metas is None else [self.metas[i] for i in indices]
        return Column(
            [self.values[i] for i in indices],
            self.path,
            self.handler,
            [self.dtypes[i] for i in indices],
            [self.shapes[i] for i in indices],
            metas,
            [self.origin(i) for i in indices],
        )

    def origin(self, i: int) -> tuple[int, Path]:
        return (i, self.path) if self.origins is None else self.origins[i]

    def error(self, message: str, i: int | None = None) -> CollateError:
        if i is None:
            return CollateError(message, path=self.path)
        sample, path = self.origin(i)
        return CollateError(message, sample=sample, path=path)

    @property
    def known(self) -> dict[int, tuple[int, ...]]:
        """The shapes of the values present, by index."""
        if self._known is None:
            self._known = {i: shape for i, shape in enumerate(self.shapes) if shape is not None}
        return self._known

    @property
    def present(self) -> list[int]:
        if self._present is None:
            self._present = [i for i, shape in enumerate(self.shapes) if shape is not None]
        return self._present

    @property
    def dtype(self) -> torch.dtype:
        """The promoted dtype of all present values (``torch.result_type`` rules)."""
        if self._dtype is None:
            self._dtype = self._promoted()
        return self._dtype

    @dtype.setter
    def dtype(self, dtype: torch.dtype) -> None:  # a column of numbers takes default_collate's dtype
        self._dtype = dtype

    def _promoted(self) -> torch.dtype:
        found = set(self.dtypes)
        found.discard(None)
        if len(found) < 2:  # one dtype (read at C speed), or none present
            return torch.float32 if not found else found.pop()  # type: ignore[return-value]
        try:
            return promote_all(self.dtypes) or torch.float32
        except Unpromoted as refused:
            raise self.error(
                f"cannot stack {refused.dtype} here with {refused.before} before it: {refused}", refused.index
            ) from None

    @property
    def stackable(self) -> bool:
        """Whether every value's class stacks: boxes anywhere in the column keep it one tensor per value."""
        return self.handler.stackable and self.unstackable is None

    def refusing(self) -> tuple[int, LeafHandler]:
        """The first value whose class never stacks, and its handler (the column is not :attr:`stackable`)."""
        if self.unstackable is not None:
            return self.unstackable
        return (self.present[0] if self.present else 0), self.handler

    @property
    def uniform(self) -> bool:
        """All values present, of one shape, with agreeing metadata: stackable."""
        if not self.stackable or self.shapes[0] is None or len(set(self.shapes)) != 1:
            return False
        return self.metas is None or all(meta == self.metas[0] for meta in self.metas)

    def _wrap(self, i: int) -> Wrap | None:
        handler = lookup(type(self.values[i]))
        return None if handler is None or handler.wrap is None else handler.wrap(self.values[i])

    def _common_wrap(self) -> Wrap | None:
        # The type every value shares (an Image, say). A column that mixes classes
        # stacks to the class torch.stack gives them, as default_collate's stack does:
        # a subclass beside plain tensors wins, tv_tensors of two kinds unwrap.
        classes = set(map(type, self.values))
        if len(classes) == 1 and (
            self.handler.wrap is None or (classes == _PLAIN and builtin(torch.Tensor, self.handler))
        ):
            return None  # values whose class never wraps, or plain tensors (read at C speed)
        wraps = {self._wrap(i): None for i in range(len(self.values))}
        if len(wraps) == 1:
            return next(iter(wraps))
        cls = self.joined_class()
        for wrap in wraps:
            if wrap is not None and wrap.cls is cls and not wrap.meta:
                return wrap
        return None if cls is None or cls is torch.Tensor else Wrap(cls)

    def joined_class(self, join: Callable[..., torch.Tensor] = torch.stack) -> type | None:
        """The class ``join`` (``torch.stack`` or ``torch.cat``) gives the values, or ``None`` for arrays.

        Where it refuses them together (two ``tv_tensors`` kinds, say), the error names
        the first value whose class differs from the first value's.
        """
        classes = [type(v) for v in self.values if v is not None]
        try:
            return stacked_class(classes, join)
        except TypeError:  # every __torch_function__ declined
            i, partner = refused_pair([None if v is None else type(v) for v in self.values], join)
            verb = "stack" if join is torch.stack else "concatenate"
            raise self.error(
                f"{type_name(self.values[i])} here does not {verb} with {type_name(self.values[partner])} in sample "
                f"{self.origin(partner)[0]}: torch.{join.__name__} refuses the two classes together",
                i,
            ) from None

    def stacked(self) -> TensorNode:
        """All values stacked along a new first dimension (requires :attr:`uniform`)."""
        return stack_node(self.dtype, self.shapes[0], self.handler.fill, self.values, self._common_wrap())  # type: ignore[arg-type]  # all present: uniform

    def single(self, i: int) -> Node:
        """Value ``i`` alone, in its own dtype and shape (``None`` stays ``None``)."""
        shape = self.shapes[i]
        if shape is None:
            return Value(None)
        # A number takes its column's dtype (a float first: float64 for every value), as it would stacked.
        dtype = self.dtype if self.handler.family == "number" else self.dtypes[i]
        assert dtype is not None  # present values have a dtype
        handler = lookup(type(self.values[i])) or self.handler
        segment = Segment(0, shape, handler.fill_one, [self.values[i]])
        return TensorNode(dtype, shape, [segment], self._wrap(i), stackable=handler.stackable)


def stacked_class(classes: Sequence[type], join: Callable[..., torch.Tensor] = torch.stack) -> type | None:
    """The class ``join`` (``torch.stack``, or ``torch.cat``) gives tensors of ``classes`` (in order), or ``None`` for arrays.

    Asked of torch itself, on empty stand-ins, so a subclass's ``__torch_function__``
    decides as it does for ``default_collate``. A ``TypeError``: torch refuses them together.
    """
    tensors = [cls for cls in dict.fromkeys(classes) if issubclass(cls, torch.Tensor)]
    if len(tensors) != len(set(classes)):
        return None
    probes: list[torch.Tensor] = [torch.empty(0, device="cpu").as_subclass(cls) for cls in classes]
    return type(join(probes))


def refused_pair(classes: Sequence[type | None], join: Callable[..., torch.Tensor] = torch.stack) -> tuple[int, int]:
    """Where ``join`` refuses tensors of ``classes`` together (``None``: absent): the first whose class
    torch refuses with those before it, and the earlier one it is refused with.

    An ``Image`` and a ``Mask`` are refused together; a plain tensor beside either is not the culprit.

    Examples:
        >>> class Only(torch.Tensor):  # declines any other subclass beside its own
        ...     @classmethod
        ...     def __torch_function__(cls, func, types, args=(), kwargs=None):
        ...         if any(t is not cls for t in types):
        ...             return NotImplemented
        ...         return super().__torch_function__(func, types, args, kwargs)
        >>> class Other(Only):
        ...     pass
        >>> refused_pair([torch.Tensor, Other, None, Only])
        (3, 1)
    """
    present = [i for i, cls in enumerate(classes) if cls is not None]
    seen: dict[type, int] = {}
    for i in present:
        cls = classes[i]
        assert cls is not None
        if cls in seen:
            continue
        for earlier, at in seen.items():
            try:
                stacked_class([earlier, cls], join)
            except TypeError:
                return i, at
        seen[cls] = i
        try:
            stacked_class(list(seen), join)
        except TypeError:  # refused only with several before it together
            return i, present[0]
    return present[-1], present[0]


def stack_node(
    dtype: torch.dtype, shape: tuple[int, ...], fill: Any, values: Sequence[Any], wrap: Wrap | None = None
) -> TensorNode:
    """``values`` (each of ``shape``) stacked along a new first dimension: one region, one copy."""
    values = values if type(values) is not Joined else list(values)  # torch.stack takes a list
    full = (len(values), *shape)
    return TensorNode(dtype, full, [Segment(0, full, fill, values, stacking=True)], wrap)


def plain_stack(
    values: Sequence[Any], handler: LeafHandler, plain: tuple[list[torch.dtype], list[tuple[int, ...]]]
) -> TensorNode | None:
    """:func:`stack_or_list`'s stack of a column of plain tensors (``plain``: their dtypes and shapes, read at
    C speed by :func:`~pincollate._types.builtin.describe_plain`), without a :class:`Column`: ``None`` where
    the dtypes or shapes differ. Plain tensors have no metadata and stack as plain tensors."""
    dtypes, shapes = plain
    if dtypes.count(dtypes[0]) != len(dtypes) or shapes.count(shapes[0]) != len(shapes):
        return None
    return stack_node(dtypes[0], shapes[0], handler.fill, values)


def stack_or_list(column: Column) -> Node:
    """The default: stack when the values agree, else a list of per-sample values (:func:`listed`)."""
    if column.uniform:
        return column.stacked()
    return listed(column)


def listed(column: Column) -> Node:
    """The column's values as a per-sample list, ``None`` where a value is absent.

    A column of the batch's samples (not a sample's items, which the walk may stack again)
    holding tensors that the compiled plan lists in one region (one dtype, one rank, plain
    or a subclass kept as its class: :func:`~pincollate._plan.recipe.kept_tensors`) is placed
    as the compiled plan places it (:class:`~pincollate._plan.listed.ListRecipe`): one
    ``torch.cat`` into one region, each value a view of it. The walk and the compiled plan
    share that size rule and that copy. Anything else: each value a tensor of its own.
    """
    if column.origins is None and column.handler.is_tensor:
        present = column.present
        values = column.values if len(present) == len(column.values) else [column.values[i] for i in present]
        kept: tuple[torch.dtype, int, type] | None = None
        if column.plain:  # described already, as kept_tensors would describe them
            ranks = set(map(len, column.shapes))  # type: ignore[arg-type]
            dtype = column.dtypes[0]
            one = dtype is not None and column.dtypes.count(dtype) == len(column.dtypes)
            if one and dtype is not None and len(ranks) == 1 and 0 not in ranks:  # one dtype, one rank (not 0-d)
                kept = (dtype, ranks.pop(), torch.Tensor)
        else:
            kept = kept_tensors(values) if values else None
        if kept is not None:
            recipe = ListRecipe(kept[0], kept[1], stacks=False, cls=kept[2])
            shapes: list[Any] = [column.shapes[i] for i in present]
            absent = [i for i, shape in enumerate(column.shapes) if shape is None]

            def place(fill: Fill) -> Any:
                return recipe.sized(values, shapes, fill, absent).node

            return Listed(place)
    return Tree(ListSpec, [column.single(i) for i in range(len(column.values))])
