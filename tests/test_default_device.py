"""Collating under a default device (``with torch.device(...)``, ``torch.set_default_device``).

A batch is built in host memory whatever the default device: ``default_collate`` stacks
CPU samples into CPU tensors there, and so does pincollate, fresh and warm, with and
without policies, and so do the paths that rebuild a batch (pickle, ``to``).
"""

from __future__ import annotations

import contextlib
import pickle
import warnings

import pytest
import torch
from torch.utils.data import default_collate

from pincollate import MMCollate, Pad
from samples import PARITY, RAGGED, assert_one_buffer, assert_same, listing


@contextlib.contextmanager
def _default_device(how: str):
    if how == "context":
        with torch.device("meta"):
            yield
    else:
        torch.set_default_device("meta")
        try:
            yield
        finally:
            torch.set_default_device(None)


@pytest.mark.parametrize("how", ["context", "set_default_device"])
@pytest.mark.parametrize("name", sorted(PARITY))
def test_parity_samples_collate_on_the_host_under_a_default_device(name, how):
    collate = MMCollate(pin_memory=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's hint about lists of arrays, on the reference side
        expected = default_collate(PARITY[name]())
    batches = [PARITY[name]() for _ in range(3)]  # CPU samples, made before the default device is set
    with _default_device(how):
        for samples in batches:  # fresh, then warm
            batch = collate(samples)
            assert_same(batch, expected)
            assert_one_buffer(batch)
        again = pickle.loads(pickle.dumps(batch))
    assert_same(again, expected)


@pytest.mark.parametrize("how", ["context", "set_default_device"])
@pytest.mark.parametrize("name", sorted(RAGGED))
def test_ragged_samples_collate_on_the_host_under_a_default_device(name, how):
    collate = MMCollate(pin_memory=False)
    with listing(name):
        reference = MMCollate(pin_memory=False)(RAGGED[name]())
    batches = [RAGGED[name]() for _ in range(3)]
    with _default_device(how), listing(name):
        for samples in batches:
            batch = collate(samples)
            assert_same(batch, reference)


@pytest.mark.parametrize("how", ["context", "set_default_device"])
def test_a_padded_field_collates_on_the_host_under_a_default_device(how):
    samples = [{"ids": torch.arange(n), "n": n} for n in (3, 5, 2)]
    collate = MMCollate(pin_memory=False, fields={"ids": Pad()})
    reference = MMCollate(pin_memory=False, fields={"ids": Pad()})(samples)
    with _default_device(how):
        for _ in range(3):
            batch = collate(samples)
            assert batch["ids"].device.type == "cpu"
            assert_same(batch, reference)
