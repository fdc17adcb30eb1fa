"""Concat and Jagged: packed ragged fields with offsets, and nested tensors on the buffer."""

from __future__ import annotations

import pickle

import pytest
import torch

from pincollate import CollateError, Concat, Jagged, MMCollate, to_device
from samples import assert_same_outcome, careful_walk, storages


def _ids(*lengths: int) -> list[dict]:
    return [{"ids": torch.arange(1, n + 1)} for n in lengths]


# --- Concat and Jagged ---------------------------------------------------------------


def test_concat_gives_cu_seqlens_offsets():
    out = MMCollate(fields={"ids": Concat()})(_ids(3, 1, 2))
    assert out["ids"].tolist() == [1, 2, 3, 1, 1, 2]
    assert out["ids_offsets"].dtype == torch.int32 and out["ids_offsets"].tolist() == [0, 3, 4, 6]


def test_concat_of_items_gives_flat_layout_with_counts():
    patches = [[torch.full((2, 4), 1.0), torch.full((3, 4), 2.0)], [torch.full((1, 4), 3.0)]]
    out = MMCollate(fields={"pixel_values": Concat()})([{"pixel_values": p} for p in patches])
    assert out["pixel_values"].shape == (6, 4)
    assert out["pixel_values"][:, 0].tolist() == [1, 1, 2, 2, 2, 3]
    assert out["pixel_values_offsets"].tolist() == [0, 5, 6]
    assert out["pixel_values_counts"].tolist() == [2, 1]
    assert out["pixel_values_item_offsets"].tolist() == [0, 2, 5, 6]
    assert len(storages(out)) == 1


def test_jagged_of_items_is_one_row_per_sample():
    patches = [[torch.ones(2, 4), torch.ones(3, 4)], [torch.ones(1, 4)]]
    out = MMCollate(fields={"p": Jagged()})([{"p": p} for p in patches])
    assert [t.shape for t in out["p"].unbind()] == [(5, 4), (1, 4)]
    assert out["p_item_offsets"].tolist() == [0, 2, 5, 6]


def test_concat_trailing_dims_must_agree():
    with pytest.raises(CollateError, match=r"sample 1 at \['x'\]: Concat\(\) needs equal trailing dims"):
        MMCollate(fields={"x": Concat()})([{"x": torch.zeros(2, 3)}, {"x": torch.zeros(2, 4)}])


def test_jagged_builds_a_nested_tensor_on_the_buffer():
    out = MMCollate(fields={"ids": Jagged()})(_ids(3, 1))
    nested = out["ids"]
    assert nested.is_nested and [t.tolist() for t in nested.unbind()] == [[1, 2, 3], [1]]
    assert (
        storages({"values": nested.values(), "offsets": nested.offsets()}) == storages(out) == {out.buffer.data_ptr()}
    )


def test_jagged_carries_its_sequence_lengths():
    # Known at planning time; without them attention kernels read the offsets back (a host sync).
    items = MMCollate(fields={"x": Jagged()})(
        [{"x": [torch.zeros(2, 3), torch.zeros(4, 3)]}, {"x": [torch.zeros(1, 3)]}, {"x": []}]
    )["x"]
    assert (items._maybe_min_seqlen, items._maybe_max_seqlen) == (0, 6)
    batch = MMCollate(fields={"ids": Jagged()})(_ids(3, 1))
    nested = batch["ids"]
    assert (nested._maybe_min_seqlen, nested._maybe_max_seqlen) == (1, 3)
    # Rebuilt from the layout after a pickle; carried over when moved leaf by leaf.
    for moved in (pickle.loads(pickle.dumps(batch))["ids"], to_device({"ids": nested, "y": 1}, "cpu")["ids"]):
        assert (moved._maybe_min_seqlen, moved._maybe_max_seqlen) == (1, 3)


def test_jagged_rejects_zero_dim_values():
    with pytest.raises(CollateError, match=r"sample 0 at \['x'\]: Jagged\(\) cannot concatenate 0-d values"):
        MMCollate(fields={"x": Jagged()})([{"x": torch.tensor(1)}, {"x": torch.tensor(2)}])


def test_concat_and_jagged_of_no_items_at_all_are_empty():
    out = MMCollate(fields={"x": Concat()})([{"x": []}, {"x": []}])
    assert out["x"].numel() == 0
    assert out["x_offsets"].tolist() == [0, 0, 0] and out["x_counts"].tolist() == [0, 0]
    jagged = MMCollate(fields={"x": Jagged()})([{"x": []}, {"x": []}])["x"]
    assert jagged.is_nested and [t.numel() for t in jagged.unbind()] == [0, 0]
    absent = MMCollate(fields={"x": Concat()}, missing="none")([{"x": None}, {}])
    assert absent["x"].numel() == 0 and absent["x_offsets"].tolist() == [0, 0, 0]


def test_concat_refuses_rows_past_its_int32_offsets():
    from pincollate._plan.packing import INT32_MAX

    # Zero-width rows: 2**31 of them cost no memory.
    big = torch.zeros(INT32_MAX // 2 + 1, 0)
    with pytest.raises(CollateError, match=r"at \['x'\]: 2,147,483,648 rows do not fit Concat\(\)'s int32 offsets"):
        MMCollate(fields={"x": Concat()})([{"x": big}, {"x": big}])
    jagged = MMCollate(fields={"x": Jagged()})([{"x": big}, {"x": big}])
    assert jagged["x"].offsets().tolist() == [0, INT32_MAX // 2 + 1, INT32_MAX + 1]


@pytest.mark.parametrize("policy", [Concat(), Jagged()], ids=["concat", "jagged"])
@pytest.mark.parametrize("items", [False, True], ids=["values", "items"])
def test_boxes_beside_plain_tensors_concatenate_plain_and_two_tv_kinds_name_the_sample(policy, items):
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")

    def batch(*values: torch.Tensor) -> list[dict]:
        return [{"b": [value] if items else value} for value in values]

    boxes = tv_tensors.BoundingBoxes(torch.arange(8.0).reshape(2, 4), format="XYXY", canvas_size=(10, 10))
    plain = torch.ones(3, 4)
    collate, reference = MMCollate(pin_memory=False, fields={"b": policy}), careful_walk(fields={"b": policy})
    for values in ((boxes, plain), (plain, boxes), (boxes, boxes)):
        out = assert_same_outcome(collate, reference, batch(*values))
        flat = out["b"].values() if isinstance(policy, Jagged) else out["b"]
        assert torch.equal(flat, torch.cat([v.as_subclass(torch.Tensor) for v in values]))
        # torch.cat gives boxes beside plain tensors as a plain tensor; boxes alone keep their class.
        kept = isinstance(policy, Concat) and not isinstance(policy, Jagged) and all(v is boxes for v in values)
        assert type(flat) is (tv_tensors.BoundingBoxes if kept else torch.Tensor)
    # An image beside a mask: torch.cat refuses the two tv_tensors kinds together.
    image, mask = tv_tensors.Image(torch.zeros(1, 2, 2)), tv_tensors.Mask(torch.zeros(2, 2, 2))
    for make in (collate, reference):
        with pytest.raises(CollateError, match="Mask here does not concatenate with Image in sample 0") as info:
            make(batch(image, mask))
        assert info.value.sample == 1 and info.value.path == (("b", 0) if items else ("b",))
