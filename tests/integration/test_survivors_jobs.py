"""Whole jobs that lose a worker twice: the survivors go on (BSP and ASP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from jobs import live_workers, wait_until
from omnilearn.files import read_records
from omnilearn.jobfile import JobSpec
from omnilearn.launch.job import resumed_members


def _job(out: Path, restarts: int) -> list[str]:
    return [sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset", "synthetic", "--workers",
            "3", "--epochs", "3", "--global-batch", "96", "--policy", "uniform", "--set", "data.synthetic_size=1280",
            "--set", "checkpoint.every=1", "--set", f"fault.max_restarts={restarts}", "--out", str(out),
            "--no-progress"]


def _step_sums(out: Path, workers: int) -> dict[int, int]:
    """step -> checksum of the samples every worker took at that step (each step counted once per file)."""
    sums: dict[int, int] = defaultdict(int)
    for k in range(workers):
        steps = [r for r in read_records(out / "metrics" / f"rank-{k}.jsonl") if r["kind"] == "step"]
        assert len({r["step"] for r in steps}) == len(steps)  # no step twice in one worker's file
        for r in steps:
            sums[r["step"]] += r["sample_sum"]
    return dict(sums)


def test_a_worker_lost_twice_in_a_row_is_left_behind_and_the_survivors_see_the_same_samples(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    r = subprocess.run(_job(whole, 0), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "lost"
    proc = subprocess.Popen(_job(out, 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics" / "rank-1.jsonl"
    wait_until(proc, lambda: metrics.exists() and '"epoch":1' in metrics.read_text(), "second epoch")
    first = live_workers(out)[1]
    os.kill(first, signal.SIGKILL)
    # Its restart: a new process for worker2, which goes on from the checkpoint, then is lost again.
    wait_until(proc, lambda: live_workers(out).get(1, first) != first and '"kind":"resume"' in metrics.read_text(),
          "restarted worker2")
    os.kill(live_workers(out)[1], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    said = " ".join(output.split())  # the console wraps long lines
    assert said.count("restarting from its checkpoint") == 2, said
    assert "without worker2 (lost 2 times in a row), with the 2 survivors worker1, worker3" in said, said
    s, w = json.loads((out / "summary.json").read_text()), json.loads((whole / "summary.json").read_text())
    assert [(x["cause"], x["dropped"], x["workers"]) for x in s["restarts"]] == [
        ("worker rank 1 died: SIGKILL", [], ["worker1", "worker2", "worker3"]),
        ("worker rank 1 died: SIGKILL", ["worker2"], ["worker1", "worker3"])]
    assert s["workers"] == 2 and s["workers_configured"] == 3 and s["worker_targets"] == ["worker1", "worker3"]
    assert s["batch_sizes"] == [48, 48]  # the global batch re-split among the survivors
    assert s["samples"] == w["samples"] and s["epochs_done"] == w["epochs_done"] == 3
    assert s["final_accuracy"] == pytest.approx(w["final_accuracy"], abs=0.03)
    assert _step_sums(out, 3) == _step_sums(whole, 3)  # the same samples at every step, none twice
    resumed = [r for r in read_records(out / "metrics" / "rank-2.jsonl") if r["kind"] == "resume"]
    assert resumed[0]["epoch"] >= 1 and resumed[0]["step_in_epoch"] == 0, resumed  # at a checkpoint's epoch end
    assert resumed[-1]["workers"] == ["worker1", "worker3"] and resumed[-1]["batch"] == [48, 48]
    job = JobSpec.load(out / "job.json")
    assert job.members == [0, 2] and resumed_members(out, job.config) == [0, 2]  # what --resume goes on with


def test_an_asp_worker_lost_twice_is_left_behind_and_the_server_applies_every_push_once(tmp_path: Path) -> None:
    out = tmp_path / "asp"
    batch = 96
    cmd = [sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset", "synthetic", "--workers", "3",
           "--epochs", "4", "--global-batch", str(batch), "--policy", "dynamic", "--hl", "HL1", "--set", "mode=asp",
           "--set", "data.synthetic_size=1024", "--set", "data.image_size=32", "--set", "asp.eval_interval=100",
           "--set", "checkpoint.every=1", "--set", "fault.max_restarts=2", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server, mine = out / "metrics" / "rank-0.jsonl", out / "metrics" / "rank-2.jsonl"
    wait_until(proc, lambda: server.exists() and '"reason":"every"' in server.read_text(), "first checkpoint")
    first = live_workers(out)[2]
    os.kill(first, signal.SIGKILL)
    wait_until(proc, lambda: live_workers(out).get(2, first) != first and mine.exists()
          and any(r["kind"] == "start" and r["pushes"] > 0 for r in read_records(mine)), "restarted aspworker3")
    os.kill(live_workers(out)[2], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    s = json.loads((out / "summary.json").read_text())
    assert [(x["dropped"], x["workers"]) for x in s["restarts"]] == [
        ([], ["aspworker1", "aspworker2", "aspworker3", "aspworker4"]),
        (["aspworker3"], ["aspworker1", "aspworker2", "aspworker4"])]
    assert s["worker_targets"] == ["aspworker2", "aspworker4"] and len(s["updates"]) == 2 and 0 < sum(s["batch_sizes"]) <= batch
    updates = [x for x in read_records(server) if x["kind"] == "update"]
    assert [u["version"] for u in updates] == list(range(1, len(updates) + 1))  # every push applied once
    for w in (1, 2, 3):  # each worker's pushes in order from 1; the lost one's stop at the checkpoint
        seqs = [u["seq"] for u in updates if u["worker"] == w]
        assert seqs == list(range(1, len(seqs) + 1))
        steps = [x["seq"] for x in read_records(out / "metrics" / f"rank-{w}.jsonl") if x["kind"] == "step"]
        assert steps == sorted(set(steps)) and set(steps) <= set(seqs)
    target = next(r["target_samples"] for r in read_records(server) if r["kind"] == "start")
    assert target <= s["samples"] < target + batch and s["epochs_done"] >= 4
