"""The scenario benchmark (``omnilearn simulate --scenarios``): its oracle, its scores, its input checks
and its outputs. In-process and deterministic: a few seconds in all."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pytest

from omnilearn.cli import main
from omnilearn.control.policies import Bounds
from omnilearn.errors import UserError
from omnilearn.simulate.scenarios import COLUMNS, load_suite, oracle_split, run_policy, run_seeds, run_suite
from omnilearn.simulate.truth import Scenario, SpeedPoint, World, cfs_time, timeline

SMALL = """
defaults:
  steps: 12
  steps_per_epoch: 6
  seeds: 2
scenarios:
  even:
    level: HL1
  skewed:
    speeds: [{at: 0, shares: [1, 1, 0.5, 2]}, {at: 6, shares: [2, 1, 1, 0.5]}]
"""


def world_of(sc: Scenario, seed: int = 0) -> World:
    sc.check("test")
    return World(sc, timeline(sc, "test"), seed)


def brute_force(world: World, bounds: Bounds) -> float:
    """The least max time over every integer split of B within bounds."""
    n, total = world.sc.workers, world.sc.global_batch
    best = np.inf
    for head in itertools.product(range(bounds.min_batch, total + 1), repeat=n - 1):
        last = total - sum(head)
        if bounds.min_batch <= last <= bounds.max_batch[-1] and all(b <= m for b, m in zip(head, bounds.max_batch, strict=False)):
            best = min(best, float(world.fluid(0, np.asarray([*head, last], float)).max()))
    return best


@pytest.mark.parametrize("exponent", [1.0, 1.7])
@pytest.mark.parametrize("fixed", [0.0, 3.0])
def test_oracle_is_optimal_on_a_small_case(exponent: float, fixed: float) -> None:
    sc = Scenario(name="small", workers=3, global_batch=13, speeds=[SpeedPoint(0, [1.0, 0.35, 2.2])],
                  fixed=fixed, exponent=exponent, min_batch=1, max_batch=9)
    world = world_of(sc)
    bounds = Bounds.make(3, 1, 9, 13)
    split = oracle_split(world, 0, bounds)
    assert sum(split) == 13 and all(1 <= b <= 9 for b in split)
    assert float(world.fluid(0, np.asarray(split, float)).max()) == pytest.approx(brute_force(world, bounds), rel=1e-12)


def test_a_worker_on_two_threads_has_its_own_k_in_the_truth_the_oracle_and_the_controller() -> None:
    """Under CFS quotas a share above one core runs on two threads, whose k is ``fixed_threads``: the
    oracle's split is the best integer split under it, and ``dynamic``, told each worker's threads at
    the probe and at every step as the trainers tell it, learns each kind's k apart."""
    sc = Scenario(name="threads", workers=3, global_batch=13, speeds=[SpeedPoint(0, [0.5, 0.25, 1.5])],
                  cfs_period_ms=10.0, fixed=1.0, fixed_threads=6.0, min_batch=1, max_batch=9)
    world = world_of(sc)
    assert world.threads(0).tolist() == [1, 1, 2] and world.fixed(0).tolist() == [1.0, 1.0, 6.0]
    bounds = Bounds.make(3, 1, 9, 13)
    split = oracle_split(world, 0, bounds)
    assert float(world.fluid(0, np.asarray(split, float)).max()) == pytest.approx(brute_force(world, bounds), rel=1e-12)
    hl8 = Scenario(name="hl8-threads", level="HL8", cpus_per_worker=0.5, cfs_period_ms=10.0, fixed=5.0,
                   fixed_threads=25.0, steps=30, steps_per_epoch=10, noise=0.02, host_noise=0.0)
    hl8.check("test")
    world = World(hl8, timeline(hl8, "test"), 0)
    split = np.asarray(oracle_split(world, 0, Bounds.make(4, 2, None, hl8.global_batch or 0)), float)
    records: list[dict] = []
    run_policy(world, "dynamic", np.full(hl8.steps, float(world.fluid(0, split).max())),
               [world.expected(0, split)], records=records)
    last = [r for r in records if r["kind"] == "batch_change"][-1]
    assert last["k_by_worker"][:3] == [pytest.approx(5.0, abs=3)] * 3
    assert last["k_by_worker"][3] == pytest.approx(25.0, abs=10)


def test_cfs_time_runs_a_share_per_period() -> None:
    period = 0.1
    # a whole core is never throttled; a quarter core needs four periods for a quarter period of work
    assert cfs_time(np.array([0.37]), np.array([1.0]), period, np.array([0.3]))[0] == pytest.approx(0.37)
    assert cfs_time(np.array([0.1]), np.array([0.25]), period, np.array([0.0]))[0] == pytest.approx(0.325)
    # work that fits in what is left of the quota runs at full speed; past it, it waits for the next period
    assert cfs_time(np.array([0.01]), np.array([0.25]), period, np.array([0.1]))[0] == pytest.approx(0.01)
    assert cfs_time(np.array([0.01]), np.array([0.25]), period, np.array([0.2]))[0] == pytest.approx(0.085)


def test_uniform_on_equal_speeds_is_the_oracle() -> None:
    sc = Scenario(name="equal", level="HL1", steps=20, steps_per_epoch=10, noise=0.1, host_noise=0.05)
    sc.check("test")
    rows = run_seeds(sc, [0, 1], ["uniform", "static"])
    assert [r["fraction_of_oracle"] for r in rows] == [pytest.approx(1.0, abs=1e-12)] * 4
    assert all(r["settle_steps"] == 0 and r["slower_than_uniform"] == 0 for r in rows)


def test_a_known_skew_is_scored_against_the_oracle() -> None:
    """dynamic finds the skew (near the oracle, its probe paid), uniform cannot (far from it)."""
    sc = Scenario(name="skew", level="HL8", steps=40, steps_per_epoch=10, noise=0.02)
    sc.check("test")
    rows = {r["policy"]: r for r in run_seeds(sc, [0], ["uniform", "dynamic"])}
    assert rows["uniform"]["fraction_of_oracle"] < 0.5
    assert rows["dynamic"]["fraction_of_oracle"] > 0.8
    assert rows["dynamic"]["settle_steps"] is not None and rows["uniform"]["settle_steps"] is None


def test_a_bad_scenario_file_names_the_culprit(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenarios:\n  one:\n    level: HL4\n    wrokers: 8\n")
    with pytest.raises(UserError, match=r"scenarios\.one\.wrokers"):
        load_suite(bad)
    bad.write_text("scenarios:\n  one:\n    level: HL5\n")
    with pytest.raises(UserError, match=r"scenarios\.one.*HL5"):
        load_suite(bad)
    bad.write_text("scenarios:\n  one:\n    noise: 0.1\n")
    with pytest.raises(UserError, match=r"scenarios\.one: needs one of level"):
        load_suite(bad)
    bad.write_text("scenarios: [1, 2]\n")
    with pytest.raises(UserError, match="bad.yaml"):
        load_suite(bad)
    with pytest.raises(UserError, match="not found"):
        load_suite(tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="'fastest'"):
        run_suite(tmp_path / "out", bad, policies=["uniform", "fastest"])
    assert main(["simulate", "--scenarios", str(bad), "--out", str(tmp_path / "out")]) == 2


def test_the_default_suite_loads() -> None:
    suite = load_suite()
    assert len(suite) >= 15 and all(sc.seeds >= 100 for sc in suite)  # at least 100 seeds a scenario
    assert {sc.workers for sc in suite} >= {4, 32, 1000}


def test_a_small_suite_end_to_end(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SMALL)
    out = tmp_path / "out"
    assert main(["simulate", "--scenarios", str(suite), "--out", str(out), "--jobs", "1", "--policies", "uniform",
                 "dynamic", "paper", "static", "dynamic+prior"]) == 0
    with open(out / "scenarios.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    assert len(rows) == 2 * 5 * 2
    assert {r["scenario"] for r in rows} == {"even", "skewed"}
    assert all(0 < float(r["fraction_of_oracle"]) <= 1.2 for r in rows)
    md = (out / "scenarios.md").read_text()
    assert "| skewed | dynamic |" in md and "**suite average**" in md
    assert "scenarios.md" in capfd.readouterr().out
    again = tmp_path / "again"
    assert main(["simulate", "--scenarios", str(suite), "--out", str(again), "--jobs", "1", "--policies", "uniform",
                 "dynamic", "paper", "static", "dynamic+prior"]) == 0
    assert (again / "scenarios.csv").read_text() == (out / "scenarios.csv").read_text()  # deterministic per seed
