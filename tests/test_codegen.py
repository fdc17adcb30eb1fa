"""The compiled plan (pincollate/_plan/codegen.py): one generated function per structure, equal to the careful walk.

``MMCollate(compile=False)`` walks every batch carefully: it is the reference every
compiled plan is compared with, fresh and warm, on every sample family.
"""

from __future__ import annotations

import collections
import io
import os
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import pincollate
from pincollate import CollateError, MMCollate, RaggedFieldWarning
from pincollate._plan.fill import Mismatch
from pincollate._plan.tree_ops import CarefulOp
from samples import PARITY, RAGGED, assert_identical

GOLDEN = Path(__file__).parent / "golden"


def _no_walk(collate: MMCollate, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collate's last plan must make every later batch in its generated function: its way out to the
    walk (``slow``) fails the test, and so does a new plan (checked by :func:`_same_plan`)."""
    plan = collate._plans.last
    assert not plan.walks
    failed = lambda *args: pytest.fail("a batch left the generated function for the walk")  # noqa: E731
    monkeypatch.setitem(plan.compiled.run.__globals__, "slow", failed)
    monkeypatch.setattr(collate, "_kept_plan", plan, raising=False)


def _same_plan(collate: MMCollate) -> None:
    assert collate._plans.last is collate._kept_plan, "a batch was planned again"


def _same_or_same_error(make, *collates):
    """Each collate's result on a fresh copy of ``make()``: equal batches, or equal error texts,
    and the same warnings (a field without a policy that this batch lists, once per collate).
    """
    results = []
    warned = []
    for collate in collates:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RaggedFieldWarning)
            try:
                results.append(collate(make()))
            except CollateError as error:
                results.append(str(error))
        warned.append([str(w.message) for w in caught])
    assert all(messages == warned[0] for messages in warned), warned
    first = results[0]
    for other in results[1:]:
        if isinstance(first, str) or isinstance(other, str):
            assert first == other
        else:
            assert_identical(other, first)


def _calls(collate, samples) -> tuple[list[tuple[str, str]], object]:
    """The Python functions (file, name) that ``collate(samples)`` calls, and its result."""
    called = []

    def profile(frame, event, arg):
        if event == "call":
            called.append((frame.f_code.co_filename, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        out = collate(samples)
    finally:
        sys.setprofile(None)
    return called, out


@pytest.mark.parametrize("name", sorted(PARITY) + sorted(RAGGED))
def test_the_compiled_plan_gives_what_the_careful_walk_gives(name):
    make = PARITY.get(name) or RAGGED[name]
    reference = MMCollate(pin_memory=False, compile=False)
    compiled = MMCollate(pin_memory=False)
    for _ in range(3):  # the first batch plans; later ones run the generated code
        _same_or_same_error(make, reference, compiled)


def test_compile_false_walks_every_batch_and_compiles_nothing_of_the_structure(monkeypatch):
    collate = MMCollate(pin_memory=False, compile=False)
    walked = []
    real = collate._planner.plan
    monkeypatch.setattr(
        collate._planner, "plan", lambda values, path, keyed=False: walked.append(path) or real(values, path, keyed)
    )
    for _ in range(3):
        collate(PARITY["multimodal-dict"]())
    assert walked == [(), (), ()]
    plan = collate._plans.last
    assert type(plan.op) is CarefulOp and plan.op.recipe is None and collate._plans.planned == 1


def test_a_warm_batch_runs_the_generated_function_and_no_node_interprets_it():
    collate = MMCollate(pin_memory=False)
    batch = PARITY["multimodal-dict"]
    collate(batch())
    plan = collate._plans.last
    called, _ = _calls(collate, batch())
    assert collate._plans.last is plan
    assert called.count((plan.compiled.filename, "run")) == 1
    # The nodes hold data and copy kernels; none of them runs (interprets) the batch.
    nodes = {os.path.join("_plan", "ops.py"), os.path.join("_plan", "tree_ops.py")}
    assert not [name for filename, name in called if name == "run" and any(filename.endswith(n) for n in nodes)]


def test_a_warm_batch_of_a_plan_without_parts_is_made_by_its_function_alone():
    # Straight from the collate to the generated function: no dispatch through _use, no
    # task list (Fill), no pin asked about for a plain buffer, no make_batch for a dict.
    collate = MMCollate(pin_memory=False)
    samples = [{"image": torch.full((3, 4, 4), float(i)), "ids": torch.arange(5) + i, "label": i} for i in range(4)]
    collate(samples)
    plan = collate._plans.last
    assert plan.layout is not None
    calls, out = _calls(collate, samples)
    called = [name for _, name in calls]
    assert not {"_use", "execute", "_source", "is_pinned", "make_batch"} & set(called), called
    assert len(called) <= 15, called
    assert type(out) is pincollate.Batch and out.layout is plan.layout and out["label"].tolist() == [0, 1, 2, 3]


def test_a_warm_batch_with_parts_in_plain_memory_asks_about_no_pin():
    # A plain buffer is pageable host memory: its tensors are carved without asking.
    collate = MMCollate(pin_memory=False, fields={"objects": pincollate.AsList()})
    # Lists of tensors in some samples, tuples of arrays in others: a part the function walks for each batch.
    samples = [{"objects": [torch.arange(i) + i] if i % 2 else (np.arange(i) + i,), "label": i} for i in range(4)]
    collate(samples)
    assert collate._plans.last.walks  # a plan with a part the function walks
    calls, out = _calls(collate, samples)
    called = [name for _, name in calls]
    assert "execute" in called and not {"_source", "is_pinned"} & set(called), called
    assert [objects.tolist() for objects in out["objects"]] == [[[]], [[1]], [[2, 3]], [[3, 4, 5]]]


def test_a_warm_padded_batch_is_made_by_its_sized_function_without_asking_about_pins():
    collate = MMCollate(pin_memory=False, fields={"ids": pincollate.Pad()})
    samples = [{"ids": torch.arange(i + 1), "label": i} for i in range(4)]
    collate(samples)
    plan = collate._plans.last
    assert not plan.walks and plan.sized is not None  # every part padded: one function makes the batch
    calls, out = _calls(collate, samples)
    called = [name for _, name in calls]
    assert calls.count((plan.compiled.filename, "run")) == 1
    assert not {"execute", "_source", "is_pinned", "filled", "_use", "make_batch"} & set(called), called
    assert out["ids"].tolist()[3] == [0, 1, 2, 3] and out["ids"].untyped_storage().nbytes() == out["ids"].nbytes
    assert_identical(out, MMCollate(pin_memory=False, fields={"ids": pincollate.Pad()}, compile=False)(samples))


def test_a_plan_without_parts_in_pinned_memory_makes_views_of_one_storage(fake_pinned):
    collate = MMCollate(pin_memory=True)
    samples = [{"image": torch.full((3, 4, 4), float(i)), "ids": torch.arange(5) + i, "label": i} for i in range(4)]
    for _ in range(3):  # planned, then made by the generated function
        out = collate(samples)
    assert collate._plans.last.layout is not None
    assert_identical(out, MMCollate(pin_memory=False, compile=False)(samples))
    storages = {t.untyped_storage().data_ptr() for t in (out["image"], out["ids"], out["label"])}
    assert storages == {out.buffer.untyped_storage().data_ptr()}  # views of the pinned buffer's one storage


def test_many_fields_planned_per_batch_are_read_by_the_generated_function_and_name_their_field():
    fields = 40

    def make(bad: bool = False) -> list[dict]:
        samples = [{f"r{j}": torch.arange(i + 1 + j % 3) for j in range(fields)} | {"label": i} for i in range(4)]
        if bad:
            samples[2]["r13"] = torch.zeros(2).to_sparse()  # refused, naming its sample and field
        return samples

    settings = {"pin_memory": False, "ragged": pincollate.AsList()}
    compiled = MMCollate(**settings)
    for _ in range(3):
        _same_or_same_error(make, MMCollate(**settings, compile=False), compiled)
    plan = compiled._plans.last
    source = plan.compiled.source
    # Every ragged field read inline by the function that makes the whole batch: no per-field call.
    assert not plan.walks and ".run(" not in source
    assert all(f"# ['r{j}']" in source for j in range(fields))
    _same_or_same_error(lambda: make(bad=True), MMCollate(**settings, compile=False), compiled)
    with pytest.raises(CollateError, match=r"sample 2 at \['r13'\]"):
        compiled(make(bad=True))


class _Features(collections.OrderedDict):
    """A user's mapping class at the top of a sample: the layout builds it."""


def test_lists_under_a_users_mapping_class_are_made_by_the_generated_function():
    # A top the generated function does not build itself (a user's mapping class): its lists are
    # placed and copied there all the same, and the layout's deferred parts build them.
    def make() -> list[_Features]:
        return [
            _Features(
                boxes=torch.arange(4.0 * i).reshape(i, 4),
                ids=torch.arange(i + 2),
                target={"labels": torch.arange(i), "name": f"n{i}"},
                label=i,
            )
            for i in (2, 0, 3, 1)
        ]

    fields = {"boxes": pincollate.AsList(), "ids": pincollate.Pad(), "target": pincollate.PerSample()}
    compiled = MMCollate(pin_memory=False, fields=fields)
    walked = MMCollate(pin_memory=False, fields=fields, compile=False)
    for _ in range(3):
        _same_or_same_error(make, walked, compiled)
    assert not compiled._plans.last.walks and ".run(" not in compiled._plans.last.compiled.source
    out = compiled(make())
    assert isinstance(out, _Features) and list(out) == ["boxes", "ids", "ids_lengths", "ids_mask", "target", "label"]
    boxes = [b for b in out["boxes"] if b.numel()]
    assert len({b.untyped_storage().data_ptr() for b in boxes}) == 1  # one region, a view per value
    boxes[0].add_(1)  # one value changed in place: no other value, and the next batch is its own
    assert torch.equal(out["boxes"][3], make()[3]["boxes"]) and torch.equal(
        compiled(make())["boxes"][0], make()[0]["boxes"]
    )


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("policy", [pincollate.AsList(), pincollate.Pad(), pincollate.Concat()])
def test_numpy_arrays_under_a_policy_are_read_by_the_generated_function(policy, read_only, monkeypatch):
    # Waveforms from a numpy pipeline, rows from an object store (read-only): the generated function
    # takes them as tensors itself; no batch goes the longer way (the queued fill and its recipes).
    import numpy as np

    def make(salt: int) -> list[dict]:
        samples = []
        for i, n in enumerate((3, 1, 4, 2)):
            array = np.arange(n * 2, dtype=np.float32).reshape(n, 2) + salt + i
            array.flags.writeable = not read_only
            samples.append({"x": array, "i": i})
        return samples

    compiled = MMCollate(pin_memory=False, fields={"x": policy})
    walked = MMCollate(pin_memory=False, fields={"x": policy}, compile=False)
    for salt in range(2):  # walked, then planned
        compiled(make(salt))
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(2, 5):
        _same_or_same_error(lambda salt=salt: make(salt), walked, compiled)
    _same_plan(compiled)


@pytest.mark.parametrize("missing", ["error", "none"])
@pytest.mark.parametrize("kind", ["image", "subclass", "flat"])
def test_lists_of_subclasses_and_of_values_that_lie_flat_are_read_by_the_generated_function(kind, missing, monkeypatch):
    # Images of several heights (tv_tensors, a user's subclass: their stack keeps the class) and
    # waveforms of several lengths along their last dim (listed flat, each viewed back as its shape),
    # with no policy: the generated function lists them, or stacks them where they agree.
    from torchvision import tv_tensors

    from samples import UserTensor

    def value(i: int, n: int) -> torch.Tensor:
        if kind == "flat":
            return torch.arange(2.0 * n).reshape(2, n) + i
        cls = tv_tensors.Image if kind == "image" else UserTensor
        return torch.full((3, n, 4), i, dtype=torch.uint8).as_subclass(cls)

    def make(sizes: list[int | None]) -> list[dict]:
        return [{"x": None if n is None else value(i, n), "i": i} for i, n in enumerate(sizes)]

    batches = [[3, 1, 4], [2, 5, 1], [2, 2, 2], [4, 1, 1]]
    if missing == "none":
        batches += [[2, None, 2], [None, 3, 1]]
    compiled = MMCollate(pin_memory=False, missing=missing)
    walked = MMCollate(pin_memory=False, missing=missing, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)
        compiled(make(batches[0])), compiled(make(batches[1]))  # walked, then planned
        walked(make(batches[0]))  # each warned once, of the field it lists
        assert not compiled._plans.last.walks
        _no_walk(compiled, monkeypatch)
        for sizes in batches:
            _same_or_same_error(lambda sizes=sizes: make(sizes), walked, compiled)
        _same_plan(compiled)
        stacked = compiled(make([2, 2, 2]))["x"]
    expected = {"image": tv_tensors.Image, "subclass": UserTensor, "flat": torch.Tensor}[kind]
    assert type(stacked) is expected and stacked.shape[0] == 3  # values that agree: one tensor of their class


def test_pad_with_absent_values_takes_numpy_arrays_after_tensors():
    # missing="none": a None is looked for by identity (an array asked == answers element by element).
    def make(salt: int, arrays: bool = False) -> list[dict]:
        out = []
        for i, n in enumerate((3, None, 5)):
            value = None if n is None else torch.arange(n, dtype=torch.float32) + salt
            out.append({"x": value.numpy() if arrays and value is not None else value, "i": i})
        return out

    settings = {"pin_memory": False, "fields": {"x": pincollate.Pad()}, "missing": "none"}
    compiled, walked = MMCollate(**settings), MMCollate(**settings, compile=False)
    compiled(make(0)), compiled(make(1))
    for salt in (2, 3):
        _same_or_same_error(lambda salt=salt: make(salt, arrays=True), walked, compiled)
        _same_or_same_error(
            lambda salt=salt: [{"j": 1.5, **sample} for sample in make(salt, arrays=True)], walked, compiled
        )


def _token_lists(salt: int) -> list[dict]:
    return [{"ids": [salt + 7 * i + j for j in range(n)], "i": i} for i, n in enumerate((3, 0, 5, 1))]


def _absent_item_lists(salt: int) -> list[dict]:
    counts = [[2, 1], None, [3], [], None][salt % 2 :]
    return [
        {"i": i}
        if sample is None
        else {"i": i, "ids": [torch.full((n, 3), float(salt + i + j)) for j, n in enumerate(sample)]}
        for i, sample in enumerate(counts[:3])
    ]


def _absent_images(salt: int) -> list[dict]:
    counts = [2, None, 1] if salt % 2 else [None, 3, 0]
    return [
        {"i": i} if k is None else {"i": i, "ids": [torch.full((3, 2, 2), float(salt + i + j)) for j in range(k)]}
        for i, k in enumerate(counts)
    ]


@pytest.mark.parametrize(
    ("policy", "make", "missing"),
    [
        (pincollate.Concat(), _token_lists, "error"),
        (pincollate.Jagged(), _token_lists, "error"),
        (pincollate.Concat(), _absent_item_lists, "none"),
        (pincollate.Concat(items="stack"), _absent_images, "none"),
    ],
    ids=["concat-token-lists", "jagged-token-lists", "concat-absent-item-lists", "concat-absent-images"],
)
def test_packed_token_lists_and_absent_item_lists_are_read_by_the_generated_function(
    policy, make, missing, monkeypatch
):
    # Token ids as Python lists packed into one tensor (sequence packing), and per-sample lists of
    # items where some samples have none (text-only samples beside image ones): no batch goes
    # through the recipes.

    compiled = MMCollate(pin_memory=False, fields={"ids": policy}, missing=missing)
    walked = MMCollate(pin_memory=False, fields={"ids": policy}, missing=missing, compile=False)
    compiled(make(0)), compiled(make(1))  # walked, then planned
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(2, 6):
        _same_or_same_error(lambda salt=salt: make(salt), walked, compiled)
    _same_plan(compiled)


def _long_tokens(salt: int) -> list[dict]:
    # Some values longer than max_length in every batch after the first (which plans the field).
    lengths = (3, 1, 2, 4) if salt == 0 else (salt + 5, 0, 2, 3 * salt + 1)
    return [{"ids": torch.arange(n) * (salt + 1), "i": i} for i, n in enumerate(lengths)]


def _long_token_lists(salt: int) -> list[dict]:
    return [{"ids": list(range(len(sample["ids"]))), "i": sample["i"]} for sample in _long_tokens(salt)]


def _long_clips(salt: int) -> list[dict]:
    # (channels, time) values padded along time: the recipe's size rule, read by the function.
    lengths = (3, 1, 2, 4) if salt == 0 else (salt + 5, 1, 2, 3 * salt + 1)
    return [{"ids": torch.full((2, n), float(salt + i)), "i": i} for i, n in enumerate(lengths)]


@pytest.mark.parametrize(
    ("policy", "make"),
    [
        (pincollate.Pad(max_length=4, truncate=True), _long_tokens),
        (pincollate.Pad(max_length=4, truncate=True, side="left", lengths_key=None), _long_tokens),
        (pincollate.Pad(max_length=4, truncate=True), _long_token_lists),
        (pincollate.Pad(max_length=4, truncate=True, dims=[-1]), _long_clips),
    ],
    ids=["tensors", "left-mask", "token-lists", "last-dim"],
)
def test_values_cut_to_max_length_are_read_by_the_generated_function(policy, make, monkeypatch):
    # Pad(max_length=..., truncate=True), the usual setting for text: a batch with a value longer
    # than max_length is cut and padded by the generated function, as the careful walk cuts it,
    # not sent to the recipes (four times slower).

    compiled = MMCollate(pin_memory=False, fields={"ids": policy})
    walked = MMCollate(pin_memory=False, fields={"ids": policy}, compile=False)
    compiled(make(0))
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(1, 5):
        _same_or_same_error(lambda salt=salt: make(salt), walked, compiled)
    _same_plan(compiled)
    batch = compiled(make(3))
    assert batch["ids"].shape[-1] == 4
    if "ids_lengths" in batch:
        assert batch["ids_lengths"].tolist() == [min(n, 4) for n in (8, 1 if make is _long_clips else 0, 2, 10)]


def _no_boxes(salt: int, make=lambda n: torch.arange(4.0 * n).view(n, 4)) -> list[dict]:
    # Detection: a batch after the first with no boxes in any image, then one with some again.
    counts = (2, 1, 3) if salt in (0, 3) else (0, 0, 0)
    return [{"boxes": make(n), "labels": torch.arange(n), "i": i} for i, n in enumerate(counts)]


def _no_flat_values(salt: int) -> list[dict]:
    # Values whose trailing sizes differ lie flat in their list: here every one without elements.
    return _no_boxes(salt, lambda n: torch.arange(3.0 * n).view(3, n))


def _no_tv_boxes(salt: int) -> list[dict]:
    from torchvision import tv_tensors

    return _no_boxes(
        salt,
        lambda n: tv_tensors.BoundingBoxes(torch.arange(4.0 * n).view(n, 4), format="XYXY", canvas_size=(8, 8 + n)),
    )


@pytest.mark.parametrize(
    ("fields", "make"),
    [
        ({"boxes": pincollate.AsList(), "labels": pincollate.AsList()}, _no_boxes),
        ({"boxes": pincollate.AsList(), "labels": pincollate.AsList()}, _no_flat_values),
        ({"boxes": pincollate.AsList(), "labels": pincollate.AsList()}, _no_tv_boxes),
        ({}, _no_boxes),
    ],
    ids=["aslist", "flat", "tv-boxes", "no-policy"],
)
def test_lists_whose_values_are_all_empty_are_read_by_the_generated_function(fields, make, monkeypatch):
    # A batch of images none of which has a box: its lists are made by the generated function (they
    # went to the recipe), each value an empty tensor whose storage has no address, so that saving
    # a value beside a field of another dtype works (torch.save refuses two dtypes at one address).

    compiled = MMCollate(pin_memory=False, fields=fields)
    walked = MMCollate(pin_memory=False, fields=fields, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)  # no policy: ragged boxes listed, warned of once
        compiled(make(0)), walked(make(0))
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(1, 5):
        _same_or_same_error(lambda salt=salt: make(salt), walked, compiled)
    _same_plan(compiled)
    batch = compiled(make(1))
    assert [value.numel() for value in batch["boxes"]] == [0, 0, 0]
    assert batch["boxes"][0].untyped_storage().data_ptr() == 0
    for value in batch["boxes"]:
        torch.save({"boxes": value, "labels": batch["labels"], "i": batch["i"]}, io.BytesIO())


def _no_crops(salt: int) -> list[dict]:
    # Each sample's list of crops (items): after the first batch, crops none of which has a pixel.
    sizes = [[2], [2, 1], [3]] if salt in (0, 3) else [[0], [0, 0], []]
    return [{"crops": [torch.full((n, 3), float(salt + i)) for n in own], "i": i} for i, own in enumerate(sizes)]


@pytest.mark.parametrize("fields", [{}, {"crops": pincollate.AsList()}], ids=["no-policy", "aslist"])
def test_items_that_are_all_empty_are_read_by_the_generated_function(fields, monkeypatch):

    compiled = MMCollate(pin_memory=False, fields=fields)
    walked = MMCollate(pin_memory=False, fields=fields, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RaggedFieldWarning)  # no policy: items that differ, warned of once
        compiled(_no_crops(0)), walked(_no_crops(0))
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(1, 5):
        _same_or_same_error(lambda salt=salt: _no_crops(salt), walked, compiled)
    _same_plan(compiled)
    batch = compiled(_no_crops(1))
    torch.save({"crops": batch["crops"], "i": batch["i"]}, io.BytesIO())


def _bare_tokens(salt: int) -> list[torch.Tensor]:
    # A dataset whose samples are the token tensors themselves (no dict around them).
    return [torch.arange(n) + salt for n in ((3, 1, 4) if salt % 2 else (2, 5, 0))]


@pytest.mark.parametrize(
    "policy",
    [
        pincollate.Pad(lengths_key=None, mask_key=None),
        pincollate.Pad(lengths_key=None, mask_key=None, max_length=3, truncate=True),
        pincollate.Concat(offsets_key=None, counts_key=None, item_offsets_key=None),
        pincollate.AsList(),
    ],
    ids=["pad", "pad-cut", "concat", "aslist"],
)
def test_samples_that_are_the_part_itself_are_read_by_the_generated_function(policy, monkeypatch):
    # collate_fn=MMCollate(ragged=Pad()) over bare tensors: the root is the part. Its batches are
    # made by the generated function (they went to the recipe through the walk's root node); that
    # such a batch crosses from workers intact is test_dataloader's.
    from pincollate._batch.layout import PartSpec

    compiled = MMCollate(pin_memory=False, ragged=policy)
    walked = MMCollate(pin_memory=False, ragged=policy, compile=False)
    compiled(_bare_tokens(0))
    plan = compiled._plans.last
    assert type(plan.template) is PartSpec and not plan.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(1, 5):
        _same_or_same_error(lambda salt=salt: _bare_tokens(salt), walked, compiled)
    _same_plan(compiled)
    batch = compiled(_bare_tokens(3))
    assert (type(batch) is list) == (type(policy) is pincollate.AsList)


def _nested_targets(salt: int, kind: str) -> list[dict]:
    # PerSample() subtrees past a dict of tensors per image: lists of labels, lists of lists,
    # per-object dicts with a dict and a list inside, a dict inside a dict, numpy boxes.
    counts = [(2, 0, 1), (1, 3, 2), (0, 1, 1)][salt % 3]
    targets = {
        "label-lists": lambda i, n: list(range(salt, salt + n)),
        "lists-of-lists": lambda i, n: [[j, j + salt] for j in range(n + 1)],
        "objects-with-attributes": lambda i, n: [
            {"box": torch.full((4,), float(j + salt)), "attrs": {"occluded": j % 2 == 0, "ids": [j, i]}}
            for j in range(n + 1)
        ],
        "dict-in-dict": lambda i, n: {"meta": {"size": torch.tensor([n, i]), "id": i + salt}, "file": f"{i}.jpg"},
        "numpy-boxes": lambda i, n: {"boxes": np.full((n, 4), float(salt + i), np.float32), "id": i},
        "ordered-dicts": lambda i, n: (
            [collections.OrderedDict(box=torch.full((4,), float(j)), label=j + salt) for j in range(n)]
            or [collections.OrderedDict(box=torch.zeros(4), label=-1)]
        ),
    }[kind]
    return [{"t": targets(i, n), "i": i} for i, n in enumerate(counts)]


@pytest.mark.parametrize(
    "kind", ["label-lists", "lists-of-lists", "objects-with-attributes", "dict-in-dict", "numpy-boxes", "ordered-dicts"]
)
def test_nested_per_sample_subtrees_are_read_by_the_generated_function(kind, monkeypatch):
    # Every place of a PerSample() subtree that the walk plans once (dicts, lists, tensors, arrays,
    # numbers, strings, at any depth) is read by the generated function: no batch goes through
    # the recipe, and each is what the walk gives, pickled and saved alike.
    import pickle

    compiled = MMCollate(pin_memory=False, fields={"t": pincollate.PerSample()})
    walked = MMCollate(pin_memory=False, fields={"t": pincollate.PerSample()}, compile=False)
    compiled(_nested_targets(0, kind))
    assert not compiled._plans.last.walks
    _no_walk(compiled, monkeypatch)
    for salt in range(1, 6):
        _same_or_same_error(lambda salt=salt: _nested_targets(salt, kind), walked, compiled)
    _same_plan(compiled)
    batch = compiled(_nested_targets(4, kind))
    assert_identical(pickle.loads(pickle.dumps(batch)), walked(_nested_targets(4, kind)))
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    assert_identical(torch.load(stream, weights_only=False), batch)


@pytest.mark.parametrize("kind", ["lists-of-lists", "objects-with-attributes", "dict-in-dict", "ordered-dicts"])
def test_nested_per_sample_subtrees_in_pinned_memory_are_built_by_the_layout(kind, fake_pinned):
    # In pinned memory the batch is built by its layout, whose deferred parts make each place of the
    # subtree (the same lists, dicts and counts as the generated function reads them).
    compiled = MMCollate(pin_memory=True, fields={"t": pincollate.PerSample()})
    walked = MMCollate(pin_memory=False, fields={"t": pincollate.PerSample()}, compile=False)
    for salt in range(4):
        out = compiled(_nested_targets(salt, kind))
        assert not compiled._plans.last.walks
        assert_identical(out, walked(_nested_targets(salt, kind)))
        assert out.layout == compiled.plan(_nested_targets(salt, kind))


class _Pair:
    """A registered container with a list inside it: the layout builds it, its parts with it."""

    def __init__(self, boxes: torch.Tensor, label: int):
        self.boxes, self.label = boxes, label

    def __eq__(self, other: object) -> bool:
        return type(other) is _Pair and vars(self).keys() == vars(other).keys()


pincollate.register_container(_Pair, lambda p: (["boxes", "label"], [p.boxes, p.label]), lambda k, v: _Pair(*v))


def _deep(value: object, depth: int = 40) -> object:
    for _ in range(depth):
        value = {"n": value}
    return value


@pytest.mark.parametrize("where", ["registered", "deep"])
def test_lists_under_a_node_the_layout_builds_are_made_by_the_generated_function(where):
    # A list below a registered container, or deeper than one generated expression goes: the node
    # builds itself from the layout's parts, which the function's batch makes from their geometry.
    def boxes(n: int, salt: int) -> torch.Tensor:
        return torch.arange(4.0 * n).reshape(n, 4) + salt

    if where == "registered":
        fields = {"p.boxes": pincollate.AsList()}

        def make(salt: int) -> list:
            return [{"p": _Pair(boxes(n, salt), i), "y": i} for i, n in enumerate((2, 0, 3))]

        def listed(out):
            return out["p"].boxes
    else:
        fields = {".".join(["n"] * 40 + ["boxes"]): pincollate.AsList()}

        def make(salt: int) -> list:
            return [_deep({"boxes": boxes(n, salt)}) for n in (2, 0, 3)]

        def listed(out):
            for _ in range(40):
                out = out["n"]
            return out["boxes"]

    compiled = MMCollate(pin_memory=False, fields=fields)
    walked = MMCollate(pin_memory=False, fields=fields, compile=False)
    for salt in range(4):
        got, expected = compiled(make(salt)), walked(make(salt))
        assert [t.tolist() for t in listed(got)] == [t.tolist() for t in listed(expected)]
    assert not compiled._plans.last.walks


def test_a_traceback_through_the_generated_code_shows_the_field_that_failed():
    collate = MMCollate(pin_memory=False)
    samples = [{"image": torch.zeros(3, 2, 2), "label": i} for i in range(2)]
    collate(samples)
    plan = collate._plans.last
    changed = [{"image": torch.zeros(3, 2, 2, dtype=torch.float64), "label": i} for i in range(2)]
    with pytest.raises(Mismatch) as info:
        plan.check(changed)
    text = "".join(traceback.format_exception(info.value))
    assert plan.compiled.filename in text and "raise Mismatch" in text and "# ['image']" in text
    assert info.value.paths == (("image",),)


def test_keys_and_values_reach_the_generated_code_only_through_its_constants():
    key = "x'] = 1\nraise SystemExit('spliced')\n#"
    samples = [{key: torch.ones(2), "s": "\nimport os"}, {key: torch.zeros(2), "s": "b"}]
    collate = MMCollate(pin_memory=False)
    for _ in range(2):
        out = collate(samples)
    assert torch.equal(out[key], torch.stack([torch.ones(2), torch.zeros(2)]))
    source = collate._plans.last.compiled.source
    # The generated code has no string literals: whatever follows a '#' is a comment.
    code = [line.split("#", 1)[0] for line in source.splitlines()]
    assert not [line for line in code if "SystemExit" in line or "import" in line or "x'" in line]


def _scenario_source(scenario: str) -> str:
    from pincollate.bench._methods import methods
    from pincollate.datasets import SCENARIOS, InMemory

    cls, batch_size = SCENARIOS[scenario]
    dataset = InMemory(cls(length=batch_size * 2))
    collate = methods(scenario)["mm_collate"]
    for i in range(2):
        collate([dataset[i * batch_size + j] for j in range(batch_size)])
    return collate._plans.last.compiled.source


@pytest.mark.parametrize("scenario", ["manyleaf", "nested", "video", "ragged", "tokens", "vlm", "audio", "detection"])
def test_the_bench_scenarios_generate_the_reviewed_code(scenario):
    # A change to the generator shows in review as a change to these files:
    # PINCOLLATE_GOLDEN=write rewrites them.
    path = GOLDEN / f"plan_{scenario}.py"
    header = (
        f'"""The generated plan of the bench\'s {scenario} scenario (tests/test_codegen.py): kN are its constants."""\n\n'
        "# ruff: noqa: F821\n\n"
    )
    source = _scenario_source(scenario)
    if os.environ.get("PINCOLLATE_GOLDEN") == "write":
        path.write_text(header + source)
    assert header + source == path.read_text()


class _Sub(torch.Tensor):
    """A user's tensor subclass: a warm plan of plain tensors must not take it as one."""


def _base(i: int) -> dict:
    # One of each node the template plans: a stacked tensor, a block of same-shape fields,
    # numbers, strings, a nested mapping, a list transposed position by position, a tuple.
    return {
        "image": torch.full((3, 2, 2), i, dtype=torch.uint8),
        "feats": {"a": torch.ones(4) * i, "b": torch.zeros(4), "c": torch.full((4,), 2.0)},
        "label": i,
        "score": 0.5 * i,
        "name": f"s{i}",
        "crops": [torch.ones(2) * i, torch.zeros(2)],
        "pair": (i, torch.tensor([i, i + 1])),
    }


def _off(name: str, sample: dict) -> dict:
    """``sample`` with one fact changed at one place."""
    s = {**sample, "feats": dict(sample["feats"]), "crops": list(sample["crops"])}
    if name == "dtype":
        s["image"] = s["image"].to(torch.int32)
    elif name == "rank":
        s["image"] = s["image"][0]
    elif name == "shape":
        s["image"] = torch.zeros(3, 2, 3, dtype=torch.uint8)
    elif name == "subclass":
        s["image"] = s["image"].as_subclass(_Sub)
    elif name == "block-dtype":
        s["feats"]["b"] = s["feats"]["b"].double()
    elif name == "block-subclass":
        s["feats"]["c"] = s["feats"]["c"].as_subclass(_Sub)
    elif name == "block-shape":
        s["feats"]["a"] = torch.ones(5)
    elif name == "key-order":
        s["feats"] = {"b": s["feats"]["b"], "a": s["feats"]["a"], "c": s["feats"]["c"]}
    elif name == "key-type":
        s["feats"] = {**s["feats"], 1: torch.ones(1)}
        del s["feats"]["c"]
    elif name == "missing-key":
        del s["feats"]["c"]
    elif name == "extra-key":
        s["extra"] = torch.ones(1)
    elif name == "length":
        s["crops"].append(torch.ones(2))
    elif name == "number-type":
        s["label"] = float(s["label"])
    elif name == "bool-for-int":
        s["label"] = True
    elif name == "int-beyond-int64":
        s["label"] = 2**64
    elif name == "string-to-bytes":
        s["name"] = b"x"
    elif name == "tuple-for-list":
        s["crops"] = tuple(s["crops"])
    elif name == "list-for-dict":
        s["feats"] = list(s["feats"].values())
    elif name == "array-for-tensor":
        s["image"] = s["image"].numpy()
    elif name == "number-for-tensor":
        s["pair"] = (s["pair"][0], 7)
    elif name == "none":
        s["score"] = None
    elif name == "nested-tensor":
        s["crops"][0] = torch.nested.nested_tensor([torch.ones(1), torch.ones(2)], layout=torch.jagged)
    elif name == "conj":
        s["feats"]["a"] = s["feats"]["a"].to(torch.complex64).conj()
    return s


ONE_FACT_OFF = [
    "dtype", "rank", "shape", "subclass", "block-dtype", "block-subclass", "block-shape", "key-order", "key-type",
    "missing-key", "extra-key", "length", "number-type", "bool-for-int", "int-beyond-int64", "string-to-bytes",
    "tuple-for-list", "list-for-dict", "array-for-tensor", "number-for-tensor", "none", "nested-tensor", "conj",
]  # fmt: skip


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("name", ONE_FACT_OFF)
def test_one_fact_off_in_a_warm_batch_gives_what_the_careful_walk_gives(name, where):
    # A warm compiled plan meets a batch that differs in one fact, in sample 0 or the last:
    # it gives exactly the careful walk's batch or error, and then the next plain batch too.
    def make():
        samples = [_base(i) for i in range(3)]
        k = 0 if where == "first" else -1
        samples[k] = _off(name, samples[k])
        return samples

    compiled = MMCollate(pin_memory=False)
    for _ in range(2):
        compiled([_base(i) for i in range(3)])
    _same_or_same_error(make, MMCollate(pin_memory=False, compile=False), compiled)
    _same_or_same_error(lambda: [_base(i) for i in range(3)], MMCollate(pin_memory=False, compile=False), compiled)


@pytest.mark.parametrize(("planned", "later"), [((1, 2), (True, 2)), (0.0, -0.0), (1.0, True)])
def test_keys_equal_to_the_plan_s_but_not_the_same_come_back_as_the_sample_s_own(planned, later):
    # (True, 2) == (1, 2) and -0.0 == 0.0 with one type: a plan built with its own key objects would
    # hand back the first batch's; such keys are each sample's own, as the careful walk keeps them.
    def batch(key: object) -> list[dict]:
        return [{key: torch.zeros(2), "target": {key: torch.arange(i + 1)}} for i in range(3)]

    fields = {"target": pincollate.PerSample()}
    compiled = MMCollate(pin_memory=False, fields=fields)
    careful = MMCollate(pin_memory=False, fields=fields, compile=False)
    compiled(batch(planned)), compiled(batch(planned))
    out, expected = compiled(batch(later)), careful(batch(later))
    assert_identical(out, expected)
    assert [repr(key) for key in out] == [repr(key) for key in expected]
    assert [repr(key) for key in out["target"][0]] == [repr(key) for key in expected["target"][0]]


@pytest.mark.walk_first
def test_a_plan_with_nothing_to_copy_compiles_and_makes_its_batch():
    # PerSample() targets of strings alone: the plan's function has lists to place and no copy.
    from pincollate import PerSample

    collate = MMCollate(pin_memory=False, fields={"t": PerSample()})
    samples = [{"t": {"name": "a", "tag": None}}, {"t": {"name": "b", "tag": b"x"}}]
    for _ in range(3):  # walked, then planned and compiled, then warm
        assert collate(samples) == {"t": [{"name": "a", "tag": None}, {"name": "b", "tag": b"x"}]}
    assert collate._plans.planned == 1
