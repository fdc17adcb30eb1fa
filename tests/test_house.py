"""The package's house rules, checked: folders by stage in layers, no import circle, a light ``import pincollate``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pincollate"

#: The stages, lowest first. A module imports only from its own stage or one below it.
LAYERS = (
    "_locks",
    "_errors",
    "_generate",
    "_types",
    "_memory",
    "_batch",
    "_plan",
    "_collate",
    "_transfer",
    "_integrations",
    "__init__",
)
#: Imported by nothing in the runtime: the benchmark and the sample datasets (bench, notebooks) sit above it all.
OUTSIDE = ("bench", "datasets", "_digits")


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module by dotted name below the package (``_plan.fill``; a folder's ``__init__`` by its folder)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _stage(name: str) -> str:
    return name.split(".")[0]


def _imports(path: Path, name: str, known: set[str], at_load: bool) -> set[str]:
    """The package's modules ``path`` (module ``name``) imports.

    ``at_load``: only those imported while it loads (not under TYPE_CHECKING, not in a function);
    else every import anywhere in the file, type-only and deferred ones too.
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    found: set[str] = set()

    def resolve(level: int, module: str | None, names: list[str]) -> None:
        if level:
            base = package[: len(package) - (level - 1)] if level > 1 else list(package)
        else:
            if not module or not module.startswith("pincollate"):
                return
            base, module = [], module.removeprefix("pincollate").lstrip(".") or None
        target = [*base, *(module.split(".") if module else [])]
        for alias in names:  # `from . import ring` names a module; `from .ring import x` names its members
            dotted = ".".join([*target, alias])
            if dotted in known:
                found.add(dotted)
                continue
            found.add(".".join(target) or "__init__")

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                test = node.test
                type_checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                )
                if not (type_checking and at_load):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.ImportFrom):
                resolve(node.level, node.module, [alias.name for alias in node.names])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("pincollate."):
                        found.add(alias.name.removeprefix("pincollate."))
            elif not at_load and hasattr(node, "body"):
                visit(node.body)  # functions and classes: deferred imports count for layers
                visit(getattr(node, "orelse", []))

    visit(ast.parse(path.read_text()).body)
    found.discard(name)
    return found & known


def _layer_breaches(root: Path = PACKAGE) -> list[str]:
    modules = _modules(root)
    rank = {stage: i for i, stage in enumerate(LAYERS)}
    breaches = []
    for name, path in modules.items():
        stage = _stage(name)
        for other in sorted(_imports(path, name, set(modules), at_load=False)):
            to = _stage(other)
            if stage in OUTSIDE:
                continue  # the benchmark and the datasets may use anything
            if to in OUTSIDE or rank[to] > rank[stage]:
                breaches.append(f"{name} -> {other}")
    return breaches


def test_every_module_sits_in_a_known_stage():
    stray = [name for name in _modules() if _stage(name) not in LAYERS + OUTSIDE]
    assert not stray, f"modules outside every stage: {stray}"


def test_each_stage_imports_only_the_stages_below_it():
    assert not _layer_breaches()


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
    graph = {name: _imports(path, name, set(modules), at_load=True) for name, path in modules.items()}
    # A folder's __init__ is loaded before its modules; it imports none of them back at load.
    graph["__init__"] = set()
    assert not _circles(graph)


def test_import_pincollate_loads_no_benchmark_ray_or_torchvision():
    code = (
        "import sys, pincollate\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torchvision', 'lightning', 'transformers', "
        "'matplotlib') or m.startswith(('pincollate.bench', 'pincollate.datasets')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# The checks above are only worth their pass if they can fail.


def test_the_layer_check_sees_an_upward_import(tmp_path):
    (tmp_path / "_types").mkdir()
    (tmp_path / "_plan").mkdir()
    (tmp_path / "_types" / "__init__.py").write_text("")
    (tmp_path / "_plan" / "__init__.py").write_text("")
    (tmp_path / "_errors.py").write_text("")
    (tmp_path / "_plan" / "fill.py").write_text("from .._types.leaves import x\nfrom .. import _errors\n")
    (tmp_path / "_types" / "leaves.py").write_text("def f():\n    from .._plan import fill\n")
    assert _layer_breaches(tmp_path) == ["_types.leaves -> _plan.fill"]
    (tmp_path / "_types" / "leaves.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pincollate._plan.fill\n"
    )
    assert _layer_breaches(tmp_path) == ["_types.leaves -> _plan.fill"]
    (tmp_path / "_types" / "leaves.py").write_text("from pincollate import bench\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("from .._plan.fill import y\n")
    assert _layer_breaches(tmp_path) == ["_types.leaves -> bench"]


def test_the_circle_check_sees_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\nfrom . import c\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from .a import x\nfrom .a import z\n")
    known = {"a", "b", "c"}
    graph = {name: _imports(tmp_path / f"{name}.py", name, known, at_load=True) for name in "abc"}
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


#: torch's factories that follow the default device (``with torch.device(...)``, ``set_default_device``).
FACTORIES = {"empty", "zeros", "ones", "full", "arange", "tensor", "as_tensor", "empty_like", "zeros_like"}


def _factory_calls_without_device(root: Path = PACKAGE) -> list[str]:
    found = []
    for name, path in _modules(root).items():
        if _stage(name) in OUTSIDE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
                and not any(keyword.arg == "device" for keyword in node.keywords)
            ):
                found.append(f"{name}:{node.lineno}")
    return found


def test_every_torch_factory_in_the_runtime_names_its_device():
    # A batch is built on the host whatever the default device; see tests/test_default_device.py.
    assert not _factory_calls_without_device()


def test_the_factory_check_sees_a_call_without_a_device(tmp_path):
    (tmp_path / "_plan").mkdir()
    (tmp_path / "_plan" / "x.py").write_text("import torch\na = torch.zeros(2)\nb = torch.zeros(2, device='cpu')\n")
    assert _factory_calls_without_device(tmp_path) == ["_plan.x:2"]


def _plain_locks(root: Path = PACKAGE) -> list[str]:
    """Locks made without ``pincollate._locks`` (a forked child would get them as the parent held them)."""
    found = []
    for name, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Lock", "threading.RLock"):
                found.append(f"{name}:{node.lineno}")
    return [spot for spot in found if not spot.startswith("_locks:")]


def test_every_lock_is_made_unlocked_again_in_a_forked_child():
    assert _plain_locks() == []


def test_a_lock_held_by_another_thread_at_a_fork_is_free_in_the_child():
    import os
    import threading
    import warnings

    from pincollate._locks import new_lock, new_rlock

    locks = [new_lock(), new_rlock()]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        held.set()
        release.wait(30)
        for lock in locks:
            lock.release()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(30)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12 warns of any fork with threads
            pid = os.fork()
        if pid == 0:  # the child: the holder's copy never runs here
            os._exit(0 if all(lock.acquire(timeout=5) for lock in locks) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join(30)
    assert os.waitstatus_to_exitcode(status) == 0


def _cached_properties(root: Path = PACKAGE) -> list[str]:
    found = []
    for name, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    text = ast.unparse(decorator)
                    if text in ("cached_property", "functools.cached_property"):
                        found.append(f"{name}.{node.name}")
    return found


def test_no_cached_property_whose_lock_a_fork_could_carry_into_a_worker():
    # Up to Python 3.11 functools.cached_property takes one lock per property, for every
    # instance: a DataLoader forking its workers while another thread was inside one left
    # each worker's first careful walk waiting on it for good (Column.present, found by a
    # concurrency round: 7 of 132 loaders hung).
    assert _cached_properties() == []


def test_the_cached_property_check_sees_one(tmp_path):
    (tmp_path / "m.py").write_text(
        "import functools\nclass A:\n    @functools.cached_property\n    def x(self):\n        return 1\n"
    )
    assert _cached_properties(tmp_path) == ["m.x"]
