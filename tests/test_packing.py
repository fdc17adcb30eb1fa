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


# --- whole items: Concat(items="stack") --------------------------------------------------


def _prompts(counts: list[int], shape: tuple[int, ...] = (3, 14, 14), seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*shape, generator=g) for _ in range(k)] for k in counts]


def _by_hand(prompts: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """What a VLM user writes for whole images: each prompt's images stacked, the stacks concatenated."""
    counts = [len(images) for images in prompts]
    return {
        "images": torch.cat([torch.stack(images) for images in prompts if images]),
        "images_offsets": torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32),
        "images_counts": torch.tensor(counts),
    }


@pytest.mark.parametrize("counts", [[2, 1, 3], [1, 1], [0, 4, 2], [5]], ids=str)
def test_whole_images_stack_to_total_items_as_the_hand_written_collate_does(counts):
    collate = MMCollate(pin_memory=False, fields={"images": Concat(items="stack")})
    for seed in range(3):  # a fresh plan, then the warm one
        prompts = _prompts(counts, seed=seed)
        out = collate([{"images": images, "label": i} for i, images in enumerate(prompts)])
        expected = _by_hand(prompts)
        assert list(out) == ["images", "images_offsets", "images_counts", "label"]  # no item offsets: item i is row i
        for key, value in expected.items():
            assert out[key].dtype == value.dtype and torch.equal(out[key], value), key
        assert out["images"].shape == (sum(counts), 3, 14, 14)
        assert len(storages(out)) == 1


def test_patches_still_concatenate_their_rows_and_whole_images_do_not():
    prompts = _prompts([2, 1, 3])
    samples = [{"images": images} for images in prompts]
    rows = MMCollate(pin_memory=False, fields={"images": Concat()})(samples)
    whole = MMCollate(pin_memory=False, fields={"images": Concat(items="stack")})(samples)
    assert rows["images"].shape == (18, 14, 14)  # each image's 3 channels taken as its rows
    assert torch.equal(rows["images"], torch.cat([image for images in prompts for image in images]))
    assert rows["images_offsets"].tolist() == [0, 6, 9, 18] and rows["images_item_offsets"].tolist()[:3] == [0, 3, 6]
    assert whole["images"].shape == (6, 3, 14, 14) and whole["images_offsets"].tolist() == [0, 2, 3, 6]


def test_whole_images_keep_their_tv_tensor_class_through_the_careful_planner():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    prompts = [[tv_tensors.Image(image) for image in images] for images in _prompts([1, 2])]
    out = MMCollate(pin_memory=False, fields={"images": Concat(items="stack")})([{"images": p} for p in prompts])
    assert type(out["images"]) is tv_tensors.Image and out["images"].shape == (3, 3, 14, 14)
    assert torch.equal(out["images"].as_subclass(torch.Tensor), _by_hand(prompts)["images"].as_subclass(torch.Tensor))


def test_whole_images_of_absent_prompts_are_no_items():
    prompts = _prompts([2, 1])
    samples = [{"images": prompts[0]}, {}, {"images": prompts[1]}]
    out = MMCollate(pin_memory=False, missing="none", fields={"images": Concat(items="stack")})(samples)
    assert out["images"].shape == (3, 3, 14, 14) and out["images_counts"].tolist() == [2, 0, 1]
    assert out["images_offsets"].tolist() == [0, 2, 2, 3]


def test_one_image_per_sample_is_one_item_each():
    images = [torch.full((3, 4, 4), float(i)) for i in range(3)]
    out = MMCollate(pin_memory=False, fields={"image": Concat(items="stack")})([{"image": im} for im in images])
    assert torch.equal(out["image"], torch.stack(images)) and out["image_offsets"].tolist() == [0, 1, 2, 3]


def test_whole_images_of_different_shapes_name_the_sample_and_both_shapes():
    prompts = [_prompts([2])[0], [torch.zeros(3, 14, 14), torch.zeros(3, 16, 14)]]
    collate = MMCollate(pin_memory=False, fields={"images": Concat(items="stack")})
    with pytest.raises(
        CollateError, match=r"needs items of one shape, got \(3, 16, 14\) here and \(3, 14, 14\)"
    ) as info:
        collate([{"images": p} for p in prompts])
    assert info.value.sample == 1 and info.value.path == ("images", 1)


def test_concat_takes_cat_or_stack_items_only():
    with pytest.raises(CollateError, match="must be 'cat' or 'stack', got 'whole'"):
        Concat(items="whole")  # type: ignore[arg-type]
    assert Concat(items="stack") != Concat() and "items='stack'" in repr(Concat(items="stack"))


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
