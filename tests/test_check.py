"""The batch's consistency check (pincollate/_check.py): what makes a batch the same values as its layout.

A batch moves, pins, pickles and saves in one piece only while every tensor and
container in it is exactly what its layout describes; otherwise leaf by leaf, with
the values its fields read.
"""

from __future__ import annotations

import collections
import io
import pickle

import pytest
import torch

from pincollate import AsList, MMCollate, Pad, mm_collate
from samples import assert_same


def _saved_and_loaded(batch):
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    return torch.load(stream)  # weights_only=True, torch's default


def _complex_batch():
    return MMCollate(pin_memory=False)([{"z": torch.randn(3, dtype=torch.complex64)}] * 2)


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_a_conjugate_or_negative_view_put_back_loses_the_layout_and_is_saved_as_it_reads(view):
    batch = _complex_batch()
    expected = batch["z"].conj() if view == "conj" else batch["z"].neg()
    batch["z"] = batch["z"].conj() if view == "conj" else torch._neg_view(batch["z"])
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True), _saved_and_loaded(batch)):
        assert torch.equal(again["z"].resolve_conj().resolve_neg(), expected)


class _Tagged(torch.Tensor):
    pass


@pytest.mark.parametrize(
    "replace",
    [
        lambda b: b.__setitem__("crops", tuple(b["crops"])),
        lambda b: b.__setitem__("meta", collections.OrderedDict(b["meta"])),
        lambda b: b.__setitem__("x", b["x"].as_subclass(_Tagged)),
    ],
    ids=["tuple-for-list", "ordereddict-for-dict", "subclass-view"],
)
def test_a_container_or_tensor_of_another_class_keeps_its_class_through_pickle_and_to(replace):
    samples = [{"x": torch.ones(2), "crops": [torch.ones(1), torch.zeros(1)], "meta": {"a": torch.ones(1)}}] * 2
    batch = MMCollate(pin_memory=False)(samples)
    assert batch.layout is not None
    replace(batch)
    assert batch.layout is None
    classes = {key: type(value) for key, value in batch.items()}
    for again in (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True)):
        assert {key: type(value) for key, value in again.items()} == classes


def test_batches_made_in_the_dataset_keep_their_layout_through_batch_size_none():
    collate = MMCollate(pin_memory=False)
    batches = [collate([{"x": torch.full((2,), float(i)), "s": f"s{i}"}] * 3) for i in range(3)]
    for made, loaded in zip(batches, torch.utils.data.DataLoader(batches, batch_size=None), strict=True):
        assert loaded.layout is not None, "a str column made the layout look changed"
        assert_same(loaded, made)


@pytest.mark.parametrize("moved", ["field", "batch.buffer", "own buffer"])
def test_memory_moved_away_by_share_memory_saves_what_the_batch_reads(moved):
    """``share_memory_`` (which a queue's feeder thread runs as it pickles) moves one storage.

    A field's storage moved: that field no longer reads the buffer, and the batch says
    so. ``batch.buffer`` is a tensor of its own over the bytes: moving it changes
    nothing. The batch's own buffer (no user reaches it) moved: no field reads it any
    more, and they still read their bytes. Every time, the batch saves and pickles the
    values its fields read.
    """
    batch = mm_collate([{"x": torch.ones(4), "y": 1, "s": "a"}, {"x": torch.zeros(4), "y": 2, "s": "b"}])
    expected = {"x": batch["x"].clone(), "y": batch["y"].clone(), "s": ["a", "b"]}
    if moved == "field":
        batch["x"].share_memory_()
    elif moved == "batch.buffer":
        batch.buffer.share_memory_()
    else:
        batch._pincollate[1].share_memory_()
    assert (batch.layout is None) == (moved != "batch.buffer")
    batch["x"] += 1  # written where the field now lives
    expected["x"] += 1
    assert_same(_saved_and_loaded(batch), expected)
    assert_same(pickle.loads(pickle.dumps(batch)), expected)


def _moved_three_ways(batch):
    return (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True), _saved_and_loaded(batch))


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_a_conjugate_or_negative_item_of_a_per_sample_list_loses_the_layout(view):
    collate = MMCollate(pin_memory=False, fields={"z": AsList()})
    batch = collate([{"z": torch.tensor([1 + 2j, 3 + 4j])}, {"z": torch.tensor([5 + 6j])}])
    assert type(batch["z"]) is list and batch.layout is not None
    first = batch["z"][0]
    batch["z"][0] = first.conj() if view == "conj" else torch._neg_view(first)
    expected = first.conj() if view == "conj" else first.neg()
    assert batch.layout is None
    for again in _moved_three_ways(batch):
        assert torch.equal(again["z"][0].resolve_conj().resolve_neg(), expected)


def test_a_box_rewrapped_with_another_canvas_size_loses_the_layout():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    boxes = [tv_tensors.BoundingBoxes(torch.ones(n, 4), format="XYXY", canvas_size=(8, 8)) for n in (1, 2)]
    batch = MMCollate(pin_memory=False)([{"boxes": boxes[0]}, {"boxes": boxes[1]}])
    assert batch.layout is not None
    batch["boxes"][0] = tv_tensors.wrap(batch["boxes"][0].as_subclass(torch.Tensor), like=boxes[0], canvas_size=(9, 9))
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True)):
        assert tuple(again["boxes"][0].canvas_size) == (9, 9) and tuple(again["boxes"][1].canvas_size) == (8, 8)


def test_a_stacked_subclass_rewrapped_with_other_metadata_loses_the_layout():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    points = [tv_tensors.KeyPoints(torch.ones(2, 2), canvas_size=(8, 8))] * 2
    batch = MMCollate(pin_memory=False)([{"points": points[0]}, {"points": points[1]}])
    assert batch.layout is not None
    batch["points"][1] = tv_tensors.wrap(
        batch["points"][1].as_subclass(torch.Tensor), like=points[1], canvas_size=(3, 3)
    )
    assert batch.layout is None
    again = pickle.loads(pickle.dumps(batch))
    assert [tuple(p.canvas_size) for p in again["points"]] == [(8, 8), (3, 3)]


def test_a_jagged_field_remade_with_lengths_loses_the_layout_and_is_saved_as_it_reads():
    from pincollate import Jagged

    batch = MMCollate(pin_memory=False, fields={"x": Jagged()})([{"x": torch.arange(3.0)}, {"x": torch.arange(5.0)}])
    assert batch.layout is not None
    field = batch["x"]
    batch["x"] = torch.nested.nested_tensor_from_jagged(field.values(), field.offsets(), lengths=torch.tensor([1, 2]))
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), _saved_and_loaded(batch)):
        assert [row.tolist() for row in again["x"].unbind()] == [[0.0], [0.0, 1.0]]


@pytest.mark.parametrize("moved", [("x",), ("sub", "x"), ("sub", "ids_lengths")], ids=["top", "nested", "extra"])
def test_a_key_put_back_last_loses_the_layout_and_keeps_the_order_it_has(moved):
    # Same values, same key set: only the order says the batch changed.
    samples = [{"x": torch.ones(2), "sub": {"x": torch.ones(2), "y": i, "ids": torch.arange(i + 1)}} for i in range(2)]
    batch = MMCollate(pin_memory=False, fields={"sub.ids": Pad()})(samples)
    assert batch.layout is not None
    mapping = batch["sub"] if len(moved) == 2 else batch
    mapping[moved[-1]] = mapping.pop(moved[-1])
    assert list(mapping)[-1] == moved[-1]
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True), _saved_and_loaded(batch)):
        assert list(again) == list(batch) and list(again["sub"]) == list(batch["sub"])
        assert_same(again, batch)


def test_a_key_put_back_as_an_equal_key_of_another_class_loses_the_layout():
    batch = MMCollate(pin_memory=False)([{"a": torch.ones(2), 1: torch.zeros(1)}] * 2)
    batch[True] = batch.pop(1)  # 1 == True: the same place and value, another key
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), batch.to("cpu", copy=True), _saved_and_loaded(batch)):
        assert [type(key) for key in again] == [str, bool]


class _KeywordFields(dict):
    """A dict built from keyword fields: built empty and updated, whatever its keys."""

    def __init__(self, image=None, label=None):
        super().__init__(image=image, label=label)


def test_a_container_class_built_by_its_keys_keeps_its_batchs_layout():
    # Whether the class is built depends on the batch's keys: the check asks with those keys.
    samples = [{"k": _KeywordFields(torch.zeros(2), i)} for i in range(2)]
    batch = MMCollate(pin_memory=False)(samples)
    assert type(batch["k"]) is _KeywordFields and batch.layout is not None
    batch["k"] = dict(batch["k"])  # replaced by another class: no longer the layout's
    assert batch.layout is None


class _TensorsOnly(collections.abc.Mapping):
    """A read-only mapping that refuses values other than tensors (and so the check's stand-ins)."""

    def __init__(self, data):
        if not all(isinstance(v, torch.Tensor) for v in data.values()):
            raise TypeError("values must be tensors")
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


@pytest.mark.parametrize("compile", [True, False])
def test_a_container_class_that_refuses_stand_in_values_keeps_its_batchs_layout(compile):
    samples = [{"a": _TensorsOnly({"x": torch.randn(3)}), "y": torch.randn(2)} for _ in range(4)]
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):
        batch = collate(samples)
        assert type(batch["a"]) is _TensorsOnly and batch.layout is not None


def test_the_checks_stand_in_build_teaches_the_builds_nothing():
    # The check builds a class with stand-in values, which a validating class refuses: that trial
    # must not make later batches' builds fall back to a plain dict.
    samples = [{"a": _TensorsOnly({"x": torch.randn(3)}), "y": torch.randn(2)} for _ in range(4)]
    collate = MMCollate(pin_memory=False)
    batch = collate(samples)
    batch["a"] = dict(batch["a"])  # another class: the check asks what the class is built as
    batch.layout  # noqa: B018 (the check, with its stand-in build)
    for _ in range(3):
        assert type(collate(samples)["a"]) is _TensorsOnly
