"""The ASP benchmark: its problems' optima, its files, its errors, and the controller's moves."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from omnilearn.control.asp import AsyncController
from omnilearn.control.policies import Bounds
from omnilearn.errors import UserError
from omnilearn.simulate.asp_problems import Logistic, Quadratic, make_problem
from omnilearn.simulate.asp_scenarios import COLUMNS, load_suite, rule_maker, run_suite
from omnilearn.simulate.asp_world import AsyncRun
from omnilearn.simulate.truth import World, timeline

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


def test_the_fixed_family_holds_uniform_and_equal_rates_within_the_bounds() -> None:
    from omnilearn.control.policies import Bounds
    from omnilearn.simulate.asp_scenarios import fixed_family

    bounds = Bounds.make(4, 2, 40, 64)
    family = fixed_family([0.5, 0.5, 1 / 3, 8 / 3], 16.0, bounds, 64)
    assert [16, 16, 16, 16] in family  # uniform: the fast worker's b_ref, power 0
    assert [3, 3, 2, 16] in family  # equal compute times, the fast worker at b_ref
    assert all(sum(s) <= 64 and all(2 <= b <= 40 for b in s) for s in family)
    assert len({tuple(s) for s in family}) == len(family)


def test_a_run_given_its_splits_holds_each_rows_own(tmp_path: Path) -> None:
    from omnilearn.simulate.asp_problems import make_problem
    from omnilearn.simulate.asp_scenarios import rule_maker
    from omnilearn.simulate.asp_world import run_async
    from omnilearn.simulate.truth import World, timeline

    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    sc = next(s for s in load_suite(suite) if s.name == "skewed")
    world = World(sc, timeline(sc, "test"), 0)
    first = np.asarray([[8, 8, 8, 8], [2, 2, 2, 8], [4, 4, 2, 16]])
    trace = run_async(world, 3, make_problem(sc.problem, sc.gradient_noise), rule_maker(sc), sc.lr, 1, "uniform",
                      sc.push, sc.server_ms, first=first)
    assert trace.batches == first.tolist()
    updates = np.sum(~np.isnan(trace.time), axis=0)
    assert updates[1] > updates[0]  # the same samples in smaller pushes: more updates


def test_best_fixed_is_asked_for_by_name_and_holds_its_split(tmp_path: Path) -> None:
    from omnilearn.simulate.asp_scenarios import run_scenario

    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    from omnilearn.simulate.asp_scenarios import DEFAULT_POLICIES

    assert "best-fixed" not in DEFAULT_POLICIES  # it knows the shares: asked for by name only
    skewed = next(sc for sc in load_suite(suite) if sc.name == "skewed")
    rows, info = run_scenario(skewed, ["uniform", "best-fixed"])
    split = info["runs"]["best-fixed"]["batch"]
    assert sum(split) <= 32 and info["runs"]["best-fixed"]["holds"]["splits tried"] > 1
    assert len([r for r in rows if r["policy"] == "best-fixed"]) == skewed.seeds
    equal = next(sc for sc in load_suite(suite) if sc.name == "equal")
    _, info = run_scenario(equal, ["uniform", "best-fixed"])
    assert len(set(info["runs"]["best-fixed"]["batch"])) == 1  # equal shares: every candidate an equal split


def test_a_scenario_whose_step_makes_no_progress_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.replace("params: {level: HL8, push: parameters}",
                                   "params: {level: HL8, problem: logistic, lr: 0.5}"))
    from omnilearn.simulate.asp_scenarios import run_scenario

    diverging = next(sc for sc in load_suite(suite) if sc.name == "params")
    with pytest.raises(UserError, match="ASP scenario params: its target .* is not below"):
        run_scenario(diverging, ["uniform"])
    diverging.lr = 0.005
    rows, _ = run_scenario(diverging, ["uniform"])
    assert len(rows) == diverging.seeds


def test_the_reference_processes_the_equal_splits_samples_a_second(tmp_path: Path) -> None:
    from omnilearn.simulate.asp_problems import make_problem
    from omnilearn.simulate.asp_scenarios import rule_maker
    from omnilearn.simulate.asp_world import run_reference
    from omnilearn.simulate.truth import World, timeline

    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    sc = next(s for s in load_suite(suite) if s.name == "skewed")
    world = World(sc, timeline(sc, "test"), 0)
    ref = run_reference(world, 2, make_problem(sc.problem, sc.gradient_noise), rule_maker(sc), sc.lr, 1)
    b = np.full(4, 8.0)
    cycles = world.fluid(0, b) + sc.sync_ms / 1e3  # each worker's compute and its pull and push
    assert ref.end[0] == pytest.approx(sc.steps * 32 / float((b / cycles).sum()))


def test_many_slow_workers_are_idled_and_push_nothing_while_idle(tmp_path: Path) -> None:
    """16 workers at HL8: dynamic idles the slowest (their late pushes cost the fast ones more than they
    give); an idle worker pushes nothing until a move wakes it, and every seed's run still ends."""
    suite = tmp_path / "suite.yaml"
    suite.write_text("defaults: {workers: 16, global_batch: 256, steps: 60, steps_per_epoch: 20, seeds: 4,"
                     " sync_ms: 2.0, lr: 0.05}\nscenarios:\n  many: {level: HL8}\n")
    sc = load_suite(suite)[0]
    world = World(sc, timeline(sc, "test"), 0)
    bounds = Bounds.make(16, sc.min_batch, sc.max_batch, 256)
    run = AsyncRun(world, sc.seeds, make_problem(sc.problem, sc.gradient_noise), rule_maker(sc), sc.lr, 1, "dynamic",
                   sc.push, sc.server_ms, lambda: AsyncController(256, bounds, sc.delay_tolerance), None)
    shares = np.asarray(world.line.shares[0])
    idle_seen = idle_pushes = 0
    while True:
        idle, applied = run.batch == 0, run.applied_at.copy()
        if not run.event():
            break
        idle_seen += int(idle[:, shares < 1.0].sum())
        assert not idle[:, shares == shares.max()].any()  # the fastest workers are never idle
        # a worker idle before the event and still idle after it did not push in it (a woken one starts anew)
        idle_pushes += int(((run.applied_at != applied) & idle & (run.batch == 0)).sum())
    assert (run.samples >= run.total).all() and idle_seen > 0 and idle_pushes == 0
