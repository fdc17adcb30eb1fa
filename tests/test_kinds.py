"""Container kinds (pincollate/_kinds.py): one precedence for every walker, and registered containers."""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from pincollate import CollateError, MMCollate, Pad, register_container, to_device
from pincollate._plan.careful import Planner
from pincollate._types.kinds import DATACLASS, MAPPING, NAMEDTUPLE, SEQUENCE, Registered, kind_of, registered
from samples import assert_identical, assert_one_buffer, careful_walk


class Point:
    """A user's container that is no mapping, sequence or dataclass."""

    def __init__(self, xy: Any, meta: Any):
        self.xy = xy
        self.meta = meta

    def __eq__(self, other: object) -> bool:
        return type(other) is Point and _same(self.xy, other.xy) and _same(self.meta, other.meta)

    __hash__ = None  # type: ignore[assignment]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is type(a) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


register_container(Point, lambda p: (["xy", "meta"], [p.xy, p.meta]), lambda keys, children: Point(*children))


class Pair(NamedTuple):
    a: Any
    b: Any


@dataclasses.dataclass
class Box:
    a: Any


class Chain:
    """A registered container whose keys depend on the value: one per link."""

    def __init__(self, *links: Any):
        self.links = list(links)


register_container(Chain, lambda c: ([f"link{j}" for j in range(len(c.links))], c.links), lambda k, c: Chain(*c))


class Tape(collections.abc.Sequence):  # type: ignore[type-arg]
    def __init__(self, *items: Any):
        self.items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ({}, MAPPING),
        (collections.OrderedDict(), MAPPING),
        (collections.UserDict(), MAPPING),
        (Pair(1, 2), NAMEDTUPLE),
        (Box(1), DATACLASS),
        ([1], SEQUENCE),
        ((1,), SEQUENCE),
        (torch.Size([2]), SEQUENCE),
        (range(2), SEQUENCE),
        (Tape(1), SEQUENCE),
        ("text", None),
        (b"bytes", None),
        (bytearray(b"x"), None),
        (1, None),
        (torch.zeros(1), None),
        (np.zeros(1), None),
        (Box, None),  # a dataclass's class is no instance of it
    ],
    ids=repr,
)
def test_every_value_has_one_kind(value, kind):
    from pincollate._types import kinds as _kinds

    assert kind_of(value) is kind
    assert isinstance(value, type) or _kinds._by_class[type(value)] is kind  # kept per class
    assert kind_of(value) is kind  # the second answer comes from the per-class cache


def test_classes_made_on_the_fly_do_not_grow_the_cache(monkeypatch):
    from pincollate._types import kinds as _kinds

    monkeypatch.setattr(_kinds, "_CLASSES_KEPT", 8)
    for i in range(40):
        cls = collections.namedtuple(f"Row{i}", ["a"])  # a new class per sample
        assert kind_of(cls(1)) is NAMEDTUPLE
    assert len(_kinds._by_class) <= 8


def test_a_registered_class_has_its_own_kind():
    kind = kind_of(Point(1, 2))
    assert isinstance(kind, Registered) and kind.cls is Point
    assert kind.keys(Point(1, 2)) == ["xy", "meta"] and kind.children(Point(1, 2)) == [1, 2]


def test_registering_needs_a_container_class_and_two_functions():
    with pytest.raises(CollateError, match="takes a class"):
        register_container(Point(1, 2), lambda p: ([], []), lambda k, c: None)  # type: ignore[arg-type]
    for leaf in (torch.Tensor, int, str, np.ndarray):
        with pytest.raises(CollateError, match="leaf type"):
            register_container(leaf, lambda p: ([], []), lambda k, c: None)
    with pytest.raises(CollateError, match="flatten"):
        register_container(Tape, None, None)  # type: ignore[arg-type]
    with pytest.raises(CollateError, match="register_container"):
        registered(Tape)


def _points(n: int, length: int = 3, label: int = 0) -> list[Point]:
    return [Point(torch.full((length,), float(i)), {"label": label + i, "name": f"p{i}"}) for i in range(n)]


def _expected(points: list[Point]) -> Point:
    """What a batch of points is: each child collated as a dict's field would be."""
    fields = MMCollate(pin_memory=False)([{"xy": p.xy, "meta": p.meta} for p in points])
    return Point(fields["xy"], dict(fields["meta"]))


def test_a_registered_container_collates_as_its_children_do():
    collate = MMCollate(pin_memory=False)
    for n in (2, 2, 3):
        batch = collate(_points(n))
        assert batch == _expected(_points(n))
        assert_one_buffer(batch)
    assert collate._plans.planned == 2  # one plan per batch size, reused


def test_a_registered_container_in_a_warm_plan_is_not_walked_again(monkeypatch):
    collate = MMCollate(pin_memory=False)
    collate(_points(2))

    def walked(*args: Any) -> None:
        raise AssertionError("the careful planner ran for a batch the plan describes")

    monkeypatch.setattr(Planner, "plan", walked)
    assert collate(_points(2, label=5)) == _expected(_points(2, label=5))


def test_a_registered_container_with_ragged_children_is_planned_carefully():
    collate = MMCollate(pin_memory=False, fields={"xy": Pad(lengths_key=None, mask_key=None)})
    points = [Point(torch.arange(n, dtype=torch.float32), {"label": n}) for n in (3, 1, 2)]
    for _ in range(2):
        batch = collate(points)
        assert batch.xy.tolist() == [[0, 1, 2], [0, 0, 0], [0, 1, 0]]
        assert batch.meta["label"].tolist() == [3, 1, 2]


def test_a_registered_container_whose_keys_differ_names_the_sample():
    collate = MMCollate(pin_memory=False)
    collate(_points(3))  # warm
    odd = _points(3)
    odd[2] = Point(Chain(torch.ones(3)), {"label": 2, "name": "p2"})  # another kind at "xy"
    with pytest.raises(CollateError) as info:
        collate(odd)
    assert info.value.sample == 2 and info.value.path == ("xy",)
    short = [Chain(torch.ones(2), torch.ones(2)), Chain(torch.ones(2))]
    with pytest.raises(CollateError, match="keys differ") as info:
        collate(short)
    assert info.value.sample == 1


def test_a_batch_holding_a_registered_container_keeps_its_layout_across_processes():
    collate = MMCollate(pin_memory=False)
    samples = [{"point": p, "label": i} for i, p in enumerate(_points(2))]
    batch = collate(samples)
    assert batch.layout is not None
    for again in (pickle.loads(pickle.dumps(batch)), _saved(batch)):
        assert again.layout == batch.layout
        assert again["point"] == batch["point"]
    half = batch.to(torch.float16)
    assert half.layout is not None and half["point"].xy.dtype == torch.float16
    assert half["point"].meta["label"].dtype == torch.int64


def _saved(batch: Any) -> Any:
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=False)


def test_moving_a_tree_rebuilds_registered_containers_and_keeps_other_sequences():
    point = Point(torch.ones(2), [torch.zeros(1), range(3), Tape(1, 2)])
    moved = to_device(point, "cpu")
    assert type(moved) is Point and moved is not point
    assert moved.meta[1] == range(3) and moved.meta[2] is point.meta[2]  # kept: no items to rebuild it from

    class Tagged(list):  # type: ignore[type-arg]
        pass

    tagged = Tagged([torch.ones(1)])
    tagged.note = "kept"  # type: ignore[attr-defined]
    out = to_device(tagged, "cpu")
    assert type(out) is Tagged and out.note == "kept"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_registered_containers_cross_from_workers():
    dataset = [{"point": p, "label": i} for i, p in enumerate(_points(8))]
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=MMCollate(pin_memory=False))
    batches = list(loader)
    assert len(batches) == 2
    for k, batch in enumerate(batches):
        expected = _expected([s["point"] for s in dataset[4 * k : 4 * k + 4]])
        assert batch["point"] == expected
        assert_identical(batch["label"], torch.arange(4 * k, 4 * k + 4))


class Bag:
    """A registered container whose keys are the value's own (numbers, say)."""

    def __init__(self, keys: list[Any], values: list[Any]):
        self.keys, self.values = keys, values


register_container(Bag, lambda b: (b.keys, b.values), lambda keys, values: Bag(list(keys), list(values)))


def test_a_warm_registered_container_keeps_key_types_as_the_careful_walk():
    # True == 1 and they hash alike: a plan keyed 1 does not describe a batch keyed True.
    collate, reference = MMCollate(pin_memory=False), careful_walk()
    for key in (1, True, 1.0, 1):
        batch = [Bag([key], [torch.full((2,), float(i))]) for i in range(2)]
        ours, theirs = collate(batch), reference(batch)
        assert list(map(type, ours.keys)) == list(map(type, theirs.keys)) == [type(key)]
        assert_identical(ours.values, theirs.values)


# --- registrations that reach collates that already ran (found by a round on the registry) ----


class _Later:
    def __init__(self, a, b):
        self.a, self.b = a, b


class _Rewrapped:
    def __init__(self, keys, children):
        self.keys, self.children = list(keys), list(children)


@pytest.mark.parametrize("compile", [True, False])
def test_registering_again_reaches_a_collate_that_already_planned(compile):
    register_container(_Later, lambda p: (["a", "b"], [p.a, p.b]), lambda keys, children: _Later(*children))
    collate = MMCollate(pin_memory=False, compile=compile)
    samples = [_Later(torch.tensor([float(i)]), i) for i in (1, 2)]
    for _ in range(3):  # walked, planned, compiled
        assert collate(samples).a.flatten().tolist() == [1.0, 2.0]
    # The same keys, another flatten: the cached plan read the children by the old one.
    register_container(_Later, lambda p: (["a", "b"], [p.a * 2, p.b]), lambda keys, children: _Later(*children))
    for _ in range(3):
        assert collate(samples).a.flatten().tolist() == [2.0, 4.0]


@pytest.mark.parametrize("compile", [True, False])
def test_registering_a_class_collated_as_a_dict_reaches_a_collate_that_already_planned(compile):
    class LaterDict(dict):  # a class of this run's own: the registration is for good
        pass

    collate = MMCollate(pin_memory=False, compile=compile)
    samples = [{"d": LaterDict(x=torch.zeros(2))}, {"d": LaterDict(x=torch.ones(2))}]
    for _ in range(3):
        assert type(collate(samples)["d"]) is LaterDict
    register_container(LaterDict, lambda d: (list(d), list(d.values())), _Rewrapped)
    for _ in range(3):
        out = collate(samples)["d"]
        assert type(out) is _Rewrapped and out.keys == ["x"] and out.children[0].tolist() == [[0.0, 0.0], [1.0, 1.0]]


class _Failing:
    def __init__(self, a):
        self.a = a


def _refuse(keys, children):
    raise ValueError("unflatten: a must be float32")


register_container(_Failing, lambda f: (["a"], [f.a]), _refuse)


class _BadKeys:
    def __init__(self, a, keys):
        self.a, self.keys = a, keys


register_container(_BadKeys, lambda b: (b.keys, [b.a]), lambda keys, children: _BadKeys(children[0], keys))


@pytest.mark.parametrize("compile", [True, False])
def test_a_registered_containers_own_errors_are_collate_errors(compile):
    collate = MMCollate(pin_memory=False, compile=compile)
    with pytest.raises(
        CollateError, match=r"unflatten of _Failing failed: ValueError\('unflatten: a must be float32'\)"
    ):
        collate([_Failing(torch.zeros(1)), _Failing(torch.ones(1))])
    with pytest.raises(CollateError, match=r"sample 0 at \['v'\]: flatten of _BadKeys gave a key that is not hashable"):
        collate([{"v": _BadKeys(torch.zeros(1), [["a"]])}] * 2)
    with pytest.raises(CollateError, match=r"sample 0 at \['v'\]: flatten of _BadKeys gave 2 keys for 1 children"):
        collate([{"v": _BadKeys(torch.zeros(1), ["a", "b"])}] * 2)
