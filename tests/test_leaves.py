"""The leaf registry: lookup order, PIL images, torchvision tv_tensors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from pincollate import CollateError, MMCollate, RaggedFieldWarning, Stack, mm_collate
from pincollate._types.leaves import LeafHandler, lookup
from pincollate._types.leaves import register_leaf as register
from samples import storages

Image = pytest.importorskip("PIL.Image")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
pil_to_tensor = pytest.importorskip("torchvision.transforms.functional").pil_to_tensor


def _image(mode: str, size=(5, 3), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (size[1], size[0]), dtype=np.uint16))
    return base.convert(mode)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "I;16", "I", "F", "P", "1", "LA", "CMYK"])
def test_pil_images_match_pil_to_tensor(mode):
    images = [_image(mode, seed=i) for i in range(3)]
    out = mm_collate(images)
    expected = torch.stack([pil_to_tensor(im) for im in images])
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.equal(out, expected)


def test_pil_images_of_different_sizes_come_back_as_a_list():
    images = [_image("RGB", (4, 4)), _image("RGB", (6, 2))]
    with pytest.warns(RaggedFieldWarning, match=r"\(3, 4, 4\) in sample 0 and \(3, 2, 6\) in sample 1"):
        out = MMCollate()([{"im": im} for im in images])
    assert [tuple(t.shape) for t in out["im"]] == [(3, 4, 4), (3, 2, 6)]
    assert all(torch.equal(a, pil_to_tensor(b)) for a, b in zip(out["im"], images, strict=True))
    assert len(storages(out)) == 1


def test_pil_image_beside_another_type_is_reported():
    image = Image.new("RGB", (2, 2))
    with pytest.raises(CollateError, match=r"sample 1 at \['im'\]: expected PIL.Image, got str"):
        mm_collate([{"im": image}, {"im": "x"}])


@pytest.mark.parametrize(
    "make",
    [
        lambda i: tv_tensors.Image(torch.full((3, 4, 4), i, dtype=torch.uint8)),
        lambda i: tv_tensors.Video(torch.full((2, 3, 4, 4), i, dtype=torch.uint8)),
        lambda i: tv_tensors.Mask(torch.full((4, 4), i, dtype=torch.uint8)),
    ],
    ids=["Image", "Video", "Mask"],
)
def test_tv_tensors_keep_their_subclass(make):
    values = [make(i) for i in range(3)]
    out = mm_collate(values)
    assert type(out) is type(values[0])
    assert torch.equal(out.as_subclass(torch.Tensor), torch.stack([v.as_subclass(torch.Tensor) for v in values]))


def test_bounding_boxes_with_different_counts_keep_format_and_canvas():
    boxes = [tv_tensors.BoundingBoxes(torch.rand(n, 4) * 10, format="XYXY", canvas_size=(10, 12)) for n in (1, 3, 0)]
    out = mm_collate([{"boxes": b} for b in boxes])
    assert isinstance(out["boxes"], list) and len(out["boxes"]) == 3
    for got, want in zip(out["boxes"], boxes, strict=True):
        assert type(got) is tv_tensors.BoundingBoxes
        assert got.format == want.format and got.canvas_size == want.canvas_size
        assert torch.equal(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
    assert len(storages(out)) == 1


def test_bounding_boxes_stay_per_image_even_when_counts_agree():
    boxes = [tv_tensors.BoundingBoxes(torch.full((2, 4), float(s)), format="XYWH", canvas_size=(8, s)) for s in (8, 9)]
    listed = mm_collate(boxes)
    assert isinstance(listed, list) and [b.canvas_size for b in listed] == [(8, 8), (8, 9)]
    assert all(type(b) is tv_tensors.BoundingBoxes and b.shape == (2, 4) for b in listed)
    assert [b[0, 0].item() for b in listed] == [8.0, 9.0]


@pytest.mark.skipif(not hasattr(tv_tensors, "KeyPoints"), reason="this torchvision has no KeyPoints")
def test_key_points_stay_per_image_with_their_canvas_size():
    points = [tv_tensors.KeyPoints(torch.full((n, 2), float(n)), canvas_size=(6, 4 + n)) for n in (2, 2, 3)]
    for _ in range(2):  # fresh, then warm
        out = mm_collate([{"points": p} for p in points])
        assert isinstance(out["points"], list)
        for got, want in zip(out["points"], points, strict=True):
            assert type(got) is tv_tensors.KeyPoints and got.canvas_size == want.canvas_size
            assert torch.equal(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
        again = pickle.loads(pickle.dumps(out))
        assert [p.canvas_size for p in again["points"]] == [(6, 6), (6, 6), (6, 7)]


def test_lookup_prefers_the_nearest_registered_base():
    class MyImage(tv_tensors.Image):
        pass

    assert lookup(MyImage) is lookup(tv_tensors.Image)
    assert lookup(bool).name == "bool" and lookup(int).name == "int"
    assert lookup(np.float16).name == "numpy scalar"
    assert lookup(object) is None


def test_register_validates_its_arguments():
    with pytest.raises(TypeError, match="LeafHandler"):
        register(complex, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="type or a tuple of types"):
        register("str", LeafHandler("x", "x", None, None))  # type: ignore[arg-type]


def test_bounding_boxes_through_policies():
    from pincollate import AsList, Concat, Jagged, MMCollate, Pad

    def boxes(canvas):
        return [
            {"b": tv_tensors.BoundingBoxes(torch.rand(n, 4) * 8, format="XYXY", canvas_size=canvas)} for n in (1, 3)
        ]

    same = boxes((8, 8))
    concat = MMCollate(fields={"b": Concat()})(same)
    assert type(concat["b"]) is tv_tensors.BoundingBoxes and concat["b"].shape == (4, 4)
    assert concat["b"].format == tv_tensors.BoundingBoxFormat.XYXY and concat["b"].canvas_size == (8, 8)
    assert concat["b_offsets"].tolist() == [0, 1, 4]
    listed = MMCollate(fields={"b": AsList()})(same)
    assert all(type(b) is tv_tensors.BoundingBoxes and b.canvas_size == (8, 8) for b in listed["b"])
    jagged = MMCollate(fields={"b": Jagged()})(same)
    assert [t.shape for t in jagged["b"].unbind()] == [(1, 4), (3, 4)]
    padded = MMCollate(fields={"b": Pad()})(same)
    assert type(padded["b"]) is torch.Tensor and padded["b"].shape == (2, 3, 4)  # boxes are 2-D in torchvision
    mixed = [same[0], {"b": tv_tensors.BoundingBoxes(torch.zeros(2, 4), format="XYXY", canvas_size=(9, 9))}]
    assert type(MMCollate(fields={"b": Concat()})(mixed)["b"]) is torch.Tensor  # no one canvas to keep


def test_a_column_mixing_an_image_and_plain_tensors_stacks_to_a_plain_tensor():
    image, plain = tv_tensors.Image(torch.zeros(3, 2, 2)), torch.ones(3, 2, 2)
    for values in ([image, plain], [plain, image]):
        out = mm_collate(values)
        assert type(out) is torch.Tensor and torch.equal(
            out, torch.stack([v.as_subclass(torch.Tensor) for v in values])
        )


def test_stack_on_boxes_says_why_it_cannot():
    from pincollate import MMCollate, Stack

    boxes = [tv_tensors.BoundingBoxes(torch.zeros(1, 4), format="XYXY", canvas_size=(4, 4)) for _ in range(2)]
    with pytest.raises(
        CollateError, match=r"at \['b'\]: Stack\(\) cannot stack BoundingBoxes: they stay one tensor per sample"
    ):
        MMCollate(fields={"b": Stack()})([{"b": b} for b in boxes])


def test_importing_pincollate_imports_neither_torchvision_nor_pil():
    import subprocess
    import sys

    code = "import sys, pincollate; print('torchvision' in sys.modules, 'PIL' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_broken_torchvision_disables_only_its_own_types(tmp_path):
    import subprocess
    import sys

    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    code = (
        "import warnings, torch, pincollate\n"
        "Fake = type('Fake', (torch.Tensor,), {'__module__': 'torchvision.tv_tensors'})\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    out = pincollate.mm_collate([torch.zeros(2).as_subclass(Fake)] * 2)\n"
        "print(type(out).__name__, tuple(out.shape), [str(x.message)[:120] for x in w])\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert out.stdout.startswith("Fake (2, 2)") and "torchvision support is disabled, its import failed" in out.stdout


@pytest.fixture
def own_handlers():
    """Register handlers for built-in classes for one test; the built-in ones come back after."""
    from pincollate._types.builtin import BUILTIN

    try:
        yield register
    finally:
        for cls, handler in BUILTIN.items():
            register(cls, handler)


@pytest.mark.parametrize("compile_", [True, False], ids=["compiled", "walked"])
def test_a_users_handler_for_int_or_tensor_describes_every_batch(own_handlers, compile_):
    from pincollate._types.builtin import describe_tensor, fill_numbers, stack_tensors

    def describe_id(value, sample, path):
        if value < 0:
            raise CollateError("negative ids are not allowed", sample=sample, path=path)
        return torch.int32, ()

    def describe_detached(value, sample, path):
        if value.requires_grad:
            raise CollateError("detach tensors first", sample=sample, path=path)
        return describe_tensor(value, sample, path)

    own_handlers(int, LeafHandler("int", "id", describe_id, fill_numbers))
    own_handlers(torch.Tensor, LeafHandler("Tensor", "tensor", describe_detached, stack_tensors))
    collate = MMCollate(pin_memory=False, compile=compile_)

    def sample(i: int, grad: bool = False) -> dict:  # two tensor fields of one shape: a block, built-in
        return {"id": i, "x": torch.ones(2, requires_grad=grad), "y": torch.zeros(2)}

    for _ in range(3):  # warm plans too
        out = collate([sample(1), sample(2)])
        assert out["id"].dtype == torch.int32 and out["id"].tolist() == [1, 2] and out["y"].shape == (2, 2)
    with pytest.raises(CollateError, match=r"sample 1 at \['id'\]: negative ids are not allowed"):
        collate([sample(1), sample(-2)])
    with pytest.raises(CollateError, match=r"sample 1 at \['x'\]: detach tensors first"):
        collate([sample(1), sample(2, grad=True)])


@pytest.mark.parametrize("compile_", [True, False], ids=["compiled", "walked"])
def test_a_handler_may_give_its_shape_as_a_list(compile_):
    class Vec:
        def __init__(self, values):
            self.values = values

    def describe(value, sample, path):
        return torch.float32, [len(value.values)]

    def fill(region, values):
        region.copy_(torch.tensor([v.values for v in values]))

    register(Vec, LeafHandler("Vec", "vec", describe, fill))
    collate = MMCollate(pin_memory=False, compile=compile_)
    for _ in range(2):
        out = collate([{"x": Vec([1.0, 2.0])}, {"x": Vec([3.0, 4.0])}])
        assert out["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("compile_", [True, False], ids=["compiled", "walked"])
def test_a_users_handler_for_tensors_fills_padded_values_its_own_way(own_handlers, compile_):
    """Pad's walk copies plain tensors with the plan's kernel only where the built-in handler takes
    tensors: a user's handler fills each value as it says (here: plus 100)."""
    from pincollate import Pad
    from pincollate._types.builtin import describe_tensor

    def fill(region, values):
        region.copy_(torch.stack(values) + 100)

    own_handlers(torch.Tensor, LeafHandler("Tensor", "mine", describe_tensor, fill))
    collate = MMCollate(pin_memory=False, fields={"x": Pad()}, compile=compile_)
    for _ in range(3):
        out = collate([{"x": torch.ones(1)}, {"x": torch.ones(2)}])
        assert out["x"].tolist() == [[101, 0], [101, 101]]


class _Rated(torch.Tensor):
    """A tensor subclass carrying a sample rate, which must agree for values to stack."""

    rate: int

    @classmethod
    def _wrap(cls, view, rate):
        out = view.as_subclass(cls)
        out.rate = rate
        return out


def _rated(values, rate):
    out = torch.tensor(values, dtype=torch.float32).as_subclass(_Rated)
    out.rate = rate
    return out


def _register_rated():
    from pincollate import Wrap
    from pincollate._types.builtin import TENSOR_DTYPE

    base = lookup(torch.Tensor)
    register(
        _Rated,
        LeafHandler(
            "Rated",
            "tensor",
            base.describe,
            base.fill,
            wrap=lambda v: Wrap(_Rated, (("rate", v.rate),)),
            key=TENSOR_DTYPE,
            meta=lambda v: v.rate,
            signature=base.signature,
        ),
    )


@pytest.mark.parametrize("compile", [True, False])
def test_a_leafs_meta_and_wrap_metadata_are_checked_by_the_compiled_plan(compile):
    _register_rated()
    collate = MMCollate(pin_memory=False, compile=compile)
    for _ in range(3):  # walked, planned, compiled at 16 kHz
        out = collate([{"a": _rated([1, 2], 16000)}, {"a": _rated([3, 4], 16000)}])["a"]
        assert type(out) is _Rated and out.rate == 16000
    out = collate([{"a": _rated([1, 2], 22050)}, {"a": _rated([3, 4], 22050)}])["a"]
    assert type(out) is _Rated and out.rate == 22050  # the plan's rate was kept before
    mixed = collate([{"a": _rated([1, 2], 8000)}, {"a": _rated([3, 4], 16000)}])["a"]
    assert isinstance(mixed, list) and [v.rate for v in mixed] == [8000, 16000]  # meta differs: not stacked


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
@pytest.mark.parametrize("at", [0, 1, 2])
def test_boxes_stay_per_image_wherever_they_sit_in_the_column(compile, at):
    # Boxes after a plain tensor of the same shape were stacked into a plain tensor: their
    # format and canvas size lost, and the result depended on the samples' order.
    box = tv_tensors.BoundingBoxes(torch.ones(2, 4), format="XYXY", canvas_size=(4, 5))
    column: list[torch.Tensor] = [torch.zeros(2, 4), torch.zeros(2, 4)]
    column.insert(at, box)
    collate = MMCollate(pin_memory=False, compile=compile)
    plain = collate([{"o": torch.zeros(2, 4)} for _ in range(3)])  # a plan that stacks this field
    assert plain["o"].shape == (3, 2, 4)
    for _ in range(2):  # the plan made by the first, and the one that batch's structure keeps
        got = collate([{"o": value} for value in column])["o"]
        assert type(got) is list and [type(v) for v in got] == [type(v) for v in column]
        assert got[at].canvas_size == (4, 5) and got[at].format == tv_tensors.BoundingBoxFormat.XYXY
        assert all(
            torch.equal(g.as_subclass(torch.Tensor), v.as_subclass(torch.Tensor))
            for g, v in zip(got, column, strict=True)
        )
    with pytest.raises(CollateError, match=rf"sample {at} at \['o'\]: Stack\(\) cannot stack BoundingBoxes"):
        MMCollate(fields={"o": Stack()}, compile=compile)([{"o": value} for value in column])


@pytest.mark.parametrize("compile", [True, False], ids=["compiled", "walk"])
@pytest.mark.parametrize("sequences", [None, "items"])
def test_an_image_and_a_mask_are_blamed_as_the_pair_torch_refuses(compile, sequences):
    # A plain tensor stacks with either: the error named it (or an Image beside it) instead.
    image, mask, plain = (
        tv_tensors.Image(torch.zeros(3, 4, 4)),
        tv_tensors.Mask(torch.zeros(3, 4, 4)),
        torch.zeros(3, 4, 4),
    )
    collate = MMCollate(pin_memory=False, compile=compile, **({"sequences": sequences} if sequences else {}))
    if sequences is None:
        cases = {(plain, image, mask): (2, "Mask", "Image", 1), (image, plain, mask): (2, "Mask", "Image", 0)}
        for values, (sample, here, other, partner) in cases.items():
            with pytest.raises(
                CollateError,
                match=rf"^sample {sample} at \['x'\]: {here} here does not stack with {other} in sample {partner}:",
            ):
                collate([{"x": value} for value in values])
    else:  # one sample's list of items
        with pytest.raises(
            CollateError, match=r"^sample 0 at \['x'\]\[2\]: Mask here does not stack with Image in sample 0:"
        ):
            collate([{"x": [plain, image, mask]}, {"x": [plain]}])
