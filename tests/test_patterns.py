"""Field patterns: which policy applies at which key path, and what a bad pattern says."""

from __future__ import annotations

import subprocess
import sys
import warnings

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


@pytest.mark.parametrize("compile", [True, False])
def test_a_tuple_pattern_names_keys_that_hold_a_dot_one_entry_per_key(compile):
    samples = [{"v1.2": {"a.b": torch.arange(n), "c": torch.arange(n)}, "img": [torch.zeros(n)]} for n in (2, 3)]
    fields = {("v1.2", "a.b"): Pad(), ("*", "c"): AsList(), ("img", 0): Pad(mask_key=None, lengths_key=None)}
    collate = MMCollate(pin_memory=False, compile=compile, fields=fields)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every pattern matched, no field left ragged
        for _ in range(3):
            out = collate(samples)
    assert out["v1.2"]["a.b"].tolist() == [[0, 1, 0], [0, 1, 2]] and out["v1.2"]["a.b_lengths"].tolist() == [2, 3]
    assert [v.tolist() for v in out["v1.2"]["c"]] == [[0, 1], [0, 1, 2]]
    assert out["img"][0].shape == (2, 3) and out["img"][0][0].tolist() == [0, 0, 0]
    # A dotted string cannot name the key: it is read as two keys and matches nothing.
    assert FieldRules({"v1.2.a.b": Pad()}).lookup(("v1.2", "a.b")) is None


@pytest.mark.parametrize("pattern", [(), ("a", None), ("a", True), ("a", b"x"), ("a", ("b",))], ids=str)
def test_a_malformed_tuple_pattern_is_refused(pattern):
    with pytest.raises(CollateError, match="a field pattern given as a tuple holds one key per entry"):
        MMCollate(fields={pattern: Pad()})


@pytest.mark.parametrize("compile", [True, False])
def test_tuple_entries_name_an_empty_key_and_a_number_key_by_their_text(compile):
    samples = [{"": torch.arange(n), 3.5: torch.arange(n), "c": torch.arange(n)} for n in (2, 3)]
    collate = MMCollate(pin_memory=False, compile=compile, fields={("",): AsList(), (3.5,): Pad(), ("c",): AsList()})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            out = collate(samples)
    assert [v.tolist() for v in out[""]] == [[0, 1], [0, 1, 2]] and out[3.5].shape == (2, 3)


@pytest.mark.slow  # mypy reads torch's stubs: about 45 s
def test_the_fields_type_takes_strings_tuples_and_both_mixed(tmp_path):
    # A dict literal of tuple keys was refused by mypy (a union of mappings gives it no context).
    pytest.importorskip("mypy")
    script = tmp_path / "user.py"
    script.write_text(
        "from pincollate import AsList, ColumnCollate, MMCollate, Pad, Policy\n"
        "MMCollate(fields={('meta', 'v1.2'): AsList()})\n"
        "MMCollate(fields={'a': Pad(), ('img', 0): AsList(), ('m', 3.5): Pad()})\n"
        "named: dict[str, Pad] = {'ids': Pad()}\n"
        "MMCollate(fields=named)\n"
        "ColumnCollate(fields={('a.b',): Pad()})\n"
        "either: dict[str | tuple[str, ...], Policy] = {'a': Pad(), ('b', 'c'): AsList()}\n"
        "MMCollate(fields=either)\n"
    )
    # In a process of its own: mypy's objects (torch's stubs, read) would stay in this one, and every
    # later full collection of the suite's process would walk them.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_policy_must_be_a_policy():
    with pytest.raises(CollateError, match=r"field 'x': expected a policy"):
        MMCollate(fields={"x": "pad"})  # type: ignore[dict-item]


def test_a_pattern_matching_nothing_is_reported_once():
    collate = MMCollate(fields={"typo": Pad()})
    with pytest.warns(UserWarning, match="'typo' matched no key path"):
        collate(_ids(2, 2))
    collate(_ids(2, 2))  # no second warning: filterwarnings=error would fail here


@pytest.mark.parametrize("compile", [True, False])
def test_extra_outputs_must_not_clash_with_keys(compile):
    samples = [{"ids": torch.ones(1), "ids_mask": 1}, {"ids": torch.ones(2), "ids_mask": 2}]
    collate = MMCollate(compile=compile, fields={"ids": Pad()})
    for _ in range(3):  # the error names what holds the name, and how to name the extra
        with pytest.raises(
            CollateError, match=r"'ids_mask' of field 'ids' clashes with the key 'ids_mask' \(a policy's"
        ):
            collate(samples)


@pytest.mark.parametrize("compile", [True, False])
def test_a_clash_between_two_fields_extras_names_both_fields(compile):
    collate = MMCollate(compile=compile, fields={"a": Pad(mask_key="m"), "b": Pad(mask_key="m")})
    samples = [{"a": torch.arange(i + 1), "b": torch.arange(i + 2)} for i in range(3)]
    for _ in range(3):
        with pytest.raises(CollateError, match="'m' of field 'b' clashes with the extra output 'm' of field 'a'"):
            collate(samples)


@pytest.mark.parametrize("compile", [True, False])
def test_two_fields_whose_extras_take_one_name_are_refused_in_every_batch(compile):
    # The second field takes the policy only once its values are all tensors: a collate that
    # compiled the structure while it did not must still refuse the batch, not put one mask over the other.
    import numpy as np

    collate = MMCollate(compile=compile, ragged=Pad(mask_key="m", lengths_key=None))
    mixed = [{"a": torch.ones(4, 3), "b": torch.arange(3)}, {"a": torch.ones(4, 3), "b": np.arange(3)}]
    tensors = [{"a": torch.ones(4, 3), "b": torch.arange(3)}, {"a": torch.ones(4, 3), "b": torch.arange(3)}]
    for _ in range(3):
        assert collate(mixed)["m"].shape == (2, 4)  # only a is padded: no clash
    for _ in range(3):
        with pytest.raises(
            CollateError, match="extra output 'm' of field 'b' clashes with the extra output 'm' of field 'a'"
        ):
            collate(tensors)


@pytest.mark.parametrize("compile", [True, False])
def test_a_key_renamed_to_an_extra_name_or_to_another_key_is_refused(compile):
    onto_extra = MMCollate(compile=compile, fields={"a": Pad(mask_key="m")}, rename={"x": "m"})
    onto_key = MMCollate(compile=compile, rename={"a": "b"})
    for _ in range(3):  # nothing dropped, however many times the structure comes
        with pytest.raises(CollateError, match="extra output 'm' of field 'a' clashes with the key 'm'"):
            onto_extra([{"a": torch.ones(2), "x": 1}, {"a": torch.ones(3), "x": 2}])
        with pytest.raises(CollateError, match=r"rename gives the keys \['a', 'b'\] one name, 'b'") as info:
            onto_key([{"a": torch.ones(2), "b": 1}, {"a": torch.ones(2), "b": 2}])
        assert info.value.path == ()


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
