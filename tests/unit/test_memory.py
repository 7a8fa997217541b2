"""Memory-aware batch bounds: budgets from cgroups, the probe's model, and real memory-limited runs."""

from __future__ import annotations

import pytest

from omnilearn.emulator.spec.plan import parse_memory
from omnilearn.errors import UserError
from omnilearn.train.memory import MemoryBudget, MemoryModel


def test_parse_memory() -> None:
    assert parse_memory("600M", "x") == 600 * 2**20
    assert parse_memory("1.5G", "x") == int(1.5 * 2**30)
    assert parse_memory("2GiB", "x") == 2 * 2**30
    assert parse_memory(4096, "x") == 4096
    for bad in ("lots", -1, "0M", True):
        with pytest.raises(UserError, match="memory size"):
            parse_memory(bad, "x")


def test_memory_model_bound() -> None:
    m = MemoryModel(base=800 * 2**20, per_sample=8 * 2**20, budget=MemoryBudget(1200 * 2**20, "test"), margin=0.1)
    assert m.max_batch() == int((1200 * 0.9 - 800) // 8)
    tight = MemoryModel(base=800 * 2**20, per_sample=2**20, budget=MemoryBudget(700 * 2**20, "test"), margin=0)
    assert tight.max_batch() == 0
