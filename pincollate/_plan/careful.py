"""The careful planner: one field's values across the batch, validated value by value.

It plans what a cached plan cannot take at C speed (ragged tensors, lists of unequal
length, mixed dtypes, policies, absent keys) and gives every error its sample index
and key path. Its result is a planned node (:mod:`pincollate._plan.fill`) plus the extra outputs
(lengths, masks, offsets) a policy asks for beside the field: ``plan`` returns both,
and a parent mapping places the extras beside the field's key.

The walk mirrors ``default_collate``: mappings by key, namedtuples and sequences by
position (transposed; :mod:`pincollate._plan.containers`), per-sample lists of items
(:mod:`pincollate._plan.items`), leaves by type through the registry in :mod:`pincollate._types.leaves` (here). Where
``default_collate`` gives up it does not: tensors of unequal shape and lists of
unequal length come back as per-sample lists, each stacked where its parts agree.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch

from .._errors import format_path
from .._types.builtin import (
    NUMBER_TYPES,
    NUMBERS,
    builtin,
    describe_plain,
    describe_tensors,
    fits_float64,
    fits_int64,
    ints_fit_float64,
    number_dtype,
    numbers_tensor,
    tensor_refusal,
)
from .._types.kinds import DATACLASS, MAPPING, NAMEDTUPLE, SEQUENCE, is_namedtuple, is_sequence, kind_of
from .._types.leaves import LeafHandler, lookup, type_name
from .column import MAX_DEPTH, Column, plain_stack, stack_or_list
from .containers import ContainerWalk
from .fallback import Fallbacks
from .fill import Node, Segment, TensorNode, Value
from .items import Extras, Origins, Path, container_name, is_scalar
from .padding import Joined
from .patterns import Renames, Settings
from .policies import AsList, PerSample, Policy, Stack
from .recipe import array_column

if TYPE_CHECKING:
    from .patterns import FieldRules

__all__ = ["ITEMS_ROUTE", "LEAVES", "NUMBER_LISTS", "PACKED_ITEMS", "PER_SAMPLE", "Planner", "Route"]


class Route(NamedTuple):
    """How the walk took a field's column: the branch, and the policy it applied there.

    The one record of that choice: a part's recipe (:func:`~pincollate._plan.ragged.recipe_for`)
    is built for the route the walk took, never chosen again beside it.
    """

    kind: str
    policy: Policy | None


#: Tensors, arrays or numbers, stacked, listed or under ``policy`` (the ``ragged=`` one where it applies).
LEAVES = "leaves"
#: Token ids as Python lists, read as 1-D sequences by ``policy``.
NUMBER_LISTS = "number lists"
#: ``PerSample()``: one subtree per sample.
PER_SAMPLE = "per sample"
#: Per-sample lists of items: no policy, ``AsList()`` or ``Stack()`` on the lists.
ITEMS_ROUTE = "items"
#: Per-sample lists of items under a packing policy (``Concat``, ``Jagged``).
PACKED_ITEMS = "packed items"


class Planner:
    """Plans one field's column carefully. One per :class:`~pincollate.MMCollate`."""

    def __init__(self, settings: Settings):
        self.rules: FieldRules = settings.rules
        self.renames: Renames = settings.renames
        self.default: Policy | None = settings.default
        self.missing: bool = settings.missing
        self.items: bool = settings.items
        self.fallbacks: Fallbacks = settings.fallbacks

    def plan(self, values: Sequence[Any], path: Path, keyed: bool = False) -> tuple[Node, Extras]:
        """Plan the column ``values`` (one per sample) found at ``path`` (``keyed``: a mapping's field)."""
        return _Walk(self).plan(values, path, None, len(path), self.items, keyed)

    def column(self, values: Sequence[Any], path: Path) -> Column:
        """The walk's description of ``values``, leaves of the first value's kind (tensors, arrays, numbers).

        Raises what the walk raises of a value it refuses (a ``CollateError`` naming it).
        """
        handler = lookup(type(values[0]))
        assert handler is not None, "a column of leaves"
        return _Walk(self)._column(values, path, None, handler)

    def may_read_ragged_numbers(self, values: Sequence[Any], keyed: bool) -> bool:
        """Whether the walk may read a column, first seen as ``values``, as ``ragged=`` token ids in some batch.

        ``ragged=`` (a policy that reads lists of Python numbers as sequences: ``Pad``,
        ``Concat``, ``Jagged``) reads a mapping's field (``keyed``) of lists or tuples in every
        batch whether or not their lengths differ, never the batch's samples themselves nor
        their items. Where this batch's lists hold numbers in any form (numpy scalars, 0-d
        tensors), lists, or nothing, another batch of its structure may hold Python numbers
        there, which the plan's guards for those would take: a plan walks such a field for each
        batch, as a field with a rule of its own.
        """
        default = self.default
        if default is None or not default.numbers_as_sequence or not keyed:
            return False
        rows = [value for value in values if isinstance(value, (list, tuple)) and not is_namedtuple(value)]
        # Lists of tensors or arrays of one dimension or more, strings or mappings keep their plan:
        # its guards refuse a number where they stood.
        return bool(rows) and (not all(rows) or any(map(_may_stand_for_numbers, itertools.chain.from_iterable(rows))))

    def route(self, values: Sequence[Any], path: Path, keyed: bool = False) -> Route | None:
        """How the walk takes the column ``values`` at ``path``: what a part's recipe is built for.

        ``None`` where the walk takes it by no route a recipe has (a container, strings,
        a column that mixes tensors and arrays) or refuses it: every batch is then walked,
        which names the sample and key path.
        """
        walk = _Walk(self)
        walk.root = len(path)
        # Silent: the batch's own run (its generated function, or the walk) warns of a listed field.
        walk.fallbacks = _SILENT
        try:
            walk.plan(values, path, None, len(path), self.items, keyed)
        except Exception:  # refused (or a user's class failed): the walk of each batch says why
            return None
        return walk.route


class _Walk(ContainerWalk):
    """One column's walk; knows the containers open on the current path (cycles)."""

    def __init__(self, planner: Planner):
        self.rules = planner.rules
        self.renames = planner.renames
        self.default = planner.default
        self.missing = planner.missing
        self.fallbacks = planner.fallbacks
        self._open: dict[int, Path] = {}
        #: The depth whose branch is recorded in ``route`` (-1: none).
        self.root = -1
        self.route: Route | None = None

    def _took(self, depth: int, kind: str, policy: Policy | None) -> None:
        if depth == self.root:
            self.route = Route(kind, policy)

    # dispatch --------------------------------------------------------------------

    def plan(
        self, values: Sequence[Any], path: Path, origins: Origins, depth: int, items: bool, keyed: bool = False
    ) -> tuple[Node, Extras]:
        """Plan ``values`` at ``path``; ``keyed``: a mapping's field, the one place ``ragged=`` reads token ids."""
        if depth > MAX_DEPTH:
            raise self._error(
                f"nesting deeper than {MAX_DEPTH} levels: is the sample self-referencing?", 0, path, origins
            )
        policy = self.rules.lookup(path) if self.rules else None
        first = next((v for v in values if v is not None), None) if self.missing else values[0]
        handler = lookup(type(first))
        if handler is not None and (handler.is_tensor or (first is None and self.missing)):
            return self._leaves(values, path, origins, handler, policy, depth)
        # The field's own policy, else ragged= (as for a field of tensors) where it reads lists.
        reads = policy
        if policy is None and keyed and origins is None:  # a mapping's field of the batch's samples
            reads = self.default
        numbers = _numbers_read(values, reads, policy is not None)
        if numbers is None and policy is not None and policy.numbers_as_sequence and not policy.takes_items:
            # The field's own Pad on token ids (ragged= leaves other columns as default_collate takes them).
            self._refuse_other_than_number_lists(values, first, path, origins)
        if numbers is not None:
            # Token ids as Python lists (datasets, tokenizers, webdataset's json): each
            # sample's list is one 1-D sequence, of the dtype torch.tensor gives the lot.
            sequences = self._number_sequences(values, numbers, path, origins)
            planned = self._leaves(sequences, path, origins, lookup(torch.Tensor), reads, depth)  # type: ignore[arg-type]
            self._took(depth, NUMBER_LISTS, reads)  # over the leaves route _leaves took with the sequences
            return planned
        if isinstance(policy, PerSample) and (handler is None or not handler.is_tensor):
            # A whole subtree per sample, whatever it holds: lists of per-item dicts too.
            self._took(depth, PER_SAMPLE, policy)
            return self._per_sample(values, path, origins, depth), {}
        if policy is not None and is_sequence(first) and not is_namedtuple(first):
            if policy.takes_items:
                self._took(depth, PACKED_ITEMS, policy)
                return self._items_policy(values, path, origins, policy)
            self._took(depth, ITEMS_ROUTE, policy)
            return self._sequence_policy(values, path, origins, depth, policy), {}
        if handler is not None:
            if isinstance(policy, AsList):
                # Always a per-sample list; its values are checked as without a policy, so a tensor
                # after a None is named (never handed back as the sample's own object).
                return self._objects(list(values), path, origins, handler), {}
            if policy is not None:
                raise self._error(
                    f"{type(policy).__name__}() applies to tensors and lists of items, not to {handler.name} values"
                    f"{self._none_hint(first)}",
                    _position(values, first),
                    path,
                    origins,
                )
            return self._objects(values, path, origins, handler), {}
        container = self._container(first, items)
        if container is None:
            raise self._error(
                f"unsupported type {type_name(first)}: expected a tensor, numpy array, number, str, bytes, None, "
                "PIL image, mapping, sequence, namedtuple or dataclass (pincollate.register_container makes a class one)",
                _position(values, first),
                path,
                origins,
            )
        if isinstance(policy, PerSample):
            self._took(depth, PER_SAMPLE, policy)
            return self._per_sample(values, path, origins, depth), {}
        if policy is not None:
            raise self._error(
                f"{type(policy).__name__}() applies to tensors and lists of items, not to a {container_name(first)}",
                _position(values, first),
                path,
                origins,
            )
        seen = self._open.get(id(first))
        if seen is not None:
            raise self._error(
                f"the sample refers to itself: this object is also at {format_path(seen)}", 0, path, origins
            )
        if kind_of(first) is SEQUENCE:
            # Lists: the walk's items where their lengths differ (or always, sequences="items").
            self._took(depth, ITEMS_ROUTE, None)
        self._open[id(first)] = path
        try:
            return container(values, path, origins, depth, items), {}
        finally:
            del self._open[id(first)]

    def _none_hint(self, value: Any) -> str:
        """Where ``None`` is what does not fit, how to take it as an absent value."""
        return " (pass missing='none' to take None as an absent value)" if value is None and not self.missing else ""

    def _container(self, first: Any, items: bool) -> Callable[..., Node] | None:
        kind = kind_of(first)
        if kind is MAPPING:
            return self._mapping
        if kind is NAMEDTUPLE:
            return self._namedtuple
        if kind is DATACLASS:
            return self._dataclass
        if kind is SEQUENCE:
            return self._items if items else self._sequence
        if kind is not None:
            return self._registered
        return None

    # leaves ----------------------------------------------------------------------

    def _column(
        self,
        values: Sequence[Any],
        path: Path,
        origins: Origins,
        handler: LeafHandler,
        plain: tuple[list[torch.dtype], list[tuple[int, ...]]] | None = None,
    ) -> Column:
        """The column of ``values``, described; ``plain``: :func:`describe_plain`'s description, where the caller read it."""
        family = handler.family
        if builtin(torch.Tensor, handler):
            if plain is None:
                plain = _plain(values)  # plain tensors, described at C speed as one by one
            if plain is not None:  # every value present: lists of dtypes and shapes, no None
                column = Column(values, path, handler, cast(Any, plain[0]), cast(Any, plain[1]), None, origins)
                column.plain = True
                return column
        classes = set(map(type, values))
        cls = next(iter(classes)) if len(classes) == 1 else None
        number = NUMBERS.get(cls) if cls is not None and builtin(cls, handler) else None
        if number is not None:
            # One exact Python number type: each described alike (a number is never refused).
            count = len(values)
            column = Column(values, path, handler, [number] * count, [()] * count, None, origins)
        else:
            column = self._described(values, path, origins, handler)
        if family == "number":
            try:
                column.dtype = number_dtype(values)
            except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
                failed: Exception | None = exc
            else:
                failed = None
            if failed is not None or not (
                number is not None or column.dtype.is_floating_point or column.dtype.is_complex
            ):
                # An int beyond int64 is refused where the column is integer, as torch does;
                # in a float column it is a float, as default_collate makes it. (Numbers of one
                # exact class that number_dtype took fit: it read their least and greatest.)
                for i, value in enumerate(values):
                    if isinstance(value, int) and not fits_int64(value):
                        raise self._error(f"int {value} does not fit int64", i, path, origins)
            if failed is not None:
                refused = _first_refused(values, number_dtype, _NUMBER_ERRORS)
                raise self._error(f"these numbers do not fit one tensor: {failed}", refused, path, origins) from failed
            if (
                (column.dtype.is_floating_point or column.dtype.is_complex)
                and number is not torch.float64
                and not ints_fit_float64(values)
            ):
                # An int among floats may be too large for them (a column of floats alone never is).
                for i, value in enumerate(values):
                    if not fits_float64(value):
                        raise self._error(
                            f"an int of {value.bit_length()} bits is too large for {column.dtype}", i, path, origins
                        )
        return column

    def _described(self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler) -> Column:
        """Each value described by its leaf handler, which names a value it refuses."""
        family = handler.family
        dtypes: list[torch.dtype | None] = []
        shapes: list[tuple[int, ...] | None] = []
        metas: list[Hashable] | None = [] if handler.meta is not None else None
        unstackable: tuple[int, LeafHandler] | None = None
        first_type = None
        for i, value in enumerate(values):
            if value is None and self.missing:
                dtypes.append(None)
                shapes.append(None)
                if metas is not None:
                    metas.append(None)
                continue
            h = lookup(type(value))
            if h is None or h.family != family:
                expected = handler.name if family != "number" else "a number"
                raise self._error(
                    f"expected {expected}, got {type_name(value)}{self._none_hint(value)}", i, path, origins
                )
            if first_type is None:
                first_type = type(value)
                handler = h
            elif not h.stackable and handler.stackable and unstackable is None:
                unstackable = (i, h)  # boxes after a plain tensor: the column never stacks
            if metas is None and h.meta is not None:
                metas = [None] * len(dtypes)  # metadata after values without any: they differ
            sample, where = self._blame(i, path, origins)
            dtype, shape = h.describe(value, sample, where)  # type: ignore[misc]
            dtypes.append(dtype)
            shapes.append(tuple(shape))  # a handler may give a list
            if metas is not None:
                metas.append(h.meta(value) if h.meta is not None else None)
        column = Column(values, path, handler, dtypes, shapes, metas, origins)
        column.unstackable = unstackable
        return column

    def _leaves(
        self,
        values: Sequence[Any],
        path: Path,
        origins: Origins,
        handler: LeafHandler,
        policy: Policy | None,
        depth: int,
    ) -> tuple[Node, Extras]:
        if not handler.is_tensor:
            # Every value is None (missing="none"): a packing or padding policy gives its empty result.
            if policy is not None and policy.empty_when_absent:
                return policy.plan(Column.empty(len(values), path), self.renames.key(path))
            if isinstance(policy, Stack):  # as where one value of the batch is missing
                raise self._error("Stack() got a missing value", 0, path, origins)
            return Value([None] * len(values)), {}
        if builtin(np.ndarray, handler):
            # Numpy arrays of one dtype that torch takes are tensors over their own memory (read-only
            # ones copied once), as the compiled plan takes them: described and copied as tensors,
            # at C speed. Anything else is described array by array, which names what is refused.
            tensors = array_column(values)
            if tensors is not None:
                values, handler = tensors, lookup(torch.Tensor)  # type: ignore[assignment]
        plain = _plain(values) if builtin(torch.Tensor, handler) else None
        if plain is not None and policy is None and self.default is None:
            # Plain tensors that agree, without a policy: stacked, the column read once at C speed.
            stacked = plain_stack(values, handler, plain)
            if stacked is not None:
                self._took(depth, LEAVES, None)
                return stacked, {}
        if policy is None and _mixed_families(values):
            return self._as_default_collate(values, path, origins), {}
        column = self._column(values, path, origins, handler, plain)
        if policy is None and handler.family != "number" and any(column.known.values()):
            # ragged= is for fields that can be ragged: numbers and 0-d values just stack.
            policy = self.default
        self._took(depth, LEAVES, policy)
        if policy is None:
            node = stack_or_list(column)
            if type(node) is not TensorNode and column.stackable:
                self.fallbacks.report(path, ((column.origin(i)[0], shape) for i, shape in enumerate(column.shapes)))
            return node, {}
        return policy.plan(column, self.renames.key(path))

    def _refuse_other_than_number_lists(self, values: Sequence[Any], first: Any, path: Path, origins: Origins) -> None:
        """Where the column's first value is token ids (a list of numbers), name the first value that is no list."""
        if not (isinstance(first, (list, tuple)) and not is_namedtuple(first) and _number_lists([first]) is not None):
            return
        for i, value in enumerate(values):
            if value is not None and not (isinstance(value, (list, tuple)) and not is_namedtuple(value)):
                j = self._blame(_position(values, first), path, origins)[0]
                raise self._error(
                    f"expected a list of numbers (token ids), as sample {j} has, got {type_name(value)}",
                    i,
                    path,
                    origins,
                )

    def _number_sequences(
        self, values: Sequence[Any], numbers: tuple[list[Any], set[type]], path: Path, origins: Origins
    ) -> list[Any]:
        """Each present value's numbers a 1-D view of one tensor of them all (``numbers``: them all, and their classes)."""
        try:
            # One tensor of all the numbers: the dtype torch.tensor gives the lot, each sample a view.
            flat = numbers_tensor(*numbers)
        except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
            refused = (OverflowError, RuntimeError, TypeError, ValueError)
            i = _first_refused(values, _numbers_of_lists, refused)
            # torch says "Overflow when unpacking long long" of an int past int64: say which.
            bad = [] if i is None else [x for x in values[i] if type(x) is int and not fits_int64(x)]
            reason = f"int {bad[0]} does not fit int64" if bad else str(exc)
            raise self._error(f"these numbers do not fit one tensor: {reason}", i, path, origins) from exc
        rows = iter(torch.split(flat, [len(v) for v in values if v is not None]))
        return [None if v is None else next(rows) for v in values]

    def _as_default_collate(self, values: Sequence[Any], path: Path, origins: Origins) -> Node:
        """A column that mixes tensors, arrays and numbers: what ``default_collate`` makes of it.

        Its promotion rules for such columns (``torch.as_tensor`` of arrays, ``torch.tensor``
        of numbers and 0-d tensors) and the class of its result are kept exactly by asking
        it, then copying its result into the batch's buffer: one extra copy, for these
        columns only.
        """
        for at, v in enumerate(values):
            refusal = tensor_refusal(v) if isinstance(v, torch.Tensor) else None
            if refusal is not None:  # a meta tensor stacks: its refusal would fall on the value after it
                raise self._error(refusal, at, path, origins)
        try:
            value = _as_default_collate(values)
        except (RuntimeError, TypeError, ValueError) as exc:
            i = _first_refused(values, _as_default_collate, (RuntimeError, TypeError, ValueError))
            bad = None if i is None else values[i]
            # torch says "Overflow when unpacking long long" of an int past int64: say which.
            reason = f"int {bad} does not fit int64" if type(bad) is int and not fits_int64(bad) else str(exc)
            raise self._error(f"these values do not stack together: {reason}", i, path, origins) from exc
        shape = tuple(value.shape)
        # Its class too: a subclass beside arrays or numbers comes back as torch.stack gives it.
        handler = lookup(type(value))
        wrap = handler.wrap(value) if handler is not None and handler.wrap is not None else None
        return TensorNode(value.dtype, shape, [Segment(0, shape, _copy_into, value)], wrap)

    def _objects(self, values: Sequence[Any], path: Path, origins: Origins, handler: LeafHandler) -> Node:
        if handler.family in ("str", "bytes"):
            # default_collate returns a column that starts with a string as it is.
            return Value(values)
        for i, value in enumerate(values):
            h = lookup(type(value))
            if h is not handler and not (value is None and self.missing):
                hint = self._none_hint(None if handler.family == "None" else value)
                raise self._error(f"expected {handler.name}, got {type_name(value)}{hint}", i, path, origins)
        # default_collate returns the batch's own list of strings.
        return Value(values)


def _position(values: Sequence[Any], value: Any) -> int:
    """Where ``value`` (the column's first present value, which the walk judged it by) lies in ``values``."""
    return next(i for i, v in enumerate(values) if v is value)


class _Silent(Fallbacks):
    """Fallbacks that report nothing: a route's walk only looks."""

    def report(self, path: Path, pairs: Iterable[tuple[int, Any]], items: bool = False) -> None:
        return None


_SILENT = _Silent()

_TENSOR_LIKE = frozenset(("tensor", "ndarray", "number"))


def _mixed_families(values: Sequence[Any]) -> bool:
    """Whether tensors, arrays and numbers are mixed in one column.

    Lists (and tuples) of numbers after a numeric array count too: ``default_collate`` makes
    each value of a column whose first value is an array a tensor, lists included.
    """
    if len(set(map(type, values))) == 1:
        return False  # one class, one family
    first = next((value for value in values if value is not None), None)
    arrays_first = isinstance(first, np.ndarray) and first.dtype.kind in "biufc"
    families = set()
    for value in values:
        if value is not None:
            if arrays_first and isinstance(value, (list, tuple)):  # a namedtuple too
                families.add("sequence")
                continue
            handler = lookup(type(value))
            if handler is None or handler.family not in _TENSOR_LIKE:
                return False
            families.add(handler.family)
    return len(families) > 1


#: isinstance's form of the Python number types (subclasses too: the careful planner describes them).
_NUMBERS = tuple(NUMBER_TYPES)


def _may_stand_for_numbers(item: Any) -> bool:
    """Whether a plan's guard for ``item``, in a list, could take a Python number in its place."""
    return isinstance(item, (list, tuple)) or is_scalar(item)


def _numbers_read(values: Sequence[Any], policy: Policy | None, named: bool) -> tuple[list[Any], set[type]] | None:
    """:func:`_number_lists` of ``values`` where ``policy`` reads lists of numbers as 1-D sequences; else ``None``.

    ``named``: the policy is the field's own, not ``ragged=``. Lists that are all empty are
    sequences of no token unless the policy may read them as lists of (no) items: a field's
    own ``Concat`` or ``Jagged`` (``ragged=`` never joins items across samples).
    """
    if policy is None or not policy.numbers_as_sequence:
        return None
    return _number_lists(values, empty=not (named and policy.takes_items))


def _number_lists(values: Sequence[Any], empty: bool = False) -> tuple[list[Any], set[type]] | None:
    """Every number of ``values`` and their classes, where each present value is a list (or tuple)
    of Python numbers, one number at least in all; else ``None``.

    ``empty``: lists that are all empty count too (no numbers): under a policy that takes no
    items (``Pad``), empty lists can only be sequences of no token.
    """
    present = [value for value in values if value is not None]
    if not all(isinstance(value, (list, tuple)) and not is_namedtuple(value) for value in present):
        return None
    numbers = list(itertools.chain.from_iterable(present))
    classes = set(map(type, numbers))  # exact number types at C speed; subclasses (an IntEnum) one by one
    if not numbers:
        return (numbers, classes) if empty and present else None
    if not NUMBER_TYPES.issuperset(classes) and not all(isinstance(x, _NUMBERS) for x in numbers):
        return None
    return numbers, classes


def _as_default_collate(values: Sequence[Any]) -> torch.Tensor:
    """What ``default_collate`` makes of a column that mixes tensors, arrays and numbers, in host memory."""
    from torch.utils.data import default_collate

    try:
        # On the host, whatever the default device (its factories would follow that).
        with warnings.catch_warnings(), torch.device("cpu"):
            warnings.simplefilter("ignore")  # its own performance hint for lists of arrays
            value: torch.Tensor = default_collate(list(values))
            return value
    except (AttributeError, RuntimeError, TypeError, ValueError):
        # It gives up where a tensor comes first (in a worker, asking an array for its numel):
        # each value as a tensor, then stacked.
        return torch.stack([torch.as_tensor(v, device="cpu") for v in values])


#: What converting a column of numbers raises where they do not fit one tensor.
_NUMBER_ERRORS = (OverflowError, RuntimeError, TypeError, ValueError)


def _numbers_of_lists(values: Sequence[Any]) -> torch.Tensor:
    """One tensor of every number in ``values`` (lists of numbers, or ``None``), as the walk makes it."""
    return numbers_tensor(list(itertools.chain.from_iterable(v for v in values if v is not None)))


def _first_refused(
    values: Sequence[Any], convert: Callable[[Sequence[Any]], Any], errors: tuple[type[Exception], ...]
) -> int | None:
    """The first position of ``values`` that ``convert`` refuses with the values before it (``None``: it takes them all).

    A prefix that fails keeps failing as it grows (the value it refuses stays in it), so the
    shortest is found by halving: a few conversions, for a batch that fails anyway.

    Examples:
        >>> _first_refused([1, 2, 2**70, 3], torch.tensor, (RuntimeError, ValueError))
        2
    """

    def fails(count: int) -> bool:
        try:
            convert(values[:count])
        except errors:
            return True
        except Exception:  # a prefix it cannot read at all (absent values only): not the refusal
            return False
        return False

    if not values or not fails(len(values)):
        return None
    low, high = 1, len(values)
    while low < high:
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle + 1
    return low - 1


def _copy_into(region: torch.Tensor, value: torch.Tensor) -> None:
    region.copy_(value)


def _plain(values: Sequence[Any]) -> tuple[list[torch.dtype], list[tuple[int, ...]]] | None:
    """:func:`~pincollate._types.builtin.describe_plain`'s description; rows read from Arrow (joined already,
    :class:`~pincollate._plan.padding.Joined`) described from their one tensor and their lengths."""
    if type(values) is not Joined:
        return describe_plain(values)
    described = describe_tensors([values.flat])  # its memory and dtype, as each row's
    if described is None:
        return None
    dtype, trailing = described[0][0], described[1][0][1:]
    return [dtype] * len(values), [(length, *trailing) for length in values.lengths]
