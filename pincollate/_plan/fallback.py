"""The per-sample list a field without a policy falls back to, and the warning that says so.

Where a field's values differ in shape and no policy names the field, the batch holds it
as a per-sample list (what ragged data usually means; ``default_collate`` raises there).
A wrong-shaped value in a field that should stack takes the same path, and the model
fails later on a list. So the first time a field of a collate falls back,
:class:`RaggedFieldWarning` names it, two of its shapes, and the policies that settle it;
a policy for the field (``AsList()`` keeps the list) or ``ragged=`` silences it.

The careful planner (:mod:`.careful`, :mod:`.items`) and the recipes that list values
(:mod:`.listed`, :mod:`.images`) report through the collate's :class:`Fallbacks`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable, Iterable
from typing import Any

from .._errors import format_path, is_items
from .._locks import new_lock

__all__ = ["Fallbacks", "FieldFallback", "RaggedFieldWarning", "two_shapes"]

Path = tuple[Hashable, ...]
Shape = tuple[int, ...]


class RaggedFieldWarning(UserWarning):
    """A field without a policy came back as a per-sample list: its values differ in shape.

    Warned once per field and per collate instance, by the process that collates (a
    DataLoader worker warns for itself, so once per worker), when a batch that lists the
    field is made: a batch that fails warns of none of its fields. Name a policy for the field
    to settle it: ``AsList()`` keeps the list without a warning, ``Stack()`` makes ragged
    values an error naming the sample, ``Pad()`` or ``Concat()`` make sequences one tensor.

    Example:
        >>> import torch
        >>> import warnings
        >>> from pincollate import MMCollate, RaggedFieldWarning
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     batch = MMCollate(pin_memory=False)([{"x": torch.zeros(3)}, {"x": torch.zeros(2)}])
        >>> [t.shape for t in batch["x"]], caught[0].category is RaggedFieldWarning
        ([torch.Size([3]), torch.Size([2])], True)
        >>> print(caught[0].message)  # doctest: +NORMALIZE_WHITESPACE
        pincollate: ['x'] holds values of different shapes, (3,) in sample 0 and (2,) in sample 1, so it is a
        per-sample list, not one tensor. Name a policy for it to settle this: fields={'x': AsList()} keeps the
        list without this warning, Stack() refuses ragged values, Pad() or Concat() make sequences one tensor.
    """


def two_shapes(pairs: Iterable[tuple[int, Any]]) -> tuple[tuple[int, Shape], tuple[int, Shape]] | None:
    """The first two ``(sample, shape)`` pairs whose shapes differ, or ``None`` if all agree."""
    first: tuple[int, Shape] | None = None
    for sample, shape in pairs:
        if shape is None:
            continue
        if first is None:
            first = (sample, tuple(shape))
        elif tuple(shape) != first[1]:
            return first, (sample, tuple(shape))
    return None


class Fallbacks:
    """The fields one collate has reported as per-sample lists: each is warned once.

    A report waits for its batch: the collate warns (:meth:`flush`) once the batch is made,
    and a batch that fails warns of nothing (:meth:`drop`), whichever of its fields its code
    read first, so the careful walk and a compiled plan warn alike. Reports wait per thread.
    """

    def __init__(self) -> None:
        self._warned: set[Path] = set()
        self._lock = new_lock()
        self._local = threading.local()
        #: Reports waiting in any thread: what the collate reads after each batch (no lock, no thread-local).
        self.waiting = 0

    def field(self, path: Path) -> FieldFallback:
        """The reporter of one field, for a recipe to keep."""
        return FieldFallback(self, path)

    def report(self, path: Path, pairs: Iterable[tuple[int, Any]], items: bool = False) -> None:
        """Warn once for ``path`` if two of its ``(sample, shape)`` pairs differ.

        ``items``: the shapes are per-sample stacks of items (lists of unequal length or
        items of different shapes), for which ``Concat()`` is the packing policy.
        """
        if path in self._warned or any(map(is_items, path)):
            return  # reported, or inside one sample's items: the field of the items reports
        found = two_shapes(pairs)
        if found is None:
            return
        pending = self._pending()
        if path not in pending:  # a batch walked again (a plan that missed) reports its field again
            pending[path] = (found, items)
            with self._lock:
                self.waiting += 1

    def _pending(self) -> dict[Path, Any]:
        pending: dict[Path, Any] | None = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = {}
        return pending

    def drop(self) -> None:
        """Forget this thread's reports: its batch failed."""
        pending = self._pending()
        if pending:
            with self._lock:
                self.waiting -= len(pending)
            pending.clear()

    def flush(self) -> None:
        """Warn of this thread's reports, its batch made: each field once per collate, in key-path order."""
        pending = self._pending()
        if not pending:
            return
        reports = sorted(pending.items(), key=lambda report: format_path(report[0]))
        with self._lock:
            self.waiting -= len(pending)
            pending.clear()
            fresh = [(path, report) for path, report in reports if path not in self._warned]
            self._warned.update(path for path, _ in fresh)
        for path, (found, items) in fresh:
            _warn(path, found, items)


def pattern_for(path: Path) -> str | tuple[str, ...]:
    """A field pattern that names ``path``: its keys joined by dots, or, where a key's text holds
    a dot (``"a.b"``, ``3.5``, an enum member) or an asterisk, or is empty, one entry per key.

    A key that is ``"*"`` itself is read as any one key by either form: no pattern names it alone.

    Examples:
        >>> pattern_for(("inp", "ids", 0))
        'inp.ids.0'
        >>> pattern_for(("inp", "a.b", 0))
        ('inp', 'a.b', '0')
    """
    keys = tuple(map(str, path))
    if any(not key or "." in key or "*" in key for key in keys):
        return keys
    return ".".join(keys)


def _warn(path: Path, found: tuple[tuple[int, Shape], tuple[int, Shape]], items: bool) -> None:
    """The warning for one field, at the line that called the collate."""
    (a, first), (b, second) = found
    where = format_path(path)
    if not items:
        what = f"{where} holds values of different shapes, {first} in sample {a} and {second} in sample {b}"
    elif a == b:
        what = f"{where} holds lists of items that do not stack: sample {a}'s items have shapes {first} and {second}"
    else:
        what = (
            f"{where} holds lists of items that do not stack: sample {a}'s stack to {first}, sample {b}'s to {second}"
        )
    # The setting that names this field: a pattern, or for a batch of bare tensors ragged=.
    if not path:
        setting = "ragged=AsList()"
    elif "*" in map(str, path):
        setting = (
            "a key other than '*' with fields={...: AsList()} (no pattern names a key '*' alone: '*' is any one key)"
        )
    else:
        setting = f"fields={{{pattern_for(path)!r}: AsList()}}"
    packing = (
        "Concat() packs lists of items into one tensor (Concat(items='stack') for whole images), "
        "Pad() pads lists of numbers (token ids) into one"
        if items
        else "Pad() or Concat() make sequences one tensor"
    )
    warnings.warn(
        f"pincollate: {what}, so it is a per-sample list, not one tensor. Name a policy for it to settle this: "
        f"{setting} keeps the list without this warning, Stack() refuses ragged values, {packing}.",
        RaggedFieldWarning,
        stacklevel=4,  # _warn, flush, the collate's __call__: the line that called the collate
    )


class FieldFallback:
    """One field's reporter: after its first warning, a flag check per batch."""

    __slots__ = ("done", "fallbacks", "path")

    def __init__(self, fallbacks: Fallbacks, path: Path):
        self.fallbacks = fallbacks
        self.path = path
        self.done = False

    def __call__(self, pairs: Iterable[tuple[int, Any]], items: bool = False) -> None:
        if not self.done:
            self.fallbacks.report(self.path, pairs, items)
            self.done = self.path in self.fallbacks._warned
