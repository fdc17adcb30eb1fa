"""The leaf ops of a cached plan: what each per-batch check relies on, and that it holds."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import CollateError, MMCollate
from pincollate._plan.ops import JOIN_BYTES
from samples import assert_identical

_DTYPES = sorted({value for value in vars(torch).values() if isinstance(value, torch.dtype)}, key=str)


def _promote(a: torch.dtype, b: torch.dtype) -> torch.dtype | None:
    try:
        return torch.promote_types(a, b)
    except RuntimeError:
        return None


def test_a_promotion_fold_that_leaves_a_dtype_never_comes_back_to_it():
    # What a small block's check (_ops._stack_joined) rests on: if a field's first value
    # has the block's dtype and the whole block promotes to it, every value of every field
    # promotes to it. Checked over every dtype pair of the installed torch.
    returns = []
    for start, other in itertools.product(_DTYPES, repeat=2):
        left = _promote(start, other)
        if left is None or left == start:
            continue
        returns += [(start, other, third) for third in _DTYPES if _promote(left, third) == start]
    assert not returns, returns[:5]


def _block(dtypes_a: list[torch.dtype], dtype_b: torch.dtype = torch.float32, size: int = 4) -> list[dict]:
    return [
        {"a": torch.full((size,), i + 0.5).to(dtype), "b": torch.full((size,), i).to(dtype_b)}
        for i, dtype in enumerate(dtypes_a)
    ]


@pytest.mark.parametrize("size", [4, JOIN_BYTES // 4 + 1], ids=["joined", "read"])
@pytest.mark.parametrize(
    "dtypes",
    [
        [torch.float32, torch.float64, torch.float32],  # one value above the block's dtype
        [torch.float32, torch.float16, torch.bfloat16],  # below it: promotes to float32 within the field
        [torch.float16, torch.float16, torch.float16],  # a whole field below the block's dtype
        [torch.float16, torch.float32, torch.float32],  # the field's first value below it
        [torch.float32, torch.int64, torch.float32],  # an int value in a float field
        [torch.int64, torch.int64, torch.int64],  # a field of another kind
    ],
)
def test_a_warm_block_gives_default_collate_for_a_field_of_other_dtypes(dtypes, size):
    collate = MMCollate(pin_memory=False)
    warm = _block([torch.float32] * 3, size=size)
    collate(warm)
    collate(warm)  # the cached plan: "a" and "b" one block
    batch = _block(dtypes, size=size)
    assert_identical(collate(batch), default_collate(batch))
    assert_identical(collate(warm), default_collate(warm))


def test_a_small_block_of_sparse_tensors_gets_a_fresh_collates_error():
    sparse = [{"a": torch.ones(4).to_sparse(), "b": torch.ones(4).to_sparse()} for _ in range(2)]
    with pytest.raises(CollateError) as fresh:
        MMCollate(pin_memory=False)(sparse)
    collate = MMCollate(pin_memory=False)
    warm = _block([torch.float32] * 2)
    collate(warm)
    collate(warm)
    with pytest.raises(CollateError) as info:
        collate(sparse)
    assert str(info.value) == str(fresh.value)


def test_a_small_block_is_checked_by_its_stack_and_a_large_one_by_reading():
    # The fast path: were the promotion check bypassed (every block read value by value),
    # the results above would not change; this says which path each block takes.
    from pincollate._plan import ops as _ops

    for size, joined in ((4, True), (JOIN_BYTES // 4 + 16, False)):  # rows of 64-byte multiples: a block
        collate = MMCollate(pin_memory=False)
        collate(_block([torch.float32] * 3, size=size))
        (block,) = collate._plans.last.op.blocks
        assert block.joined is joined
        assert (getattr(block.fill, "func", None) is _ops._stack_joined) is joined


def test_a_warm_block_of_plain_tensors_is_checked_by_one_call_not_by_reading_classes(monkeypatch):
    # The fast path of a block's class check: one has_torch_function call over the block's
    # values answers it. Were it bypassed (every value's class read), the results would not
    # change; this says the call answers for plain tensors, and a subclass still keeps its class.
    from pincollate._plan import ops as _ops

    calls: list[bool] = []
    real = _ops.HAS_TORCH_FUNCTION

    def counted(values):
        calls.append(found := real(values))
        return found

    collate = MMCollate(pin_memory=False)
    collate(_block([torch.float32] * 3))
    # The plan's generated function reads it from its own namespace.
    monkeypatch.setitem(collate._plans.last.compiled.run.__globals__, "HAS_TORCH_FUNCTION", counted)
    assert_identical(collate(_block([torch.float32] * 3)), default_collate(_block([torch.float32] * 3)))
    assert calls == [False]
    tagged = [
        {key: value.as_subclass(_Tagged) for key, value in sample.items()} for sample in _block([torch.float32] * 3)
    ]
    assert_identical(collate(tagged), default_collate(tagged))
    assert calls[1] is True


class _Tagged(torch.Tensor):
    """A subclass with torch's own __torch_function__: the block reads classes to keep it."""
