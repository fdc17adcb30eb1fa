"""The compiled plan: one generated Python function per cached plan, run for every later batch.

The template (:mod:`pincollate._plan.template`) plans a structure into a tree of typed nodes
(:mod:`pincollate._plan.ops` for leaves, :mod:`pincollate._plan.tree_ops` for containers and
parts) that holds no sample values. :func:`compile_whole` and :func:`compile_parts` turn that
tree into one straight-line function that makes the whole batch: for each field, in the order
of the tree, the gather (one ``itemgetter`` call per sample for a mapping's fields), the guards
at C speed (exact classes, dtypes, sample 0's shape, keys, lengths), then one allocation, each
copy as a call of its own, and the batch built. Every guard that fails raises
:class:`~pincollate._plan.fill.Mismatch` with the key paths the tree names, as the nodes
themselves would; the cache then plans the batch again, carefully where it failed. A part's
guard that fails sends the batch to the plan's function that walks every part (the careful
walk, :meth:`~pincollate._plan.tree_ops.CarefulOp.run`), which takes it or names the sample.

As in attrs' and cattrs' generated code, nothing of the plan is spliced into the source as
text: keys, classes, dtypes and nodes are read from a constant table (``k0``, ``k1``, ...),
and each field's group of lines starts with its key path as a comment. The source is
registered in :mod:`linecache` under a unique file name, so a traceback or a debugger shows
the line that failed, and :attr:`CompiledPlan.source` keeps it for review.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from .._batch.batch import Batch, BatchList, carrier_class, carries, make_batch
from .._batch.compiled import Parts, expression, inlines_parts
from .._batch.layout import Layout, PartSpec, Spec, TensorSpec
from .._batch.list_specs import grouped_units, scalar_items, split_views, with_absent, wrapped
from .._batch.specs import DataclassSpec, MappingSpec, NamedTupleSpec, SequenceSpec, jagged
from .._batch.views import ALIGN, Bulk, Views, numpy_dtype, pitch
from .._errors import ITEMS, format_path
from .._generate import Writer, text
from .._memory.arena import allocate
from .._types.build import make_mapping, make_sequence, new_dataclass
from .._types.builtin import (
    KEPT_VALUES,
    NARROW,
    TENSOR_DTYPE,
    TENSOR_SHAPE,
    concat_tensors,
    fill_numbers,
    plain_memory,
    stack_tensors,
)
from .._types.kinds import LISTS
from .fill import Fill, Mismatch
from .listed import FLAT, ItemsRecipe, ListRecipe, NumberItems, aligned_pieces, gaps_to, number_items, zero_rows
from .ops import (
    FIRST,
    HAS_TORCH_FUNCTION,
    PLAIN,
    BlockOp,
    NumbersOp,
    Op,
    StackOp,
    ValueOp,
    fill_block,
    fill_one_field,
)
from .packed import ConcatRecipe, none_as_empty
from .packing import INT32_MAX, offsets, spread
from .padding import Joined, cut, nonempty, pad_1d, valid_1d, valid_into
from .ragged import MixedNumbers, PadRecipe
from .recipe import Arrays, NumberLists, array_tensors, holds_none, number_tensor
from .rows import Arrays as RowArrays
from .rows import Groups, Numbers, PerSampleRecipe, Rows, Tensors, Values, fill_spaced
from .sized import ListedParts, SizedLayouts, merged, with_regions
from .tree_ops import CarefulOp, DataclassOp, MappingOp, RegisteredOp, SequenceOp

__all__ = [
    "CompiledPlan",
    "builds_inline",
    "compile_parts",
    "compile_whole",
    "is_listed",
    "is_sized",
]

Path = tuple[Hashable, ...]


#: What every generated function may name besides its constants.
_GLOBALS: dict[str, Any] = {
    "Mismatch": Mismatch,
    "HAS_TORCH_FUNCTION": HAS_TORCH_FUNCTION,
    "PLAIN": PLAIN,
    "TENSOR_DTYPE": TENSOR_DTYPE,
    "TENSOR_SHAPE": TENSOR_SHAPE,
    "fill_block": fill_block,
    "fill_one_field": fill_one_field,
    "chain": itertools.chain.from_iterable,
    "islice": itertools.islice,
    "LISTS": LISTS,
    "FIRST": FIRST,
    "KEYS": operator.methodcaller("keys"),
    "errstate": np.errstate,
    "NARROW": NARROW,
}


#: What a whole batch's function names besides those.
_WHOLE: dict[str, Any] = {
    "allocate": allocate,
    "Views": Views,
    "make_batch": make_batch,
    "Batch": Batch,
    "BatchList": BatchList,
    "set_attribute": object.__setattr__,
    "CARRIED": "_pincollate",  # the attribute a batch carries its layout, buffer and values in
    "PAGEABLE": "plain",  # the buffer kind of plain host memory
    "stack": torch.stack,
    "is_grad_enabled": torch.is_grad_enabled,
    "set_grad_enabled": torch._C._set_grad_enabled,
    "make_mapping": make_mapping,
    "make_sequence": make_sequence,
    "new_dataclass": new_dataclass,
    # What the parts of sized and listed plans name.
    "pad_1d": pad_1d,
    "cut": cut,
    "valid_1d": valid_1d,
    "valid_into": valid_into,
    "nonempty": nonempty,
    "number_tensor": number_tensor,
    "Joined": Joined,
    "number_items": number_items,
    "jagged": jagged,
    "spread": spread,
    "concat_offsets": offsets,
    "cat": torch.cat,
    "INT32_MAX": INT32_MAX,
    "Layout": Layout,
    "ALIGN": ALIGN,
    "Fill": Fill,
    "merged": merged,
    "carries": carries,
    "repeat": itertools.repeat,
    "scalar_items": scalar_items,
    "array_tensors": array_tensors,
    "split_views": split_views,
    "grouped_units": grouped_units,
    "with_absent": with_absent,
    "wrapped": wrapped,
    "DisableTorchFunctionSubclass": torch._C.DisableTorchFunctionSubclass,
    "KEPT_VALUES": KEPT_VALUES,
    "fill_spaced": fill_spaced,
    "pitch": pitch,
    "plain_memory": plain_memory,
    "prod": math.prod,
    "gaps_to": gaps_to,
    "holds_none": holds_none,
    "aligned_pieces": aligned_pieces,
    "FLAT": FLAT,
}


class CompiledPlan:
    """A plan's generated function and the source it was compiled from.

    ``run(samples, kind, slots, pin_slots, pin, into=None)`` makes the whole batch (:func:`compile_whole`,
    :func:`compile_parts`), or its layout alone with ``kind`` ``None``; it raises
    :class:`~pincollate._plan.fill.Mismatch` where the batch does not fit the plan.
    """

    __slots__ = ("filename", "run", "source")

    def __init__(self, run: Callable[..., Any], source: str, filename: str):
        self.run: Callable[..., Any] = run
        self.source: str = source
        self.filename: str = filename


class _PlanWriter(Writer):
    """A plan's lines, and the copies its function makes (``(fill, spec, payload local, owner)``, in order)."""

    def __init__(self) -> None:
        super().__init__()
        #: Each copy: its fill, its region (a spec, or the local that holds it), payload and owner.
        self.copies: list[tuple[Any, Any, str, Op]] = []
        #: The parts read so far (a sized or listed plan's): the node, its key and the locals its copies read.
        self.parts_read: list[tuple[CarefulOp, str, dict[str, Any]]] = []
        #: A listed plan's PerSample() parts, by index: what each is made of (:data:`Member`), each
        #: list by its place in ``parts_read``.
        self.rows: dict[int, Member] = {}
        #: Every part walked for each batch (the function a plan's guard sends a batch to).
        self.walk_all = False
        self.nvalues = 0
        self.size = 0

    def copy(self, depth: int, fill: Any, spec: TensorSpec, payload: str, owner: Op) -> None:
        self.copies.append((fill, spec, payload, owner))

    def value(self, depth: int, index: int, column: str) -> None:
        self.line(depth, f"values[{index}] = {column}")


def compile_whole(op: Op, layout: Layout, size: int, nvalues: int, description: str = "plan") -> CompiledPlan:
    """The function that makes a whole batch of a plan without parts, ``layout``'s, from its samples.

    ``run(samples, kind, slots, pin_slots, pin, into=None)`` checks the samples (a batch of
    ``size``), then takes the buffer (:func:`~pincollate._memory.arena.allocate` with the
    other arguments; ``into``, a buffer of the caller's, where given: nothing is allocated),
    makes every region at once, runs each copy as a call of its own and builds
    the batch: no task list, no per-task lookups. With ``kind`` ``None`` it only checks and
    returns the layout. A copy that fails raises :class:`~pincollate._plan.fill.Mismatch` naming
    what its node blames.
    """
    w = _PlanWriter()
    _checks(w, op, size, nvalues)
    copies = w.copies
    bulk = with_regions(layout.bulk(), [spec for _, spec, _, _ in copies])
    w.line(1, f"layout = {w.const(layout)}")
    w.line(1, "if kind is None:  # checked only")
    w.line(2, "return layout")
    # A plain buffer is pageable host memory: its tensors are carved without asking about pins.
    _buffer(w, f"{layout.nbytes}", f"Views(buffer, values, (), {w.const(bulk)}, kind == PAGEABLE)")
    if copies:
        _copies(w, copies, size, None)
    if not copies:
        w.line(1, "made = views.made")
    _output(w, layout.root, frozenset(bulk[0]))
    return _compiled(w, description, {})


def compile_parts(
    op: Op,
    template: Spec,
    nbytes: int,
    nparts: int,
    size: int,
    nvalues: int,
    bulk: Bulk,
    slow: Callable[..., Any] | None,
    description: str = "plan",
    planner: Any = None,
    walk_all: bool = False,
) -> tuple[CompiledPlan, SizedLayouts | None]:
    """The function that makes a whole batch of a plan with parts (sized, listed or walked).

    As :func:`compile_whole`'s, with each part read inline by its node's rules (:func:`is_sized`,
    :func:`is_listed`): its guards (one class, dtype and rank for the column, at C speed), then

    - a *sized* part (``Pad``, ``Concat``, ``Jagged`` of plain tensors, of numpy arrays, of
      token ids as Python lists, of item lists some of which may be absent; numbers of several
      types) its sizes by the policy's size rule (lengths and padded size; total rows, trailing
      sizes and count; a dtype): the sizes of all of them pick the batch's layout from the
      returned :class:`~pincollate._plan.sized.SizedLayouts` (``None`` where no part is sized);
    - a *listed* part (a list of tensors, of a subclass or numpy arrays too, with or without
      absent values; ``PerSample()`` dicts of them) its values' rows by the list's size rule
      (:meth:`~pincollate._plan.listed.ListRecipe.geometry`: rows of one width, or each value
      flat): each list is placed after the sized layout by the function itself (each value
      starting aligned, then the next list), one ``torch.cat`` fills it and each value is a
      view of its column (as :class:`~pincollate._batch.list_specs.SplitSpec` builds it); the
      batch's layout then makes its parts only when asked
      (:class:`~pincollate._plan.sized.ListedParts`), whose deferred parts build what the
      function does not build itself (:func:`builds_inline`, :func:`~pincollate._batch.compiled.inlines_parts`).

    - a *walked* part (one no recipe describes; every part where ``walk_all``): walked by the
      careful planner (:meth:`~pincollate._plan.tree_ops.CarefulOp.run`, ``planner``'s) into a
      :class:`~pincollate._plan.fill.Fill` that places it after the lists, its values after the
      plan's; its copies run after the function's own, and the layout (made at once) builds
      the batch.

    Then it copies and builds as for a plan without parts. A column its guards do not
    describe (a missing value, another dtype) is no mismatch of the plan: the batch goes to
    ``slow(samples, kind, slots, pin_slots, pin, into)`` (the plan's function with ``walk_all``,
    whose careful walk of each part takes it, or names the sample).
    """
    w = _PlanWriter()
    w.walk_all = walk_all
    _checks(w, op, size, nvalues)
    copies = w.copies
    fixed = len(copies)
    read = w.parts_read
    listed_at = [j for j, (_, key, _) in enumerate(read) if key == _LISTED]
    walked = [(part, found["column"]) for part, key, found in read if key == _WALKED]
    where = {j: n for n, j in enumerate(listed_at)}  # a list's place among the lists
    sized = None
    if len(listed_at) + len(walked) < len(read):
        parts = [(part.index, _placing(part.recipe)) for part, key, _ in read if key not in (_LISTED, _WALKED)]
        sized = SizedLayouts(template, nbytes, nparts, size, bulk, [spec for _, spec, _, _ in copies], parts)
        keys = ", ".join(key for _, key, _ in read if key not in (_LISTED, _WALKED))
        # The layouts seen, read as a dict first: a call fewer for every batch of known sizes.
        w.line(1, f"sized = {w.const(sized.kept)}.get(({keys},))")
        w.line(1, "if sized is None:")
        w.line(2, f"sized = {w.const(sized)}.get(({keys},))")
        w.line(1, "layout, bulk, specs, ids = sized")
    end = "layout.nbytes" if sized is not None else w.const(nbytes)
    # The lists, each after the one before it (after the sized layout), each starting aligned.
    units = [(read[j][2]["recipe"].dtype, *_list_kind(read[j][2])) for j in listed_at]
    composition: dict[int, Any] = {}
    for j in listed_at:
        part, _, found = read[j]
        if found["group"] is None:
            composition[part.index] = where[j]
    for index, member in w.rows.items():
        composition[index] = _placed_member(member, where)
    listed = ListedParts(nparts, units, composition)
    geometry, shapes, offsets, dtypes, ids = [], [], [], [], []
    bulk_at: list[int] = []  # the lists whose regions are made at once: those of a dtype numpy has
    for n, j in enumerate(listed_at):
        found = read[j][2]
        start, after = w.local("o"), w.local("e")
        w.line(1, f"{start} = {end}")
        w.line(1, f"{after} = ({start} + {found['total']} * {found['row']} + ALIGN - 1) // ALIGN * ALIGN")
        end = after
        shape = f"({found['total']},)" if found["trailing"] == "()" else f"({found['total']}, *{found['trailing']})"
        # What else the list's spec needs: absent positions, wraps, the units' shapes and groups.
        more = "".join(f", {local}" for _, local in found["extras"])
        geometry.append(f"{found['split']}, {found['trailing']}, {start}{more}")
        shapes.append(shape)
        offsets.append(start)
        as_numpy = numpy_dtype(units[n][0])
        dtypes.append(w.const(as_numpy))
        ids.append(str(-1 - n))  # no object's id: the lists' regions in ``made``
        if as_numpy is not None:  # bfloat16 (VLM pixels): made over the buffer as its own
            bulk_at.append(n)
    # Each value's count of items, for the PerSample() parts' lists, after the lists', in their order.
    geometry += [counts for member in w.rows.values() for counts in _counts(member)]
    lists = bool(listed_at or w.rows)  # listed parts: lists, or PerSample() dicts of strings alone
    arguments = "".join(f"{each}, " for each in geometry)  # a tuple, of none where no key holds a list
    root, root_bulk = (w.const(template), w.const(bulk)) if walked or lists else ("", "")
    if walked:
        # The parts nothing reads at C speed, walked for this batch and placed after the others
        # (their values after the plan's); the layout is made at once with their parts.
        w.line(1, f"walk = Fill({w.const(planner)}, {nparts}, {end})")
        w.line(1, "walk.values = values")
        for part, column in walked:
            w.line(1, f"{w.const(part)}.run({column}, walk)")
        end = "walk.offset"
        merged = f"merged({'layout.parts' if sized is not None else 'None'}, walk.parts)"
        if lists:
            merged = f"{w.const(listed.over)}({merged}, {arguments})"
        w.line(1, f"layout = Layout({root}, {end}, {merged}, {root_bulk})")
        if sized is None:
            w.line(1, f"bulk = {root_bulk}")
    elif lists:
        if sized is None:
            deferred = f"({w.const(listed.make)}, ({arguments}))"
        else:  # the sized parts are the sized layout's
            deferred = f"({w.const(listed.over)}, (layout.parts, {arguments}))"
        w.line(1, f"layout = Layout({root}, {end}, None, {root_bulk}, {deferred})")
    w.line(1, "if kind is None:  # checked only")
    w.line(2, "return layout")
    if type(template) is PartSpec:  # the samples are the part: a batch that is no carrier takes no ring slot
        w.line(1, "if not carries(layout):")
        w.line(2, "slots, pin = 0, None")
    # The plan's fixed tensors, the sized parts' and the lists' regions, made at once.
    if not lists:
        _buffer(w, "layout.nbytes", "Views(buffer, values, layout.parts, bulk, kind == PAGEABLE)")
    else:
        made_with = (
            [f"*{w.const(each)}" for each in with_regions(bulk, [spec for _, spec, _, _ in copies])]
            if sized is None
            else [f"*bulk[{k}]" for k in range(4)]
        )
        made_at_once = ", ".join(
            f"({known}, {', '.join(more[n] for n in bulk_at)})"
            for known, more in zip(made_with, (ids, dtypes, shapes, offsets), strict=True)
        )
        _buffer(w, end, f"Views(buffer, values, (), ({made_at_once}), kind == PAGEABLE)")
    w.line(1, "made = views.made")
    # Each part's tensors: a sized part's in the sized layout's order (the values, the lengths,
    # the mask; a Jagged part's offsets), a list's region.
    expressions: Parts = {}
    at = 0
    items: dict[int, str] = {}
    for j, (part, key, found) in enumerate(read):
        if key == _WALKED:
            continue  # copied by the walk's fill, built by the layout
        if j in where:
            n = where[j]
            region = w.local("x")
            # Every value empty: a region of its own without an address (Views.tensor), which no
            # other tensor of another dtype shares (torch.save refuses such a pair).
            w.line(
                1,
                f"{region} = made[{ids[n]}] if {found['total']} and {ids[n]} in made else "
                f"views.tensor({w.const(units[n][0])}, {shapes[n]}, {offsets[n]})",
            )
            if "numbers" in found:
                copies.append((fill_spaced, region, found["column"], part))
            else:
                copies.append((concat_tensors, region, found["pieces"], part))
            found["region"] = region
            items[n] = w.local("items")
            continue
        recipe = _placing(part.recipe)
        jagged = type(recipe) is ConcatRecipe and recipe.jagged
        names = [w.local("p")] + ([w.local("p")] if jagged else [])  # Jagged: its values, then its offsets
        extras = []
        for name in recipe.extras():
            names.append(w.local("p"))
            extras.append((name, names[-1]))
        for k, local in enumerate(names):
            w.line(1, f"{local} = made[ids[{at + k}]] if ids[{at + k}] in made else specs[{at + k}].region(views)")
        at += len(names)
        output = names[0]
        if jagged:  # one nested tensor over the values and offsets, as JaggedSpec builds it
            output = f"jagged({names[0]}, {names[1]}, *{found['spread']})"
        expressions[part.index] = (output, tuple(extras))
        if type(recipe) is PadRecipe:
            _pad_copies(w, part, recipe, names, found, copies)
        elif type(recipe) is MixedNumbers:
            copies.append((fill_numbers, names[0], found["column"], part))
        else:
            _concat_copies(w, part, names, found, copies)
    _copies(w, copies, size, fixed)
    if walked:
        w.line(1, "walk.execute(buffer, kind == PAGEABLE)")
    # Each value of a list a view of its column: not an autograd view, so each keeps a version counter of its own.
    lines = []
    for n, j in enumerate(listed_at):
        found = read[j][2]
        if "numbers" in found:  # a 0-d tensor each
            lines.append(f"{items[n]} = scalar_items({found['region']}, {found['count']}, {found['numbers'].step})")
            continue
        named = dict(found["extras"])
        if "units" in named:  # one tensor of all the items, or each sample's stack of items, or its items
            units, groups, stacked = named["units"], named["groups"], named["stacked"]
            lines.append(
                f"{items[n]} = {found['region']}.view({stacked}) if {stacked} is not None else "
                f"grouped_units(split_views({found['region']}, {found['split']}, {units}), {groups})"
            )
            continue
        made = f"list({found['region']}.unsafe_split_with_sizes({found['split']})[0::2])"
        if "shaped" in named:  # values that lie flat: each viewed back as its shape
            shaped = named["shaped"]
            made = f"{made} if {shaped} is None else split_views({found['region']}, {found['split']}, {shaped})"
        if "wraps" in named:  # each value as its class (a box with its format and canvas size)
            made = f"wrapped({made}, {named['wraps']})"
        if "stacked" in named:  # one tensor where every value is there and of one shape
            stacked, view = named["stacked"], f"{found['region']}.view({named['stacked']})"
            if "wraps" in named:  # a subclass's stack keeps its class, as torch.stack gives it
                wraps = named["wraps"]
                view = f"{view} if {wraps} is None else {wraps}[0]({view})"
            made = f"({view}) if {stacked} is not None else {made}"
        lines.append(f"{items[n]} = {made}")
        if "absent" in named:
            lines.append(f"{items[n]} = with_absent({items[n]}, {named['absent']})")
    for index, made_of in composition.items():
        if type(made_of) is int:
            expressions[index] = (items[made_of], ())
            continue
        expressions[index] = (_built_member(w, w.rows[index], where, items, lines), ())
    _output(w, template, frozenset(bulk[0]), expressions, lines, inline=not walked)
    return _compiled(w, description, {"slow": slow}), sized


def _placed_member(member: Member, where: dict[int, int]) -> Member:
    """``member`` as :class:`~pincollate._plan.sized.ListedParts` takes it: each list by its place among the lists."""
    tag = member[0]
    if tag == "list":
        return ("list", where[member[1]])
    if tag == "rows":
        return ("rows", member[1], tuple(_placed_member(inner, where) for inner in member[2]), member[3])
    if tag == "groups":
        return ("groups", _placed_member(member[1], where))
    return member


def _counts(member: Member) -> list[str]:
    """The locals of each value's count of items in ``member``, in the order the layout reads them (depth first)."""
    if member[0] == "rows":
        return [counts for inner in member[2] for counts in _counts(inner)]
    if member[0] == "groups":
        return [member[2], *_counts(member[1])]
    return []


def _built_member(
    w: _PlanWriter, member: Member, where: dict[int, int], items: dict[int, str], lines: list[str]
) -> str:
    """The lines that build ``member``'s values (after the copies): returns the local or expression of its list."""
    tag = member[0]
    if tag == "list":
        return items[where[member[1]]]
    if tag == "value":
        return f"values[{member[1]}]"
    if tag == "rows":
        columns = ", ".join(_built_member(w, inner, where, items, lines) for inner in member[2])
        rows, keys = w.local("rows"), w.const(member[1])
        if member[3] is None:  # a dict per value over its keys' members, at C speed
            lines.append(f"{rows} = list(map(dict, map(zip, repeat({keys}), zip({columns}, strict=True))))")
        else:  # a mapping of the samples' own class per value, as the layout builds it
            row = w.local("row")
            lines.append(
                f"{rows} = [make_mapping({w.const(member[3])}, dict(zip({keys}, {row}, strict=True)))"
                f" for {row} in zip({columns}, strict=True)]"
            )
        return rows
    # Each value's list of its items.
    inner, counts = _built_member(w, member[1], where, items, lines), member[2]
    objects, groups = w.local("objects"), w.local("groups")
    lines.append(f"{objects} = iter({inner})")
    lines.append(f"{groups} = [list(islice({objects}, count)) for count in {counts}]")
    return groups


#: The key a walked part is read with: the careful planner places it, after the lists.
_WALKED = "walked"

#: The key a listed part is read with: its layout is placed by the function for each batch.
_LISTED = "None"


def _list_kind(found: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """What a list of a listed plan holds, as :class:`~pincollate._plan.sized.ListedParts` makes its spec:
    whether numbers (a 0-d tensor each), and the names of its arguments after its region's."""
    return "numbers" in found, tuple(name for name, _ in found["extras"])


def _listed(
    w: _PlanWriter,
    op: CarefulOp,
    column: str,
    depth: int,
    recipe: Any = None,
    group: Any = None,
    path: Path | None = None,
) -> None:
    """A per-sample list of a listed plan: its guards, its values' rows and the gaps that align each.

    ``recipe``: the list's own (a ``PerSample()`` mapping's column), where it is not the part's;
    ``group``: then the mapping's keys; ``path``: the column's key path.
    """
    recipe = op.recipe if recipe is None else recipe
    assert type(recipe) is ListRecipe
    _comment(w, depth, op.path if path is None else path)
    extras = []
    if recipe.missing:  # missing="none": an absent value is None in the list, the others placed
        absent, present = w.local("absent"), w.local("present")
        w.line(depth, f"{absent} = [i for i, value in enumerate({column}) if value is None]")
        w.line(depth, f"{present} = [value for value in {column} if value is not None] if {absent} else {column}")
        column = present  # every value absent: no class to check, the walk's
        extras.append(("absent", absent))
    shapes = _tensor_guards(w, recipe, column, depth)
    if recipe.wrap is not None:  # a tensor subclass: each value's view made its class, as the recipe makes it
        wraps = w.local("wraps")
        if recipe.per_value:  # with its own metadata (a box's format and canvas size)
            w.line(depth, f"{wraps} = list(map({w.const(recipe.wrap)}, {column}))")
        else:  # one wrap for the class, none where it is listed plain (nn.Parameter)
            w.line(depth, f"{wraps} = {w.const(recipe.wrap)}({column}[0])")
            w.line(depth, f"{wraps} = None if {wraps} is None else ({wraps},) * len({column})")
        extras.insert(0, ("wraps", wraps))
    rows, gaps, split, total, pieces = (w.local(stem) for stem in ("r", "g", "split", "total", "pieces"))
    itemsize = recipe.dtype.itemsize
    if recipe.ndim == 1:
        trailing, step, zeros, row = (
            "()",
            w.const(pitch(1, itemsize)),
            w.const(zero_rows(recipe.dtype, (), pitch(1, itemsize))),
            w.const(itemsize),
        )
        w.line(depth, f"{rows} = list(map(FIRST, {shapes}))")
    else:
        # The list's size rule (ListRecipe.geometry): rows of one width where the values' trailing
        # sizes agree; else each value flat, its elements its rows, viewed back as its shape.
        trailing, step, zeros, row, shaped = (w.local(stem) for stem in ("t", "step", "zeros", "row", "shaped"))
        w.line(depth, f"{rows}, {step}, {trailing}, {shaped} = {w.const(recipe)}.geometry({shapes})")
        flat = w.local("v")
        w.line(depth, f"{flat} = {column}")
        w.line(depth, f"if {shaped} is not None:")
        inner = depth + 1
        if recipe.subclass:  # its own __torch_function__ would run for every memory read and reshape
            w.line(inner, "with DisableTorchFunctionSubclass():")
            inner += 1
        # Reshaped before any copy reads them: a sparse or meta value is the careful error.
        w.line(inner, f"if not plain_memory({column}):")
        w.line(inner + 1, _SLOW)
        w.line(inner, f"{flat} = list(map(FLAT, {column}))")
        column = flat
        w.line(depth, f"{row} = prod({trailing}) * {itemsize}")
        w.line(depth, f"{zeros} = {w.const(zero_rows)}({w.const(recipe.dtype)}, {trailing}, {step})")
        extras.append(("shaped", shaped))
    if recipe.stacks:  # no policy: one tensor where every value is there and of one shape, else a list
        stacked = w.local("stacked")
        holes = dict(extras).get("absent")  # the local of the absent values' positions, where they may be
        alike = f"not {holes} and " if holes is not None else ""
        w.line(depth, f"{stacked} = (len({column}), *{shapes}[0]) if {alike}len(set({shapes})) == 1 else None")
        w.line(depth, f"if {stacked} is None:  # listed: warned of once, where the shapes differ")
        w.line(depth + 1, f"{w.const(recipe)}.listed({shapes}{'' if holes is None else ', ' + holes})")
        w.line(depth, f"{gaps} = gaps_to({rows}, {step}) if {stacked} is None else [0] * len({rows})")
        extras.append(("stacked", stacked))
    else:
        w.line(depth, f"{gaps} = gaps_to({rows}, {step})  # rows of zeros after each value")
    w.line(depth, f"{split} = list(chain(zip({rows}, {gaps}, strict=True)))")
    w.line(depth, f"{total} = sum({split})")
    w.line(depth, f"{pieces} = aligned_pieces({column}, {rows}, {gaps}, {zeros})")
    found = {
        "split": split,
        "total": total,
        "trailing": trailing,
        "row": row,
        "pieces": pieces,
        "extras": extras,
        "recipe": recipe,
        "group": group,
    }
    w.parts_read.append((op, _LISTED, found))


def _listed_items(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> None:
    """Per-sample lists of tensors as items (images per prompt): its guards, then what they make, by the recipe's rule."""
    recipe = op.recipe
    assert type(recipe) is ItemsRecipe
    _comment(w, depth, op.path)
    counts, flat = w.local("n"), w.local("flat")
    w.line(depth, f"if not LISTS.issuperset(map(type, {column})):")
    w.line(depth + 1, _SLOW)
    w.line(depth, f"{counts} = list(map(len, {column}))")
    if not recipe.items:  # sequences="transpose": lists of one length are transposed, by the walk
        w.line(depth, f"if len(set({counts})) == 1:")
        w.line(depth + 1, _SLOW)
    w.line(depth, f"{flat} = list(chain({column}))")
    shapes = _tensor_guards(w, recipe, flat, depth, some=True)
    arranged, stacked = w.local("arranged"), w.local("stacked")
    units, groups, split, total, pieces = (w.local(stem) for stem in ("u", "groups", "split", "total", "pieces"))
    w.line(depth, f"{arranged} = {w.const(recipe)}.arranged({flat}, {counts}, {shapes})")
    w.line(depth, f"if {arranged} is None:  # Stack() of items that do not stack: the walk's error")
    w.line(depth + 1, _SLOW)
    w.line(depth, f"{stacked}, {units}, {groups}, {split}, {pieces} = {arranged}")
    w.line(depth, f"{total} = sum({split})")
    found = {
        "split": split,
        "total": total,
        "trailing": "()",
        "row": w.const(recipe.dtype.itemsize),
        "pieces": pieces,
        "extras": [("stacked", stacked), ("units", units), ("groups", groups)],
        "recipe": recipe,
        "group": None,
    }
    w.parts_read.append((op, _LISTED, found))


#: What a ``PerSample()`` part is made of, column by column: ``("list", j)`` (the list read as
#: ``parts_read[j]``), ``("value", i)`` (``values[i]``, kept objects), ``("rows", keys, members, cls)``
#: (a mapping per value over its keys' members: a dict where ``cls`` is ``None``, else the samples'
#: class) or ``("groups", member, counts)`` (each value a list of ``member``'s items, ``counts`` the
#: local of each value's count).
Member = tuple[Any, ...]


def _rows(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> None:
    """``PerSample()`` of dicts, or of lists (of dicts, numbers, tensors, lists...): each place a column of the plan's."""
    recipe = op.recipe
    assert type(recipe) is PerSampleRecipe
    _comment(w, depth, op.path)
    w.rows[op.index] = _member(w, op, recipe.column, column, depth, op.path, w.size)


def _member(w: _PlanWriter, op: CarefulOp, kind: Any, column: str, depth: int, path: Path, size: int | None) -> Member:
    """One place of a ``PerSample()`` subtree, its values the list ``column``: its guards and reads, by its kind.

    ``size``: how many values ``column`` holds where the plan knows it (one a sample), else ``None``
    (the items of lists, counted for each batch).
    """
    if type(kind) is Rows:
        # One class, the planned keys in order and of the planned types, for every value (at C speed).
        w.line(
            depth,
            f"if set(map(type, {column})) != {w.const(kind.types)} or set(map(tuple, {column})) != "
            f"{w.const(kind.key_sets)} or set(map(tuple, map(map, repeat(type), {column}))) != {w.const(kind.key_types)}:",
        )
        w.line(depth + 1, _SLOW)
        columns = w.local("cols")
        if len(kind.keys) == 1:
            w.line(depth, f"{columns} = [list(map({w.const(kind.gather)}, {column}))]")
        else:
            w.line(depth, f"{columns} = list(zip(*map({w.const(kind.gather)}, {column}), strict=True))")
        members = []
        for j, (key, inner) in enumerate(zip(kind.keys, kind.columns, strict=True)):
            local = w.local("c")
            w.line(depth, f"{local} = {columns}[{j}]")
            members.append(_member(w, op, inner, local, depth, (*path, key), size))
        return ("rows", kind.keys, tuple(members), kind.cls)
    if type(kind) is Groups:
        # Lists (or tuples): all their items as one column, then each value's count of them.
        counts, flat = w.local("n"), w.local("flat")
        w.line(depth, f"if not LISTS.issuperset(map(type, {column})):")
        w.line(depth + 1, _SLOW)
        w.line(depth, f"{counts} = list(map(len, {column}))")
        w.line(depth, f"{flat} = list(chain({column}))")
        w.line(depth, f"if not {flat}:  # every list empty: nothing to read, the walk's")
        w.line(depth + 1, _SLOW)
        return ("groups", _member(w, op, kind.items, flat, depth, (*path, ITEMS), None), counts)
    if type(kind) is Values:
        # Strings, bytes, None: the samples' own, kept beside the buffer.
        _comment(w, depth, path)
        w.line(depth, f"if not KEPT_VALUES.issuperset(map(type, {column})):")
        w.line(depth + 1, _SLOW)
        at = w.nvalues
        w.line(depth, f"values.append(list({column}))  # values[{at}]")
        w.nvalues += 1
        return ("value", at)
    at = len(w.parts_read)
    if type(kind) is Numbers:
        # Numbers of one type: a 0-d tensor each, one per aligned step of one region.
        _comment(w, depth, path)
        w.line(depth, f"if set(map(type, {column})) != {w.const(kind.types)}:")
        w.line(depth + 1, _SLOW)
        if size is not None:  # a number a sample: the region's split and size are the plan's
            count, split, total = str(size), w.const((1, kind.step - 1) * size), w.const(kind.step * size)
        else:  # a number an item: counted for each batch
            count, split, total = w.local("count"), w.local("split"), w.local("total")
            w.line(depth, f"{count} = len({column})")
            w.line(depth, f"{split} = {w.const((1, kind.step - 1))} * {count}")
            w.line(depth, f"{total} = {kind.step} * {count}")
        found = {
            "numbers": kind,
            "count": count,
            "column": column,
            "split": split,
            "total": total,
            "trailing": "()",
            "row": w.const(kind.dtype.itemsize),
            "extras": [],
            "recipe": kind,
            "group": path,
        }
        w.parts_read.append((op, _LISTED, found))
        return ("list", at)
    if type(kind) is RowArrays:  # numpy arrays of one dtype: tensors over their memory, then listed
        tensors = _converted(w, "a", f"array_tensors({column}, {w.const(kind.dtypes)})", depth)
        kind, column = kind.tensors, tensors
    assert type(kind) is Tensors
    _listed(w, op, column, depth, kind.recipe, path, path)
    return ("list", at)


def _output(
    w: _PlanWriter,
    root: Spec,
    bulk: frozenset[int],
    parts: Parts | None = None,
    before: Sequence[str] = (),
    inline: bool = True,
) -> None:
    """The end of a whole batch's function: the batch built here over the tensors made at once, where
    :func:`builds_inline` says so.

    Any other top, and a buffer whose tensors were not made at once (pinned memory), is built
    by the layout (its parts made where they are deferred). ``before``: lines that make the
    parts' locals.
    """
    if not (inline and builds_inline(root) and inlines_parts(root)):
        # A top the function does not build itself (a user's mapping class), or a part under a node
        # that builds itself (a registered container, a subtree too deep for one expression): the
        # layout builds the batch, its parts made from its deferred geometry.
        w.line(1, "return make_batch(layout, buffer, values, views)")
        return
    w.line(1, "if views.source is None:  # not made at once (pinned memory): built by the layout")
    w.line(2, "return make_batch(layout, buffer, values, views)")
    for line in before:
        w.line(1, line)
    if type(root) is NamedTupleSpec or type(root) is DataclassSpec:  # its carrier subclass, as make_batch makes it
        w.line(1, f"batch = {expression(w, root, bulk, parts, cls=carrier_class(root.cls))}")
    else:
        carrier = "Batch" if type(root) is MappingSpec else "BatchList"
        w.line(1, f"batch = {carrier}({expression(w, root, bulk, parts)})")
    w.line(1, "set_attribute(batch, CARRIED, (layout, buffer, values))")
    w.line(1, "return batch")


def builds_inline(root: Spec) -> bool:
    """Whether a whole batch's function builds a batch of top ``root`` itself (a Batch of a dict, a
    BatchList of a list or tuple, a namedtuple's or a dataclass's carrier), its parts' values being
    its locals.

    A user's mapping or sequence class is built by the layout (:func:`make_batch`).
    """
    kind = type(root)
    if kind is MappingSpec or kind is SequenceSpec:
        return root.cls is None  # type: ignore[attr-defined]
    return kind is NamedTupleSpec or kind is DataclassSpec


def _checks(w: _PlanWriter, op: Op, size: int, nvalues: int) -> None:
    """A whole batch's function up to its buffer: the batch size, then every field's guards in tree order."""
    w.line(1, f"if len(samples) != {size}:")
    w.line(2, "raise Mismatch()  # another batch size (an epoch's last batch): another plan")
    w.line(1, f"values = [None] * {nvalues}" if nvalues else "values = []")
    w.nvalues = nvalues
    w.size = size
    if type(op) is CarefulOp:  # the samples are the part's column: a local of its own, which its reading may rebind
        w.line(1, "column = samples")
        _emit(w, op, "column", 1)
        return
    _emit(w, op, "samples", 1)


def _buffer(w: _PlanWriter, nbytes: str, views: str) -> None:
    # ``into``: a buffer of the caller's (the bench's reused one, a ring slot).
    w.line(1, f"buffer = allocate({nbytes}, kind, slots, pin_slots, pin) if into is None else into")
    w.line(1, f"views = {views}")


def _compiled(w: _PlanWriter, description: str, names: dict[str, Any]) -> CompiledPlan:
    names = {**_GLOBALS, **_WHOLE, **names}
    run, source, filename = w.compile("samples, kind, slots, pin_slots, pin, into=None", "batch", description, names)
    return CompiledPlan(run, source, filename)


def _copies(w: _PlanWriter, copies: list[tuple[Any, Any, str, Op]], size: int, locals_from: int | None) -> None:
    """Each copy as a call of its own into its region, under one guard that names what failed.

    The regions of copies from ``locals_from`` on are locals already (a sized plan's parts,
    which read ``made`` first); the others are specs (``None``: none are locals).
    """
    if locals_from is None:
        w.line(1, "made = views.made")
    # The regions first: only the copies are guarded, so that nothing but a copy that fails
    # reads as a batch that does not fit.
    regions = []
    for at, (_, spec, _, _) in enumerate(copies):
        if locals_from is not None and at >= locals_from:
            regions.append(spec)
            continue
        key, name = w.const(id(spec)), w.local("region")
        w.line(1, f"{name} = made[{key}] if {key} in made else {w.const(spec)}.region(views)")
        regions.append(name)
    if not copies:
        return  # nothing to copy (a batch of strings and None alone): no guard either
    w.line(1, "grad = is_grad_enabled()")
    w.line(1, "set_grad_enabled(False)  # copies into the buffer are never part of a graph")
    w.line(1, "try:")
    for at, ((fill, spec, payload, owner), region) in enumerate(zip(copies, regions, strict=True)):
        w.line(2, f"at = {at}  # " + text(format_path(owner.path)))
        numbers = fill is fill_one_field or fill is fill_numbers
        if numbers and not isinstance(spec, TensorSpec):  # a part's: its dtype is the batch's
            w.line(2, f"if {region}.dtype in NARROW:  # a number past its range is inf, unwarned")
            w.line(3, f"{w.const(fill)}({region}, {payload})")
            w.line(2, "else:")
            w.line(3, f"{region}.numpy()[{f':{size}' if fill is fill_one_field else '...'}] = {payload}")
        elif numbers and spec.dtype in NARROW:
            # Python numbers into float32 or narrower: one past its range is inf, as torch.tensor
            # makes it, without numpy's overflow warning (an error under warnings-as-errors).
            w.line(2, 'with errstate(over="ignore"):')
            w.line(3, f"{region}.numpy()[{f':{size}' if fill is fill_one_field else '...'}] = {payload}")
        elif fill is stack_tensors:  # the common copies, as the calls their fill would make
            w.line(2, f"stack({payload}, out={region})")
        elif fill is fill_one_field:
            w.line(2, f"{region}.numpy()[:{size}] = {payload}")
        elif fill is fill_numbers:
            w.line(2, f"{region}.numpy()[...] = {payload}")
        elif fill is pad_1d:
            w.line(2, f"pad_1d({region}, {payload})")
        elif fill is concat_tensors:
            w.line(2, f"cat({payload}, out={region})")
        else:
            w.line(2, f"{w.const(fill)}({region}, {payload})")
    w.line(1, "except Exception as exc:")
    # What each copy blames is read from its payload; a part blames its own path, whatever it copied.
    payloads = ", ".join("None" if type(owner) is CarefulOp else payload for _, _, payload, owner in copies)
    owners = w.const(tuple(owner for _, _, _, owner in copies))
    w.line(2, f"raise Mismatch(*{owners}[at].blame(({payloads},)[at])) from exc")
    w.line(1, "finally:")
    w.line(2, "set_grad_enabled(grad)")


def _comment(w: _PlanWriter, depth: int, path: Path) -> None:
    w.line(depth, "# " + text(format_path(path)))


def _mismatch(w: _PlanWriter, depth: int, *paths: Path) -> None:
    # The key path beside the raise: a traceback shows the field on the line that failed.
    where = text(", ".join(format_path(path) for path in paths))
    w.line(depth, f"raise Mismatch(*{w.const(tuple(paths))})  # {where}")


def _emit(w: _PlanWriter, op: Op, column: str, depth: int) -> None:
    """The lines that run node ``op`` over the expression ``column`` (a local name)."""
    kind = type(op)
    if kind is MappingOp:
        _mapping(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is SequenceOp:
        _sequence(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is StackOp:
        _stack(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is ValueOp:
        _value(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is DataclassOp:
        _dataclass(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is RegisteredOp:
        _registered(w, op, column, depth)  # type: ignore[arg-type]
    elif kind is CarefulOp and (w.walk_all or not (is_sized(op) or is_listed(op))):
        _comment(w, depth, op.path)  # walked for each batch, after the other parts are placed
        w.parts_read.append((op, _WALKED, {"column": column}))  # type: ignore[arg-type]
    elif kind is CarefulOp:
        if type(_placing(op.recipe)) is PadRecipe:  # type: ignore[attr-defined]
            _padded(w, op, column, depth)  # type: ignore[arg-type]
        elif type(op.recipe) is MixedNumbers:  # type: ignore[attr-defined]
            _mixed_numbers(w, op, column, depth)  # type: ignore[arg-type]
        elif type(op.recipe) is ListRecipe:  # type: ignore[attr-defined]
            _listed(w, op, column, depth)  # type: ignore[arg-type]
        elif type(op.recipe) is Arrays and type(op.recipe.inner) is ListRecipe:  # type: ignore[attr-defined]
            _listed(w, op, _arrays(w, op, column, depth), depth, recipe=op.recipe.inner)  # type: ignore[arg-type,attr-defined]
        elif type(op.recipe) is NumberItems:  # type: ignore[attr-defined]
            _listed(w, op, _number_items(w, op, column, depth), depth, recipe=op.recipe.inner)  # type: ignore[arg-type,attr-defined]
        elif type(op.recipe) is ItemsRecipe:  # type: ignore[attr-defined]
            _listed_items(w, op, column, depth)  # type: ignore[arg-type]
        elif type(op.recipe) is PerSampleRecipe:  # type: ignore[attr-defined]
            _rows(w, op, column, depth)  # type: ignore[arg-type]
        else:
            _concatenated(w, op, column, depth)  # type: ignore[arg-type]
    else:
        raise TypeError(f"no code for a plan node of type {kind.__name__}")


def is_sized(op: Op) -> bool:
    """Whether a part node is one a sized plan reads inline: ``Pad``, or ``Concat``, over plain tensors.

    Also ``Pad`` over token ids as Python lists, converted inline (one ``torch.tensor`` of all),
    and Python numbers of several types (ints beside floats), whose dtype is their key.
    """
    if type(op) is not CarefulOp:
        return False
    recipe = op.recipe
    if type(recipe) is Arrays:  # numpy arrays: viewed as tensors inline, then as tensors are
        recipe = recipe.inner
    if type(recipe) is ConcatRecipe:
        return True
    if type(recipe) is NumberLists:  # token ids as Python lists: padded, or concatenated (packed)
        inner = recipe.inner
        return (type(inner) is PadRecipe and inner.ndim == 1) or (
            type(inner) is ConcatRecipe and inner.containers is None and not inner.stack
        )
    return type(recipe) is PadRecipe or type(recipe) is MixedNumbers


def _placing(recipe: Any) -> Any:
    """The recipe whose rules place a part: a converting recipe's inner one."""
    return recipe.inner if type(recipe) in _CONVERTING else recipe


#: The recipes that convert a column (token ids as lists, numpy arrays), then read it by an inner one.
_CONVERTING = (NumberLists, Arrays)


def _arrays(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> str:
    """A column of numpy arrays as tensors (:meth:`~pincollate._plan.recipe.Arrays.tensors`: over their
    memory; read-only ones concatenated once, joined): returns their local.

    Anything else (another dtype, arrays torch cannot take) goes the longer way.
    """
    recipe = op.recipe
    assert type(recipe) is Arrays
    return _converted(w, "a", f"{w.const(recipe)}.tensors({column})", depth)


def _number_items(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> str:
    """A column of Python number lists as 1-D tensors (:func:`number_items`): returns their local.

    Anything else (an empty list, another number class, an int past ``int64``) goes the longer way.
    """
    recipe = op.recipe
    assert type(recipe) is NumberItems
    return _converted(w, "n", f"number_items({column}, {w.const(recipe.kind)})", depth)


def _converted(w: _PlanWriter, stem: str, conversion: str, depth: int) -> str:
    """A column as tensors by ``conversion`` (an expression; ``None`` where the recipe does not take
    the column, which then goes the longer way): returns their local."""
    tensors = w.local(stem)
    w.line(depth, f"{tensors} = {conversion}")
    w.line(depth, f"if {tensors} is None:")
    w.line(depth + 1, _SLOW)
    return tensors


def is_listed(op: Op) -> bool:
    """Whether a part node is one a listed plan places inline.

    ``AsList()`` of plain tensors of a dtype numpy has (or of per-sample lists of them: images
    per prompt), or ``PerSample()`` of dicts and lists whose every place holds such tensors (or
    arrays), numbers of one type or strings: detection targets as a dict per image or per object,
    a list of labels per sample (:func:`_compiles`).
    """
    if type(op) is not CarefulOp:
        return False
    recipe = op.recipe
    if type(recipe) is PerSampleRecipe:
        return _compiles(recipe.column)
    if type(recipe) is ItemsRecipe:  # per-sample lists of items: one tensor, or each sample's stack or items
        return True
    if type(recipe) is NumberItems:  # AsList() of number lists: read as 1-D tensors, then listed
        return True
    if type(recipe) is Arrays:  # numpy arrays: as tensors, then listed as they are
        recipe = recipe.inner
    return type(recipe) is ListRecipe and _listable(recipe)


def _compiles(kind: Any) -> bool:
    """Whether the generated function reads a ``PerSample()`` place of this kind (:func:`_member`): mappings
    and lists of such places, tensors and arrays listed, numbers, strings."""
    if type(kind) is Rows:
        return all(map(_compiles, kind.columns))
    if type(kind) is Groups:
        return _compiles(kind.items)
    if type(kind) is RowArrays:
        kind = kind.tensors
    if type(kind) is Tensors:
        return _listable(kind.recipe)
    if type(kind) is Numbers:
        return numpy_dtype(kind.dtype) is not None
    return type(kind) is Values


def _listable(recipe: ListRecipe) -> bool:
    # A field without a policy stacks where its values agree: a subclass's stack keeps the class of the
    # first value's wrap, which describes the others only where the class has no metadata.
    return not (recipe.stacks and recipe.per_value)


def _pad_copies(
    w: _PlanWriter, part: CarefulOp, recipe: PadRecipe, names: list[str], found: dict[str, str], copies: list[Any]
) -> None:
    column, lengths = found["column"], found["lengths"]
    if recipe.lengths_name is not None:
        copies.append((fill_numbers, names[1], lengths, part))
    # Padding's one kernel, called as its fill would call it (the mask, where asked for, first).
    value, left = w.const(recipe.policy.value), w.const(recipe.left)
    valid = "None"
    if recipe.mask_name is not None:
        # A bool mask is the copy's own; another dtype's (1 and 0) is written from one.
        writer = "valid_1d" if recipe.policy.mask_dtype == torch.bool else "valid_into"
        valid = f"{writer}({lengths}, {names[-1]}.shape[1], {left}, {names[-1]}.numpy())"
    copies.append((pad_1d, names[0], f"{column}, {lengths}, {found['dim']}, {value}, {left}, {valid}", part))


def _concat_copies(w: _PlanWriter, part: CarefulOp, names: list[str], found: dict[str, str], copies: list[Any]) -> None:
    recipe = _placing(part.recipe)
    assert type(recipe) is ConcatRecipe
    values, rows, counts = found["values"], found["rows"], found.get("counts", "None")
    if recipe.stack:
        copies.append((stack_tensors, names[0], values, part))
    else:
        copies.append((concat_tensors, names[0], f"nonempty({values}, {rows})", part))
    outputs = iter(names[1:])
    if recipe.jagged:  # its offsets, read already; the nested tensor's offsets first
        item_offsets, offsets = found["item_offsets"], found["offsets"]
        copies.append((fill_numbers, next(outputs), offsets, part))
    else:
        # An unused local starts with an underscore (the golden files are linted).
        item_offsets, offsets = w.local("io" if recipe.item_offsets_name else "_io"), w.local("o")
        w.line(1, f"{item_offsets}, {offsets} = concat_offsets({rows}, {counts})")
    for name, numbers in (
        (recipe.offsets_name, offsets),
        (recipe.counts_name, counts),
        (recipe.item_offsets_name, item_offsets),
    ):
        if name is not None:
            copies.append((fill_numbers, next(outputs), numbers, part))


def _concatenated(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> None:
    """A concatenated part of a sized plan: its guards, rows and key (its values' total rows, trailing sizes and count)."""
    recipe = _placing(op.recipe)
    assert type(recipe) is ConcatRecipe
    _comment(w, depth, op.path)
    if type(op.recipe) is NumberLists:  # copied whole; each sample's rows its list's length
        rows, key = w.local("r"), w.local("m")
        flat = _token_lists(w, recipe, column, rows, depth)
        w.line(depth, f"{key} = (sum({rows}), (), len({column}))")
        _packed_offsets(w, op, recipe, {"values": f"[{flat}]", "rows": rows}, key, depth)
        return
    if type(op.recipe) is Arrays:
        column = _arrays(w, op, column, depth)
    found = {"values": column}
    if recipe.containers is not None:  # per-sample lists of items, chained
        counts, values = w.local("n"), w.local("v")
        w.line(depth, f"if set(map(type, {column})) - {w.const(recipe.containers)}:")
        w.line(depth + 1, _SLOW)
        if type(None) in recipe.containers:  # missing="none": an absent list has no items, as the recipe takes it
            w.line(depth, f"{column} = {w.const(none_as_empty)}({column}) if holds_none({column}) else {column}")
        w.line(depth, f"{counts} = list(map(len, {column}))")
        w.line(depth, f"{values} = list(chain({column}))")
        found.update(values=values, counts=counts)
    values = found["values"]
    shapes = _tensor_guards(w, recipe, values, depth, some=True)
    if recipe.stack:  # items="stack": each item whole, one row, all of one shape
        rows, key = w.local("r"), w.local("m")
        w.line(depth, f"if len(set({shapes})) != 1:")
        w.line(depth + 1, _SLOW)
        w.line(depth, f"{rows} = [1] * len({values})")
        w.line(depth, f"{key} = (len({values}), tuple({shapes}[0]), len({values}))")
    else:
        trailing = _trailing(w, recipe.ndim, shapes, depth) if recipe.ndim > 1 else "()"
        rows, key = w.local("r"), w.local("m")
        w.line(depth, f"{rows} = list(map(FIRST, {shapes}))")
        w.line(depth, f"{key} = (sum({rows}), {trailing}, len({values}))")
    found["rows"] = rows
    _packed_offsets(w, op, recipe, found, key, depth)


def _packed_offsets(
    w: _PlanWriter, op: CarefulOp, recipe: ConcatRecipe, found: dict[str, str], key: str, depth: int
) -> None:
    """A packed part's offsets where its key needs them (``Jagged``: its nested tensor's spread), or
    the check that Concat's int32 offsets hold its rows; then the part is read."""
    rows = found["rows"]
    if recipe.jagged:
        # Jagged: int64 offsets, and the fewest and most rows of a sample (its nested tensor's) in the key.
        item_offsets, offsets, spread = w.local("io"), w.local("o"), w.local("spread")
        counts_arg = found.get("counts", "None")
        w.line(depth, f"{item_offsets}, {offsets} = concat_offsets({rows}, {counts_arg})")
        w.line(depth, f"{spread} = spread({offsets})")
        w.line(depth, f"{key} = (*{key}, {spread})")
        found.update(item_offsets=item_offsets, offsets=offsets, spread=spread)
    else:
        w.line(depth, f"if {key}[0] > INT32_MAX:  # Concat's int32 offsets cannot hold it: the careful error")
        w.line(depth + 1, _SLOW)
    w.parts_read.append((op, key, found))


def _token_lists(w: _PlanWriter, recipe: Any, column: str, lengths: str, depth: int) -> str:
    """Token ids as Python lists: one tensor of all of them (its dtype as ``torch.tensor`` infers it, the
    recipe's), and each list's length in the local ``lengths``: returns the tensor's local."""
    flat = w.local("flat")
    w.line(depth, f"{flat} = number_tensor({column})")
    w.line(depth, f"if {flat} is None or {flat}.dtype not in {w.const(recipe.dtypes)}:")
    w.line(depth + 1, _SLOW)
    w.line(depth, f"{lengths} = list(map(len, {column}))")
    return flat


def _padded(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> None:
    """A padded part of a sized plan: its guards, lengths and key (the padded sizes), by the recipe's size rule."""
    recipe = _placing(op.recipe)
    assert type(recipe) is PadRecipe
    _comment(w, depth, op.path)
    lengths, key = w.local("l"), w.local("m")
    if type(op.recipe) is NumberLists:
        flat = _token_lists(w, recipe, column, lengths, depth)
        joined = w.local("joined")
        w.line(depth, f"{joined} = Joined({flat}, {lengths})  # the values, concatenated already")
        _pad_key(w, recipe, joined, lengths, key, depth)
        w.parts_read.append((op, key, {"column": joined, "lengths": lengths, "dim": "0"}))
        return
    if type(op.recipe) is Arrays:
        column = _arrays(w, op, column, depth)
    if recipe.missing:  # missing="none": an absent value an empty one, by the recipe's rule
        present = w.local("present")
        w.line(depth, f"{present} = {w.const(recipe)}.with_empties({column}) if holds_none({column}) else {column}")
        w.line(depth, f"if {present} is None:")
        w.line(depth + 1, _SLOW)
        column = present
    shapes = _tensor_guards(w, recipe, column, depth)
    if recipe.ndim == 1:
        w.line(depth, f"{lengths} = list(map(FIRST, {shapes}))")
        _pad_key(w, recipe, column, lengths, key, depth)
        dim = "0"
    else:
        measured, dim, sizes, longer = (
            w.local("measured"),
            w.local("d"),
            w.local("z"),
            w.local("longer" if recipe.policy.truncate else "_longer"),
        )
        w.line(depth, f"{measured} = {w.const(recipe)}.measure({shapes})")
        w.line(depth, f"if {measured} is None:")
        w.line(depth + 1, _SLOW)
        w.line(depth, f"{lengths}, {dim}, {sizes}, {longer} = {measured}")
        if recipe.policy.truncate:
            w.line(depth, f"if {longer}:")
            w.line(
                depth + 1, f"{column}, {lengths} = cut({column}, {lengths}, {dim}, {w.const(recipe.policy.max_length)})"
            )
        w.line(depth, f"{key} = ({dim}, {sizes})")
    w.parts_read.append((op, key, {"column": column, "lengths": lengths, "dim": dim}))


def _mixed_numbers(w: _PlanWriter, op: CarefulOp, column: str, depth: int) -> None:
    """Python numbers of several types in a sized plan: their dtype, by ``default_collate``'s rule, is the key."""
    _comment(w, depth, op.path)
    key = w.local("m")
    w.line(depth, f"{key} = {w.const(op.recipe)}.dtype_of({column})")
    w.line(depth, f"if {key} is None:  # an int past int64 or too large for a float, not a Python number")
    w.line(depth + 1, _SLOW)
    w.parts_read.append((op, key, {"column": column}))


#: A part's guard that fails: the batch goes to the plan's function that walks every part, which takes it or names it.
_SLOW = "return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it"


def _tensor_guards(w: _PlanWriter, recipe: Any, values: str, depth: int, some: bool = False) -> str:
    """A part's column of tensors checked at C speed, as its recipe's ``shapes`` checks it: returns the shapes' local.

    One exact class, one dtype and one rank (``some``: and at least one value), strided in CPU
    memory. The copies refuse a sparse, meta or accelerator value with elements, so memory is
    read only where a value has none (no copy reads it), or where the recipe reshapes the
    values (items) before any copy.
    """
    shapes = w.local("s")
    empty = f"not {values} or " if some else ""
    w.line(depth, "try:")
    classes = f"{empty}set(map(type, {values})) != {w.const(recipe.types)}"
    dtypes = f"set(map(TENSOR_DTYPE, {values})) != {w.const(recipe.dtypes)}"
    inner = depth + 1
    if recipe.subclass:  # its own __torch_function__ would run for every dtype and shape read
        w.line(inner, f"if {classes}:")
        w.line(inner + 1, _SLOW)
        w.line(inner, "with DisableTorchFunctionSubclass():")
        inner += 1
        w.line(inner, f"if {dtypes}:")
    else:
        w.line(inner, f"if {classes} or {dtypes}:")
    w.line(inner + 1, _SLOW)
    w.line(inner, f"{shapes} = list(map(TENSOR_SHAPE, {values}))")
    unread = f"0 in chain({shapes}) and " if not some else ""
    w.line(inner, f"if {unread}not plain_memory({values}):  # sparse, meta or accelerator: the careful error")
    w.line(inner + 1, _SLOW)
    w.line(depth, "except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape")
    w.line(depth + 1, _SLOW)
    w.line(depth, f"if set(map(len, {shapes})) != {w.const(frozenset((recipe.ndim,)))}:")
    w.line(depth + 1, _SLOW)
    return shapes


def _trailing(w: _PlanWriter, ndim: int, shapes: str, depth: int) -> str:
    """The values' trailing sizes (``ndim`` > 1), which must agree: returns their local."""
    getter = w.const(operator.itemgetter(*range(1, ndim)) if ndim > 2 else operator.itemgetter(1))
    tail, trailing = w.local("t"), w.local("t")
    w.line(depth, f"{tail} = {getter}({shapes}[0])")
    w.line(depth, f"if set(map({getter}, {shapes})) != {{{tail}}}:")
    w.line(depth + 1, _SLOW)
    w.line(depth, f"{trailing} = tuple({shapes}[0][1:])")
    return trailing


def _pad_key(w: _PlanWriter, recipe: PadRecipe, column: str, lengths: str, key: str, depth: int) -> None:
    """The size rule of 1-D values (:meth:`~pincollate._plan.ragged.PadRecipe.measure`), inline:
    the longest, then ``max_length`` (values longer cut with ``truncate``) or ``multiple_of``."""
    policy = recipe.policy
    w.line(depth, f"{key} = max({lengths})")
    if policy.max_length is not None:
        most = w.const(policy.max_length)
        w.line(depth, f"if {key} > {most}:")
        if policy.truncate:
            w.line(depth + 1, f"{column}, {lengths} = cut({column}, {lengths}, 0, {most})")
        else:
            w.line(depth + 1, _SLOW)
        w.line(depth, f"{key} = {most}")
    elif policy.multiple_of is not None:
        step = w.const(policy.multiple_of)
        w.line(depth, f"{key} = -(-{key} // {step}) * {step}")


def _types(w: _PlanWriter, op: Op, column: str, depth: int) -> None:
    w.line(depth, f"if set(map(type, {column})) != {w.const(op.types)}:")  # type: ignore[attr-defined]
    _mismatch(w, depth + 1, op.path)


def _stack(w: _PlanWriter, op: StackOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    guards = [f"set(map(type, {column})) != {w.const(op.types)}"]
    if op.key is not None:
        guards.append(f"set(map({w.const(op.key)}, {column})) != {w.const(op.expected)}")
    if op.shape is not None:
        guards.append(f"{column}[0].shape != {w.const(op.shape)}")
    w.line(depth, "try:")
    w.line(depth + 1, f"if {' or '.join(guards)}:")
    _mismatch(w, depth + 2, op.path)
    # The dtype getter on something that is not a tensor; a nested tensor's shape.
    w.line(depth, "except (TypeError, AttributeError, RuntimeError):")
    w.line(depth + 1, f"raise Mismatch(*{w.const((op.path,))}) from None")
    w.copy(depth, op.fill, op.spec, column, op)


def _value(w: _PlanWriter, op: ValueOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    _types(w, op, column, depth)
    w.value(depth, op.index, column)


def _fields(w: _PlanWriter, op: MappingOp | SequenceOp, columns: str, depth: int) -> None:
    """A container's fields: single nodes by column, blocks by columns."""
    for index, child, as_list in op.singles:
        name = w.local("c")
        w.line(depth, f"{name} = list({columns}[{index}])" if as_list else f"{name} = {columns}[{index}]")
        _emit(w, child, name, depth)
    for block in op.blocks:
        _block(w, block, [f"{columns}[{index}]" for index in block.index], depth)


def _block(w: _PlanWriter, op: BlockOp, columns: list[str], depth: int) -> None:
    _comment(w, depth, op.path)
    w.line(depth, "# a block of " + text(", ".join(format_path(path) for path in op.paths)))
    values = w.local("v")
    if op.pad:
        pad = w.const(op.pad)
        w.line(depth, f"{values} = [*{f', *{pad}, *'.join(columns)}, *{pad}]")
    else:
        w.line(depth, f"{values} = [*{', *'.join(columns)}]")
    firsts = w.local("f")
    w.line(depth, f"{firsts} = ({', '.join(f'{column}[0]' for column in columns)},)")
    ok = w.local("ok")
    w.line(depth, "try:")
    # Exact classes first: a subclass passes the dtype getter. Where no value has a
    # __torch_function__ of its own, torch.stack takes every value as a plain tensor.
    w.line(depth + 1, f"{ok} = not HAS_TORCH_FUNCTION({values}) or set(map(type, {values})) == PLAIN")
    w.line(
        depth + 1,
        f"{ok} = {ok} and set(map(TENSOR_SHAPE, {firsts})) == {w.const(op.shapes)}"
        f" and set(map(TENSOR_DTYPE, {firsts})) == {w.const(op.dtypes)}",
    )
    if not op.joined:
        w.line(depth + 1, f"{ok} = {ok} and set(map(TENSOR_DTYPE, {values})) == {w.const(op.dtypes)}")
    w.line(depth, "except (TypeError, RuntimeError):  # a nested tensor has no shape")
    w.line(depth + 1, f"{ok} = False")
    w.line(depth, f"if not {ok}:")
    w.line(depth + 1, f"raise Mismatch(*{w.const(op)}.blame({values}))")
    w.copy(depth, op.fill, op.block, values, op)


def _numbers(w: _PlanWriter, op: NumbersOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    w.line(depth, "# numbers at " + text(", ".join(repr(key) for key in op.keys)))
    rows = w.local("r")
    w.line(depth, "try:")
    w.line(depth + 1, f"{rows} = list(map({w.const(op.get)}, {column}))")
    w.line(depth, "except KeyError:  # absent in a sample (missing='none'): planned for each batch")
    w.line(depth + 1, f"raise Mismatch(*{w.const(tuple((*op.path, key) for key in op.keys))}) from None")
    if len(op.keys) == 1:
        w.line(depth, f"if set(map(type, {rows})) != {w.const(op.types)}:")
        _mismatch(w, depth + 1, op.path + op.keys)
        w.copy(depth, fill_one_field, op.block, rows, op)
        return
    w.line(depth, f"if set(map(type, chain({rows}))) != {w.const(op.types)}:")
    w.line(depth + 1, f"raise Mismatch(*{w.const(op)}.blame({rows}))")
    w.copy(depth, fill_block, op.block, rows, op)


_DICT = frozenset((dict,))


def _mapping(w: _PlanWriter, op: MappingOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    _types(w, op, column, depth)
    first, columns = w.local("first"), w.local("cols")
    w.line(depth, f"{first} = {column}[0]")
    w.line(depth, f"{columns} = None")
    # One class and size everywhere, sample 0's keys in order and of the same types
    # (True is not 1), and every key found: the key sets agree. A dict's len() and iteration
    # are its keys; another mapping's may not be (a TensorDict's len() is its batch size), so
    # its keys are read as the walk reads them, by keys().
    keys = first if op.types == _DICT else f"{first}.keys()"
    sizes = column if op.types == _DICT else f"map(KEYS, {column})"
    w.line(
        depth,
        f"if set(map(len, {sizes})) == {w.const(op.sizes)} and tuple({keys}) == {w.const(op.keys)}"
        f" and tuple(map(type, {keys})) == {w.const(op.key_types)}:",
    )
    w.line(depth + 1, "try:")
    if op.gather is None:
        w.line(depth + 2, f"{columns} = []")
    elif op.single:
        w.line(depth + 2, f"{columns} = [list(map({w.const(op.gather)}, {column}))]")
    else:
        w.line(depth + 2, f"{columns} = list(zip(*map({w.const(op.gather)}, {column}), strict=True))")
    w.line(depth + 1, "except KeyError:  # a sample of the same size with another key")
    w.line(depth + 2, f"{columns} = None")
    w.line(depth, f"if {columns} is None:")
    if op.missing:
        w.line(depth + 1, f"{columns} = {w.const(op)}.with_absent({column})")
    else:
        _mismatch(w, depth + 1, op.path)
    _fields(w, op, columns, depth)
    for numbers in op.numbers:
        _numbers(w, numbers, column, depth)


def _sequence(w: _PlanWriter, op: SequenceOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    w.line(
        depth,
        f"if set(map(type, {column})) != {w.const(op.types)} or set(map(len, {column})) != {w.const(op.sizes)}:",
    )
    _mismatch(w, depth + 1, op.path)
    columns = w.local("cols")
    # zip's tuples, as default_collate: a column of strings comes back as one.
    w.line(depth, f"{columns} = list(zip(*{column}, strict=True))")
    _fields(w, op, columns, depth)


def _dataclass(w: _PlanWriter, op: DataclassOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    _types(w, op, column, depth)
    for get, child in op.children:
        name = w.local("c")
        w.line(depth, f"{name} = list(map({w.const(get)}, {column}))")
        _emit(w, child, name, depth)


def _registered(w: _PlanWriter, op: RegisteredOp, column: str, depth: int) -> None:
    _comment(w, depth, op.path)
    _types(w, op, column, depth)
    rows = w.local("rows")
    w.line(depth, f"{rows} = {w.const(op)}.rows({column})")
    for index, child in enumerate(op.children):
        name = w.local("c")
        w.line(depth, f"{name} = [row[{index}] for row in {rows}]")
        _emit(w, child, name, depth)
