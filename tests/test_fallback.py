"""A field without a policy listed per sample (pincollate/_plan/fallback.py): warned once, with shapes and policies."""

from __future__ import annotations

import pickle
import re
import threading
import warnings

import numpy as np
import pytest
import torch

from pincollate import AsList, CollateError, ColumnCollate, Concat, MMCollate, Pad, RaggedFieldWarning, Stack


def _ragged(*lengths: int, key: str = "x") -> list[dict]:
    return [{key: torch.zeros(n, 2), "y": i} for i, n in enumerate(lengths)]


def _warned(call, *args):
    """``call(*args)`` and the messages of the RaggedFieldWarnings it gave (others stay errors)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RaggedFieldWarning)
        out = call(*args)
    return out, [str(w.message) for w in caught]


def test_a_listed_field_is_named_with_two_shapes_and_the_policies_that_settle_it():
    with pytest.warns(RaggedFieldWarning) as warned:
        out = MMCollate(pin_memory=False)([{"image": torch.zeros(3, 8, 8)}, {"image": torch.zeros(3, 8, 6)}])
    assert [tuple(t.shape) for t in out["image"]] == [(3, 8, 8), (3, 8, 6)]
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "['image'] holds values of different shapes, (3, 8, 8) in sample 0 and (3, 8, 6) in sample 1" in message
    assert "fields={'image': AsList()} keeps the list without this warning" in message
    assert "Stack() refuses ragged values" in message and "Pad() or Concat()" in message


def test_once_per_field_and_collate_and_again_for_a_new_collate():
    collate = MMCollate(pin_memory=False)
    _, first = _warned(collate, _ragged(1, 2))
    _, later = _warned(lambda: [collate(_ragged(3, 1)), collate(_ragged(2, 5, 1))])
    assert len(first) == 1 and later == []
    _, other_field = _warned(collate, _ragged(1, 2, key="z"))
    assert len(other_field) == 1 and "['z']" in other_field[0]
    _, fresh = _warned(MMCollate(pin_memory=False), _ragged(1, 2))
    assert len(fresh) == 1
    # What a DataLoader worker receives: the settings, not the fields already warned of.
    _, unpickled = _warned(pickle.loads(pickle.dumps(collate)), _ragged(1, 2))
    assert len(unpickled) == 1


def test_two_listed_fields_are_two_warnings_and_each_field_names_its_own_samples():
    samples = [{"a": torch.zeros(2), "b": torch.zeros(4)}, {"a": torch.zeros(2), "b": torch.zeros(4)}]
    samples.append({"a": torch.zeros(3), "b": torch.zeros(5)})
    _, messages = _warned(MMCollate(pin_memory=False), samples)
    assert len(messages) == 2
    assert "['a'] holds values of different shapes, (2,) in sample 0 and (3,) in sample 2" in messages[0]
    assert "['b'] holds values of different shapes, (4,) in sample 0 and (5,) in sample 2" in messages[1]


@pytest.mark.parametrize(
    "settings",
    [
        {"fields": {"x": AsList()}},
        {"fields": {"x": Pad()}},
        {"fields": {"x": Concat()}},
        {"fields": {"*": AsList()}},
        {"ragged": AsList()},
        {"ragged": Pad()},
    ],
    ids=["aslist", "pad", "concat", "pattern", "ragged-aslist", "ragged-pad"],
)
def test_a_policy_the_user_chose_is_quiet(settings):
    collate = MMCollate(pin_memory=False, **settings)
    for lengths in ((1, 2), (3, 1, 2)):
        _, messages = _warned(collate, _ragged(*lengths))
        assert messages == []


def test_stack_refuses_where_no_policy_would_list_and_warn():
    with pytest.raises(CollateError, match=r"Stack\(\) needs equal shapes, got \(2, 2\) here and \(1, 2\)"):
        MMCollate(pin_memory=False, fields={"x": Stack()})(_ragged(1, 2))


def test_a_field_turning_ragged_in_a_cached_plan_warns_from_its_recipe():
    collate = MMCollate(pin_memory=False)
    _, quiet = _warned(lambda: [collate(_ragged(2, 2)) for _ in range(3)])
    _, turned = _warned(collate, _ragged(2, 3))
    assert quiet == [] and len(turned) == 1 and "(2, 2) in sample 0 and (3, 2) in sample 1" in turned[0]
    assert _warned(collate, _ragged(2, 3))[1] == []
    recipes = [op.recipe for _, op, _ in collate._plans.last.op.singles if getattr(op, "recipe", None)]
    assert recipes and all(recipe.fallback.done for recipe in recipes)  # a flag check per batch from now on


def test_values_that_agree_beside_absent_ones_are_not_warned_of():
    collate = MMCollate(pin_memory=False, missing="none")
    out, messages = _warned(collate, [{"x": torch.zeros(2)}, {"y": 1}, {"x": torch.ones(2)}])
    assert out["x"][1] is None and messages == []


def test_a_nested_field_is_named_by_its_key_path_and_pattern():
    samples = [{"meta": {"boxes": torch.zeros(n, 4)}} for n in (1, 3)]
    _, messages = _warned(MMCollate(pin_memory=False), samples)
    assert "['meta']['boxes'] holds values" in messages[0]
    assert "fields={'meta.boxes': AsList()}" in messages[0]
    quiet = MMCollate(pin_memory=False, fields={"meta.boxes": AsList()})
    assert _warned(quiet, samples)[1] == []


def test_a_batch_of_bare_tensors_names_ragged():
    _, messages = _warned(MMCollate(pin_memory=False), [torch.zeros(2), torch.zeros(3)])
    assert "root holds values of different shapes" in messages[0] and "ragged=AsList() keeps the list" in messages[0]


def test_numpy_arrays_and_token_lists_of_different_lengths_warn():
    arrays = [{"wave": np.zeros(n, np.float32)} for n in (3, 5)]
    _, messages = _warned(MMCollate(pin_memory=False), arrays)
    assert "(3,) in sample 0 and (5,) in sample 1" in messages[0]


def test_lists_of_items_that_do_not_stack_name_each_samples_stack_or_items():
    a = torch.zeros(3, 4, 4)
    collate = MMCollate(pin_memory=False, sequences="items")
    _, counts = _warned(collate, [{"images": [a, a]}, {"images": [a]}])
    assert (
        "['images'] holds lists of items that do not stack: sample 0's stack to (2, 3, 4, 4), sample 1's to (1, 3, 4, 4)"
        in counts[0]
    )
    assert "Concat() packs lists of items into one tensor" in counts[0]
    assert "Pad() pads lists of numbers (token ids) into one" in counts[0]
    _, inside = _warned(MMCollate(pin_memory=False, sequences="items"), [{"images": [a]}, {"images": [a, a[:, :2]]}])
    assert "sample 1's items have shapes (3, 4, 4) and (3, 2, 4)" in inside[0]
    # A rule for the items, or for the field, is the user's choice.
    for fields in ({"images.*": AsList()}, {"images": AsList()}, {"images": Concat()}):
        rule = MMCollate(pin_memory=False, sequences="items", fields=fields)
        assert _warned(rule, [{"images": [a, a]}, {"images": [a]}])[1] == []


def test_values_that_never_stack_are_listed_without_a_warning():
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    boxes = [tv_tensors.BoundingBoxes(torch.zeros(n, 4), format="XYXY", canvas_size=(8, 8)) for n in (1, 2)]
    out, messages = _warned(MMCollate(pin_memory=False), [{"boxes": b} for b in boxes])
    assert isinstance(out["boxes"], list) and messages == []


def test_a_columnar_batch_warns_for_a_ragged_column_without_a_policy():
    ids = np.empty(2, dtype=object)
    ids[:] = [np.arange(3), np.arange(1)]
    _, messages = _warned(ColumnCollate(pin_memory=False), {"ids": ids, "label": np.arange(2)})
    assert len(messages) == 1 and "['ids'] holds values of different shapes, (3,) in sample 0" in messages[0]
    assert _warned(ColumnCollate(pin_memory=False, fields={"ids": Pad()}), {"ids": ids})[1] == []


def test_threads_sharing_a_collate_warn_once():
    collate = MMCollate(pin_memory=False)
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        for lengths in ((1, 2), (2, 3), (4, 1)):
            collate(_ragged(*lengths))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RaggedFieldWarning)
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert [w.category for w in caught] == [RaggedFieldWarning]


@pytest.mark.parametrize("key", ["a.b", 3.5, "x*"], ids=["dotted", "float", "star"])
@pytest.mark.parametrize("compile", [True, False])
def test_the_warnings_suggested_setting_names_a_key_with_a_dot_and_not_its_siblings(key, compile):
    # A dot-separated pattern cannot spell a key whose text holds a dot; "inp.*" would also
    # have settled the sibling "c" without a word. The suggestion names the key alone.
    samples = [{"inp": {key: torch.zeros(2), "c": torch.zeros(2)}}, {"inp": {key: torch.zeros(3), "c": torch.zeros(4)}}]
    _, said = _warned(MMCollate(pin_memory=False, compile=compile), samples)
    (about_key,) = [message for message in said if "['c']" not in message]
    suggested = re.search(r"(fields=\{.*?\}) keeps the list without this warning", about_key)
    assert suggested is not None and suggested.group(1) == f"fields={{('inp', {str(key)!r}): AsList()}}"
    fields = eval(suggested.group(1)[len("fields=") :], {"AsList": AsList})
    collate = MMCollate(pin_memory=False, compile=compile, fields=fields)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = collate(samples)
    # The suggestion settles its field, and only it: the sibling still warns (once), no pattern is unmatched.
    assert [str(w.message).split(" holds ")[0] for w in caught] == ["pincollate: ['inp']['c']"]
    assert [v.shape for v in out["inp"][key]] == [(2,), (3,)]


@pytest.mark.parametrize("compile", [True, False])
def test_a_key_that_is_a_star_warns_as_any_key_does_and_its_suggestion_says_no_pattern_names_it(compile):
    # "*" is also the path entry of a sample's items, which never warns: the key was listed silently.
    samples = [{"inp": {"*": torch.zeros(2), "c": torch.zeros(2)}}, {"inp": {"*": torch.zeros(3), "c": torch.zeros(2)}}]
    out, said = _warned(MMCollate(pin_memory=False, compile=compile), samples)
    assert len(said) == 1 and said[0].startswith("pincollate: ['inp']['*'] holds values of different shapes")
    assert "no pattern names a key '*' alone" in said[0] and "fields={'inp.*'" not in said[0]
    assert [v.shape for v in out["inp"]["*"]] == [(2,), (3,)] and out["inp"]["c"].shape == (2, 2)


def test_the_items_path_entry_stays_one_object_across_pickling_and_copying():
    import copy

    from pincollate._errors import ITEMS, is_items

    assert pickle.loads(pickle.dumps(ITEMS)) is ITEMS and copy.deepcopy(ITEMS) is ITEMS
    assert is_items(ITEMS) and not is_items("*") and ITEMS == "*"  # it prints, and compares, as "*"


@pytest.mark.parametrize("compile", [True, False])
def test_an_empty_key_gets_a_suggestion_that_works(compile):
    samples = [{"inp": {"": torch.zeros(2), "c": torch.zeros(2)}}, {"inp": {"": torch.zeros(3), "c": torch.zeros(4)}}]
    _, said = _warned(MMCollate(pin_memory=False, compile=compile), samples)
    (about_key,) = [message for message in said if "['c']" not in message]
    assert "fields={('inp', ''): AsList()} keeps the list" in about_key
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MMCollate(pin_memory=False, compile=compile, fields={("inp", ""): AsList()})(samples)
    assert [str(w.message).split(" holds ")[0] for w in caught] == ["pincollate: ['inp']['c']"]
