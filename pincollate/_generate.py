"""Generated Python functions: the machinery the compiled plan and the compiled layout share.

Code is written as lines with a constant table: every key, class and object the code uses
is read from a name of the table (``k0``, ``k1``, ...), never spliced into the source as
text, and comments carry only printable characters, so no value of a sample or a plan can
become code. The source is compiled under a unique file name registered in :mod:`linecache`,
so tracebacks and debuggers show the generated lines as they show a file's, for as long as
the function lives: plans come and go (a cache of a few dozen), their sources with them.
"""

from __future__ import annotations

import itertools
import linecache
import re
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Writer", "text"]

_serial = itertools.count(1)


def text(value: str) -> str:
    """``value`` fit for a comment: a comment is text, never code, so only printable characters stay."""
    return re.sub(r"[^\x20-\x7e]", "?", value)[:160]


class Writer:
    """The lines of one generated function, its constant table, and fresh local names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self._ids: dict[int, str] = {}
        self._locals = itertools.count()

    def const(self, value: Any) -> str:
        """The name under which ``value`` is read from the table (one name per object)."""
        name = self._ids.get(id(value))
        if name is None:
            name = self._ids[id(value)] = f"k{len(self.constants)}"
            self.constants[name] = value
        return name

    def local(self, stem: str) -> str:
        """A local name no other line of this function uses."""
        return f"{stem}{next(self._locals)}"

    def line(self, depth: int, code: str) -> None:
        self.lines.append("    " * depth + code)

    def compile(
        self, signature: str, kind: str, description: str, names: dict[str, Any], head: tuple[str, ...] = ()
    ) -> tuple[Callable[..., Any], str, str]:
        """Compile ``def run(signature):`` with ``head`` then the lines; returns the function, its source, its file name.

        ``names`` are the globals the code may use besides its constants.
        """
        source = "\n".join([f"def run({signature}):", *head, *self.lines]) + "\n"
        safe = re.sub(r"[^\w.,= -]", "_", description)[:80]
        filename = f"<pincollate {kind} {next(_serial)}: {safe}>"
        namespace = {**names, **self.constants}
        exec(compile(source, filename, "exec"), namespace)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        run = namespace["run"]
        # Its lines go with the function: a long run plans and drops many structures.
        weakref.finalize(run, linecache.cache.pop, filename, None)
        return run, source, filename
