"""The shared sample trees every test module draws from.

``PARITY`` holds batches ``default_collate`` accepts (it is the oracle there);
``RAGGED`` holds batches it rejects and pincollate handles. Each is a dict from a
readable id to a function building a fresh batch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from pincollate import RaggedFieldWarning

Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Record:
    image: Any
    label: Any
    name: str = "r"


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: Any


class Meta(collections.OrderedDict):
    """A user mapping type that default_collate keeps."""


def _t(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(*shape, dtype=dtype, generator=g)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _multimodal(n: int = 4) -> list[dict[str, Any]]:
    return [
        {
            "image": _t(3, 8, 8, dtype=torch.uint8, seed=i),
            "audio": _t(1, 50, seed=10 + i),
            "tokens": _t(12, dtype=torch.int64, seed=20 + i),
            "label": i,
            "score": 0.5 * i,
            "flag": bool(i % 2),
            "caption": f"caption {i}",
            "meta": {"boxes": _t(2, 4, seed=30 + i), "source": b"cam"},
        }
        for i in range(n)
    ]


PARITY: dict[str, Callable[[], list[Any]]] = {
    "multimodal-dict": _multimodal,
    "tensors": lambda: [_t(2, 3, seed=i) for i in range(3)],
    "tuple-samples": lambda: [(_t(2, seed=i), i, "s") for i in range(3)],
    "list-samples": lambda: [[_t(2, seed=i), float(i)] for i in range(3)],
    "namedtuple": lambda: [Point(i, _t(2, seed=i)) for i in range(3)],
    "string-then-number": lambda: ["a", 1],
    "strings-then-number-in-dicts": lambda: [{"a": "s"}, {"a": 1}],
    "str-then-bytes": lambda: ["a", b"b"],
    "ndarray-then-tensor": lambda: [np.zeros(2, dtype=np.float32), _t(2, seed=1)],
    "np-scalar-then-0d-array": lambda: [np.float32(1.5), np.array(2.0)],
    "0d-array-then-np-scalar": lambda: [np.array(2.0), np.float32(1.5)],
    "int-then-0d-tensor": lambda: [1, torch.tensor(2)],
    "namedtuple-then-tuple": lambda: [Point(0, _t(2, seed=0)), (1, _t(2, seed=1))],
    "nested-namedtuple": lambda: [{"p": Point(_t(1, seed=i), [i, i + 1])} for i in range(2)],
    "ordered-mapping": lambda: [Meta(a=_t(2, seed=i), b=i) for i in range(3)],
    "ints": lambda: [1, 2, 3],
    "floats": lambda: [1.5, 2.5],
    "bools": lambda: [True, False, True],
    "int-then-float": lambda: [1, 2.5, 3],
    "float-then-int": lambda: [2.5, 1],
    "bool-then-int": lambda: [True, 2],
    "strings": lambda: ["a", "bb", "ccc"],
    "bytes": lambda: [b"a", b"b"],
    "numpy-arrays": lambda: [np.full((2, 2), i, dtype=np.float32) for i in range(3)],
    "numpy-int16": lambda: [np.arange(3, dtype=np.int16) + i for i in range(2)],
    "numpy-bool": lambda: [np.array([True, False]), np.array([False, False])],
    "numpy-scalars": lambda: [np.float32(1.5), np.float32(2.5)],
    "numpy-scalars-mixed": lambda: [np.int8(1), np.int64(300)],
    "numpy-0d": lambda: [np.array(1.0), np.array(2.0)],
    "bfloat16": lambda: [_t(4, dtype=torch.bfloat16, seed=i) for i in range(2)],
    "float16": lambda: [_t(4, dtype=torch.float16, seed=i) for i in range(2)],
    "complex64": lambda: [_t(3, dtype=torch.complex64, seed=i) for i in range(2)],
    "bool-tensors": lambda: [_t(5, dtype=torch.bool, seed=i) for i in range(3)],
    "int8": lambda: [_t(5, dtype=torch.int8, seed=i) for i in range(3)],
    "zero-dim": lambda: [torch.tensor(1.0), torch.tensor(2.0)],
    "zero-size": lambda: [torch.zeros(0, 3), torch.zeros(0, 3)],
    "non-contiguous": lambda: [_t(4, 3, seed=i).t() for i in range(3)],
    "sliced": lambda: [_t(10, seed=i)[::3] for i in range(3)],
    "expanded": lambda: [torch.ones(1, 3).expand(4, 3) for _ in range(2)],
    "batch-of-one": lambda: [{"x": _t(2, seed=0), "y": 1}],
    "deep": lambda: [{"a": {"b": {"c": [_t(2, seed=i), {"d": i}]}}} for i in range(3)],
    "list-of-equal-lists": lambda: [{"img": [_t(2, seed=i), _t(2, seed=i + 9)]} for i in range(3)],
    "empty-lists": lambda: [{"x": []}, {"x": []}],
    "dict-of-strings": lambda: [{"s": "a"}, {"s": "b"}],
}


def _ragged_images() -> list[dict[str, Any]]:
    a, b, c = (torch.full((2, 2), float(i)) for i in range(3))
    return [{"img": [a, b]}, {"img": [c]}]


RAGGED: dict[str, Callable[[], list[Any]]] = {
    "tensor-then-ndarray": lambda: [_t(2, seed=1), np.ones(2, dtype=np.float64)],
    "unequal-shapes": lambda: [{"x": _t(3, seed=0)}, {"x": _t(5, seed=1)}],
    "unequal-lists": _ragged_images,
    "mixed-dtypes": lambda: [{"x": _t(3, dtype=torch.int32, seed=0)}, {"x": _t(3, seed=1)}],
    "ragged-boxes": lambda: [{"image": _t(3, 4, 4, seed=i), "boxes": _t(i, 4, seed=i)} for i in range(1, 4)],
    "dataclass": lambda: [Record(_t(3, seed=i), i) for i in range(3)],
    "frozen-dataclass": lambda: [Frozen(_t(2, seed=i)) for i in range(2)],
    "nones": lambda: [{"x": None}, {"x": None}],
}


class TreeDataset(Dataset):
    """A dataset over one named sample tree, for DataLoader tests (picklable for spawn)."""

    def __init__(self, name: str, repeat: int = 4):
        builder = PARITY.get(name) or RAGGED[name]
        self.items = builder() * repeat
        self.name = name

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


class UserTensor(torch.Tensor):
    """A user's tensor subclass: a collate keeps it as its class, as torch.stack does."""


torch.serialization.add_safe_globals([UserTensor])  # a saved batch of them loads with weights_only=True


#: The ``RAGGED`` trees with a field that, under no policy, becomes a per-sample list because
#: its values differ in shape: a fresh collate warns once (``RaggedFieldWarning``).
LISTED = frozenset({"ragged-boxes", "unequal-lists", "unequal-shapes"})


def listing(name: str) -> contextlib.AbstractContextManager[Any]:
    """What collating the sample tree ``name`` with a fresh collate and no policy warns: a
    ``RaggedFieldWarning`` for the trees in :data:`LISTED`, nothing for the others.
    """
    return pytest.warns(RaggedFieldWarning) if name in LISTED else contextlib.nullcontext()


def print_ragged_warnings(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: the worker prints its ``RaggedFieldWarning`` s to its stderr,
    as it does outside the test suite (pytest's recorder and ``filterwarnings=error`` came with the fork).
    """
    warnings.simplefilter("always", RaggedFieldWarning)
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
        warnings.formatwarning(message, category, filename, lineno, line)
    )


def assert_same(ours: Any, theirs: Any, path: str = "batch") -> None:
    """Equal containers (types kept), dtypes, shapes and values."""
    if isinstance(theirs, torch.Tensor) and theirs.is_nested:
        # Each jagged tensor has a ragged size of its own (j1, j2, ...): compare what it holds.
        assert isinstance(ours, torch.Tensor) and ours.is_nested, f"{path}: expected a nested tensor"
        assert_same(ours.values(), theirs.values(), f"{path}.values()")
        assert_same(ours.offsets(), theirs.offsets(), f"{path}.offsets()")
    elif isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{path}: expected a tensor, got {type(ours).__name__}"
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        assert torch.equal(ours, theirs), f"{path}: values differ"
    elif isinstance(theirs, dict):
        assert isinstance(ours, type(theirs)), f"{path}: {type(ours).__name__} is not a {type(theirs).__name__}"
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        # True == 1: the keys' types are compared too.
        assert list(map(type, ours)) == list(map(type, theirs)), f"{path}: key types differ"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert isinstance(ours, type(theirs)), f"{path}: {type(ours).__name__} is not a {type(theirs).__name__}"
        assert len(ours) == len(theirs), f"{path}: length {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif dataclasses.is_dataclass(theirs):
        assert type(ours) is type(theirs)
        for field in dataclasses.fields(theirs):
            assert_same(getattr(ours, field.name), getattr(theirs, field.name), f"{path}.{field.name}")
    elif isinstance(theirs, np.ndarray):  # a value kept as it is (a per-sample list, say)
        assert type(ours) is np.ndarray and ours.dtype == theirs.dtype, f"{path}: {ours!r} != {theirs!r}"
        assert np.array_equal(ours, theirs), f"{path}: values differ"
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def buffer_of(batch: Any) -> torch.Tensor:
    """The batch's own buffer (``batch.buffer`` hands out a tensor of its own over it)."""
    return batch._pincollate[1]


def assert_one_buffer(tree: Any) -> None:
    """Every tensor of the batch ``tree`` lies in its one buffer (and there is one, if there are tensors)."""
    from pincollate._batch.trees import tensors

    expected = 1 if any(t.numel() for t in tensors(tree)) else 0
    assert len(storages(tree)) == expected, f"{len(storages(tree))} storages, expected {expected}"


def storages(tree: Any) -> set[int]:
    """The memory behind every tensor of ``tree``: a batch's buffer counts once.

    In pageable memory a batch's tensors each have a storage of their own over their
    bytes of the batch's one buffer, which each storage holds: those count as the
    buffer's address. Any other tensor counts as its storage's address; a tensor with
    no elements counts as none.
    """
    from pincollate._batch.trees import tensors
    from pincollate._memory.ownership import holder

    found = set()
    for t in tensors(tree):
        if not t.numel():
            continue
        storage = t.untyped_storage()
        source = holder(storage)
        at = storage.data_ptr()
        if (
            source is not None
            and source.ctypes.data <= at
            and at + storage.nbytes() <= source.ctypes.data + source.nbytes
        ):
            found.add(source.ctypes.data)
        else:
            found.add(at)
    return found


# --- structures that mutate from batch to batch (a long-lived collate's cache) --------------

Pair = collections.namedtuple("Pair", "a b")
OtherPair = collections.namedtuple("OtherPair", "a b")


@dataclasses.dataclass
class Box:
    a: Any
    b: Any


@dataclasses.dataclass
class OtherBox:
    a: Any
    b: Any


class Tagged(torch.Tensor):
    """A user's tensor subclass: default_collate keeps it, and so must every cached plan."""


class Tagged2(Tagged):
    """A subclass of a subclass: torch.stack prefers it to its base."""


class Quiet(torch.Tensor):
    """A subclass that turns ``__torch_function__`` off (as ``nn.Parameter`` does): torch.stack gives plain tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl


#: The kinds of leaf a mutating structure draws from. Numbers and strings as samples give them.
LEAF_KINDS = ("tensor", "ndarray", "int", "float", "bool", "str", "bytes", "npscalar")
TENSOR_CLASSES = {"plain": torch.Tensor, "tagged": Tagged, "tagged2": Tagged2, "quiet": Quiet}
#: Per-sample class patterns of a tensor column: one class, or a mix by sample.
CLASS_PATTERNS = ("plain", "tagged", "tagged2", "plain/tagged", "tagged/plain", "tagged/tagged2")
MUTATING_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.bfloat16)
CONTAINERS = ("dict", "meta", "list", "tuple", "pair", "pair/other", "box", "box/other")


def build_mutating(structure: Any, n: int, seed: int) -> list[Any]:
    """``n`` samples of a structure description (see ``tests/test_cache.py``), values drawn from ``seed``.

    A description is a nested tuple: ``("tensor", dtype, shape, classes, ragged)``,
    ``(leaf_kind,)``, or ``(container, children)`` where a mapping's children are
    ``(key, child)`` pairs. ``"pair/other"`` alternates two namedtuple classes of the
    same fields, ``"box/other"`` two dataclasses; ``"plain/tagged"`` a tensor column
    whose class alternates by sample; ``ragged`` makes odd samples one row longer.
    """
    g = torch.Generator().manual_seed(seed)
    return [_build_one(structure, i, g) for i in range(n)]


def _pick(pattern: str, i: int) -> str:
    options = pattern.split("/")
    return options[i % len(options)]


def _build_one(structure: Any, i: int, g: torch.Generator) -> Any:
    kind = structure[0]
    if kind == "tensor":
        _, dtype, shape, classes, ragged = structure
        if ragged and shape and i % 2:
            shape = (shape[0] + 1, *shape[1:])
        value = (
            (torch.randn(shape, generator=g) * 20).to(dtype)
            if dtype != torch.bool
            else torch.rand(shape, generator=g) > 0.5
        )
        cls = TENSOR_CLASSES[_pick(classes, i)]
        return value if cls is torch.Tensor else value.as_subclass(cls)
    if kind == "ndarray":
        return (torch.randn(structure[1], generator=g) * 20).numpy().astype(np.float32)
    if kind in LEAF_KINDS:
        x = float(torch.randn((), generator=g)) * 100
        return {
            "int": lambda: int(x),
            "float": lambda: x,
            "bool": lambda: x > 0,
            "str": lambda: f"s{int(x)}",
            "bytes": lambda: b"b%d" % int(x),
            "npscalar": lambda: np.float32(x),
        }[kind]()
    children = structure[1]
    if kind in ("dict", "meta"):
        out = {key: _build_one(child, i, g) for key, child in children}
        return Meta(out) if kind == "meta" else out
    values = [_build_one(child, i, g) for child in children]
    if kind == "list":
        return values
    if kind == "tuple":
        return tuple(values)
    if kind in ("pair", "pair/other"):
        return (Pair if kind == "pair" or i % 2 == 0 else OtherPair)(*values)
    return (Box if kind == "box" or i % 2 == 0 else OtherBox)(*values)


def random_structure(rng: Any, depth: int = 0) -> Any:
    """A random structure description for :func:`build_mutating`; ``rng`` is a ``random.Random``."""
    if depth >= 2 or rng.random() < 0.4:
        return _random_leaf(rng)
    kind = rng.choice(CONTAINERS)
    if kind in ("dict", "meta"):
        keys = rng.sample("abcdefg", rng.randint(1, 4))
        return (kind, tuple((key, random_structure(rng, depth + 1)) for key in keys))
    size = 2 if kind.startswith(("pair", "box")) else rng.randint(1, 3)
    return (kind, tuple(random_structure(rng, depth + 1) for _ in range(size)))


def _random_leaf(rng: Any) -> Any:
    kind = rng.choice(("tensor", "tensor", "tensor", *LEAF_KINDS))
    if kind == "tensor":
        shape = tuple(rng.randint(0, 3) for _ in range(rng.randint(0, 2)))
        return ("tensor", rng.choice(MUTATING_DTYPES), shape, rng.choice(CLASS_PATTERNS), rng.random() < 0.2)
    if kind == "ndarray":
        return ("ndarray", (rng.randint(1, 3),))
    return (kind,)


def mutate(structure: Any, rng: Any) -> Any:
    """``structure`` with one thing changed: a dtype, shape, class, leaf kind, container, key or length."""
    kind = structure[0]
    if kind == "tensor":
        _, dtype, shape, classes, ragged = structure
        what = rng.randrange(4)
        if what == 0:
            dtype = rng.choice(MUTATING_DTYPES)
        elif what == 1:
            shape = tuple(rng.randint(0, 3) for _ in range(rng.randint(0, 2)))
        elif what == 2:
            classes = rng.choice(CLASS_PATTERNS)
        else:
            ragged = not ragged
        return ("tensor", dtype, shape, classes, ragged)
    if kind in LEAF_KINDS or kind == "ndarray" or rng.random() < 0.15:
        return random_structure(rng, depth=1)
    children = list(structure[1])
    j = rng.randrange(len(children))
    what = rng.randrange(3)
    if kind in ("dict", "meta"):
        if what == 0:  # the container's class
            return ("meta" if kind == "dict" else "dict", tuple(children))
        if what == 1:  # a key added, removed or renamed
            free = [k for k in "abcdefg" if k not in dict(children)]
            if len(children) > 1 and rng.random() < 0.5:
                del children[j]
            elif free:
                children.insert(rng.randint(0, len(children)), (rng.choice(free), _random_leaf(rng)))
            return (kind, tuple(children))
        children[j] = (children[j][0], mutate(children[j][1], rng))
        return (kind, tuple(children))
    if what == 0:  # another container of the same length
        same = [
            c
            for c in CONTAINERS
            if c not in ("dict", "meta") and (len(children) == 2 or not c.startswith(("pair", "box")))
        ]
        return (rng.choice(same), tuple(children))
    if what == 1 and kind in ("list", "tuple"):  # another length
        if len(children) > 1 and rng.random() < 0.5:
            del children[j]
        else:
            children.append(_random_leaf(rng))
        return (kind, tuple(children))
    children[j] = mutate(children[j], rng)
    return (kind, tuple(children))


def assert_identical(ours: Any, theirs: Any, path: str = "batch") -> None:
    """:func:`assert_same`, and every tensor of the exact class (a subclass kept as such)."""
    assert_same(ours, theirs, path)
    from pincollate._batch.trees import tensors

    ours_types = [type(t) for t in tensors(ours)]
    theirs_types = [type(t) for t in tensors(theirs)]
    assert ours_types == theirs_types, f"{path}: tensor classes {ours_types} != {theirs_types}"
    # A subclass's metadata (torchvision boxes: their format and canvas size) too.
    ours_meta = [_metadata(t) for t in tensors(ours)]
    theirs_meta = [_metadata(t) for t in tensors(theirs)]
    assert ours_meta == theirs_meta, f"{path}: tensor metadata {ours_meta} != {theirs_meta}"


def _metadata(t: torch.Tensor) -> dict[str, Any]:
    return {name: getattr(t, name) for name in ("format", "canvas_size", "clamping_mode") if hasattr(t, name)}


def careful_walk(**settings: Any) -> Any:
    """A collate that walks every batch carefully (``compile=False``): the reference for any warm collate.

    The careful walk is the one definition of a batch; the compiled plans and the recipes
    must give exactly what it gives.
    """
    from pincollate import MMCollate

    return MMCollate(pin_memory=False, compile=False, **settings)


def assert_same_outcome(collate: Any, reference: Any, batch: list[Any]) -> Any:
    """``collate`` gives what ``reference`` gives ``batch``: the same batch, or a ``CollateError`` of the
    same text, and the same ``RaggedFieldWarning`` s (a field listed without a policy, once per collate).
    """
    from pincollate import CollateError

    outcomes = []
    for each in (reference, collate):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RaggedFieldWarning)
            try:
                outcome: Any = each(batch)
            except CollateError as error:
                outcome = error
        outcomes.append((outcome, [str(w.message) for w in caught]))
    (expected, expected_warned), (ours, warned) = outcomes
    assert warned == expected_warned
    if isinstance(expected, CollateError) or isinstance(ours, CollateError):
        assert isinstance(ours, CollateError) and isinstance(expected, CollateError), (ours, expected)
        assert str(ours) == str(expected)
        return None
    assert_identical(ours, expected)
    return ours
