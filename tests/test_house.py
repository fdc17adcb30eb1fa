"""The package's house rules, checked: modules of at most 300 lines, no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pincollate"
MOST_LINES = 300


def _modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(PACKAGE.glob("*.py"))}


def _imports_at_load(path: Path) -> set[str]:
    """The package's modules ``path`` imports while it loads (not under TYPE_CHECKING, not in a function)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                test = node.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                ):
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pincollate."):
                found.add(node.module.split(".")[1])

    visit(ast.parse(path.read_text()).body)
    return found


def test_every_module_has_at_most_300_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MOST_LINES}
    assert not long, long


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle a depth-first walk of ``graph`` meets."""
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append([*path[path.index(other) :], other])
            elif other not in state:
                walk(other, [*path, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    return circles


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports_at_load(path) & modules.keys() for name, path in modules.items()}
    graph["__init__"] = set()  # the package imports everything; nothing imports it back at load
    assert not _circles(graph)


def test_the_circle_check_sees_a_circle(tmp_path):
    # The check above is only worth its pass if it can fail.
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\nfrom . import c\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from .a import x\nfrom .a import z\n")
    graph = {name: _imports_at_load(tmp_path / f"{name}.py") for name in "abc"}
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
