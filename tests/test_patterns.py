"""Field patterns: which policy applies at which key path, and what a bad pattern says."""

from __future__ import annotations

import pytest
import torch

from pincollate import AsList, CollateError, MMCollate, Pad, Stack
from pincollate._plan.patterns import FieldRules


def _ids(*lengths: int) -> list[dict]:
    return [{"ids": torch.arange(1, n + 1)} for n in lengths]


# --- patterns ------------------------------------------------------------------------------


def test_most_specific_pattern_wins():
    rules = FieldRules({"*.boxes": AsList(), "meta.boxes": Stack(), "*.*": Pad()})
    assert rules.lookup(("meta", "boxes")) == Stack()
    assert rules.lookup(("det", "boxes")) == AsList()
    assert rules.lookup(("a", "b")) == Pad()
    assert rules.lookup(("a",)) is None


@pytest.mark.parametrize("pattern", ["", "a..b", "a.b*", "*x"])
def test_malformed_patterns_are_rejected(pattern):
    with pytest.raises(CollateError, match="pattern"):
        MMCollate(fields={pattern: Pad()})


def test_a_policy_must_be_a_policy():
    with pytest.raises(CollateError, match=r"field 'x': expected a policy"):
        MMCollate(fields={"x": "pad"})  # type: ignore[dict-item]


def test_a_pattern_matching_nothing_is_reported_once():
    collate = MMCollate(fields={"typo": Pad()})
    with pytest.warns(UserWarning, match="'typo' matched no key path"):
        collate(_ids(2, 2))
    collate(_ids(2, 2))  # no second warning: filterwarnings=error would fail here


def test_extra_outputs_must_not_clash_with_keys():
    samples = [{"ids": torch.ones(1), "ids_mask": 1}, {"ids": torch.ones(2), "ids_mask": 2}]
    with pytest.raises(CollateError, match="'ids_mask' of field 'ids' clashes"):
        MMCollate(fields={"ids": Pad()})(samples)


def test_a_pattern_that_matched_but_lost_is_not_reported():
    collate = MMCollate(fields={"*.x": Pad(), "a.x": AsList()})
    out = collate([{"a": {"x": torch.zeros(2)}}, {"a": {"x": torch.zeros(3)}}])  # warnings are errors here
    assert isinstance(out["a"]["x"], list)


def test_an_index_pattern_does_not_apply_to_every_item():
    items = [{"images": [torch.zeros(2), torch.ones(2)]} for _ in range(2)]
    with pytest.warns(UserWarning, match="'images.0' matched no key path"):
        out = MMCollate(sequences="items", fields={"images.0": AsList()})(items)
    assert out["images"].shape == (2, 2, 2)
    every = MMCollate(sequences="items", fields={"images.*": AsList()})(items)["images"]
    assert [len(sample) for sample in every] == [2, 2]  # sample-major: each sample's items
