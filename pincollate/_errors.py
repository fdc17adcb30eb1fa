"""The one exception type of pincollate, and key-path formatting."""

from __future__ import annotations

import ast
import re
from collections.abc import Hashable, Sequence

__all__ = ["Attr", "CollateError", "format_path"]


class Attr(str):
    """A key path entry that is an attribute (a namedtuple or dataclass field), not a key.

    It equals the field's name as a ``str``, and renders as ``.name``.
    """

    __slots__ = ()


def format_path(path: Sequence[Hashable]) -> str:
    """Render a key path the way a user would reach into the sample.

    Example:
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
    ``default_collate``'s exceptions keeps catching it.

    Attributes:
        sample: index of the offending sample in the batch, or ``None`` when the
            problem concerns the batch as a whole.
        path: the key path inside the sample, as a tuple of keys and indices.
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
        super().__init__(message)


_RERAISED = "CollateError: "
_WHERE = re.compile(r"CollateError: (?:sample (\d+) at )?(root|(?:\[[^\]]*\]|\.\w+)+)?")
_PART = re.compile(r"\[([^\]]*)\]|\.(\w+)")


def _read_where(message: str) -> tuple[int | None, tuple[Hashable, ...]]:
    line = message[message.rindex(_RERAISED) :].splitlines()[0]
    found = _WHERE.match(line)
    if found is None or (found.group(1) is None and not found.group(2)):
        return None, ()
    sample = None if found.group(1) is None else int(found.group(1))
    path: list[Hashable] = []
    text = found.group(2) or "root"
    if text != "root":
        for key, attr in _PART.findall(text):
            if attr:
                path.append(Attr(attr))
                continue
            try:
                path.append(ast.literal_eval(key))
            except (ValueError, SyntaxError):
                return sample, ()
    return sample, tuple(path)
