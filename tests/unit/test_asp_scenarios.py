"""The ASP benchmark: its problems' optima, its files, its errors, and the controller's moves."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from omnilearn.errors import UserError
from omnilearn.simulate.asp_problems import Logistic, Quadratic
from omnilearn.simulate.asp_scenarios import COLUMNS, load_suite, run_suite

SUITE = """
defaults: {workers: 4, global_batch: 32, steps: 40, steps_per_epoch: 20, seeds: 6, sync_ms: 2.0, lr: 0.05}
scenarios:
  equal: {level: HL1}
  skewed: {level: HL8, delay_tolerance: 4}
  params: {level: HL8, push: parameters}
"""


def test_the_problems_know_their_optimum() -> None:
    q = Quadratic(dim=10)
    assert float(q.excess(torch.zeros(1, 10, dtype=torch.float64))[0]) == 0.0
    g = torch.Generator().manual_seed(0)
    noisy = torch.stack([q.gradient(torch.zeros(1, 10, dtype=torch.float64), torch.tensor([[4.0]]), g)[0]
                         for _ in range(4000)])
    assert torch.allclose(noisy.var(0), q.h / 4, rtol=0.1)  # the noise covariance H / b
    lg = Logistic(points=512)
    zero = torch.zeros(1, lg.dim, dtype=torch.float64)
    assert float(lg.excess(zero)[0]) > 0.0
    full = lg.gradient(zero, torch.tensor([[20000.0]], dtype=torch.float64), g)  # nearly the full gradient
    assert float(full.norm()) > 0.01


def test_the_suite_writes_its_csv_and_table(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    result = run_suite(tmp_path / "out", suite, jobs=1)
    rows = list(csv.DictReader((tmp_path / "out" / "asp_scenarios.csv").open()))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) == 3 * 3 * 6  # scenarios x policies x seeds
    assert {r["push"] for r in rows if r["scenario"] == "params"} == {"parameters"}
    table = (tmp_path / "out" / "asp_scenarios.md").read_text()
    assert "| skewed | dynamic |" in table and "## Scenarios" in table
    lines = {(ln["scenario"], ln["policy"]): ln for ln in result["lines"]}
    assert lines[("equal", "uniform")]["ratio"] == pytest.approx(1.0)
    for r in rows:
        assert float(r["reference_loss"]) >= 0 and (r["time_to_target_s"] == "" or float(r["time_to_target_s"]) > 0)


def test_dynamic_moves_where_its_model_says_a_split_pays(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    from omnilearn.simulate.asp_scenarios import run_scenario

    skewed = next(sc for sc in load_suite(suite) if sc.name == "skewed")
    _, info = run_scenario(skewed, ["uniform", "dynamic"])
    assert info["runs"]["uniform"]["batch"] == [8, 8, 8, 8]
    moved = info["runs"]["dynamic"]["batch"]
    assert sum(moved) <= 32 and moved[3] > 8  # towards equal update rates: the 32-core worker takes more
    equal = next(sc for sc in load_suite(suite) if sc.name == "equal")
    _, info = run_scenario(equal, ["uniform", "dynamic"])
    fresher = info["runs"]["dynamic"]["batch"]
    # equal workers under a step that tolerates one unit: smaller pushes, as fresh for every worker
    assert len(set(fresher)) == 1 and sum(fresher) < 32
    assert not math.isnan(info["target"]) and info["target"] > 0


@pytest.mark.parametrize("text,message", [
    ("scenarios: {a: {level: HL8, problem: mnist}}", "scenarios.a.problem: must be one of nqm, logistic"),
    ("scenarios: {a: {level: HL8, push: weights}}", "scenarios.a.push: must be one of gradients, parameters"),
    ("scenarios: {a: {level: HL8, lr: 0}}", "needs lr > 0"),
    ("scenarios: {a: {level: HL8, push: parameters, update: scaled-gradient}}", "push parameters steps"),
    ("scenarios: {a: {level: HL8, bogus: 1}}", "unknown key 'scenarios.a.bogus'"),
    ("scenarios: {a: {}}", "needs one of level, schedule, trace or speeds"),
    ("oops: 1", "expected a mapping with 'scenarios'"),
])
def test_a_bad_suite_is_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    suite = tmp_path / "bad.yaml"
    suite.write_text(text)
    with pytest.raises(UserError, match=message):
        load_suite(suite)


def test_the_default_suite_loads() -> None:
    suite = load_suite()
    assert len(suite) >= 15 and all(sc.seeds >= 100 for sc in suite)
    assert {sc.workers for sc in suite} >= {4, 8, 16, 64}
    assert {sc.optimizer for sc in suite} == {"sgd", "adamw"} and {sc.push for sc in suite} == {"gradients", "parameters"}
    assert np.isfinite([sc.lr for sc in suite]).all()
