"""The plan cache: one Layout per sample structure, checked cheaply for every batch.

A batch's *signature* is sample 0's structure (container types, keys with their
types, leaf types, dtypes and shapes) and the batch size. A new structure's first batch
is walked carefully (:meth:`Plans.first_sight`); when it comes again, its signature is
planned once: every field whose values all agree (one type, dtype and
shape; mappings with one key set; sequences of one length) gets a slot in a cached
:class:`~pincollate._batch.layout.Layout` and an op that, for every later batch, gathers the
field's column and checks it at C speed (:mod:`pincollate._plan.template` plans it). Fields that do
not agree (ragged, mixed, with a policy) become *parts*, planned anew for each batch
by the plan's generated function (their recipes) or the careful walk after the cached slots.

A batch that does not fit its plan (a column that turned ragged) raises
:class:`~pincollate._plan.fill.Mismatch`; its paths are remembered as careful for good,
and the batch is planned again: at most two plans for any batch.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from .._batch.batch import carries, make_batch
from .._batch.layout import Layout, PartSpec, Spec, bulk_of
from .._batch.views import START
from .._locks import new_lock
from .._memory.arena import Kind, PinMode, allocate
from .._types.builtin import KEPT_VALUES, NUMBERS
from .._types.kinds import LISTS, MAPPING, SEQUENCE, kind_of
from .._types.leaves import lookup
from .careful import Planner
from .codegen import CompiledPlan, compile_parts, compile_whole, is_listed, is_sized
from .column import MAX_DEPTH
from .fill import Fill, Mismatch
from .ops import Op
from .patterns import Settings
from .sized import SizedLayouts
from .template import Template
from .tree_ops import CarefulOp, DataclassOp, MappingOp, RegisteredOp, SequenceOp

__all__ = ["CAREFUL_LEAST", "Plan", "Plans"]

Path = tuple[Hashable, ...]

_CAREFUL = object()

#: Whether a new structure's first batch is walked and its plan compiled when it comes again
#: (:meth:`Plans.first_sight`); ``False`` compiles at first sight (the suite's tests of the
#: compiled code, which read the plan a first batch made).
WALK_FIRST_SIGHT = True

#: The source shown for a plan that walks its whole batch: it runs the walk, no generated code.
_WALKED = "# the careful walk of the whole batch (Plan._walk_whole): no generated code\n"


#: The fewest careful paths a cache keeps before it cuts them back to its plans' own.
CAREFUL_LEAST = 1024


class Plan:
    """A cached plan: the Layout template, its node tree's generated functions, and how many values and parts it has.

    ``layout`` is the one Layout every batch of this plan shares when it has no parts.
    ``size`` is its batch size: the generated code checks each sample, not how many there are.
    ``compiled.run(samples, kind, slots, pin_slots, pin)`` makes the whole batch
    (:func:`~pincollate._plan.codegen.compile_whole`; with parts, the samples themselves one
    included, :func:`~pincollate._plan.codegen.compile_parts`), or its layout alone (``kind``
    ``None``).
    """

    __slots__ = (
        "bulk",
        "careful",
        "carrier",
        "compiled",
        "key",
        "layout",
        "nbytes",
        "nparts",
        "nvalues",
        "op",
        "planner",
        "size",
        "sized",
        "template",
        "walking",
        "walks",
    )

    def __init__(
        self,
        template: Spec,
        op: Op,
        nbytes: int,
        nvalues: int,
        nparts: int,
        size: int,
        planner: Planner | None = None,
    ):
        self.size: int = size
        self.template: Spec = template
        self.op: Op = op
        self.nbytes: int = nbytes
        self.nvalues: int = nvalues
        self.nparts: int = nparts
        self.planner = planner
        self.bulk = bulk_of(template)
        self.layout = Layout(template, nbytes, bulk=self.bulk) if nparts == 0 else None
        self.key: Hashable = None
        #: The key paths this plan walks for each batch: what of the cache's careful paths it needs.
        self.careful: frozenset[Path] = frozenset()
        self.sized: SizedLayouts | None = None
        #: The function that walks every part of a batch (where a part's guard in the plan's own
        #: function misses): made by the first batch that needs it.
        self.walking: CompiledPlan | None = None
        description = _describe(op, size)
        #: Whether its function walks a part for each batch (a part no recipe describes), or the whole batch.
        self.walks = False
        if self.layout is not None:
            self.compiled: CompiledPlan = compile_whole(op, self.layout, size, nvalues, description)
            self.carrier = carries(self.layout)
            return
        assert planner is not None, "a plan with parts needs its planner"
        if type(op) is CarefulOp and op.recipe is None:
            # The careful walk of the whole batch (compile=False, a first sight): the walk's own run,
            # no code to generate.
            self.compiled = CompiledPlan(self._walk_whole, _WALKED, "<pincollate careful walk>")
            self.carrier = True  # the walk's batch says whether it is a carrier
            self.walks = True
            return
        # A plan with parts: one generated function makes the whole batch, the parts its recipes
        # describe read at C speed (a sized layout picked by their sizes, the lists placed after it),
        # the others walked for each batch and placed after them.
        self.compiled, self.sized = compile_parts(
            op, template, nbytes, nparts, size, nvalues, self.bulk, self.walked, description, planner
        )
        # A part at the root (the samples themselves) makes whatever the batch makes of it: its
        # function asks for each batch whether the batch is a carrier, which alone takes a ring slot.
        self.carrier = type(template) is PartSpec or carries(Layout(template, nbytes))
        self.walks = not all(is_sized(node) or is_listed(node) for node in _nodes(op) if type(node) is CarefulOp)

    def check(self, samples: Sequence[Any]) -> Layout:
        """The layout of ``samples``'s batch (their parts planned where the plan has parts).

        The copies check what the guards leave to them (a stacked value's shape past sample 0,
        a block's classes and dtypes): they run into plain memory of their own, dropped, so a
        batch the collate would refuse (or plan again) is refused (or planned again) here too.
        """
        layout = self.compiled.run(samples, None, 0, False, None)
        self.compiled.run(samples, "plain", 0, False, None)
        return layout  # type: ignore[no-any-return]

    def _walk_whole(
        self,
        samples: Sequence[Any],
        kind: Kind | None,
        slots: int,
        pin_slots: bool,
        pin: PinMode | None,
        into: Any = None,
    ) -> Any:
        """The batch (``kind`` ``None``: its layout) as the careful walk makes it, whole."""
        if len(samples) != self.size:
            raise Mismatch()  # another batch size: another plan
        fill = Fill(self.planner, 1, START)  # type: ignore[arg-type]
        self.op.run(samples, fill)  # type: ignore[attr-defined]
        layout = Layout(self.template, fill.offset, fill.parts)
        if kind is None:
            return layout
        if not carries(layout):  # only a carrier crosses as a slot index: any other takes a buffer of its own
            slots, pin = 0, None
        buffer = allocate(layout.nbytes, kind, slots, pin_slots, pin) if into is None else into
        return make_batch(layout, buffer, fill.values, fill.execute(buffer, kind == "plain"))

    def walked(
        self,
        samples: Sequence[Any],
        kind: Kind | None,
        slots: int,
        pin_slots: bool,
        pin: PinMode | None,
        into: Any = None,
    ) -> Any:
        """The batch with every part walked (``kind`` ``None``: its layout): where a part's guard misses."""
        walking = self.walking
        if walking is None:  # two threads may both compile it: either function serves
            walking = self.walking = compile_parts(
                self.op,
                self.template,
                self.nbytes,
                self.nparts,
                self.size,
                self.nvalues,
                self.bulk,
                None,
                _describe(self.op, self.size) + ", parts walked",
                self.planner,
                walk_all=True,
            )[0]
        return walking.run(samples, kind, slots, pin_slots, pin, into)


class Plans:
    """The cache of plans of one :class:`~pincollate.MMCollate`, keyed by signature.

    ``careful`` holds the key paths planned anew for each batch. It grows as plans learn
    them, and where keys come from the data (a file name per sample) it would grow for good, and
    make every plan cost more (each copies it): past twice what the cached plans need (and
    :data:`CAREFUL_LEAST`), it is cut back to the paths of the plans still cached. A structure
    evicted with its plan learns its paths again if it comes back.
    ``planned`` counts the plans made, so tests can tell the cache is used.

    A structure is compiled the second time it comes (:meth:`first_sight`): its first batch
    is the careful walk's, which costs a fraction of planning and compiling, so a structure
    seen once (an epoch's last, smaller batch) never pays for code it would not run again.
    New shapes of a structure seen before (another bucket's) are planned at once, and the fields
    whose shapes differ from the structure's last plan are planned for each batch from then on
    (:func:`_varying`): one plan for every shape.
    """

    def __init__(self, settings: Settings, planner: Planner, capacity: int = 64):
        self.settings: Settings = settings
        self.planner = planner
        self.items: bool = settings.items
        self.capacity: int = capacity
        self.careful: set[Path] = set()
        self._careful_bound = CAREFUL_LEAST
        self.planned = 0
        #: The plan the last batch used: tried first, without a signature.
        self.last: Plan | None = None
        self._plans: OrderedDict[Hashable, Plan] = OrderedDict()
        #: Signatures whose first batch was walked, not planned: the next one plans them.
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        #: The careful walk of a whole batch, by batch size: what a first sight runs.
        self._walks: dict[int, Plan] = {}
        #: Each structure's last planned signature: where a new one differs only in shapes, those
        #: fields are planned for each batch from then on (one plan, not one per shape).
        self._shapes: OrderedDict[Hashable, Hashable] = OrderedDict()
        self._lock = new_lock()

    def signature(self, samples: Sequence[Any]) -> Hashable:
        return (len(samples), _signature(samples[0], (), self.careful, self.items), self._keys(samples))

    def _keys(self, samples: Sequence[Any]) -> frozenset[Hashable] | None:
        """Under ``missing="none"``, every key the batch's samples hold (mappings at the top), else ``None``.

        Sample 0 may lack a key other samples hold: batches with it and without it are two
        structures, two plans. Without it in the key, the plan of one would miss on the other
        at the top and make the whole batch careful, walked for good for every structure.
        """
        if not self.settings.missing or kind_of(samples[0]) is not MAPPING:
            return None
        return frozenset().union(*samples)

    def get(self, key: Hashable) -> Plan | None:
        """The cached plan for a signature, or ``None``; a plan found is the last the cache evicts.

        Least recently used, not first in: a structure a loader keeps coming back to (the
        training batches between evaluation batches of many shapes) keeps its plan.
        """
        plan = self._plans.get(key)
        if plan is not None:
            with self._lock:
                if key in self._plans:
                    self._plans.move_to_end(key)
        return plan

    def first_sight(self, samples: Sequence[Any]) -> Hashable | None:
        """The structure of ``samples`` where it has not come before (:meth:`saw` remembers it), else ``None``.

        The structure is sample 0's keys, classes, dtypes and ranks (a list's first value for
        all of them): a ragged field that no plan has learnt yet changes its shapes or a list's
        length with every batch, not its structure. Never with ``compile=False``, whose every
        plan walks its batch.
        """
        if not WALK_FIRST_SIGHT or not self.settings.compiled:
            return None
        key = (len(samples), _signature(samples[0], (), self.careful, self.items, shapes=False), self._keys(samples))
        with self._lock:
            return None if key in self._seen else key

    def saw(self, key: Hashable) -> None:
        """Remember a structure whose first batch was walked (and collated: one that fails teaches nothing)."""
        with self._lock:
            self._seen[key] = None
            if len(self._seen) > 4 * self.capacity:
                self._seen.popitem(last=False)

    def walked(self, size: int) -> Plan:
        """A plan that walks a whole batch of ``size`` samples carefully (what ``compile=False`` plans), cached by size."""
        plan = self._walks.get(size)
        if plan is None:
            if len(self._walks) >= 8:  # sizes a loader makes are few: keep the table small
                self._walks.clear()
            plan = self._walks[size] = Plan(PartSpec(0), CarefulOp((), 0, None), 0, 0, 1, size, self.planner)
        return plan

    def make(self, samples: Sequence[Any], learned: Sequence[Path] = ()) -> tuple[Plan, Callable[[], None]]:
        """Plan ``samples``, with ``learned`` paths careful besides those known.

        Returns the plan and ``commit``, which caches it and keeps the careful paths
        it found. Call it once the batch collated: a batch that fails teaches nothing.
        """
        with self._lock:  # another thread may be committing what it learnt
            careful = {*self.careful, *learned}
            structure = (len(samples), _signature(samples[0], (), careful, self.items, shapes=False))
            before = self._shapes.get(structure)
        if before is not None:
            # A structure planned before, with other shapes: the fields whose shapes change from
            # batch to batch (a bucketed length, a resized image) are planned for each batch by
            # their recipe, which reads their sizes, so a loader of many shapes compiles one plan.
            careful.update(_varying(before[1], _signature(samples[0], (), careful, self.items), ()))  # type: ignore[index]
        if not self.settings.compiled or _refers_to_itself(samples[0]):
            # The careful walk for the whole batch: asked for (compile=False), or it names
            # where the sample refers to itself, whatever was planned before.
            careful.add(())
        known = set(careful)
        template = Template(self.settings, careful, self.planner)
        spec, op = template.plan(samples, (), None)
        while template.clashing - known:
            # A mapping whose parts may give extras of one name: walked for each batch, as a part.
            known |= template.clashing
            careful = set(known)
            template = Template(self.settings, careful, self.planner)
            spec, op = template.plan(samples, (), None)
        plan = Plan(spec, op, template.offset, template.nvalues, template.nparts, len(samples), self.planner)

        def commit() -> None:
            with self._lock:
                # A new set, not the old one changed: another thread may be reading it for a signature.
                self.careful = self.careful | template.careful
                plan.careful = frozenset(template.own)
                self.planned += 1
                # The key later batches compute, now that the careful paths are known.
                plan.key = self.signature(samples)
                self._plans[plan.key] = plan
                self.last = plan
                if len(self._plans) > self.capacity:
                    self._plans.popitem(last=False)
                if len(self.careful) > self._careful_bound:
                    # Each cached plan keeps its own paths, so its key, computed with them careful,
                    # is what its later batches compute still.
                    self.careful = set().union(*(kept.careful for kept in self._plans.values()))
                    self._careful_bound = max(CAREFUL_LEAST, 2 * len(self.careful))
                # Under the structure later batches compute, now that the careful paths are known.
                now = (len(samples), _signature(samples[0], (), self.careful, self.items, shapes=False))
                self._shapes[now] = plan.key
                self._shapes.move_to_end(now)
                if len(self._shapes) > 4 * self.capacity:
                    self._shapes.popitem(last=False)

        return plan, commit


def _signature(value: Any, path: Path, careful: set[Path], items: bool, depth: int = 0, shapes: bool = True) -> object:
    """What of ``value`` decides its plan; careful paths are not looked into.

    ``shapes=False``: a tensor's rank in place of its shape, a ``list``'s first value in place of
    all of them, a leaf's class: the structure that a ragged field (whose shape or length changes
    from batch to batch until a plan learns it is ragged) keeps.
    """
    if careful and path in careful:
        return _CAREFUL
    cls = type(value)
    if cls is torch.Tensor:
        # A nested tensor has no shape; the careful planner says why it is refused.
        return (cls, value.dtype, value.shape if shapes else value.dim()) if not value.is_nested else _CAREFUL
    if cls in NUMBERS or cls in KEPT_VALUES:
        return cls
    if depth > MAX_DEPTH:
        return _CAREFUL
    depth += 1
    handler = lookup(cls)
    if handler is not None:
        return (cls, handler.signature(value)) if handler.signature is not None and shapes else cls
    kind = kind_of(value)
    if kind is None or (kind is SEQUENCE and items):
        return cls
    if cls is list and not shapes:  # a list's length, like a shape, may change with every batch (a tuple's keeps)
        return (cls, _signature(value[0], (*path, 0), careful, items, depth, shapes) if value else None)
    if cls in LISTS:
        classes = _flat_classes(value)
        if classes is not None and not _careful_child(careful, path, len(classes)):
            # Numbers or strings only (a list of token ids): each one's signature is its class,
            # read at C speed; _varying reads such a tuple child by child.
            return (cls, _FLAT, classes)
    if kind is MAPPING:
        return (
            cls,
            *((type(k), k, _signature(v, (*path, k), careful, items, depth, shapes)) for k, v in value.items()),
        )
    try:
        keys, children = kind.flatten(value)
        hash(tuple(keys))
    except Exception:  # a registered container's flatten failed, or gave unhashable keys: the careful planner says why
        return _CAREFUL
    return (
        cls,
        # A registered flatten may give keys and children of two lengths: the plan then says so.
        *(
            (type(key), key, _signature(child, (*path, key), careful, items, depth, shapes))
            for key, child in zip(keys, children, strict=False)
        ),
    )


#: The classes whose signature is the class itself, and that hold no container.
_FLAT_LEAVES = frozenset((*NUMBERS, *KEPT_VALUES))
#: Marks the signature of a list or tuple of such values: ``(cls, _FLAT, their classes)``.
_FLAT = object()


def _flat_classes(value: list[Any] | tuple[Any, ...]) -> tuple[type, ...] | None:
    """The classes of a list's values where all are numbers or strings (no container among them), else ``None``."""
    classes = tuple(map(type, value))
    if classes and classes.count(classes[0]) == len(classes):  # one class (token ids): the common case
        return classes if classes[0] in _FLAT_LEAVES else None
    return classes if _FLAT_LEAVES.issuperset(classes) else None


def _careful_child(careful: set[Path], path: Path, length: int) -> bool:
    """Whether a place of the sequence of ``length`` at ``path`` is careful (its signature is then not its class).

    Only a place the sequence has counts: a careful path learnt where another structure held
    something longer (or a mapping) there says nothing about it.
    """
    depth = len(path) + 1
    return any(
        len(known) == depth and type(place := known[-1]) is int and 0 <= place < length and known[:-1] == path
        for known in careful
    )


def _per_place(signature: object) -> object:
    """A list of numbers or strings' signature as any sequence's: ``(cls, (int, i, class), ...)``; else ``signature``."""
    if type(signature) is tuple and len(signature) == 3 and signature[1] is _FLAT:
        return (signature[0], *zip(itertools.repeat(int), range(len(signature[2])), signature[2]))
    return signature


def _varying(before: object, now: object, path: Path) -> list[Path]:
    """The key paths where two signatures of one structure differ: a tensor's shape, a list's length.

    Containers that agree in class and keys are looked into; the root never counts (a whole
    batch walked is no plan).
    """
    # A list of numbers or strings is read place by place, as every other sequence is (the
    # other signature may be one whose places hold something else, or no such list at all).
    before, now = _per_place(before), _per_place(now)
    if before == now:
        return []
    if (
        type(before) is tuple
        and type(now) is tuple
        and len(before) == len(now) > 1
        and before[0] == now[0]
        # (key type, key, child) per child; a leaf handler's own signature is no such tuple of tuples.
        and all(type(a) is tuple and len(a) == 3 and isinstance(a[0], type) for a in (*before[1:], *now[1:]))
        and [a[:2] for a in before[1:]] == [b[:2] for b in now[1:]]
    ):
        # A mapping, sequence or registered container: (key type, key, child signature) per child.
        found: list[Path] = []
        for a, b in zip(before[1:], now[1:], strict=True):
            found.extend(_varying(a[2], b[2], (*path, a[1])))
        return found
    return [path] if path else []


def _refers_to_itself(value: Any, open_: set[int] | None = None, depth: int = 0) -> bool:
    """Whether a container of ``value`` holds itself (a sample that refers to itself), read once per new plan."""
    cls = type(value)
    if cls is torch.Tensor or cls in NUMBERS or cls in KEPT_VALUES or lookup(cls) is not None or depth > MAX_DEPTH:
        return False
    if cls in LISTS and _flat_classes(value) is not None:
        return False  # numbers or strings only (token ids), read at C speed
    kind = kind_of(value)
    if kind is None:
        return False
    open_ = set() if open_ is None else open_
    if id(value) in open_:
        return True
    try:
        children = kind.flatten(value)[1]
    except Exception:  # a registered flatten that fails: the careful walk says why
        return False
    open_.add(id(value))
    found = any(_refers_to_itself(child, open_, depth + 1) for child in children)
    open_.discard(id(value))
    return found


def _nodes(op: Op) -> Iterator[Op]:
    yield op
    for child in _children(op):
        yield from _nodes(child)


def _children(op: Op) -> tuple[Op, ...]:
    kind = type(op)
    if kind is MappingOp or kind is SequenceOp:
        return (*(child for _, child, _ in op.singles), *op.blocks)  # type: ignore[attr-defined]
    if kind is DataclassOp:
        return tuple(child for _, child in op.children)  # type: ignore[attr-defined]
    if kind is RegisteredOp:
        return op.children  # type: ignore[attr-defined,no-any-return]
    return ()


def _describe(op: Op, size: int) -> str:
    """A short name for a plan's generated file: its batch size and top-level keys or class."""
    keys = getattr(op, "keys", None)
    what = ", ".join(map(str, keys))[:60] if keys else type(op).__name__
    return f"{size} x {what}"
