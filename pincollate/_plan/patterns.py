"""Field patterns: which policy applies at which key path."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import CollateError
from .policies import Policy

if TYPE_CHECKING:
    from .fallback import Fallbacks

__all__ = ["FieldRules", "Fields", "Pattern", "Renames", "Settings"]

Path = tuple[Hashable, ...]
#: A field pattern: keys joined by dots (``"inp.ids"``), or one entry per key (``("inp", "a.b")``)
#: where a key holds a dot.
Pattern = str | tuple[str | int | float, ...]
#: Policies by pattern. A mapping's key type is invariant and a union of mappings gives a dict
#: literal no context, so no narrower type takes ``{"a": Pad()}``, ``{("a", "b.c"): Pad()}`` and
#: both mixed alike; the keys are checked when the rules are made.
Fields = Mapping[Any, Policy]

_SEGMENT = re.compile(r"^(\*|[^.*]+)$")


#: The most key paths whose policy :class:`FieldRules` keeps looked up.
_LOOKUPS_KEPT = 4096


class FieldRules:
    """Field patterns compiled once; the most specific match wins.

    A pattern is dot-separated segments matched against a key path's keys read as text
    (list indices as digits); ``*`` matches any one key. A tuple gives one entry per key
    instead (a string, a number, or ``"*"`` for any one key), for keys a dotted pattern
    cannot spell: one that holds a dot or an asterisk, or is empty (``("inp", "a.b")``).
    More literal segments is more specific; ties go to the pattern given first.

    Examples:
        >>> from pincollate import Concat, Pad, Stack
        >>> rules = FieldRules({"*.boxes": Pad(), "images.*": Concat(), "meta.boxes": Stack()})
        >>> rules.lookup(("meta", "boxes"))
        Stack()
        >>> rules.lookup(("images", 0))
        Concat(offsets_key='{key}_offsets', counts_key='{key}_counts', item_offsets_key='{key}_item_offsets', items='cat')
        >>> FieldRules({("meta", "v1.2"): Stack()}).lookup(("meta", "v1.2"))
        Stack()
    """

    def __init__(self, fields: Fields | None):
        self._rules: list[tuple[int, int, tuple[str, ...], Pattern, Policy]] = []
        for order, (pattern, policy) in enumerate((fields or {}).items()):
            parts = _parts(pattern)
            if not isinstance(policy, Policy):
                raise CollateError(
                    f"field {pattern!r}: expected a policy (Stack, AsList, Pad, Concat, Jagged), got {type(policy).__name__}"
                )
            literal = sum(p != "*" for p in parts)
            self._rules.append((-literal, order, parts, pattern, policy))
        self._rules.sort(key=lambda rule: rule[:2])
        self._cache: dict[Path, Policy | None] = {}
        self.matched: set[Pattern] = set()

    def __bool__(self) -> bool:
        return bool(self._rules)

    @property
    def patterns(self) -> list[Pattern]:
        return [rule[3] for rule in self._rules]

    def lookup(self, path: Path) -> Policy | None:
        try:
            return self._cache[path]
        except KeyError:
            pass
        found = None
        keys = tuple(str(k) for k in path)
        for _, _, parts, pattern, policy in self._rules:
            if len(parts) == len(keys) and all(p == "*" or p == k for p, k in zip(parts, keys, strict=True)):
                # A pattern that matches but loses to a more specific one did match.
                self.matched.add(pattern)
                if found is None:
                    found = policy
        if len(self._cache) >= _LOOKUPS_KEPT:
            # Key paths that change with the data (annotations keyed by file name) would grow it for good.
            self._cache.clear()
        self._cache[path] = found
        return found


def _parts(pattern: Pattern) -> tuple[str, ...]:
    """A pattern's segments, as key paths' keys read as text are matched against them."""
    if isinstance(pattern, tuple):
        # Entries are keys as they are: a dot or an asterisk inside one is part of the key. Keys
        # are matched as text, so a number names the key whose text it has (3.5, a list index).
        if not pattern or not all(isinstance(p, (str, int, float)) and not isinstance(p, bool) for p in pattern):
            raise CollateError(
                f"a field pattern given as a tuple holds one key per entry (a string, a number or '*'), got {pattern!r}"
            )
        return tuple(map(str, pattern))
    if not isinstance(pattern, str) or not pattern:
        raise CollateError(f"field pattern must be a non-empty string or a tuple of keys, got {pattern!r}")
    parts = tuple(pattern.split("."))
    if not all(_SEGMENT.match(p) for p in parts):
        raise CollateError(
            f"malformed field pattern {pattern!r}: use dot-separated keys and '*' for any one key "
            "(a tuple of keys names a key that holds a dot)"
        )
    return parts


class Renames:
    """Output names for keys, by dot-separated key path: ``{"label": "labels"}``.

    A renamed field's policy extras take the new name too (``labels_mask``).

    Examples:
        >>> renames = Renames({"meta.label": "labels"})
        >>> renames.key(("meta", "label")), renames.key(("meta", "other"))
        ('labels', 'other')
    """

    def __init__(self, rename: Mapping[str, str] | None):
        self.names: dict[str, str] = {}
        for path, name in (rename or {}).items():
            if not isinstance(path, str) or not path or not isinstance(name, str) or not name:
                raise CollateError(
                    f"rename maps key paths to new names, both non-empty strings; got {path!r}: {name!r}"
                )
            self.names[path] = name
        self.matched: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.names)

    def outputs(self, path: Path, keys: Sequence[Hashable]) -> Sequence[Hashable]:
        """The output names of a mapping's ``keys`` (the mapping at ``path``): ``keys`` where nothing is renamed."""
        return [self.key((*path, key)) for key in keys] if self.names else keys

    @staticmethod
    def twice(keys: Sequence[Hashable], names: Sequence[Hashable]) -> tuple[list[Hashable], Hashable] | None:
        """The keys ``rename`` gives one name, and that name, where it gives two keys one (``names``: theirs)."""
        if names is keys or len(set(names)) == len(names):
            return None
        name = next(name for j, name in enumerate(names) if name in names[:j])
        return [key for key, out in zip(keys, names, strict=True) if out == name], name

    def key(self, path: Path) -> Hashable:
        """The output name of the last key of ``path``."""
        if not path:
            return None
        if self.names:
            dotted = ".".join(str(k) for k in path)
            name = self.names.get(dotted)
            if name is not None:
                self.matched.add(dotted)
                return name
        return path[-1]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one collate plans by: the same object for its cached plans and its careful planner.

    Attributes:
        rules: the policies by key-path pattern.
        renames: the output names by key path.
        fallbacks: the fields warned of as per-sample lists (:mod:`.fallback`).
        default: the policy for tensor fields no pattern names (``ragged=``).
        missing: whether absent keys are taken as ``None``.
        items: whether lists are each sample's items (``sequences="items"``).
        compiled: whether structures are planned once and run as compiled code; ``False``
            walks every batch carefully (``MMCollate(compile=False)``).
    """

    rules: FieldRules
    renames: Renames
    fallbacks: Fallbacks
    default: Policy | None = None
    missing: bool = False
    items: bool = False
    compiled: bool = True
