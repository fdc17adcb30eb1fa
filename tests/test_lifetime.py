"""The lifetime fuzzer's bounded run: every configuration, a fixed seed, nothing left behind.

``make fuzz`` runs the same program for 100,000 steps (see ``tests/lifetime.py``).
"""

from __future__ import annotations

import pytest

import lifetime

pytestmark = pytest.mark.slow

STEPS = {"fork": 500, "spawn": 300}  # spawned workers take seconds to start


@pytest.mark.parametrize("config", lifetime.CONFIGS, ids=str)
def test_every_value_held_keeps_its_bytes(no_leaks, config):
    counts = lifetime.run(config, seed=11, steps=STEPS[config.context])
    # The program did what it is for: each escape was tried, more than once.
    for what in ("numpy view", "storage", "slice", "sent", "share_memory_", "tensor returned beside a batch"):
        assert counts.get(what, 0) >= 3, (what, counts)
