"""``MMCollate``: plan a batch once per structure, allocate its one buffer, fill it.

The pipeline, one module per stage: :mod:`pincollate._plan.cache` finds the batch's cached plan
(or plans it), :mod:`pincollate._plan.fill` gathers and checks each field and copies it into its
slot, :mod:`pincollate._memory.arena` allocates the buffer, :mod:`pincollate._batch.batch` returns the views.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal

from .._batch.layout import Layout
from .._errors import CollateError
from .._locks import new_lock
from .._memory import ring as _ring
from .._memory.arena import Kind, PinMode, resolve_kind
from .._plan.cache import Plan, Plans
from .._plan.careful import Planner
from .._plan.fallback import Fallbacks
from .._plan.fill import Mismatch
from .._plan.patterns import FieldRules, Fields, Pattern, Renames, Settings
from .._plan.policies import Policy
from .._types.kinds import is_sequence
from .._types.leaves import REGISTRATIONS, type_name

__all__ = ["MMCollate", "mm_collate"]

Path = tuple[Hashable, ...]

_SETTINGS = (
    "pin_memory",
    "sequences",
    "fields",
    "ragged",
    "missing",
    "rename",
    "worker_slots",
    "pin_slots",
    "compile",
)


def _samples(batch: Any) -> list[Any]:
    if type(batch) is list:
        samples = batch
    elif not is_sequence(batch):
        raise CollateError(f"expected a sequence of samples, got {type_name(batch)}")
    else:
        samples = list(batch)
    if not samples:
        raise CollateError("empty batch: there are no samples to collate")
    return samples


class MMCollate:
    """A multimodal collate function that builds each batch in one buffer.

    Use an instance as a DataLoader's ``collate_fn``. Wherever torch's
    ``default_collate`` succeeds the result is the same (container types, dtypes,
    shapes, values; a top-level dict comes back as a [Batch][pincollate.Batch], a
    ``dict`` subclass). Every output tensor lies in one ``uint8`` buffer:
    shared memory inside a DataLoader worker (a recycled slot, see ``worker_slots``),
    pinned memory in the main process when ``pin_memory`` asks for it.

    Args:
        pin_memory: ``"auto"`` pins in a process that has started an accelerator
            with pinned memory (a process that has not, such as a data-loading pool,
            keeps plain memory); ``True`` pins wherever such an accelerator is
            present and raises where none is; ``False`` never pins. Workers never
            pin and never touch CUDA.
        sequences: ``"transpose"`` treats lists like ``default_collate`` (position by
            position), falling back to item semantics when lengths differ;
            ``"items"`` treats every list as that sample's items (several images of
            one prompt): stacked where they agree, else kept as a list.
        fields: policies by key-path pattern, e.g. ``{"input_ids": Pad()}``: keys
            joined by dots, list positions as digits, ``*`` for any one key or
            position; a tuple of keys (``("meta", "v1.2")``) names keys that hold a
            dot. The most specific pattern wins; one that matches nothing is
            reported once.
        ragged: the policy for fields no pattern names: their tensors and arrays, in
            every batch, and their token-id lists where it is ``Pad``, ``Concat`` or
            ``Jagged`` (``None``: stack when the values agree, else a list). See
            docs/policies.md.
        missing: ``"error"`` (keys must agree across samples) or ``"none"`` (absent
            keys become ``None``; empty for ``Pad``/``Concat``/``Jagged``).
        rename: output names for keys, by dot-separated key path, e.g.
            ``{"label": "labels"}`` for Hugging Face models; a renamed field's policy
            extras take the new name. Never automatic; a path that matches nothing
            is reported once, as field patterns are.
        worker_slots: the most shared-memory slots each DataLoader worker recycles
            for its batches (a batch then crosses to the main process without a
            file descriptor or a new mapping). A ring only grows to the batches a
            worker has in flight at once, about ``prefetch_factor + 1``; with every
            slot in use a batch takes a fresh buffer. ``0`` gives every batch a
            fresh buffer; the default is 8. A worker has one ring, sized by the
            first collate that runs there.
        pin_slots: in the main process, register each worker slot with CUDA once,
            so worker batches arrive page-locked and ``pin_memory`` copies nothing.
            Needs CUDA in the main process; without it slots are left as they are.
        compile: ``True`` walks a new structure's first batch carefully, plans the
            structure once when it comes again, and runs every later batch as the plan's
            generated code; ``False`` walks every batch carefully, value by value
            (slower; the same batches and errors: for debugging, and as the reference
            the compiled plans are tested against).

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate
        >>> collate = MMCollate(pin_memory=False)
        >>> batch = collate([{"img": torch.zeros(3, 2, 2), "label": 1}, {"img": torch.ones(3, 2, 2), "label": 0}])
        >>> batch["img"].shape, batch["label"].tolist()
        (torch.Size([2, 3, 2, 2]), [1, 0])
        >>> batch["label"].data_ptr() - batch.buffer.data_ptr()  # one buffer: "label" after "img"
        192
    """

    def __init__(
        self,
        pin_memory: PinMode = "auto",
        *,
        sequences: Literal["transpose", "items"] = "transpose",
        fields: Fields | None = None,
        ragged: Policy | None = None,
        missing: Literal["error", "none"] = "error",
        rename: Mapping[str, str] | None = None,
        worker_slots: int = _ring.DEFAULT_SLOTS,
        pin_slots: bool = False,
        compile: bool = True,
    ):
        if not (isinstance(pin_memory, bool) or pin_memory == "auto"):
            # 1 == True and 0 == False pass a membership test, then read as neither.
            raise CollateError(f"pin_memory must be True, False or 'auto', got {pin_memory!r}")
        if sequences not in ("transpose", "items"):
            raise CollateError(f"sequences must be 'transpose' or 'items', got {sequences!r}")
        if missing not in ("error", "none"):
            raise CollateError(f"missing must be 'error' or 'none', got {missing!r}")
        if type(worker_slots) is not int or worker_slots < 0:
            raise CollateError(f"worker_slots must be an int >= 0, got {worker_slots!r}")
        if not isinstance(pin_slots, bool):
            raise CollateError(f"pin_slots must be True or False, got {pin_slots!r}")
        if not isinstance(compile, bool):
            raise CollateError(f"compile must be True or False, got {compile!r}")
        if ragged is not None and not isinstance(ragged, Policy):
            raise CollateError(f"ragged must be a policy or None, got {type_name(ragged)}")
        self.pin_memory: PinMode = pin_memory
        self.sequences: Literal["transpose", "items"] = sequences
        self.fields: dict[Pattern, Policy] = dict((fields or {}).items())
        self.ragged: Policy | None = ragged
        self.missing: Literal["error", "none"] = missing
        self.rename: dict[str, str] = dict(rename or {})
        self.worker_slots = worker_slots
        self.pin_slots = pin_slots
        self.compile = compile
        self._rules = FieldRules(self.fields)
        self._renames = Renames(self.rename)
        self._reported: set[Pattern] = set()
        self._lock = new_lock()
        #: The fields warned of as per-sample lists: warned once a batch is made (a failed one warns of none).
        self._fallbacks = Fallbacks()
        settings = Settings(
            self._rules,
            self._renames,
            self._fallbacks,
            ragged,
            missing=missing == "none",
            items=sequences == "items",
            compiled=compile,
        )
        self._settings = settings
        self._planner = Planner(settings)
        self._plans = Plans(settings, self._planner)
        self._generation = REGISTRATIONS[0]

    def _replan_if_registered(self) -> None:
        """Drop every plan made before a leaf or container type was registered (or registered again).

        A plan holds what the registrations said when it was made (a container's flatten, a
        leaf's handler, the built-in kind of a class now registered): the walk reads the
        registrations anew, so the plans are made anew from it.
        """
        now = REGISTRATIONS[0]
        if now != self._generation:
            with self._lock:
                if now != self._generation:
                    self._planner = Planner(self._settings)
                    self._plans = Plans(self._settings, self._planner)
                    self._generation = now

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SETTINGS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("pin_memory"), **state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"MMCollate(pin_memory={self.pin_memory!r}, sequences={self.sequences!r}, "
            f"fields={self.fields!r}, ragged={self.ragged!r}, missing={self.missing!r}, rename={self.rename!r}, "
            f"worker_slots={self.worker_slots!r}, pin_slots={self.pin_slots!r}, compile={self.compile!r})"
        )

    def plan(self, batch: Sequence[Any]) -> Layout:
        """The [Layout][pincollate.Layout] the next call on ``batch`` gives its batch, without making the batch.

        A batch the collate would refuse raises the same
        [CollateError][pincollate.CollateError] here: the copies, which check what the plan's
        guards leave to them, run into plain memory of their own, dropped (a batch's worth of
        memory and copying for a moment). A new structure's first batch is walked and its
        layout is the walk's; a later batch's is the compiled plan's.
        """
        self._replan_if_registered()
        try:
            layout: Layout = self._through_plans(_samples(batch), None)
        except BaseException as error:
            self._failed(batch, error)
            raise
        if self._fallbacks.waiting:
            self._fallbacks.flush()
        return layout

    def __call__(self, batch: Sequence[Any]) -> Any:
        """Collate ``batch`` (a sequence of samples) into one buffer."""
        if self._generation != REGISTRATIONS[0]:  # read inline: once per batch
            self._replan_if_registered()
        try:
            kind = resolve_kind(self.pin_memory)
            if type(batch) is not list or not batch:
                out = self._through_plans(_samples(batch), kind)
            else:
                last = self._plans.last
                if last is not None and kind != "shared":
                    # A run of batches of one structure: straight to the last plan's function, which
                    # checks the batch completely as it runs.
                    try:
                        out = last.compiled.run(batch, kind, 0, self.pin_slots, None)
                    except Mismatch as mismatch:
                        out = self._through_plans(batch, kind, (last, mismatch.paths))
                else:
                    out = self._through_plans(batch, kind)
        except BaseException as error:
            self._failed(batch, error)
            raise
        if self._fallbacks.waiting:  # warned once the batch is made, whichever field its code read first
            self._fallbacks.flush()
        return out

    def _failed(self, batch: Sequence[Any], error: BaseException) -> None:
        """A batch failed with ``error``: it warns of none of its fields, and a ``CollateError`` is the walk's.

        Raises the careful walk's error where it differs from ``error`` (see :meth:`_walked_error`);
        returns where the caller re-raises ``error``.
        """
        try:
            if isinstance(error, CollateError):
                walked = self._walked_error(batch, error)
                if walked is not error:
                    raise walked from None
        finally:
            self._fallbacks.drop()  # what this batch's code, or the walk of it, reported

    def _walked_error(self, batch: Sequence[Any], error: CollateError) -> CollateError:
        """The error the careful walk of the whole batch gives (``compile=False``'s), else ``error``.

        A compiled plan checks its fields in the order its code reads them (blocks of numbers
        after the other fields, a field planned anew after the cached ones), and a batch with
        two faults may fail first at the later one. Its error is the careful walk's: the first
        fault in the samples' key order, named as ``compile=False`` names it (and warned of as
        it warns), at the cost of one walk of a batch that fails.
        """
        if not self.compile:
            return error  # it was the walk's
        try:
            samples = _samples(batch)
            self._planner.plan(samples, ())
        except CollateError as walked:
            return walked
        except Exception:  # the walk cannot say more than the error already does
            return error
        return error

    def _use(self, plan: Plan, samples: list[Any], kind: Kind | None) -> Any:
        """The batch of ``samples`` by ``plan`` (``kind`` ``None``: its layout only, nothing copied)."""
        if kind is None:
            return plan.check(samples)
        # Only a carrier crosses as a slot index (a batch of a user's mapping type would
        # cross tensor by tensor, and its slot could not be reused). A carrier can also
        # cross as its bytes, where /dev/shm has no room (see _shm).
        carrier = kind == "shared" and plan.carrier
        slots = self.worker_slots if carrier else 0
        pin = self.pin_memory if carrier else None
        return plan.compiled.run(samples, kind, slots, self.pin_slots, pin)

    def _through_plans(
        self, samples: list[Any], kind: Kind | None, failed: tuple[Plan, tuple[Path, ...]] | None = None
    ) -> Any:
        """:meth:`_use` with the plan that fits: the last one, a cached one, or a new one.

        The last plan used checks the batch completely as it runs, so a run of batches of
        one structure never computes a signature. A batch that does not fit is looked up
        by signature; if its own plan does not fit either, the fields that failed are
        planned carefully from now on, in a new plan: at most two plans per batch. A
        structure that has not come before is walked (:meth:`Plans.first_sight`), not planned.
        ``failed``: the last plan, tried already, and the paths where the batch did not fit it.
        """
        plans = self._plans
        tried = plans.last
        learned: tuple[Path, ...] = ()
        if failed is not None:
            tried, learned = failed
        elif tried is not None:
            try:
                return self._use(tried, samples, kind)
            except Mismatch as mismatch:
                learned = mismatch.paths
        key = plans.signature(samples)
        first: Hashable | None = None
        if tried is None or key != tried.key:
            learned = ()
            found = plans.get(key)
            if found is not None:
                try:
                    out = self._use(found, samples, kind)
                    plans.last = found
                    return out
                except Mismatch as mismatch:
                    learned = mismatch.paths
            else:
                # A new structure is walked this once, planned and compiled if it comes again.
                first = plans.first_sight(samples)
        plan, commit = (plans.walked(len(samples)), None) if first is not None else plans.make(samples, learned)
        try:
            out = self._use(plan, samples, kind)
        except Mismatch as mismatch:
            # A fresh plan checked every value it relies on; samples changed under us.
            raise CollateError(f"the samples changed while they were collated (at {mismatch.paths})") from mismatch
        if commit is not None:
            commit()
        elif first is not None and kind is not None:  # a layout asked for is the one its next batch gets
            plans.saw(first)
        if self._rules or self._renames:
            self._report_unmatched()
        return out

    def _report_unmatched(self) -> None:
        with self._lock:
            unmatched = [p for p in self._rules.patterns if p not in self._rules.matched]
            unmatched += [p for p in self._renames.names if p not in self._renames.matched]
            for pattern in unmatched:
                if pattern not in self._reported:
                    self._reported.add(pattern)
                    warnings.warn(
                        f"pincollate: {'rename' if pattern in self._renames.names else 'field pattern'} {pattern!r} matched no key path in this batch",
                        UserWarning,
                        stacklevel=4,
                    )


mm_collate: MMCollate = MMCollate()
"""``MMCollate()`` with its defaults: ``DataLoader(dataset, collate_fn=pincollate.mm_collate)``."""
