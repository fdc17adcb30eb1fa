"""Ragged-field policies, key-path patterns, item semantics and mixed modality."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from pincollate import AsList, CollateError, Concat, Jagged, MMCollate, Pad, PerSample, RaggedFieldWarning, Stack
from samples import (
    Point,
    UserTensor,
    assert_identical,
    assert_one_buffer,
    assert_same,
    careful_walk,
    print_ragged_warnings,
    storages,
)


def _ids(*lengths: int) -> list[dict]:
    return [{"ids": torch.arange(1, n + 1)} for n in lengths]


# --- Pad ---------------------------------------------------------------------------------


def test_pad_right_matches_pad_sequence_with_lengths_and_mask():
    samples = _ids(3, 1, 4)
    out = MMCollate(fields={"ids": Pad(value=-1)})(samples)
    expected = pad_sequence([s["ids"] for s in samples], batch_first=True, padding_value=-1)
    assert_same(out["ids"], expected)
    assert out["ids_lengths"].tolist() == [3, 1, 4]
    assert out["ids_mask"].tolist() == [[True] * 3 + [False], [True] + [False] * 3, [True] * 4]
    assert len(storages(out)) == 1


def test_pad_left_and_multiple_of():
    out = MMCollate(fields={"ids": Pad(side="left", multiple_of=4, mask_key="attention_mask")})(_ids(2, 5))
    assert out["ids"].tolist() == [[0] * 6 + [1, 2], [0] * 3 + [1, 2, 3, 4, 5]]
    assert out["attention_mask"].sum(1).tolist() == [2, 5]
    assert out["attention_mask"][0, -2:].all() and not out["attention_mask"][0, :-2].any()


def test_pad_every_ragged_dim_of_images():
    images = [torch.ones(3, 2, 4), torch.ones(3, 5, 3)]
    out = MMCollate(fields={"img": Pad()})([{"img": im} for im in images])
    assert out["img"].shape == (2, 3, 5, 4)
    assert out["img_lengths"].tolist() == [[2, 4], [5, 3]]
    assert out["img_mask"].shape == (2, 5, 4)
    assert out["img"][0].sum().item() == 3 * 2 * 4 and out["img"][1].sum().item() == 3 * 5 * 3


def test_pad_keeps_its_shape_on_a_uniform_batch():
    out = MMCollate(fields={"ids": Pad()})(_ids(3, 3))
    assert out["ids"].shape == (2, 3) and out["ids_mask"].all() and out["ids_lengths"].tolist() == [3, 3]


def test_pad_waveforms_along_time_with_explicit_dims():
    waves = [{"audio": torch.randn(1, n)} for n in (5, 9)]
    out = MMCollate(fields={"audio": Pad(dims=[-1])})(waves)
    assert out["audio"].shape == (2, 1, 9) and out["audio_lengths"].tolist() == [5, 9]
    assert torch.equal(out["audio"][0, :, :5], waves[0]["audio"]) and not out["audio"][0, :, 5:].any()


@pytest.mark.parametrize(
    "policy,pattern",
    [
        (Pad(value=300), r"at \['ids'\]: pad value 300 does not fit dtype torch.uint8"),
        (Pad(value=0.5), r"pad value 0.5 does not fit"),
        (Pad(dims=[5]), r"out of range"),
    ],
)
def test_pad_bad_settings_name_the_key_path(policy, pattern):
    samples = [{"ids": torch.ones(n, dtype=torch.uint8)} for n in (2, 3)]
    with pytest.raises(CollateError, match=pattern):
        MMCollate(fields={"ids": policy})(samples)


def test_pad_rejects_bad_arguments_up_front():
    with pytest.raises(CollateError, match="side"):
        Pad(side="middle")  # type: ignore[arg-type]
    with pytest.raises(CollateError, match="multiple_of"):
        Pad(multiple_of=0)
    with pytest.raises(CollateError, match="must be a number"):
        Pad(value="x")  # type: ignore[arg-type]
    with pytest.raises(CollateError, match="at least one dimension"):
        Pad(dims=[])


# --- Stack and AsList -----------------------------------------------------------------


def test_stack_names_key_path_and_shapes():
    with pytest.raises(
        CollateError,
        match=r"sample 1 at \['ids'\]: Stack\(\) needs equal shapes, got \(1,\) here and \(3,\) in sample 0",
    ):
        MMCollate(fields={"ids": Stack()})(_ids(3, 1))


def test_aslist_is_a_list_even_when_shapes_agree():
    out = MMCollate(fields={"ids": AsList()})(_ids(2, 2))
    assert isinstance(out["ids"], list) and [t.tolist() for t in out["ids"]] == [[1, 2], [1, 2]]


def test_ragged_default_policy_applies_to_unnamed_fields():
    out = MMCollate(ragged=Pad())(_ids(1, 2))
    assert out["ids"].tolist() == [[1, 0], [1, 2]]


# --- item semantics ---------------------------------------------------------------------------


def _abcd():
    return tuple(torch.full((2, 2), float(i)) for i in range(4))


def test_items_stack_when_all_agree():
    a, b, c, d = _abcd()
    out = MMCollate(sequences="items")([{"img": [a, b]}, {"img": [c, d]}])
    assert_same(out["img"], torch.stack([torch.stack([a, b]), torch.stack([c, d])]))
    assert len(storages(out)) == 1


def test_items_fall_back_to_a_list():
    a, b, c, _ = _abcd()
    with pytest.warns(RaggedFieldWarning, match="sample 0's stack to \\(2, 2, 2\\), sample 1's to \\(1, 2, 2\\)"):
        out = MMCollate(sequences="items")([{"img": [a, b]}, {"img": [c]}])
    assert_same(out["img"], [torch.stack([a, b]), c.unsqueeze(0)])


@pytest.mark.parametrize("first, second", [("image", "mask"), ("mask", "image")])
def test_items_of_two_tv_tensor_kinds_in_two_samples_name_the_sample(first, second):
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    kinds = {"image": tv_tensors.Image, "mask": tv_tensors.Mask}
    batch = [{"x": [kinds[first](torch.zeros(1, 2, 2))]}, {"x": [kinds[second](torch.zeros(1, 2, 2))]}]
    names = {"image": "Image", "mask": "Mask"}
    expected = f"{names[second]} items here do not stack with {names[first]} items in sample 0"
    for collate in (MMCollate(pin_memory=False, sequences="items"), careful_walk(sequences="items")):
        with pytest.raises(CollateError, match=expected) as info:
            collate(batch)
        assert info.value.sample == 1 and info.value.path == ("x",)


def test_items_of_a_subclass_beside_plain_items_stack_to_the_subclass_as_torch_stack_does():
    batch = [{"x": [torch.zeros(2)]}, {"x": [torch.ones(2).as_subclass(UserTensor)]}]
    out = MMCollate(pin_memory=False, sequences="items")(batch)
    expected = torch.stack([torch.stack([v["x"][0]]) for v in batch])
    assert type(expected) is UserTensor
    assert_identical(out["x"], expected)


def test_items_deeper_nesting():
    a, b, c, d = _abcd()
    samples = [{"img": [[a, b], [c]]}, {"img": [[d]]}]
    with pytest.warns(RaggedFieldWarning, match=r"\['img'\] holds lists of items"):
        out = MMCollate(sequences="items")(samples)
    assert_same(out["img"], [[torch.stack([a, b]), c.unsqueeze(0)], torch.stack([d.unsqueeze(0)])])
    samples = [{"img": [[a, b], [c, d]]}, {"img": [[d, c], [b, a]]}]
    out = MMCollate(sequences="items")(samples)
    assert out["img"].shape == (2, 2, 2, 2, 2)


def test_items_mode_single_sample_single_item():
    (a, *_) = _abcd()
    out = MMCollate(sequences="items")([{"img": [a]}])
    assert out["img"].shape == (1, 1, 2, 2)


def test_items_of_dicts_collate_by_key():
    samples = [
        {"objs": [{"box": torch.zeros(4), "cls": 1}, {"box": torch.ones(4), "cls": 2}]},
        {"objs": [{"box": torch.ones(4), "cls": 3}]},
    ]
    out = MMCollate(sequences="items")(samples)
    assert isinstance(out["objs"], list)
    assert out["objs"][0]["box"].shape == (2, 4) and out["objs"][0]["cls"].tolist() == [1, 2]
    assert out["objs"][1]["cls"].tolist() == [3]


# --- mixed modality ------------------------------------------------------------------------------


def _mixed():
    return [
        {"ids": torch.arange(3), "pixels": torch.ones(2, 4)},
        {"ids": torch.arange(2)},
        {"ids": torch.arange(4), "pixels": torch.ones(1, 4)},
    ]


def test_missing_key_is_an_error_by_default():
    with pytest.raises(CollateError, match=r"sample 1 at root: keys differ from sample 0: missing keys \['pixels'\]"):
        MMCollate()(_mixed())


def test_missing_none_gives_none_entries_for_aslist():
    out = MMCollate(missing="none", fields={"ids": Pad(), "pixels": AsList()})(_mixed())
    assert out["pixels"][1] is None and out["pixels"][0].shape == (2, 4)


@pytest.mark.parametrize("policy,rows", [(Concat(), 3), (Pad(), 2)])
def test_missing_none_gives_empty_entries_for_concat_and_pad(policy, rows):
    out = MMCollate(missing="none", fields={"pixels": policy, "ids": AsList()})(_mixed())
    if isinstance(policy, Concat):
        assert out["pixels"].shape == (3, 4) and out["pixels_offsets"].tolist() == [0, 2, 2, 3]
    else:
        assert out["pixels"].shape == (3, rows, 4) and out["pixels_lengths"].tolist() == [2, 0, 1]
        assert not out["pixels"][1].any()


@pytest.mark.parametrize(
    "policy, shape, fill",
    [(Pad(), (2, 0), None), (Pad(max_length=3, value=-1), (2, 3), -1.0), (Pad(dims=[0, 1]), (2, 0, 0), None)],
    ids=["pad", "max-length", "two-dims"],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_batch_with_no_value_under_pad_gives_its_empty_result_and_keeps_its_keys(policy, shape, fill, compile):
    # A text-only batch among batches with images: the same keys, rows of nothing (Concat's float32).
    some = [{"pixels": torch.ones(2, 4), "y": 0}, {"pixels": None, "y": 1}]
    none = [{"pixels": None, "y": 0}, {"pixels": None, "y": 1}]
    collate = MMCollate(pin_memory=False, missing="none", compile=compile, fields={"pixels": policy})
    for batch in (none, some, some, some, none):
        out = collate(batch)
        assert sorted(out) == ["pixels", "pixels_lengths", "pixels_mask", "y"]
    assert out["pixels"].shape == shape and out["pixels"].dtype == torch.float32
    assert fill is None or (out["pixels"] == fill).all()
    assert out["pixels_mask"].shape == shape and not out["pixels_mask"].any()
    assert not out["pixels_lengths"].any() and out["pixels_lengths"].shape == ((2,) if len(shape) == 2 else (2, 2))
    assert_one_buffer(out)


@pytest.mark.parametrize("compile", [True, False])
def test_token_lists_that_are_all_empty_pad_to_rows_of_nothing(compile):
    # A last batch whose texts tokenize to nothing: Pad's empty rows, not an error about items.
    collate = MMCollate(pin_memory=False, compile=compile, fields={"ids": Pad(mask_key="mask")})
    for lists in ([[1, 2], [3]], [[], [5]], [[1], [2, 3]], [[], []], [[], []], [[]]):
        out = collate([{"ids": ids} for ids in lists])
        assert sorted(out) == ["ids", "ids_lengths", "mask"]
        assert out["ids_lengths"].tolist() == [len(ids) for ids in lists]
    assert out["ids"].shape == (1, 0) and out["mask"].shape == (1, 0)


def test_missing_none_gives_empty_entries_for_jagged():
    out = MMCollate(missing="none", fields={"pixels": Jagged(), "ids": AsList()})(_mixed())
    assert [t.shape[0] for t in out["pixels"].unbind()] == [2, 0, 1]


# --- through a DataLoader with workers -----------------------------------------------------------


class _VLM(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n_images = 1 + i % 3
        return {
            "input_ids": torch.randint(0, 100, (3 + i,), generator=g),
            "pixel_values": [torch.randn(2 + j, 6, generator=g) for j in range(n_images)],
            "image": [torch.randn(3, 4, 4, generator=g) for _ in range(n_images)],
        }


@pytest.mark.slow
def test_policies_through_dataloader_workers_match_main_process():
    collate = MMCollate(
        sequences="items",
        fields={"input_ids": Pad(mask_key="attention_mask"), "pixel_values": Concat(), "image": AsList()},
    )
    in_workers = list(DataLoader(_VLM(), batch_size=4, collate_fn=collate, num_workers=2, timeout=60))
    in_main = list(DataLoader(_VLM(), batch_size=4, collate_fn=collate, num_workers=0))
    for a, b in zip(in_workers, in_main, strict=True):
        assert_same(a, b)
        assert len(storages(a)) == 1
        assert a["attention_mask"].dtype == torch.bool
        assert a["pixel_values_offsets"][-1].item() == a["pixel_values"].shape[0]


class _Multimodal(torch.utils.data.Dataset):
    """Every ragged feature at once: text-only samples, varying items, PIL, tv_tensors."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image
        from torchvision import tv_tensors

        g = torch.Generator().manual_seed(i)
        sample = {
            "ids": torch.randint(0, 50, (2 + i,), generator=g),
            "audio": torch.randn(1, 10 + 3 * i, generator=g),
            "photo": Image.fromarray(np.full((4 + i % 3, 5, 3), i, dtype=np.uint8)),
            "mask": tv_tensors.Mask(torch.full((4, 4), i, dtype=torch.uint8)),
            "boxes": tv_tensors.BoundingBoxes(torch.rand(i % 4, 4, generator=g) * 8, format="XYXY", canvas_size=(8, 8)),
            "crops": [torch.full((2, 2), float(i + j)) for j in range(1 + i % 2)],
            "nested": [[torch.zeros(3)] * (1 + i % 2), [torch.ones(3)]],
        }
        if i % 3:
            sample["patches"] = [torch.randn(1 + j, 4, generator=g) for j in range(i % 3)]
        return sample


POLICY_SETS = {
    "pad-concat-jagged": {"ids": Jagged(), "audio": Pad(dims=[-1]), "patches": Concat()},
    "stack-aslist": {"mask": Stack(), "ids": AsList(), "audio": AsList(), "patches": AsList()},
    "jagged-items": {"patches": Jagged(), "audio": Pad(dims=[-1])},
}


@pytest.mark.slow
@pytest.mark.parametrize("sequences", ["transpose", "items"])
@pytest.mark.parametrize("name", sorted(POLICY_SETS))
def test_every_policy_and_vision_type_through_workers(name, sequences):
    collate = MMCollate(sequences=sequences, missing="none", fields=POLICY_SETS[name])
    # Fields without a policy (the photos of several sizes, say) are listed, with a warning.
    loader = DataLoader(
        _Multimodal(), batch_size=6, collate_fn=collate, num_workers=2, timeout=60, worker_init_fn=print_ragged_warnings
    )
    in_workers = list(loader)
    with pytest.warns(RaggedFieldWarning) as warned:
        in_main = list(DataLoader(_Multimodal(), batch_size=6, collate_fn=collate, num_workers=0))
    assert len(in_workers) == len(in_main) == 2
    assert "['photo'] holds values of different shapes" in " ".join(str(w.message) for w in warned)
    for a, b in zip(in_workers, in_main, strict=True):
        assert list(a) == list(b)
        for key in a:
            x, y = a[key], b[key]
            if isinstance(y, torch.Tensor) and y.is_nested:
                assert x.is_nested and all(torch.equal(p, q) for p, q in zip(x.unbind(), y.unbind(), strict=True))
            else:
                assert_same(x, y, key)
        assert len(storages(a)) == 1
    first = in_workers[0]
    assert type(first["mask"]).__name__ == "Mask"
    assert [tuple(p.shape) for p in first["photo"]] == [(3, 4 + i % 3, 5) for i in range(6)]
    assert all(type(b).__name__ == "BoundingBoxes" and b.canvas_size == (8, 8) for b in first["boxes"])
    # Samples 0 and 3 have no patches (text only): their entries are empty or None.
    patches = first["patches"]
    if isinstance(patches, list):
        assert patches[0] is None and patches[3] is None and isinstance(patches[1], torch.Tensor)
    elif patches.is_nested:
        assert [t.shape[0] for t in patches.unbind()][:2] == [0, 1]
    else:
        assert first["patches_offsets"].tolist()[:3] == [0, 0, 1]


def test_aslist_and_stack_on_lists_of_items():
    a, b, c, d = _abcd()
    samples = [{"img": [a, b]}, {"img": [c, d]}]
    listed = MMCollate(fields={"img": AsList()})(samples)
    assert isinstance(listed["img"], list) and [tuple(t.shape) for t in listed["img"]] == [(2, 2, 2), (2, 2, 2)]
    stacked = MMCollate(fields={"img": Stack()})(samples)
    assert stacked["img"].shape == (2, 2, 2, 2)
    with pytest.raises(CollateError, match=r"at \['img'\]: Stack\(\) needs every sample's items to stack") as info:
        MMCollate(fields={"img": Stack()})([{"img": [a, b]}, {"img": [c]}])
    assert info.value.sample == 1
    assert "this sample has items that stack to (1, 2, 2), where sample 0 has items that stack to (2, 2, 2)" in str(
        info.value
    )
    with pytest.raises(
        CollateError, match=r"at \['img'\]: Pad\(\) takes tensors; for lists of items use Concat\(\) or Jagged\(\)"
    ):
        MMCollate(fields={"img": Pad()})(samples)


@pytest.mark.parametrize("compiled", [True, False])
def test_stack_on_items_names_the_sample_whose_items_do_not_stack(compiled):
    z = torch.zeros
    collate = MMCollate(fields={"p": Stack()}, compile=compiled)
    collate([{"p": [z(2), z(2)]}, {"p": [z(2), z(2)]}])
    collate([{"p": [z(2), z(2)]}, {"p": [z(2), z(2)]}])  # planned and compiled: the next batch misses the plan
    with pytest.raises(CollateError) as info:
        collate([{"p": [z(2), z(2)]}, {"p": [z(2), z(3)]}])
    assert info.value.sample == 1 and info.value.path == ("p",)
    assert str(info.value) == (
        "sample 1 at ['p']: Stack() needs every sample's items to stack to one shape: "
        "this sample has items of several shapes, where sample 0 has items that stack to (2, 2)"
    )


def test_policy_on_a_mapping_is_an_error_not_ignored():
    with pytest.raises(
        CollateError, match=r"at \['meta'\]: Pad\(\) applies to tensors and lists of items, not to a mapping"
    ):
        MMCollate(fields={"meta": Pad()})([{"meta": {"a": torch.zeros(1)}}] * 2)


def test_missing_list_fields_become_none_items():
    a, b, _, _ = _abcd()
    out = MMCollate(missing="none")([{"img": [a, b]}, {"x": 1}])
    assert out["img"][1] is None and out["img"][0].shape == (2, 2, 2)
    assert out["x"][0] is None and out["x"][1].item() == 1


@pytest.mark.parametrize(
    "make,pattern",
    [
        (lambda: Pad(lengths_key="m", mask_key="m"), "must differ"),
        (lambda: Pad(dims=(0, 0)), "names a dimension twice"),
    ],
)
def test_pad_settings_that_would_lose_outputs_are_refused(make, pattern):
    with pytest.raises(CollateError, match=pattern):
        make()


def test_pad_refuses_negative_and_positive_dims_naming_one_dimension():
    collate = MMCollate(fields={"x": Pad(dims=(0, -2))})
    with pytest.raises(CollateError, match=r"at \['x'\]: Pad\(dims=\(0, -2\)\) names a dimension twice"):
        collate([{"x": torch.zeros(2, 3)}, {"x": torch.zeros(3, 3)}])


def test_pad_value_must_fit_a_floating_dtype():
    collate = MMCollate(fields={"x": Pad(value=1e6)})
    with pytest.raises(CollateError, match=r"at \['x'\]: pad value 1000000.0 does not fit dtype torch.float16"):
        collate([{"x": torch.zeros(2, dtype=torch.float16)}, {"x": torch.zeros(3, dtype=torch.float16)}])


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_pad_value_must_fit_each_part_of_a_complex_dtype_and_a_complex_value_pads_one(compile):
    def ragged(dtype):
        return [{"x": torch.ones(2, dtype=dtype)}, {"x": torch.ones(1, dtype=dtype)}]

    # complex32 is two float16: a value past float16's range would pad inf.
    with pytest.raises(CollateError, match=r"at \['x'\]: pad value 70000.0 does not fit dtype torch.complex32"):
        MMCollate(pin_memory=False, fields={"x": Pad(value=70000.0)}, compile=compile)(ragged(torch.complex32))
    collate = MMCollate(pin_memory=False, fields={"x": Pad(value=2 - 1j)}, compile=compile)
    for dtype in (torch.complex64, torch.complex128, torch.complex32) * 2:  # a warm collate too
        batch = collate(ragged(dtype))
        assert batch["x"].dtype == dtype and batch["x"][1].tolist() == [1, 2 - 1j]
    with pytest.raises(CollateError, match=r"at \['x'\]: pad value \(2-1j\) does not fit dtype torch.float32"):
        collate(ragged(torch.float32))


@pytest.mark.parametrize("name", ["float4_e2m1fn_x2", "bits8", "bits16", "int4", "uint4"])
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_pad_refuses_dtypes_without_a_range_naming_the_field(name, compile):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")
    size = dtype.itemsize
    samples = [
        {"x": torch.zeros(2 * size, dtype=torch.uint8).view(dtype)},
        {"x": torch.zeros(size, dtype=torch.uint8).view(dtype)},
    ]
    expected = rf"at \['x'\]: Pad\(\) does not pad values of dtype torch.{name}; convert them first"
    with pytest.raises(CollateError, match=expected):
        MMCollate(pin_memory=False, fields={"x": Pad()}, compile=compile)(samples)
    listed = MMCollate(pin_memory=False, fields={"x": AsList()}, compile=compile)(samples)  # as the error says
    assert [t.dtype for t in listed["x"]] == [dtype, dtype]


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "float8_e4m3fn"])
@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walked"])
def test_items_of_dtypes_torch_does_not_promote_together_name_the_sample(name, compile):
    # A sample's int items (int64) beside another's uint16 tensor: torch promotes them with nothing.
    dtype = getattr(torch, name)
    batch = [{"v": [1, 2]}, {"v": torch.ones(2).to(dtype)}]
    collate = MMCollate(pin_memory=False, sequences="items", compile=compile)
    expected = rf"{dtype} items here do not stack with torch.int64 items before them: Promotion"
    with pytest.raises(CollateError, match=expected) as info:
        collate(batch)
    assert info.value.sample == 1 and info.value.path == ("v",)


def test_a_policy_on_string_values_is_an_error():
    with pytest.raises(CollateError, match=r"at \['s'\]: Pad\(\) applies to tensors and lists of items, not to str"):
        MMCollate(fields={"s": Pad()})([{"s": "a"}, {"s": "b"}])


def test_ragged_default_applies_to_tensors_not_to_scalar_labels():
    out = MMCollate(ragged=Pad())([{"ids": torch.arange(2), "y": 1}, {"ids": torch.arange(3), "y": 2}])
    assert out["y"].tolist() == [1, 2] and out["ids_lengths"].tolist() == [2, 3]
    uniform = MMCollate(ragged=Pad())([{"ids": torch.arange(2), "y": 1}] * 2)
    assert "ids_mask" in uniform  # the same keys in every batch


def test_lists_of_numbers_under_pad_concat_and_jagged_are_1d_sequences():
    samples = [{"ids": [5, 6, 7]}, {"ids": [8]}]
    padded = MMCollate(fields={"ids": Pad(mask_key="attention_mask")})(samples)
    assert padded["ids"].tolist() == [[5, 6, 7], [8, 0, 0]] and padded["ids"].dtype == torch.int64
    assert padded["attention_mask"].tolist() == [[True, True, True], [True, False, False]]
    packed = MMCollate(fields={"ids": Concat()})(samples)
    assert packed["ids"].tolist() == [5, 6, 7, 8] and packed["ids_offsets"].tolist() == [0, 3, 4]
    jagged = MMCollate(fields={"ids": Jagged()})(samples)["ids"]
    assert [t.tolist() for t in jagged.unbind()] == [[5, 6, 7], [8]]
    floats = MMCollate(fields={"x": Pad()})([{"x": [0.5, 1]}, {"x": [2]}])["x"]
    assert floats.dtype == torch.float32  # what torch.tensor gives a list starting with a float
    assert MMCollate()(samples[:1] * 2)["ids"][0].tolist() == [5, 5]  # no policy: default_collate's transpose


def test_rename_renames_outputs_and_their_extras():
    collate = MMCollate(rename={"label": "labels", "ids": "input_ids"}, fields={"ids": Pad()})
    samples = [{"ids": [1, 2, 3], "label": 0}, {"ids": [4], "label": 1}]
    for _ in range(2):  # planned, then the cached plan
        out = collate(samples)
        assert list(out) == ["input_ids", "input_ids_lengths", "input_ids_mask", "labels"]
        assert out["labels"].tolist() == [0, 1]
    nested = MMCollate(rename={"meta.label": "labels"})([{"meta": {"label": 1}}, {"meta": {"label": 2}}])
    assert nested["meta"]["labels"].tolist() == [1, 2]
    with pytest.warns(UserWarning, match="rename 'lable' matched no key path"):
        MMCollate(rename={"lable": "labels"})(samples[:1] * 2)
    with pytest.raises(CollateError, match="rename maps key paths to new names"):
        MMCollate(rename={"": "x"})


def test_pad_to_a_fixed_max_length_and_truncate():
    fixed = MMCollate(fields={"ids": Pad(max_length=5, mask_key="attention_mask")})
    out = fixed([{"ids": [1, 2, 3]}, {"ids": [4]}])
    assert out["ids"].tolist() == [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0]]
    assert out["attention_mask"].sum(1).tolist() == [3, 1]
    with pytest.raises(CollateError, match=r"sample 1 at \['ids'\]: shape \(7,\) is longer than Pad\(max_length=5\)"):
        fixed([{"ids": [1]}, {"ids": list(range(7))}])
    cut = MMCollate(fields={"ids": Pad(max_length=2, truncate=True)})([{"ids": [1, 2, 3]}, {"ids": [4]}])
    assert cut["ids"].tolist() == [[1, 2], [4, 0]] and cut["ids_lengths"].tolist() == [2, 1]
    images = MMCollate(fields={"x": Pad(max_length=3, truncate=True, dims=(-1,))})(
        [{"x": torch.ones(2, 4)}, {"x": torch.ones(2, 1)}]
    )["x"]
    assert images.shape == (2, 2, 3) and images[1, :, 1:].sum() == 0
    for bad, pattern in (
        (dict(max_length=0), "positive int"),
        (dict(truncate=True), "needs a max_length"),
        (dict(max_length=4, multiple_of=2), "do not go together"),
    ):
        with pytest.raises(CollateError, match=pattern):
            Pad(**bad)


def test_per_sample_keeps_each_samples_subtree_in_the_buffer():
    from pincollate import PerSample

    samples = [
        {"image": torch.zeros(3, 2, 2), "target": {"boxes": torch.rand(i + 1, 4), "labels": [i, i]}} for i in range(3)
    ]
    collate = MMCollate(fields={"target": PerSample()})
    for _ in range(2):
        out = collate(samples)
        assert [t["boxes"].shape[0] for t in out["target"]] == [1, 2, 3]
        for ours, sample in zip(out["target"], samples, strict=True):
            assert torch.equal(ours["boxes"], sample["target"]["boxes"])
            assert [t.item() for t in ours["labels"]] == sample["target"]["labels"]
        assert len(storages(out)) == 1


def test_persample_takes_lists_and_tuples_of_per_item_dicts():
    collate = MMCollate(pin_memory=False, fields={"targets": PerSample()})
    samples = [
        {"targets": [{"box": torch.ones(4), "label": 1}, {"box": torch.zeros(4), "label": 2}]},
        {"targets": ({"box": torch.full((4,), 2.0), "label": 3},)},
    ]
    out = collate(samples)
    assert [len(t) for t in out["targets"]] == [2, 1]
    assert torch.equal(out["targets"][1][0]["box"], torch.full((4,), 2.0))
    assert out["targets"][0][1]["label"] == 2
    assert len(storages(out)) == 1


@pytest.mark.parametrize("values", [["a", "bb"], [b"a", b"b"], [None, None]], ids=["str", "bytes", "none"])
def test_aslist_is_a_per_sample_list_for_every_value_kind(values):
    out = MMCollate(pin_memory=False, fields={"v": AsList()})([{"v": v} for v in values])
    assert out["v"] == values


# --- Pad against a reference written with plain indexing ----------------------------------


def _padded_by_hand(values: list[torch.Tensor], size: int, dim: int, value: float, left: bool) -> torch.Tensor:
    """Each value at the start (or end) of its row along ``dim``, ``value`` elsewhere: Pad's contract."""
    shape = list(values[0].shape)
    shape[dim] = size
    out = torch.full((len(values), *shape), value, dtype=values[0].dtype)
    for i, v in enumerate(values):
        n = v.shape[dim]
        out[i].narrow(dim, size - n if left else 0, n).copy_(v)
    return out


PAD_DTYPES = [torch.float32, torch.int64, torch.bfloat16, torch.float16, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", PAD_DTYPES, ids=str)
@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize(
    "trailing, dims",
    [((), None), ((3,), None), ((2, 3), None), ((4,), [-1]), ((700, 3), None)],
    ids=["1-d", "rows", "2-d rows", "last dim", "large rows"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["walk", "compiled"])
@pytest.mark.parametrize("mask", [True, False], ids=["mask", "no mask"])
def test_pad_gives_what_indexing_by_hand_gives(dtype, left, trailing, dims, compiled, mask):
    """The walk and the compiled plan share Pad's copy kernel: both checked against plain indexing,
    over every copy path (numpy's boolean assignment, an integer view of the bits, one concatenation
    of large rows, row by row), lengths 0 included, over batch after batch of one collate."""
    generator = torch.Generator().manual_seed(0)
    side = "left" if left else "right"
    policy = Pad(value=1, side=side, dims=dims, mask_key="{key}_mask" if mask else None)
    collate = MMCollate(pin_memory=False, fields={"x": policy}, compile=compiled)
    for lengths in ([3, 0, 5, 1], [2, 6, 6, 4], [1, 1, 1, 1], [7, 2, 0, 3]):
        if dims is None:
            values = [torch.randn(n, *trailing, generator=generator).to(dtype) for n in lengths]
            dim = 0
        else:
            values = [torch.randn(*trailing[:-1], 3, n, generator=generator).to(dtype) for n in lengths]
            dim = values[0].dim() - 1
        out = collate([{"x": v} for v in values])
        size = max(lengths) if dims is None or max(lengths) else 0
        expected = _padded_by_hand(values, size, dim, 1, left)
        assert out["x"].dtype == dtype and torch.equal(out["x"].view(expected.shape), expected)
        assert out["x"].shape == expected.shape
        assert out["x_lengths"].tolist() == lengths
        valid = _padded_by_hand([torch.ones(n, dtype=torch.bool) for n in lengths], size, 0, False, left)
        assert torch.equal(out["x_mask"], valid) if mask else "x_mask" not in out


MASK_CASES = {
    # name: (policy keywords, the values' shapes per batch); each batch differs from the one before.
    "1-d": ({}, [[(3,), (0,), (5,)], [(2,), (6,), (6,)], [(1,), (1,), (1,)]]),
    "rows": ({}, [[(3, 2), (1, 2), (4, 2)], [(5, 2), (2, 2), (2, 2)]]),
    "two dims": ({"dims": [0, 1]}, [[(3, 2), (1, 4), (2, 2)], [(1, 1), (2, 3), (3, 1)]]),
    "max length": ({"max_length": 4, "truncate": True}, [[(6,), (2,), (4,)], [(1,), (9,), (3,)]]),
    "large rows": ({}, [[(300, 200), (100, 200), (250, 200)], [(50, 200), (300, 200), (10, 200)]]),
}


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.uint8, torch.float32], ids=str)
@pytest.mark.parametrize("case", list(MASK_CASES))
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("compile", [False, True], ids=["walk", "compiled"])
def test_a_mask_of_another_dtype_holds_one_and_zero_where_the_bool_mask_holds_true_and_false(
    mask_dtype, case, side, compile
):
    """``Pad(mask_dtype=...)``: the bool mask's places, as 1 and 0; the values and lengths as with a bool mask."""
    keywords, batches = MASK_CASES[case]
    generator = torch.Generator().manual_seed(1)
    collate = MMCollate(
        pin_memory=False, compile=compile, fields={"x": Pad(side=side, mask_dtype=mask_dtype, **keywords)}
    )
    reference = MMCollate(pin_memory=False, compile=False, fields={"x": Pad(side=side, **keywords)})
    for shapes in [*batches, *batches]:  # walked, planned, compiled: every batch through each
        samples = [{"x": torch.randn(*shape, generator=generator)} for shape in shapes]
        out, expected = collate(samples), reference(samples)
        assert out["x_mask"].dtype == mask_dtype and out["x_mask"].shape == expected["x_mask"].shape
        assert torch.equal(out["x_mask"], expected["x_mask"].to(mask_dtype))
        assert torch.equal(out["x"], expected["x"]) and torch.equal(out["x_lengths"], expected["x_lengths"])
        assert_one_buffer(out)


@pytest.mark.parametrize("compile", [False, True], ids=["walk", "compiled"])
def test_an_integer_mask_crosses_from_workers_and_saves_as_it_was_made(compile, tmp_path):
    samples = [{"ids": torch.arange(1, n + 1)} for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    collate = MMCollate(compile=compile, fields={"ids": Pad(mask_key="attention_mask", mask_dtype=torch.int64)})
    loader = DataLoader(samples, batch_size=4, num_workers=2, collate_fn=collate)
    for i, batch in enumerate(loader):
        lengths = torch.tensor([n for n in (3, 1, 4, 1, 5, 9, 2, 6)][4 * i : 4 * i + 4])
        expected = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
        assert batch["attention_mask"].dtype == torch.int64 and torch.equal(batch["attention_mask"], expected)
        torch.save(batch, tmp_path / "b.pt")
        assert torch.equal(torch.load(tmp_path / "b.pt", weights_only=False)["attention_mask"], expected)


@pytest.mark.parametrize("compile", [False, True], ids=["walk", "compiled"])
def test_a_batch_with_no_value_gives_an_all_zero_mask_of_the_asked_dtype(compile):
    collate = MMCollate(pin_memory=False, missing="none", compile=compile, fields={"x": Pad(mask_dtype=torch.int64)})
    some = [{"x": torch.ones(2)}, {"x": None}]
    for batch in ([{"x": None}, {"x": None}], some, some, [{"x": None}, {"x": None}]):
        mask = collate(batch)["x_mask"]
        assert mask.dtype == torch.int64
    assert mask.shape == (2, 0)
    assert collate(some)["x_mask"].tolist() == [[1, 1], [0, 0]]


@pytest.mark.parametrize(
    "mask_dtype", [torch.bfloat16, torch.complex64, torch.uint16, "int64", None, [torch.int64]], ids=str
)
def test_a_mask_dtype_numpy_cannot_write_is_refused_when_the_policy_is_made(mask_dtype):
    with pytest.raises(CollateError) as refused:
        Pad(mask_dtype=mask_dtype)
    assert str(refused.value) == (
        "Pad(mask_dtype=...) must be one of torch.bool, torch.float16, torch.float32, torch.float64, torch.int16, "
        f"torch.int32, torch.int64, torch.int8, torch.uint8, got {mask_dtype!r}"
    )


@pytest.mark.parametrize(
    "values",
    [
        [torch.zeros(0, dtype=torch.bfloat16), torch.tensor([1, 2, 3], dtype=torch.int16)],
        [torch.zeros(0, dtype=torch.bfloat16), torch.tensor([1, 2, 3])],
        [torch.zeros(0), torch.tensor([1, 2, 3], dtype=torch.bfloat16)],
        [torch.tensor([1.5], dtype=torch.float16), torch.tensor([1, 2, 3], dtype=torch.int32)],
    ],
    ids=["bf16 empty, int16", "bf16 empty, int64", "f32 empty, bf16", "f16, int32"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["walk", "compiled"])
def test_pad_of_values_of_several_dtypes_casts_each_as_indexing_by_hand_does(values, compiled):
    """The field's dtype is the values' promoted one; each value is cast into it (an empty one too decides it)."""
    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, compile=compiled)
    dtype = torch.promote_types(values[0].dtype, values[1].dtype)
    expected = _padded_by_hand([v.to(dtype) for v in values], 3, 0, 0, False)
    for _ in range(2):
        out = collate([{"x": v} for v in values])
        assert out["x"].dtype == dtype and torch.equal(out["x"], expected)


@pytest.mark.parametrize("compiled", [False, True], ids=["walk", "compiled"])
def test_a_negative_zero_pad_value_keeps_its_sign_whatever_padded_before(compiled):
    batch = [{"x": torch.ones(70000)}, {"x": torch.ones(60000)}]  # past SCATTER_BYTES: the large-row path
    for value in (0.0, -0.0, 0.0):
        collate = MMCollate(pin_memory=False, fields={"x": Pad(value=value)}, compile=compiled)
        for _ in range(2):
            padding = collate(batch)["x"][1, 60000:]
            assert torch.equal(
                torch.signbit(padding), torch.full_like(padding, math.copysign(1, value) < 0, dtype=torch.bool)
            )


@pytest.mark.parametrize("compiled", [False, True], ids=["walk", "compiled"])
def test_an_absent_value_under_pad_has_length_zero_along_the_padded_dimension(compiled):
    """missing='none': an absent value is all padding, whichever dimension the present values differ in."""
    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, missing="none", compile=compiled)
    collate([{"x": torch.zeros(0, 4)}, {"x": torch.zeros(0, 2)}, {"x": None}])
    for batch, lengths in (
        ([{"x": torch.zeros(0, 1)}, {}, {"x": torch.zeros(0, 0)}], [1, 0, 0]),
        ([{"x": torch.ones(2, 3)}, {}, {"x": torch.ones(2, 1)}], [3, 0, 1]),
        ([{"x": torch.ones(2, 3)}, {"x": None}, {"x": torch.ones(1, 3)}], [2, 0, 1]),
    ):
        out = collate(batch)
        assert out["x_lengths"].tolist() == lengths
        assert out["x_mask"].sum(1).tolist() == lengths


# --- per-sample lists of tensors: one region, in the walk as in the compiled plan ------------------


def _counted(monkeypatch, cls: type, name: str) -> list:
    """The objects whose method ``name`` of ``cls`` runs from now on, in order (the method still runs)."""
    calls = []
    method = getattr(cls, name)

    def counted(self, *args, **kwargs):
        calls.append(self)
        return method(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return calls


def _counted_function(monkeypatch, owner: object, name: str) -> list:
    """The arguments of each call of ``owner.name`` from now on (it still runs)."""
    calls = []
    function = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def _listed_samples():
    from torchvision import tv_tensors

    grad = torch.arange(6.0).reshape(2, 3).requires_grad_()
    rows = [torch.arange(12.0).reshape(4, 3), torch.zeros(0, 3), torch.arange(6.0).reshape(3, 2).t(), grad]
    flat = [torch.ones(2, 3, dtype=torch.int16), torch.full((3, 2), 7, dtype=torch.int16)]
    flat += [torch.zeros(0, 4, dtype=torch.int16), torch.arange(5, dtype=torch.int16).reshape(1, 5)]
    boxes = [
        tv_tensors.BoundingBoxes(torch.rand(n, 4) * 8, format="XYXY", canvas_size=(8 + n, 9)) for n in (2, 0, 3, 1)
    ]
    half = [torch.arange(n, dtype=torch.bfloat16) for n in (3, 1, 5, 2)]
    return [
        {"rows": rows[i], "flat": flat[i], "boxes": boxes[i], "half": half[i], "maybe": None if i == 1 else rows[i]}
        for i in range(4)
    ]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_per_sample_list_of_tensors_lies_in_one_region_its_values_kept(compiled):
    # The walk (compile=False, and every new structure's first batch) lists a column of the
    # batch's tensors as the compiled plan does: one region, a view per value, each value its own.
    samples = _listed_samples()
    fields = {key: AsList() for key in ("rows", "flat", "boxes", "half", "maybe")}
    collate = MMCollate(pin_memory=False, compile=compiled, missing="none", fields=fields)
    for _ in range(3):  # the first batch walked, then (compiled) planned and run warm
        out = collate(samples)
        for key in fields:
            listed = out[key]
            assert isinstance(listed, list) and len(listed) == len(samples)
            for item, sample in zip(listed, samples, strict=True):
                value = sample[key]
                if value is None:
                    assert item is None
                    continue
                assert type(item) is type(value) and item.dtype == value.dtype and torch.equal(item, value.detach())
                assert not item.requires_grad
                if key == "boxes":
                    assert item.canvas_size == value.canvas_size and item.format == value.format
            present = [item for item in listed if item is not None and item.numel()]
            assert len({item.untyped_storage().data_ptr() for item in present}) == 1, key
        others = [out[key][0] for key in ("rows", "flat", "half")]
        assert len({t.untyped_storage().data_ptr() for t in others}) == 3  # a field's list: a storage of its own
        first = out["rows"][0]
        first.add_(1)  # one value changed in place: no other value, no sample
        assert all(item._version == 0 for item in out["rows"][1:] if item.numel())
        assert torch.equal(samples[0]["rows"], torch.arange(12.0).reshape(4, 3))


def test_the_walk_lists_a_column_with_the_compiled_plans_own_copy(monkeypatch):
    # One size rule and one copy for per-sample lists: the walk runs ListRecipe.sized.
    from pincollate._plan.listed import ListRecipe

    calls = _counted(monkeypatch, ListRecipe, "sized")
    samples = [{"rows": sample["rows"]} for sample in _listed_samples()]
    out = MMCollate(pin_memory=False, compile=False, fields={"rows": AsList()})(samples)
    assert len(calls) == 1 and [t.shape for t in out["rows"]] == [(4, 3), (0, 3), (2, 3), (2, 3)]


@pytest.mark.walk_first
def test_the_walk_and_the_planned_recipe_pad_by_one_size_rule(monkeypatch):
    # One size rule for Pad: the walk (a first batch, or a batch its recipe does not describe) and
    # the recipe planned for later batches both ask Pad.measure for the dims and padded sizes.
    from pincollate._plan.cache import _nodes
    from pincollate._plan.policies import Unpadded
    from pincollate._plan.ragged import PadRecipe

    calls = _counted(monkeypatch, Pad, "measure")
    policy = Pad(multiple_of=4)
    collate = MMCollate(pin_memory=False, fields={"x": policy})
    samples = [{"x": torch.ones(2, 3), "i": 0}, {"x": torch.ones(5, 3), "i": 1}]
    first = collate(samples)  # walked
    assert calls == [policy] and first["x"].shape == (2, 8, 3)
    collate(samples)  # planned: the recipe's guard and sizes
    recipe = next(op.recipe for op in _nodes(collate._plans.last.op) if type(getattr(op, "recipe", None)) is PadRecipe)
    calls.clear()
    assert recipe.measure([torch.Size((2, 3)), torch.Size((7, 3))]) == ([2, 7], 0, (8, 3), False)
    assert calls == [policy]
    assert recipe.measure([torch.Size((2, 3)), torch.Size((2, 5))]) == ([3, 5], 1, (2, 8), False)
    # Two padded dimensions (a mask over both): the walk's, not the recipe's.
    assert recipe.measure([torch.Size((2, 3)), torch.Size((3, 4))]) is None
    assert Pad().measure([(2, 3), (2, 4)]) == ((1,), [2, 4], [])
    with pytest.raises(Unpadded, match=r"does not pad dim 1") as refused:
        Pad(dims=[0]).measure([(2, 5), (1, 4), (2, 5)])
    assert refused.value.index == 1
    assert Pad(max_length=3, truncate=True).measure([(2,), (5,), (4,)]) == ((0,), [3], [1, 2])


@pytest.mark.parametrize("compiled", [False, True])
def test_aslist_names_a_tensor_after_a_none_as_no_policy_does(compiled):
    # missing="error": a None is a value, not an absent one. A tensor (or array) after it was handed
    # back as the sample's own object (an array unconverted); it is named, as without a policy,
    # whichever comes first.
    import numpy as np

    tensor, array = torch.tensor([1, 2]), np.array([1.0, 2.0])
    for value in (tensor, array):
        for samples in ([{"x": None}, {"x": value}], [{"x": value}, {"x": None}]):
            for fields in ({}, {"x": AsList()}):
                collate = MMCollate(pin_memory=False, compile=compiled, fields=fields)
                for warm in ([{"x": None}] * 2, [{"x": value}] * 2):  # planned (and compiled) first
                    for _ in range(2):
                        collate(warm)
                with pytest.raises(CollateError, match=r"sample 1 at \['x'\]: expected .*pass missing='none'"):
                    collate([dict(sample) for sample in samples])
    # With missing="none" the None is absent: the tensor is copied into the batch, the array converted.
    out = MMCollate(pin_memory=False, compile=compiled, missing="none", fields={"x": AsList()})(
        [{"x": None}, {"x": tensor}, {"x": None}]
    )
    assert out["x"][0] is None and out["x"][1] is not tensor and torch.equal(out["x"][1], tensor)
    # A column of None alone, or of strings, stays the batch's own list.
    assert MMCollate(pin_memory=False, compile=compiled, fields={"x": AsList()})([{"x": None}] * 2)["x"] == [None, None]


def test_the_walk_stacks_plain_tensors_that_agree_from_one_description(monkeypatch):
    # A column of plain tensors of one dtype and shape, without a policy, is stacked from the one
    # description read at C speed: no column of per-value descriptions is built for it (a ragged
    # or mixed column still is, and names what it refuses).
    from pincollate._plan.column import Column

    built = _counted(monkeypatch, Column, "__init__")
    samples = [
        {"a": torch.full((2, 3), float(i)), "b": {"c": torch.arange(4) + i}, "d": torch.tensor(i)} for i in range(4)
    ]
    out = MMCollate(pin_memory=False, compile=False)(samples)
    assert built == []
    assert torch.equal(out["a"], torch.stack([s["a"] for s in samples])) and out["d"].tolist() == [0, 1, 2, 3]
    assert torch.equal(out["b"]["c"], torch.stack([s["b"]["c"] for s in samples]))
    with pytest.warns(RaggedFieldWarning):
        MMCollate(pin_memory=False, compile=False)([{"a": torch.zeros(2)}, {"a": torch.zeros(3)}])
    assert len(built) == 1  # the ragged column: described value by value, then listed
    with pytest.raises(CollateError, match=r"sample 1 at \['a'\]"):
        MMCollate(pin_memory=False, compile=False)([{"a": torch.zeros(2)}, {"a": "x"}])


def test_read_only_arrays_are_named_in_the_walks_errors_as_writable_ones():
    import numpy as np

    def make(read_only: bool) -> list[dict]:
        out = []
        for n in (3, 1, 5):
            array = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
            array.flags.writeable = not read_only
            out.append({"x": array})
        return out

    for policy, text in (
        (Stack(), r"got \(1, 2\) here and \(3, 2\) in sample 0"),
        (Pad(max_length=4), r"shape \(5, 2\) is longer"),
    ):
        for read_only in (False, True):
            with pytest.raises(CollateError, match=text):
                MMCollate(pin_memory=False, compile=False, fields={"x": policy})(make(read_only))


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("policy", [None, AsList(), Pad(), Concat(), Stack()])
def test_the_walk_takes_numpy_arrays_of_one_dtype_as_tensors(policy, read_only, monkeypatch):
    # Arrays of one dtype torch takes are described and copied as tensors (over their own memory;
    # read-only ones, an object store's rows, copied once), as the compiled plan takes them: not
    # array by array. The batch is what default_collate (or the policy) makes of them.
    import numpy as np

    from pincollate._types.leaves import lookup

    described = _counted_function(monkeypatch, lookup(np.ndarray), "describe")
    lengths = [3, 3, 3] if policy is None or type(policy) is Stack else [3, 1, 2]
    arrays = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) + i for i, n in enumerate(lengths)]
    for array in arrays:
        array.flags.writeable = not read_only
    samples = [{"x": array, "i": i} for i, array in enumerate(arrays)]
    fields = {} if policy is None else {"x": policy}
    out = MMCollate(pin_memory=False, compile=False, fields=fields)(samples)
    assert described == []
    tensors = [torch.from_numpy(array.copy()) for array in arrays]
    if policy is None or type(policy) is Stack:
        assert_same(out["x"], torch.stack(tensors))
    elif type(policy) is AsList:
        assert_same(out["x"], tensors)
    elif type(policy) is Pad:
        assert_same(out["x"], pad_sequence(tensors, batch_first=True))
        assert out["x_lengths"].tolist() == lengths
    else:
        assert_same(out["x"], torch.cat(tensors))
        assert out["x_offsets"].tolist() == [0, 3, 4, 6]
    for tensor in out["x"] if isinstance(out["x"], list) else [out["x"]]:
        tensor.add_(100)  # the batch's own memory: the arrays stay as they were
    assert all(
        np.array_equal(array, np.arange(n * 2, dtype=np.float32).reshape(n, 2) + i)
        for i, (array, n) in enumerate(zip(arrays, lengths, strict=True))
    )


@pytest.mark.walk_first
@pytest.mark.parametrize("compiled", [False, True])
def test_persample_subtrees_lie_in_one_region_per_place_in_the_walk_as_in_the_compiled_plan(compiled, monkeypatch):
    # Detection targets, a mapping per image: the walk places each key's column as the compiled plan
    # does (the boxes of every image in one region), and a later batch's plan gives the same batch.
    from pincollate._plan.rows import Rows

    calls = _counted(monkeypatch, Rows, "place")

    def target(i):
        return {"boxes": torch.arange(4.0 * i).reshape(i, 4), "labels": torch.arange(i), "id": i, "name": f"img{i}"}

    samples = [{"image": torch.full((3, 4, 4), float(i)), "target": target(i)} for i in (2, 0, 3, 1)]
    collate = MMCollate(pin_memory=False, compile=compiled, fields={"target": PerSample()})
    first = collate(samples)
    assert len(calls) == 1  # the first batch (walked): the compiled plan's rows
    for out in (first, collate(samples), collate(samples)):
        assert_identical(out, first)
        targets = out["target"]
        for got, sample in zip(targets, samples, strict=True):
            expected = sample["target"]
            assert type(got) is dict and list(got) == list(expected)
            assert torch.equal(got["boxes"], expected["boxes"]) and torch.equal(got["labels"], expected["labels"])
            assert got["id"].shape == () and got["id"].item() == expected["id"] and got["name"] == expected["name"]
        boxes = [t["boxes"] for t in targets if t["boxes"].numel()]
        assert len({b.untyped_storage().data_ptr() for b in boxes}) == 1


@pytest.mark.parametrize("compiled", [False, True])
def test_items_that_do_not_stack_lie_in_one_region_in_the_walk_as_in_the_compiled_plan(compiled, monkeypatch):
    # Several images per prompt: each sample's images stacked where they agree, listed where they
    # do not, all in one region, by the compiled plan's own placement (the walk runs it too).
    from pincollate._plan.listed import ItemsRecipe

    calls = _counted(monkeypatch, ItemsRecipe, "placed")
    a, b, c, d = (torch.full((2, 3), float(i)) for i in range(4))
    wide = torch.arange(8.0).reshape(2, 4)
    samples = [{"img": [a, b]}, {"img": []}, {"img": [c]}, {"img": [d, wide]}]
    collate = MMCollate(pin_memory=False, compile=compiled, sequences="items")
    with pytest.warns(RaggedFieldWarning):
        out = collate(samples)
    if not compiled:
        assert len(calls) == 1  # the walk placed them with the compiled plan's rule
    for again in (out, collate(samples), collate(samples)):
        got = again["img"]
        assert got[1] == [] and isinstance(got[3], list)
        assert_same(got[0], torch.stack([a, b]))
        assert_same(got[2], c.unsqueeze(0))
        assert_same(got[3], [d, wide])
        assert len({t.untyped_storage().data_ptr() for t in (got[0], got[2], *got[3])}) == 1


def test_the_walk_lists_a_column_of_plain_tensors_from_its_one_description(monkeypatch):
    # AsList() of plain tensors, walked: the column read once at C speed gives the list's dtype and
    # rank; it is not described a second time to be listed (nor concatenated by Concat()).
    from pincollate._plan import recipe

    def described_again(values):
        raise AssertionError("a column of plain tensors described again")

    monkeypatch.setattr(recipe, "describe_tensors", described_again)
    samples = [{"x": torch.arange(n * 2.0).view(n, 2), "i": n} for n in (3, 1, 0, 2)]
    for policy in (AsList(), Concat()):
        batch = MMCollate(pin_memory=False, fields={"x": policy}, compile=False)(samples)
        if type(policy) is AsList:
            assert [value.tolist() for value in batch["x"]] == [sample["x"].tolist() for sample in samples]
        else:
            assert batch["x"].tolist() == torch.cat([sample["x"] for sample in samples]).tolist()


@pytest.mark.parametrize("side", ["right", "left"])
def test_many_short_rows_past_scatter_bytes_are_padded_by_one_masked_assignment(side, monkeypatch):
    # 256 token rows of at most ~4 KiB (a large batch of text, 1 MB in all): the masked assignment,
    # twice as fast here as one torch.cat of 512 pieces (a value and its padding per row), gives the
    # same padded rows; long rows keep the cat.
    from pincollate._plan import padding

    generator = torch.Generator().manual_seed(0)
    values = [
        torch.randint(0, 1000, (int(n),), generator=generator)
        for n in torch.randint(1, 512, (256,), generator=generator)
    ]
    lengths = [v.shape[0] for v in values]
    size = max(lengths)
    region = torch.empty(256, size, dtype=torch.int64)
    assert region.numel() * 8 > padding.SCATTER_BYTES
    monkeypatch.setattr(padding, "_pad_values", lambda *args: pytest.fail("the one-cat path for short rows"))
    padding.pad_1d(region, values, lengths, 0, 7, side == "left", None)
    for row, value in zip(region, values, strict=True):
        gap = torch.full((size - value.shape[0],), 7)
        assert torch.equal(row, torch.cat([gap, value]) if side == "left" else torch.cat([value, gap]))


@pytest.mark.parametrize(
    "policy, odd, says",
    [
        (Pad(), "oops", "expected a list of numbers (token ids), as sample 0 has, got str"),
        (Stack(), None, "Stack() applies to tensors and lists of items, not to None values"),
        (AsList(), Point(1, 2), "AsList() applies to tensors and lists of items, not to a namedtuple"),
    ],
    ids=["pad-str", "stack-none", "aslist-namedtuple"],
)
@pytest.mark.parametrize("compile", [True, False])
def test_a_value_a_policy_does_not_take_among_lists_is_named_with_its_sample(policy, odd, says, compile):
    samples = [{"v": [1, 2]}, {"v": [3]}, {"v": odd}]
    with pytest.raises(CollateError, match=re.escape(says)) as info:
        MMCollate(pin_memory=False, compile=compile, fields={"v": policy})(samples)
    assert (info.value.sample, info.value.path) == (2, ("v",))


# --- found by a differential round against the docs ---------------------------------------


@pytest.mark.parametrize("compiled", [True, False])
def test_stack_refuses_a_batch_whose_every_value_is_missing_as_it_refuses_one(compiled):
    collate = MMCollate(pin_memory=False, missing="none", fields={"x": Stack()}, compile=compiled)
    for _ in range(2):  # planned (and compiled) on present values first
        collate([{"x": torch.ones(2), "l": 1}, {"x": torch.zeros(2), "l": 2}])
    for batch in ([{"x": None, "l": 1}, {"l": 2}], [{"x": None, "l": 1}]):
        with pytest.raises(CollateError, match=r"sample 0 at \['x'\]: Stack\(\) got a missing value"):
            collate(batch)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("policy", [Pad(), Concat(), Jagged()], ids=["pad", "concat", "jagged"])
def test_a_token_list_past_int64_is_named_by_its_sample(policy, compiled):
    collate = MMCollate(pin_memory=False, fields={"x": policy}, compile=compiled)
    with pytest.raises(CollateError) as info:
        collate([{"x": [1, 2]}, {"x": [3, 2**70]}, {"x": [4]}])
    assert info.value.sample == 1
    assert str(info.value).endswith(f"these numbers do not fit one tensor: int {2**70} does not fit int64")


@pytest.mark.parametrize("other", [torch.tensor([3]), np.array([3]), 5], ids=["tensor", "array", "int"])
def test_pad_on_token_ids_names_the_sample_that_holds_no_list(other):
    with pytest.raises(CollateError) as info:
        MMCollate(pin_memory=False, fields={"x": Pad()})([{"x": [1, 2]}, {"x": other}])
    assert info.value.sample == 1
    assert f"expected a list of numbers (token ids), as sample 0 has, got {type(other).__name__}" in str(info.value)
