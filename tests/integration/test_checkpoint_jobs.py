"""BSP checkpoints in whole jobs: a changed config is refused on resume, a killed worker restarts from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import live_workers, wait_until
from omnilearn import config
from omnilearn.files import read_records
from omnilearn.train import checkpoint


def test_resume_with_a_changed_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from omnilearn.emulator.spec.plan import build_plan
    from omnilearn.jobfile import JobSpec
    from omnilearn.launch.runfolder import prepare_out

    out = prepare_out(str(tmp_path / "run"), False)
    cfg = config.build(None, [("model.name", "smallcnn"), ("data.name", "synthetic")])
    JobSpec("j", cfg, build_plan(cfg), out, "none").save()
    checkpoint.save(checkpoint.checkpoint_path(out, "bsp"), {}, cfg)
    run = [sys.executable, "-m", "omnilearn", "run", "--resume", str(out), "--no-progress"]
    r = subprocess.run([*run, "--set", "train.lr=0.5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "made under another config" in r.stderr, r.stderr
    (out / ".omnilearn-run").unlink()
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a run folder of omnilearn" in r.stderr, r.stderr
    assert not (out / "metrics" / "rank-0.jsonl").exists()


def _job(out: Path, restarts: int) -> list[str]:
    return [sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset", "synthetic", "--workers",
            "2", "--epochs", "3", "--global-batch", "64", "--policy", "uniform", "--set", "data.synthetic_size=2560",
            "--set", "checkpoint.every=1", "--set", f"fault.max_restarts={restarts}", "--out", str(out),
            "--no-progress"]


def _steps(out: Path) -> list[tuple[int, int, int]]:
    """(step, epoch, checksum of the step's samples over both ranks) of every step the run kept."""
    ranks = [[r for r in read_records(out / "metrics" / f"rank-{k}.jsonl") if r["kind"] == "step"] for k in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])
    return [(a["step"], a["epoch"], a["sample_sum"] + b["sample_sum"]) for a, b in zip(*ranks, strict=True)]


def test_a_killed_bsp_worker_restarts_from_the_checkpoint_and_sees_the_same_samples(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    r = subprocess.run(_job(whole, 0), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen(_job(out, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics" / "rank-1.jsonl"
    wait_until(proc, lambda: metrics.exists() and '"epoch":1' in metrics.read_text(), "second epoch")
    victim = [live_workers(out)[1]]
    os.kill(victim[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert "restarting from its checkpoint" in output
    s, w = json.loads((out / "summary.json").read_text()), json.loads((whole / "summary.json").read_text())
    assert [x["cause"] for x in s["restarts"]] == ["worker rank 1 died: SIGKILL"]
    assert _steps(out) == _steps(whole)  # the same samples in the same steps, none twice
    assert s["samples"] == w["samples"] and s["epochs_done"] == w["epochs_done"] == 3
    assert s["final_accuracy"] == pytest.approx(w["final_accuracy"], abs=0.02)
    resumed = [r for r in read_records(out / "metrics" / "rank-0.jsonl") if r["kind"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["epoch"] >= 1 and resumed[0]["step_in_epoch"] == 0
