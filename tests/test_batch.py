"""Batches as objects: pickled, saved, pinned and moved in one piece, from their layout."""

from __future__ import annotations

import collections
import copy
import dataclasses
import io
import pickle

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import AsList, Batch, BatchList, Jagged, MMCollate, mm_collate, to_device
from pincollate._batch.batch import carried, reduce_changed
from pincollate._batch.trees import tensors
from pincollate._batch.views import ALIGN
from samples import PARITY, RAGGED, Point, Record, assert_same, listing, storages

#: One sample tree per batch type.
BATCH_TYPES = {
    "dict": "multimodal-dict",
    "list": "tuple-samples",
    "namedtuple": "namedtuple",
    "dataclass": "dataclass",
}


def _batch(kind: str):
    name = BATCH_TYPES[kind]
    return MMCollate(pin_memory=False)((PARITY.get(name) or RAGGED[name])())


def _one_buffer(batch) -> None:
    assert storages(batch) == {batch.buffer.data_ptr()}


@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_every_batch_type_carries_its_layout_and_buffer(kind):
    batch = _batch(kind)
    assert batch.layout is not None and batch.buffer.dtype == torch.uint8
    assert batch.buffer.numel() == batch.layout.nbytes
    _one_buffer(batch)


@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_pickle_round_trip_is_one_buffer_and_small(kind):
    batch = _batch(kind)
    data = pickle.dumps(batch)
    again = pickle.loads(data)
    assert_same(again, batch)
    assert type(again) is type(batch) and again.layout == batch.layout
    _one_buffer(again)
    if kind != "dataclass":  # default_collate rejects dataclasses
        name = BATCH_TYPES[kind]
        theirs = pickle.dumps(default_collate(PARITY[name]()))
        # The buffer's first ALIGN bytes (views.START) hold no tensor: a tiny batch pickles them too.
        assert len(data) <= 1.1 * len(theirs) + ALIGN, (len(data), len(theirs))


def _saved_and_loaded(batch):
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    return torch.load(stream)


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_torch_save_and_load_with_weights_only(kind):
    batch = _batch(kind)
    again = _saved_and_loaded(batch)  # weights_only=True is torch's default
    assert_same(again, batch)
    assert again.layout == batch.layout
    _one_buffer(again)


@pytest.mark.parametrize("kind", ["namedtuple", "dataclass"])
def test_torch_save_of_user_types_loads_once_the_user_allows_them(kind):
    batch = _batch(kind)
    cls = Point if kind == "namedtuple" else Record
    with torch.serialization.safe_globals([cls]):
        again = _saved_and_loaded(batch)
    assert_same(again, batch)
    _one_buffer(again)


@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_pin_memory_makes_one_pinned_copy_and_points_buffer_at_it(kind, fake_pinned):
    batch = _batch(kind)
    pinned = batch.pin_memory()
    assert fake_pinned == [batch.layout.nbytes]
    assert pinned.buffer.data_ptr() != batch.buffer.data_ptr()
    _one_buffer(pinned)
    assert_same(pinned, batch)
    assert pinned.pin_memory() is pinned and len(fake_pinned) == 1


@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_to_copies_the_buffer_once_and_points_buffer_at_it(kind):
    batch = _batch(kind)
    assert batch.to("cpu") is batch
    copied = batch.to("cpu", copy=True)
    assert copied.buffer.data_ptr() != batch.buffer.data_ptr()
    _one_buffer(copied)
    assert_same(copied, batch)


def test_to_takes_tensor_to_arguments_and_casts_floats_only():
    batch = mm_collate(PARITY["multimodal-dict"]())
    for half in (
        batch.to(torch.float16),
        batch.to("cpu", torch.float16),
        batch.to(dtype=torch.float16),
        batch.to(torch.ones(1, dtype=torch.float16)),
    ):
        assert half["audio"].dtype == torch.float16 and half["score"].dtype == torch.float16
        assert (
            half["image"].dtype == torch.uint8
            and half["label"].dtype == torch.int64
            and half["flag"].dtype == torch.bool
        )
        assert torch.equal(half["audio"], batch["audio"].half())
        assert half["caption"] == batch["caption"]
        _one_buffer(half)
        assert half.layout.nbytes < batch.layout.nbytes
    positional = batch.to("cpu", torch.float64, False, True)
    assert positional["audio"].dtype == torch.float64 and positional.buffer.data_ptr() != batch.buffer.data_ptr()


def test_to_device_moves_a_batch_in_one_copy():
    batch = mm_collate(PARITY["multimodal-dict"]())
    moved = to_device(batch, "cpu")
    assert moved is batch


def test_a_batch_whose_contents_changed_moves_leaf_by_leaf(fake_pinned):
    batch = mm_collate(PARITY["multimodal-dict"]())
    batch["labels"] = torch.arange(4)
    assert batch.layout is None and carried(batch) is None
    pinned = batch.pin_memory()
    assert torch.equal(pinned["labels"], torch.arange(4)) and "labels" in pinned
    half = batch.to(torch.float16)
    assert half["audio"].dtype == torch.float16 and torch.equal(half["labels"], torch.arange(4))
    again = pickle.loads(pickle.dumps(batch))
    assert torch.equal(again["labels"], torch.arange(4))
    nested = mm_collate(PARITY["multimodal-dict"]())
    nested["meta"]["boxes"] = torch.zeros(1)
    assert nested.layout is None
    assert nested.to(torch.float64)["meta"]["boxes"].dtype == torch.float64


@pytest.mark.parametrize("change", ["added", "removed", "replaced"])
def test_a_changed_pinned_batch_saves_and_pickles_leaf_by_leaf(fake_pinned, change):
    # Pinned fields are views of one storage in several dtypes, which torch refuses to save
    # together: each is written as a copy of its own, so the changed batch saves as a dict's would.
    samples = [
        {
            "image": torch.full((3, 4, 4), i, dtype=torch.uint8),
            "score": i / 2,
            "ids": torch.arange(i + 1),
            "feats": torch.full((i + 2,), i / 4),  # a second jagged field, of another dtype
        }
        for i in range(3)
    ]
    batch = MMCollate(fields={"ids": Jagged(), "feats": Jagged()})(samples).pin_memory()
    assert len(fake_pinned) == 1 and batch.layout is not None
    if change == "added":
        batch["extra"] = torch.arange(3)
    elif change == "removed":
        del batch["score"]
    else:
        batch["image"] = batch["image"].float()
    assert batch.layout is None
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    for again in (torch.load(stream), pickle.loads(pickle.dumps(batch))):
        assert type(again) is Batch and list(again) == list(batch)
        for key, value in batch.items():
            if value.is_nested:
                assert torch.equal(again[key].values(), value.values())
                assert torch.equal(again[key].offsets(), value.offsets())
            else:
                assert again[key].dtype == value.dtype and torch.equal(again[key], value)


def test_a_changed_pinned_batch_crosses_processes_as_it_is_and_pickles_copies(fake_pinned):
    # multiprocessing's pickler shares each storage as it is (no dtype rule): nothing to copy there.
    batch = mm_collate([{"x": torch.full((2,), float(i)), "n": i} for i in range(2)]).pin_memory()
    batch["extra"] = torch.arange(2)
    _, (sent,) = reduce_changed(batch, across=True)
    assert all(sent[key] is batch[key] for key in batch)
    _, (pickled,) = reduce_changed(batch)
    assert pickled["extra"] is batch["extra"]  # not a view of the pinned buffer: as it is
    assert pickled["x"] is not batch["x"] and torch.equal(pickled["x"], batch["x"])


def test_a_batch_saves_beside_one_of_its_own_fields():
    # The batch pickles its buffer; no field of several dtypes starts at the buffer's address.
    batch = mm_collate([{"x": torch.full((3,), float(i)), "n": i} for i in range(2)])
    for together in ((batch, batch["x"]), {"batch": batch, "n": batch["n"]}, [batch, dict(batch)]):
        stream = io.BytesIO()
        torch.save(together, stream)
        stream.seek(0)
        loaded = torch.load(stream)
        first = loaded[0] if isinstance(loaded, (tuple, list)) else loaded["batch"]
        assert torch.equal(first["x"], batch["x"]) and torch.equal(first["n"], batch["n"])


def test_grad_and_tensor_attributes_are_kept_by_pickling_copying_and_moving(fake_pinned):
    # A tensor that requires grad, or carries an attribute of the user's, is not the layout's:
    # the batch then pickles and moves leaf by leaf, as a dict of tensors does.
    batch = mm_collate([{"x": torch.full((2,), float(i)), "n": i} for i in range(2)])
    batch["x"].requires_grad_()
    batch["n"].source = "camera 0"
    assert batch.layout is None
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    for again in (copy.deepcopy(batch), pickle.loads(pickle.dumps(batch)), torch.load(stream)):
        assert again["x"].requires_grad and again["n"].source == "camera 0"
        assert torch.equal(again["x"].detach(), batch["x"].detach())
    pinned = batch.pin_memory()
    assert pinned["x"].requires_grad and pinned["x"].grad_fn is not None and torch.equal(pinned["n"], batch["n"])
    weighted = mm_collate([{"h": torch.ones(2)} for _ in range(2)])
    weighted["h"] = weighted["h"] * torch.tensor(2.0, requires_grad=True)  # a field with a graph
    for moved in (weighted.to("meta"), to_device(weighted, "meta"), weighted.to(torch.float64)):
        assert moved["h"].requires_grad and moved["h"].grad_fn is not None


@pytest.mark.filterwarnings("ignore:.*(in beta state|in prototype stage):UserWarning")
@pytest.mark.parametrize("make", ["sparse", "sparse_csr", "strided nested"])
def test_a_batch_with_a_tensor_of_no_storage_span_added_still_moves(make):
    batch = mm_collate([{"x": torch.full((2,), float(i))} for i in range(2)])
    dense = torch.arange(6.0).view(2, 3)
    if make == "sparse":
        added = dense.to_sparse()
    elif make == "sparse_csr":
        added = dense.to_sparse_csr()
    else:
        added = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    batch["added"] = added
    for moved in (batch.to("cpu"), batch.to("cpu", copy=True), to_device(batch, "cpu")):
        assert moved["added"].layout == added.layout and torch.equal(moved["x"], batch["x"])
        if not added.is_nested:
            assert torch.equal(moved["added"].to_dense(), dense)
    copied = batch.to("cpu", copy=True)
    # copy=True copies the added tensor too, as Tensor.to(copy=True) does.
    assert copied["x"].data_ptr() != batch["x"].data_ptr() and copied["added"] is not added
    assert copied["added"].values().data_ptr() != added.values().data_ptr()


@pytest.mark.filterwarnings("ignore:.*in prototype stage:UserWarning")
def test_a_jagged_field_given_an_attribute_or_grad_keeps_them():
    batch = MMCollate(fields={"ids": Jagged()})([{"ids": torch.arange(i + 1.0)} for i in range(3)])
    batch["ids"].source = "camera 0"
    assert batch.layout is None
    for again in (pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch)):
        assert again["ids"].source == "camera 0" and torch.equal(
            again["ids"].values(), batch["ids"].values().to(again["ids"].dtype)
        )
    grad = MMCollate(fields={"ids": Jagged()})([{"ids": torch.arange(i + 1.0)} for i in range(3)])
    grad["ids"].requires_grad_()
    assert grad.layout is None and pickle.loads(pickle.dumps(grad))["ids"].requires_grad


def test_conjugate_and_negative_views_pin_and_move_as_their_values(fake_pinned):
    z = torch.tensor([1 + 2j, 3 - 1j])
    batch = mm_collate([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])
    batch["conj"] = z.conj()
    batch["neg"] = z.conj().imag  # a view with the negative bit
    for moved in (batch.pin_memory(), to_device(dict(batch), "cpu")):
        assert torch.equal(moved["conj"].resolve_conj(), z.conj().resolve_conj())
        assert torch.equal(moved["neg"].resolve_neg(), torch.tensor([-2.0, 1.0]))
        assert torch.equal(moved["x"], batch["x"])


def test_to_takes_copy_positionally_as_tensor_to_does():
    batch = mm_collate([{"x": torch.ones(2), "n": 1}, {"x": torch.zeros(2), "n": 2}])
    for moved in (batch.to(torch.float16, False, True), batch.to("cpu", torch.float16, False, True)):
        assert moved["x"].dtype == torch.float16 and moved["n"].dtype == torch.int64
    same = batch.to(batch["x"], False, True)  # Tensor.to(other, non_blocking, copy)
    assert same["x"].data_ptr() != batch["x"].data_ptr() and torch.equal(same["x"], batch["x"])


@pytest.mark.parametrize("compile", [True, False])
def test_torch_pytree_sees_a_batchs_fields(compile):
    import torch.utils._pytree as pytree

    batch = MMCollate(compile=compile)([{"x": torch.full((2,), float(i)), "n": i} for i in range(3)])
    leaves = pytree.tree_leaves(batch)
    assert len(leaves) == 2 and all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    doubled = pytree.tree_map_only(torch.Tensor, lambda t: t * 2, batch)
    assert type(doubled) is Batch and list(doubled) == ["x", "n"] and torch.equal(doubled["x"], batch["x"] * 2)
    assert doubled.layout is None and torch.equal(batch["x"][:, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(batch)[0]] == ["['x']", "['n']"]
    summed = torch.func.vmap(lambda b: b["x"].sum() + b["n"])(batch)
    assert summed.tolist() == [0.0, 3.0, 6.0]
    rows = MMCollate(compile=compile)([[torch.ones(2), 1], [torch.zeros(2), 2]])
    assert type(pytree.tree_map(lambda t: t + 1, rows)) is BatchList and len(pytree.tree_leaves(rows)) == 2


Shadow = collections.namedtuple("Shadow", "to pin_memory")


def test_namedtuple_fields_beat_methods():
    out = mm_collate([Shadow(torch.zeros(2), 1), Shadow(torch.ones(2), 2)])
    assert isinstance(out, Shadow)
    assert torch.equal(out.to, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert out.pin_memory.tolist() == [1, 2]
    assert out.layout is not None
    moved = to_device(out, "cpu")
    assert torch.equal(moved.to, out.to)


def test_top_level_namedtuple_batch_is_a_subclass_that_pickles_as_the_users_class():
    out = mm_collate(PARITY["namedtuple"]())
    assert isinstance(out, Point) and type(out) is not Point and type(out).__name__ == "Point"
    assert repr(out).startswith("Point(")


@dataclasses.dataclass
class _WithExtra:
    x: torch.Tensor

    def __post_init__(self):
        self.cache = ["not a field"]


def test_dataclass_batches_hold_fields_only():
    samples = [_WithExtra(torch.zeros(2)), _WithExtra(torch.ones(2))]
    out = mm_collate(samples)
    assert isinstance(out, _WithExtra) and not hasattr(out, "cache")


def test_batch_list_and_batch_types():
    assert type(_batch("dict")) is Batch
    assert type(_batch("list")) is BatchList


def test_ragged_batches_pickle_as_one_buffer():
    collate = MMCollate(fields={"x": AsList()})
    batch = collate([{"x": torch.arange(float(i + 1))} for i in range(8)])
    again = pickle.loads(pickle.dumps(batch))
    assert_same(again, batch)
    _one_buffer(again)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", sorted(BATCH_TYPES))
def test_on_cuda_a_batch_pins_and_moves_as_one_buffer(kind):
    batch = _batch(kind)
    pinned = batch.pin_memory()
    assert pinned.buffer.is_pinned()
    moved = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert moved.buffer.device.type == "cuda"
    _one_buffer(moved)
    assert_same(moved.to("cpu"), batch)
    half = moved.to(torch.float16)
    assert half.buffer.device.type == "cuda"
    _one_buffer(half)


@pytest.mark.cuda
def test_on_cuda_collate_in_the_main_process_allocates_pinned():
    batch = MMCollate(pin_memory=True)(PARITY["multimodal-dict"]())
    assert batch.buffer.is_pinned()
    assert batch.pin_memory() is batch


@pytest.fixture
def stand_in_dma(monkeypatch):
    """Each copy to a device made by a stand-in DMA (a clone on the CPU), listed by its source."""
    from pincollate._memory import arena as _arena

    copies = []
    monkeypatch.setattr(_arena, "_copy", lambda source, device, non_blocking: copies.append(source) or source.clone())
    return copies


def _changed() -> Batch:
    """A batch of two samples, then changed: a key added after collate (no layout any more)."""
    # Fields of a few hundred bytes: a span copy of tiny ones would move mostly alignment padding.
    samples = [{"x": torch.full((64,), float(i)), "y": i, "f": [0.5, 1.5]} for i in range(2)]
    for i, sample in enumerate(samples):
        sample["tokens"] = torch.arange(64 - i)
    batch = MMCollate(pin_memory=False, fields={"tokens": AsList()})(samples)
    batch["z"] = torch.arange(64.0)
    assert batch.layout is None
    return batch


@pytest.mark.parametrize("move", ["Batch.to", "to_device"])
def test_a_batch_moves_in_one_copy(stand_in_dma, move):
    batch = _batch("dict")
    assert len(list(tensors(batch))) > 1
    moved = batch.to("cuda:1", non_blocking=True) if move == "Batch.to" else to_device(batch, "cuda:1")
    assert len(stand_in_dma) == 1 and stand_in_dma[0].data_ptr() == batch.buffer.data_ptr()
    assert_same(moved, batch)


@pytest.mark.cuda
@pytest.mark.parametrize("move", ["Batch.to", "to_device"])
def test_on_cuda_a_batch_moves_in_one_dma(move):
    from pincollate.bench._gpu import count_h2d, per_leaf

    cuda = torch.device("cuda")
    batch = MMCollate(pin_memory=True)(PARITY["multimodal-dict"]())

    def moved(batch):
        return batch.to(cuda, non_blocking=True) if move == "Batch.to" else to_device(batch, cuda)

    assert count_h2d(lambda: moved(batch)) == 1
    batch["added"] = torch.arange(64.0)
    assert count_h2d(lambda: moved(batch)) == 2  # changed: the buffer and the added value, one copy each
    # The control: the profiler sees one "Memcpy HtoD" per copy, so the same batch moved one
    # .to() per tensor must count one per tensor.
    leaves = sum(1 for t in tensors(batch) if t.numel())
    assert leaves > 2 and count_h2d(lambda: per_leaf(batch, cuda)) == leaves


@pytest.mark.parametrize("move", ["Batch.to", "to_device"])
def test_a_changed_batch_moves_in_one_copy_per_storage(stand_in_dma, move):
    # Seven tensors (x, y, two in f, two in the ragged tokens, z) in two storages: the batch's buffer, z's own.
    batch = _changed()
    assert len(list(tensors(batch))) == 7 and len(storages(batch)) == 2
    moved = batch.to("cuda:1", non_blocking=True) if move == "Batch.to" else to_device(batch, "cuda:1")
    assert len(stand_in_dma) == 2
    assert type(moved) is Batch and moved.layout is None
    assert_same(moved, batch)
    assert all(t.data_ptr() != s.data_ptr() for t, s in zip(tensors(moved), tensors(batch), strict=True))


def test_a_changed_batch_casts_after_its_one_copy_per_storage(stand_in_dma):
    batch = _changed()
    half = batch.to("cuda:1", torch.float16)
    assert len(stand_in_dma) == 2
    assert half["x"].dtype == torch.float16 and half["y"].dtype == torch.int64 and half["z"].dtype == torch.float16
    assert torch.equal(half["x"], batch["x"].half())
    same = batch.to(torch.float64, copy=True)  # nothing moves: every leaf is copied once by the cast or the copy
    assert len(stand_in_dma) == 2
    assert all(t.data_ptr() != s.data_ptr() for t, s in zip(tensors(same), tensors(batch), strict=True))


@pytest.mark.parametrize("jagged", [False, True])
def test_a_changed_batch_holds_a_registered_slot_until_copied(monkeypatch, stand_in_dma, jagged):
    """The slot a changed batch's fields lie in is held until the copy that reads it has finished.

    A ``Jagged`` field is a nested tensor, whose ``data_ptr()`` is 0: asked about itself
    it is in no registered slot. Here it is the only field in the slot (beside its own
    lengths), so the hold must come from its parts.
    """
    from pincollate import Jagged
    from pincollate._memory import registration as _registration

    held = []
    monkeypatch.setattr(_registration, "hold_until_copied", lambda source, device: held.append(source))
    samples = [{"tokens": torch.arange(64 - i)} for i in range(2)]
    batch = MMCollate(pin_memory=False, fields={"tokens": Jagged() if jagged else AsList()})(samples)
    assert isinstance(batch["tokens"], list) is not jagged  # a nested tensor, or a list of two
    start = batch.buffer.data_ptr()
    end = start + batch.buffer.untyped_storage().nbytes()
    monkeypatch.setitem(_registration.registered, start, end)  # as pin_slots registers a worker's slot
    batch["z"] = torch.arange(3.0)
    moved = batch.to("cuda:1", non_blocking=True)
    assert len(stand_in_dma) == 2
    assert len(held) == 1 and start <= held[0].data_ptr() < end
    assert_same(moved, batch)


# --- saving part of a batch: each field writes its own bytes -----------------------------------


def _written(obj, how: str) -> bytes:
    if how == "pickle":
        return pickle.dumps(obj)
    stream = io.BytesIO()
    torch.save(obj, stream)
    return stream.getvalue()


def _read(data: bytes, how: str):
    return pickle.loads(data) if how == "pickle" else torch.load(io.BytesIO(data), weights_only=False)


def _framing(how: str) -> int:
    """What the format writes around one tensor: an empty tensor saved alone."""
    return len(_written(torch.empty(0), how))


def _own_bytes_bound(obj, how: str) -> int:
    """What saving ``obj`` may write: the format's framing, then 2x each tensor's bytes plus 1 KiB."""
    return _framing(how) + sum(2 * t.nbytes + 1024 for t in tensors(obj))


def _all_saving_samples():
    return sorted(PARITY) + sorted(RAGGED)


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
@pytest.mark.parametrize("name", _all_saving_samples())
def test_each_field_saves_alone_with_its_own_bytes(name, how):
    with listing(name):
        batch = MMCollate()((PARITY.get(name) or RAGGED[name])())
    for t in tensors(batch):
        data = _written(t, how)
        assert len(data) <= _own_bytes_bound(t, how), (name, tuple(t.shape), t.dtype, len(data))
        assert_same(_read(data, how), t)


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
@pytest.mark.parametrize(
    "part",
    ["dict(batch)", "{**batch}", "batch | {...}", "some fields", "key added", "key removed"],
)
def test_any_dict_of_fields_saves_with_their_own_bytes(part, how):
    batch = mm_collate(PARITY["multimodal-dict"]())  # float, int64, uint8 and bool fields
    assert len({t.dtype for t in tensors(batch)}) >= 3
    if part == "dict(batch)":
        obj = dict(batch)
    elif part == "{**batch}":
        obj = {**batch}
    elif part == "batch | {...}":
        obj = batch | {"extra": torch.arange(3)}
    elif part == "some fields":
        obj = {key: value for key, value in list(batch.items())[1:3]}
    elif part == "key added":
        obj = batch
        obj["extra"] = torch.arange(3)
    else:
        obj = batch
        del obj[next(iter(obj))]
    expected = {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in obj.items()}
    data = _written(obj, how)
    assert len(data) <= _own_bytes_bound(obj, how), (len(data), _own_bytes_bound(obj, how))
    assert_same(dict(_read(data, how)), expected)


class _SavesAField(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"image": torch.full((3, 32, 32), float(i)), "label": i, "mask": torch.ones(4, dtype=torch.bool)}


def _save_in_worker(samples):
    batch = mm_collate(samples)
    return batch, _written(batch["label"], "torch.save"), _written(dict(batch), "torch.save")


@pytest.mark.slow
def test_a_worker_saves_one_field_or_a_dict_with_their_own_bytes():
    loader = torch.utils.data.DataLoader(
        _SavesAField(), batch_size=4, collate_fn=_save_in_worker, num_workers=1, timeout=60
    )
    for batch, label, fields in loader:
        assert len(label) <= _own_bytes_bound(batch["label"], "torch.save")
        assert torch.equal(torch.load(io.BytesIO(label)), batch["label"])
        assert len(fields) <= _own_bytes_bound(batch, "torch.save")
        assert_same(torch.load(io.BytesIO(fields)), dict(batch))


def test_to_honours_memory_format():
    batch = MMCollate(pin_memory=False)([{"image": torch.randn(3, 4, 4), "ids": torch.arange(3)}] * 2)
    moved = batch.to(memory_format=torch.channels_last)
    assert moved["image"].is_contiguous(memory_format=torch.channels_last)
    assert not moved["image"].is_contiguous()
    assert torch.equal(moved["image"], batch["image"]) and torch.equal(moved["ids"], batch["ids"])
    assert batch.to(memory_format=torch.preserve_format) is batch


ZERO_SIZE = {
    "empty-field-beside-others": lambda: [{"x": torch.zeros(0, 5), "y": torch.ones(2)}] * 2,
    "image-without-boxes": lambda: [
        {"image": torch.ones(3, 2, 2), "boxes": torch.zeros(n, 4), "labels": torch.zeros(n, dtype=torch.int64)}
        for n in (0, 2, 0)
    ],
    "pad-of-empty-sequences": lambda: [{"ids": torch.zeros(0, dtype=torch.int64), "y": 1}] * 2,
    "concat-of-no-items": lambda: [{"px": [], "ids": torch.arange(2)}] * 2,
}


@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_zero_size_tensors_keep_the_layout_and_one_buffer(name):
    from pincollate import Concat, Pad

    samples = ZERO_SIZE[name]()
    policies = {"ids": Pad(), "px": Concat(), "boxes": AsList(), "labels": AsList()}
    fields = {key: policy for key, policy in policies.items() if key in samples[0]}
    collate = MMCollate(pin_memory=False, fields=fields)
    for _ in range(2):  # fresh, then the cached plan
        batch = collate(ZERO_SIZE[name]())
        assert batch.layout is not None and batch.buffer is not None
        _one_buffer(batch)
        assert_same(_saved_and_loaded(batch), batch)
