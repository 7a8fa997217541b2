"""Per-rank straggler scores: from a run's steps (samples per compute-second) and from emulate's busy time
(CPU time ran per busy second), in summary.json, the printed tables and TensorBoard."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_worker_models import UNIFORM, C, make_run

from omnilearn import config
from omnilearn.emulator.backends import NullBackend
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.launch import emulate
from omnilearn.report.stragglers import WINDOW_SCANS, WINDOW_STEPS, StragglerScores, step_scores
from omnilearn.report.table import emulate_table, worker_table


def step(batch: int, ms: float, global_batch: int = 32) -> dict[str, Any]:
    return {"kind": "step", "batch": batch, "compute_ms": ms, "global_batch": global_batch}


def test_scores_from_known_step_times() -> None:
    """Rank 0: 20 samples in 100 ms (200/s) throughout. Rank 1: 12 in 120 ms (100/s), then 12 in 240 ms
    (50/s) over the last window; a partial step (an epoch's end) in the middle is nobody's speed."""
    n = 3 * WINDOW_STEPS
    fast = [step(20, 100.0) for _ in range(n)]
    slow = [step(12, 120.0) for _ in range(n - WINDOW_STEPS)] + [step(12, 240.0) for _ in range(WINDOW_STEPS)]
    fast.insert(WINDOW_STEPS + 1, step(10, 50.0, global_batch=10))
    slow.insert(WINDOW_STEPS + 1, step(0, 400.0, global_batch=10))
    assert step_scores([fast, slow]) == [{"relative": 1.0, "individual": 1.0},
                                         {"relative": 0.25, "individual": 0.5}]


def test_a_short_run_is_scored_on_its_open_window_and_idle_ranks_on_nothing() -> None:
    scores = StragglerScores(3, window=10)
    for _ in range(4):
        scores.add(0, 30.0, 0.1)
        scores.add(1, 10.0, 0.1)
        scores.add(2, 0.0, 0.0)  # a rank that never ran
    assert scores.scores() == [{"relative": 1.0, "individual": 1.0}, {"relative": 0.3333, "individual": 1.0},
                               {"relative": None, "individual": None}]


def test_a_recorded_run_has_its_scores_in_summary_json_and_the_table(tmp_path: Path) -> None:
    summary = json.loads((make_run(tmp_path, "uniform", UNIFORM, 0.0, 1) / "summary.json").read_text())
    # equal batches, compute time c_i (b + k): speeds in proportion to 1 / c_i, constant over the run
    want = [round(min(C) / c, 4) for c in C]
    assert [s["relative"] for s in summary["straggler_scores"]] == want
    assert [s["individual"] for s in summary["straggler_scores"]] == [1.0, 1.0, 1.0]
    console = Console(record=True, width=200)
    console.print(worker_table(summary))
    text = console.export_text()
    assert "relative" in text and "individual" in text and "0.25" in text


class Schedstat:
    """Each scan, rank 0's process runs 0.2 s of 0.2 s busy; rank 1's 0.05 s of 0.2 s busy, then (its last
    window) 0.025 s."""

    def __init__(self, scans: int) -> None:
        self.calls = {11: 0, 12: 0}
        self.scans = scans
        self.totals = {11: [0.0, 0.0], 12: [0.0, 0.0]}

    def __call__(self, pid: int) -> tuple[float, float]:
        self.calls[pid] += 1
        slow_now = self.calls[pid] > self.scans - WINDOW_SCANS
        ran = 0.2 if pid == 11 else (0.025 if slow_now else 0.05)
        self.totals[pid][0] += ran
        self.totals[pid][1] += 0.2
        return self.totals[pid][0], self.totals[pid][1]


def emulate_job(tmp_path: Path) -> JobSpec:
    cfg = config.build(None, [("workers", 2), ("emulation.backend", "none"), ("emulation.hl", "HL1")])
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=build_plan(cfg, host=[0, 1]), out_dir=tmp_path, backend="none")
    job.log_dir.mkdir(parents=True)
    job.save()
    return job


def test_emulate_scores_an_unmodified_job_from_busy_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scans = 3 * WINDOW_SCANS
    monkeypatch.setattr(emulate, "descendants", lambda root: [11, 12])
    monkeypatch.setattr(emulate, "rank_of", {11: 0, 12: 1}.get)
    monkeypatch.setattr(emulate, "cpu_seconds", lambda pid: 1.0)
    monkeypatch.setattr(emulate, "schedstat_seconds", Schedstat(scans))
    watch = emulate.RankWatch(NullBackend(), ("worker1", "worker2"))
    for _ in range(scans):
        watch.scan(1)
    scores = watch.stragglers.scores()
    assert scores == [{"relative": 1.0, "individual": 1.0}, {"relative": 0.125, "individual": 0.5}]
    job = emulate_job(tmp_path)
    seconds, busy = watch.totals()
    emulate.write_summary(job, 0.0, seconds, busy, 2, None, scores)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["straggler_scores"] == scores
    console = Console(record=True, width=200)
    console.print(emulate_table(summary))
    assert "0.12" in console.export_text()


def test_a_scripts_own_scores_stay_under_emulate(tmp_path: Path) -> None:
    job = emulate_job(tmp_path)
    own = [{"relative": 1.0, "individual": 0.9}, {"relative": 0.5, "individual": 1.0}]
    (tmp_path / "summary.json").write_text(json.dumps({"straggler_scores": own}))
    emulate.write_summary(job, 0.0, [1.0, 1.0], [1.0, 2.0], 2, None,
                          [{"relative": 1.0, "individual": 1.0}, {"relative": 0.1, "individual": 1.0}])
    assert json.loads((tmp_path / "summary.json").read_text())["straggler_scores"] == own


def test_omnilearn_report_shows_an_emulated_commands_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from omnilearn.cli.manage import cmd_report

    job = emulate_job(tmp_path)
    emulate.write_summary(job, 0.0, [3.0, 3.0], [3.0, 6.0], 2, None,
                          [{"relative": 1.0, "individual": 1.0}, {"relative": 0.4321, "individual": 0.8765}])
    assert cmd_report(argparse.Namespace(out=str(tmp_path))) == 0  # omnilearn report OUT
    out = capsys.readouterr().out
    assert "individual" in out and "0.43" in out and "0.88" in out


def test_tensorboard_gets_the_scores_live(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from omnilearn.observe.tensorboard import LiveTensorBoard

    folder = make_run(tmp_path / "run", "uniform", UNIFORM, 0.0, 1)
    job = JobSpec.load(folder / "job.json", out_dir=folder)
    board = LiveTensorBoard(job, stragglers=StragglerScores(3, WINDOW_STEPS))
    board.update()
    board.writer.close()
    name = job.plan.target(0)
    events = EventAccumulator(str(folder / "tensorboard" / f"straggler_relative_{name}")).Reload()
    values = [e.value for e in events.Scalars("straggler/relative")]
    assert values and values[-1] == pytest.approx(min(C) / C[0], abs=1e-3)


def test_a_rewritten_summary_keeps_emulates_measurements_and_its_own_scores(tmp_path: Path) -> None:
    from omnilearn.report.summary import summarize

    folder = make_run(tmp_path, "uniform", UNIFORM, 0.0, 1)
    job = JobSpec.load(folder / "job.json", out_dir=folder)
    job.log_dir.mkdir(parents=True, exist_ok=True)
    own = json.loads((folder / "summary.json").read_text())["straggler_scores"]
    emulate.write_summary(job, 0.0, [1.0] * 3, [1.0, 2.0, 4.0], 3, None, [{"relative": 0.5, "individual": 0.5}] * 3)
    again = summarize(folder)  # omnilearn report OUT
    assert again["busy_seconds"] == [1.0, 2.0, 4.0] and again["command"] == "emulate"
    assert again["straggler_scores"] == own and again["allocations"] == [0.5, 1.0, 2.0]
