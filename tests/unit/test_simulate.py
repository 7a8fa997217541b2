"""The simulator (``omnilearn simulate``) on a synthetic finished run folder: no process is started.

The run folder is written here in the trainers' record format: two workers whose compute times
follow known lines ``a + c * b`` at one level (0.4 and 1.6 CPUs), with batches that change once,
so that the fitted models can be checked against the lines that made them.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.cli import main
from omnilearn.control import controller as control
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.metrics import MetricsWriter, metrics_path, read_rank
from omnilearn.report.summary import summarize
from omnilearn.simulate import load_run, simulate

LINES = [(0.020, 0.010), (0.005, 0.0025)]  # (a, c) seconds of worker1 and worker2: worker2 4x as fast
BATCHES = [[32, 32]] * 4 + [[13, 51]] * 8  # uniform for 4 steps, then a split (12 steps: 2 epochs)
SYNC_S = 0.030


def make_run(folder: Path, shared: list[float] | None = None, batches: list[list[int]] = BATCHES,
             start_up: tuple[int, int] | None = None) -> Path:
    """A finished 2-worker BSP run (2 epochs of 6 steps, B = 64) with exact compute times (``shared``:
    each step's factor on both workers' times, a host that slows whole steps); ``batches``: each step's
    split; ``start_up``: the two sizes of a start-up pass every worker records, on the same lines."""
    cfg = config.build(None, [("workers", 2), ("model.name", "smallcnn"), ("data.name", "synthetic"),
                              ("data.synthetic_size", 384), ("train.epochs", 2), ("train.global_batch", 64),
                              ("emulation.allocation", "quota"),
                              ("emulation.hl", "SKEW"), ("emulation.levels", {"SKEW": [0.4, 1.6]})])
    plan = build_plan(cfg, host=[0, 1])
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=folder, backend="synthetic")
    job.save()
    clock = 100.0
    writers = [MetricsWriter(metrics_path(folder, r)) for r in range(2)]
    for r, w in enumerate(writers):
        w.write("start", rank=r, world=2, target=f"worker{r + 1}", policy="uniform", params=1000, train_samples=384,
                steps_per_epoch=6, time=clock)
        w.write("hl_change", step=0, from_level=None, level="SKEW", epoch=0.0, status="applied", time=clock)
        w.write("batch_change", step=0, batch=batches[0], reason="initial", time=clock)
        if start_up:
            a, c = LINES[r]
            w.write("start_up", sizes=list(start_up), times_ms=[(a + c * b) * 1e3 for b in start_up], cpu=False,
                    level="SKEW", time=clock)
    start = clock
    for k, batch in enumerate(batches):
        times = [(a + c * b) * (shared[k] if shared else 1.0) for (a, c), b in zip(LINES, batch, strict=True)]
        clock += max(times) + SYNC_S
        for r, w in enumerate(writers):
            w.write("step", step=k + 1, epoch=k // 6, batch=batch[r], global_batch=64,
                    compute_ms=times[r] * 1e3, sync_ms=(max(times) - times[r] + SYNC_S) * 1e3, level="SKEW",
                    cpus=[0.4, 1.6][r], threads=[1, 2][r], time=clock)
        if k == 3 and batches[4] != batch:
            writers[0].write("batch_change", step=4, batch=batches[4], reason="compute-time", time=clock)
    for r, w in enumerate(writers):
        if r == 0:
            w.write("eval", epoch=1, step=12, accuracy=0.5, loss=1.0, elapsed_s=clock - start, time=clock)
        w.write("end", wall_time_s=clock - start + 1.0, train_time_s=clock - start, samples=768, steps=12,
                batch=batches[-1], level="SKEW", epochs=2.0, time=clock + 1.0)
        w.close()
    return folder


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run")


def test_models_recover_the_lines_that_made_the_run(run: Path) -> None:
    models = load_run(run)
    for rank, (a, c) in enumerate(LINES):
        m = models.model(rank, "SKEW")
        assert m.a == pytest.approx(a, rel=1e-6, abs=1e-9) and m.c == pytest.approx(c, rel=1e-6)
    assert models.allreduce.seconds(2) == pytest.approx(SYNC_S)


def test_simulate_writes_a_real_runs_summary_keys_plus_decision_time(run: Path, tmp_path: Path) -> None:
    real = summarize(run)
    out = tmp_path / "sim"
    assert main(["simulate", "--replay", str(run), "--out", str(out), "--noise", "0"]) == 0
    sim = json.loads((out / "summary.json").read_text())
    assert set(real) <= set(sim)
    assert isinstance(sim["decision_ms"], float) and sim["decision_ms"] >= 0
    assert (out / "run.png").is_file()
    assert sim["workers"] == 2 and sum(sim["batch_sizes"]) == 64
    # the dynamic controller moves batches toward the 4x faster worker
    assert sim["batch_sizes"][1] > 2 * sim["batch_sizes"][0]


def test_more_workers_repeat_the_measured_workers_models_in_turn(run: Path, tmp_path: Path) -> None:
    sim = simulate(run, tmp_path / "sim", workers=6, policy="uniform", noise=0.0, figures=False)
    assert sim["workers"] == 6 and sim["global_batch"] == 192 and sim["batch_sizes"] == [32] * 6
    first = [next(r for r in read_rank(tmp_path / "sim", k) if r["kind"] == "step") for k in range(6)]
    for k, rec in enumerate(first):
        a, c = LINES[k % 2]
        assert rec["compute_ms"] == pytest.approx((a + c * 32) * 1e3, rel=1e-4)
        assert rec["cpus"] == [0.4, 1.6][k % 2]


def test_the_trainers_controller_class_takes_the_decisions(run: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class Counting(control.DynamicController):
        def decide(self, cpu_shares=None, steps_left=None, cost=None):
            calls.append(self.workers)
            return super().decide(cpu_shares, steps_left, cost)

    monkeypatch.setitem(control.STEP_DRIVEN, "dynamic", Counting)
    sim = simulate(run, tmp_path / "sim", noise=0.0, figures=False)
    # every step's decision point, and the probe's first split
    assert len(calls) == sim["simulated"]["decisions"] + 1 == sim["steps"] + 1 and set(calls) == {2}


def test_a_thousand_workers_report_the_decision_time(run: Path, tmp_path: Path) -> None:
    sim = simulate(run, tmp_path / "sim", workers=1000, epochs=1, figures=False)
    assert sim["workers"] == 1000 and sum(sim["batch_sizes"]) == 32000
    assert sim["decision_ms"] is not None and sim["simulated"]["decisions"] == 6


def test_a_folder_that_is_no_run_is_one_clear_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--replay", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a run folder" in capfd.readouterr().err


def test_the_simulators_decisions_replay_through_the_one_loop(run: Path, tmp_path: Path) -> None:
    """The simulator drives the trainers' control loop: its recorded inputs give its recorded decisions."""
    from jobs import decisions_replay

    simulate(run, tmp_path / "sim", noise=1.0, figures=False)
    recorded, replayed = decisions_replay(tmp_path / "sim")
    assert [r["reason"] for r in recorded][:2] == ["initial", "probe"] and recorded[1]["batch"] != recorded[0]["batch"]
    assert recorded == replayed


def test_a_slowdown_every_worker_of_a_step_shares_is_replayed_as_one_draw_a_step(tmp_path: Path) -> None:
    """Noise the workers of a step share is the step's, not each worker's: drawn for each worker apart, it
    would make every balanced step wait for the slower of two draws (+4% here, the all-reduce aside)."""
    rng = random.Random(1)
    run = make_run(tmp_path / "run", shared=[rng.lognormvariate(0.0, 0.2) for _ in BATCHES])
    models = load_run(run)
    assert 0.1 < models.common["SKEW"] < 0.4
    assert all(models.model(r, "SKEW").sigma < 0.01 for r in (0, 1))  # no worker's own scatter
    calm = simulate(run, tmp_path / "calm", policy="static", noise=0.0, figures=False)["train_time_s"]
    noisy = [simulate(run, tmp_path / f"s{seed}", policy="static", seed=seed, figures=False)["train_time_s"]
             for seed in range(30)]
    # one draw a step: the mean step is the calm one times the draws' mean, exp(sigma^2 / 2): 1.005 here
    # (seeded), where a draw for each worker gave 1.042
    assert 1.0 < statistics.fmean(noisy) / calm < 1.025
