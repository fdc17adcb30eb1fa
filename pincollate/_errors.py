"""The one exception type of pincollate, and key-path formatting."""

from __future__ import annotations

import ast
import base64
import pickle
import re
from collections.abc import Hashable, Sequence

from ._locks import new_lock

__all__ = ["EXTRA_NAMES", "ITEMS", "Attr", "CollateError", "format_path", "is_items"]


class _ItemsKey(str):
    """The one key path entry of a sample's items: text ``*`` (as paths print it), told from a
    key ``"*"`` of the user's by its type, since one-character strings are one object in CPython."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "ITEMS"  # the one instance, in every process a path crosses to


#: The key path entry of a sample's items (a list under item semantics): every item,
#: matched by ``*`` in a field pattern, never by an index. :func:`is_items` tells it apart.
ITEMS = _ItemsKey("*")


def is_items(key: object) -> bool:
    """Whether ``key`` is the items' path entry, not a key ``"*"`` of a sample."""
    return type(key) is _ItemsKey


#: What an error about an extra output's name (one that clashes with a key or another's) adds.
EXTRA_NAMES = " (a policy's *_key arguments name its extra outputs; None leaves one out)"


class Attr(str):
    """A key path entry that is an attribute (a namedtuple or dataclass field), not a key.

    It equals the field's name as a ``str``, and renders as ``.name``.
    """

    __slots__ = ()


def format_path(path: Sequence[Hashable]) -> str:
    """Render a key path the way a user would reach into the sample.

    Examples:
        >>> format_path(("meta", "boxes", 0))
        "['meta']['boxes'][0]"
        >>> format_path(("meta", Attr("box"), 0))
        "['meta'].box[0]"
        >>> format_path(())
        'root'
    """
    if not path:
        return "root"
    return "".join(f".{key}" if isinstance(key, Attr) else f"[{key!r}]" for key in path)


class CollateError(TypeError, ValueError):
    """A batch that cannot be collated, with the sample and key path that broke it.

    It is both a ``TypeError`` and a ``ValueError`` so that code written against
    ``default_collate``'s exceptions keeps catching it. The message starts with
    ``sample N at PATH``: ``N`` is the sample's position in the batch the collate
    function received, not its index in the dataset. Where the problem is the batch
    as a whole it starts with ``at PATH`` (or names no place). Settings that cannot
    work (a policy's arguments, a ``Prefetcher``'s, a container registration) raise
    it too, when they are made.

    Attributes:
        sample: the offending sample's position in the batch (from 0), or ``None``
            when the problem concerns the batch as a whole.
        path: the key path inside the sample, as a tuple of keys and indices.

    Examples:
        >>> import torch
        >>> import pincollate
        >>> try:
        ...     pincollate.mm_collate([{"x": torch.zeros(2)}, {"x": torch.zeros(2)}, {"x": "oops"}])
        ... except pincollate.CollateError as error:
        ...     print(error.sample, error.path)
        ...     print(error)
        2 ('x',)
        sample 2 at ['x']: expected Tensor, got str
    """

    def __init__(self, message: str, *, sample: int | None = None, path: Sequence[Hashable] = ()):
        self.sample: int | None = sample
        self.path: tuple[Hashable, ...] = tuple(path)
        if sample is None and not self.path and _RERAISED in message:
            # DataLoader re-raises a worker's error from its message alone: read the
            # sample and key path back from the original error's line.
            self.sample, self.path = _read_where(message)
        else:
            where = format_path(self.path)
            if sample is not None:
                message = f"sample {sample} at {where}: {message}"
            elif self.path:
                message = f"at {where}: {message}"
            if self.path and _in_worker() and not _reads_back(where, self.path):
                # Keys whose repr is no literal (an Enum) cannot be read back from the
                # text the main process gets: the path travels pickled beside it.
                message += f"\n({_PICKLED}{base64.b64encode(pickle.dumps(self.path)).decode()})"
        super().__init__(message)


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def _reads_back(where: str, path: tuple[Hashable, ...]) -> bool:
    parsed = _parse_path(where)
    return parsed == path and list(map(type, parsed)) == list(map(type, path))


_RERAISED = "CollateError: "
_PICKLED = "pincollate key path: "
# A key is a Python literal in brackets (quoted strings may hold brackets) or ``.name``.
_KEY = r"\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]'\"])*\]|\.\w+"
_WHERE = re.compile(rf"CollateError: (?:sample (\d+) at )?(root|(?:{_KEY})+)?")
_PART = re.compile(r"\[((?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]'\"])*)\]|\.(\w+)")


#: One thread at a time reads a key back: CPython 3.11's ``ast`` module counts its recursion in a
#: global, and two threads parsing at once can raise ``SystemError`` instead of giving the key.
_LITERALS = new_lock()


def _parse_path(text: str) -> tuple[Hashable, ...] | None:
    """The key path ``format_path`` rendered as ``text``, or ``None`` where a key is no literal."""
    if text == "root":
        return ()
    path: list[Hashable] = []
    for key, attr in _PART.findall(text):
        if attr:
            path.append(Attr(attr))
            continue
        try:
            with _LITERALS:
                path.append(ast.literal_eval(key))
        except (ValueError, SyntaxError):
            return None
    return tuple(path)


def _read_where(message: str) -> tuple[int | None, tuple[Hashable, ...]]:
    start = message.rindex(_RERAISED)
    line = message[start:].splitlines()[0]
    found = _WHERE.match(line)
    if found is None or (found.group(1) is None and not found.group(2)):
        return None, ()
    sample = None if found.group(1) is None else int(found.group(1))
    pickled = message.find(_PICKLED, start)
    if pickled != -1:
        encoded = message[pickled + len(_PICKLED) :].split(")", 1)[0]
        try:
            return sample, tuple(pickle.loads(base64.b64decode(encoded)))
        except Exception:  # a class the main process cannot import: the text is all there is
            pass
    path = _parse_path(found.group(2) or "root")
    return sample, () if path is None else path
