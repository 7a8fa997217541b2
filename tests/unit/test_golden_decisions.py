"""The controllers decide as they did when the golden file was written (``tests/golden_decisions.py``
writes it): the scenario benchmark's simulated times through each baseline and ``dynamic``, and a
stream of parameter-server pushes through ``paper``, give the same batch changes, record for record."""

from __future__ import annotations

import json

import pytest

from golden_decisions import GOLDEN, POLICIES, asp_decisions, decisions

KEPT = ("uniform", "static", "paper", "dynamic")
"""The policies whose decisions must not move (``dynamic+prior`` was rebuilt on ``dynamic``)."""


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def now() -> dict:
    return decisions()


def test_bsp_decisions_unchanged(golden: dict, now: dict) -> None:
    keys = [k for k in golden if k.split("/")[1] in KEPT and not k.startswith("asp/")]
    assert len(keys) >= 9 * 2 * len(KEPT)
    moved = [k for k in keys if now[k] != golden[k]]
    assert not moved, moved


def test_asp_paper_decisions_unchanged(golden: dict) -> None:
    assert asp_decisions() == golden["asp/paper/0"]
    assert len(golden["asp/paper/0"]) >= 2  # it did decide


def test_every_policy_still_runs(now: dict) -> None:
    assert {k.split("/")[1] for k in now} == set(POLICIES)
