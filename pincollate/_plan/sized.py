"""Sized layouts: a plan whose parts are padded or concatenated fields has one layout per tuple of their sizes.

A field padded by :class:`~pincollate.Pad` (or concatenated by :class:`~pincollate.Concat`)
is placed anew for each batch, but all a batch changes of it is its sizes (the padded
length; the total rows, trailing sizes and count of the values): with them known, the
whole batch's layout is fixed.
:class:`SizedLayouts` keeps, for each tuple of sizes seen, that layout and what a batch of
it needs (every region made at once), so the compiled plan
(:func:`~pincollate._plan.codegen.compile_parts`) reads the sizes, looks the layout up and
copies, as it does for a plan without parts. A batch's lengths and masks are copied, never
kept: the layouts hold only dtypes, shapes and offsets.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import torch

from .._batch.layout import Layout, Part, Spec, TensorSpec, ValueSpec
from .._batch.list_specs import GroupsSpec, ItemsSpec, RowsSpec, SplitSpec
from .._batch.views import Bulk
from .packed import ConcatRecipe
from .ragged import MixedNumbers, PadRecipe

__all__ = ["ListedParts", "SizedLayouts", "merged", "with_regions"]

#: The most layouts one plan keeps; past it they are made again as batches need them.
MOST_LAYOUTS = 512


def with_regions(bulk: Bulk, regions: Sequence[TensorSpec]) -> Bulk:
    """``bulk`` and the copies' regions that are not among its tensors (a block's, say), made at once too."""
    ids, dtypes, shapes, offsets = list(bulk[0]), list(bulk[1]), list(bulk[2]), list(bulk[3])
    known = set(ids)
    for spec in regions:
        if id(spec) not in known and spec._numpy is not None:
            known.add(id(spec))
            ids.append(id(spec))
            dtypes.append(spec._numpy)
            shapes.append(spec.shape)
            offsets.append(spec.offset)
    return tuple(ids), tuple(dtypes), tuple(shapes), tuple(offsets)


#: A batch's layout and what it needs: the layout, the tensors made at once (the plan's fixed
#: ones, their copies' regions and the parts'), the parts' tensors in order and their ids.
Sized = tuple[Layout, Bulk, tuple[TensorSpec, ...], tuple[int, ...]]


class SizedLayouts:
    """The layouts of one plan with padded or concatenated parts, by the parts' sizes.

    ``parts`` are the parts in the order the compiled plan reads them: each part's index
    among the layout's parts and the recipe that places it. A padded part's key is its
    padded length (1-D values) or ``(dim, sizes)``, a concatenated one's ``(total rows,
    trailing sizes, values)``, one of numbers of several types its dtype; :meth:`get` takes
    one key per part.
    """

    __slots__ = ("bulk", "fixed", "kept", "nbytes", "nparts", "parts", "size", "template")

    def __init__(
        self,
        template: Spec,
        nbytes: int,
        nparts: int,
        size: int,
        bulk: Bulk,
        fixed: Sequence[TensorSpec],
        parts: Sequence[tuple[int, PadRecipe | ConcatRecipe | MixedNumbers]],
    ):
        self.template = template
        self.nbytes = nbytes  # the fixed fields' bytes: the parts start here
        self.nparts = nparts
        self.size = size
        self.bulk = bulk
        self.fixed = tuple(fixed)  # the regions of the fixed fields' copies
        self.parts = tuple(parts)
        self.kept: dict[Hashable, Sized] = {}

    def get(self, key: tuple[Any, ...]) -> Sized:
        """The layout of a batch whose parts have these sizes (made on first sight)."""
        found = self.kept.get(key)
        if found is None:
            found = self._make(key)
            if len(self.kept) >= MOST_LAYOUTS:
                self.kept.clear()  # a plan of ever new sizes: start over rather than grow
            self.kept[key] = found
        return found

    def _make(self, key: tuple[Any, ...]) -> Sized:
        offset = self.nbytes
        parts: list[Part | None] = [None] * self.nparts
        specs: list[TensorSpec] = []
        for (index, recipe), sizes in zip(self.parts, key, strict=True):
            if isinstance(recipe, PadRecipe):
                dim, shape = (0, (sizes,)) if recipe.ndim == 1 else sizes
                parts[index], placed, offset = recipe.placed(offset, self.size, dim, shape)
            elif isinstance(recipe, MixedNumbers):  # its key: the column's dtype
                parts[index], placed, offset = recipe.placed(offset, self.size, sizes)
            else:  # Concat: its values' total rows, trailing sizes and count (Jagged: and its spread)
                parts[index], placed, offset = recipe.placed(offset, self.size, sizes[:3], *sizes[3:])
            specs.extend(placed)
        layout = Layout(self.template, offset, parts, self.bulk)  # type: ignore[arg-type]
        return layout, with_regions(self.bulk, [*self.fixed, *specs]), tuple(specs), tuple(map(id, specs))


def merged(sized: Sequence[Part | None] | None, walked: Sequence[Part | None]) -> list[Part | None]:
    """A batch's parts: the sized layout's (``None`` where the plan has no sized part), and those the walk placed."""
    if sized is None:
        return list(walked)
    return [part if part is not None else other for part, other in zip(sized, walked, strict=True)]


class ListedParts:
    """The per-sample lists of a plan's parts (``AsList()`` of plain tensors, or ``PerSample()``
    dicts of them, a list per key, or lists of such dicts), beside its sized parts, if it has some.

    Their layout changes with every batch (each sample's rows), so it is not kept: the
    compiled plan places the lists itself and hands the layout these arguments, from which
    it makes its parts only when asked (the batch moved, pickled or checked). ``lists`` are
    the lists' dtypes, in the order the compiled plan places them, each with whether it
    holds numbers (a 0-d tensor each) and the names of the arguments that follow its
    region's: ``"wraps"`` (each value's class and metadata), ``"absent"`` (where values are
    ``None``), ``"stacked"`` (the shape of the one tensor a field without a policy makes where
    its values agree, else ``None``), ``"units"`` and ``"groups"`` (each sample's stack of
    items, or its items); ``parts`` says, by part index, which list is the part (its
    place in that order), or, for a ``PerSample()`` part, what it is made of: ``("list", n)``,
    ``("value", i)``, ``("rows", keys, members, cls)`` (a mapping per value) or ``("groups", member)``
    (each value a list of ``member``'s items; each value's count of them follows the lists'
    arguments, depth first, in the order of ``parts``).
    """

    __slots__ = ("lists", "nparts", "parts")

    def __init__(self, nparts: int, lists: Sequence[tuple[torch.dtype, bool, tuple[str, ...]]], parts: dict[int, Any]):
        self.nparts = nparts
        self.lists = tuple(lists)
        self.parts = dict(parts)

    def make(self, *geometry: Any) -> list[Part]:
        """The parts, from each list's ``split`` (its values' rows and the gaps), trailing sizes and offset."""
        return self._placed([None] * self.nparts, geometry)

    def over(self, sized: Sequence[Part | None], *geometry: Any) -> list[Part]:
        """:meth:`make` where the plan has sized parts too: ``sized`` are the sized layout's parts."""
        return self._placed(list(sized), geometry)

    def _placed(self, parts: list[Part | None], geometry: Sequence[Any]) -> list[Part]:
        lists: list[Spec] = []
        arguments = iter(geometry)
        for dtype, numbers, names in self.lists:
            split, trailing, offset = next(arguments), next(arguments), next(arguments)
            more = {name: next(arguments) for name in names}
            region = TensorSpec(dtype, (sum(split), *trailing), offset)
            if more.get("stacked") is not None:  # values (or items) that agree, without a policy: one tensor
                wraps = more.get("wraps")  # a subclass's stack keeps its class, as torch.stack gives it
                lists.append(TensorSpec(dtype, more["stacked"], offset, None if wraps is None else wraps[0]))
                continue
            if "units" in more:  # each sample's stack of items, or its items
                lists.append(ItemsSpec(SplitSpec(region, split, more["units"]), more["groups"]))
                continue
            # A number: one 0-d tensor; values that lie flat: each viewed back as its shape.
            shapes = ((),) * (len(split) // 2) if numbers else more.get("shaped")
            lists.append(SplitSpec(region, split, shapes, more.get("absent", ()), more.get("wraps")))
        counts = arguments  # then each value's count of items, for the PerSample() parts' lists
        for index, made_of in self.parts.items():
            parts[index] = Part(lists[made_of] if type(made_of) is int else _member(made_of, lists, counts))
        return parts  # type: ignore[return-value]


def _member(member: tuple[Any, ...], lists: list[Spec], counts: Iterator[Any]) -> Spec:
    """The spec of a ``PerSample()`` part's member (the code generator's ``Member``, its lists by their place)."""
    tag = member[0]
    if tag == "list":
        found: Spec = lists[member[1]]
        return found
    if tag == "value":
        return ValueSpec(member[1])
    if tag == "rows":
        return RowsSpec(member[3], member[1], [_member(inner, lists, counts) for inner in member[2]])
    own = next(counts)  # depth first, as the generated function hands them over
    return GroupsSpec(_member(member[1], lists, counts), own)
