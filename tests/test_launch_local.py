"""A whole local job: launcher, toggler, cgroup/affinity emulation, 3 gloo workers, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.emulator.toggler import read_audit

JOB = """
mode: bsp
workers: 3
model: {name: smallcnn}
data: {name: synthetic, image_size: 32, synthetic_size: 1536}
train: {epochs: 3, global_batch: 192, lr: 0.05}
control: {policy: dynamic, interval: 2, window: 3, min_samples: 2, deadband: 0.05}
emulation:
  backend: auto
  allocation: quota
  schedule: SCHEDULE
  levels:
    EVEN: [0.6, 0.6, 0.6]
    SKEW: [0.15, 0.3, 1.2]
"""
SCHEDULE = "unit: epoch\npoints:\n  - {at: 0, level: EVEN}\n  - {at: 1, level: SKEW}\n"


@pytest.mark.slow
def test_local_job_moves_batch_toward_allocation(tmp_path: Path) -> None:
    (tmp_path / "sched.yaml").write_text(SCHEDULE)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(JOB.replace("SCHEDULE", str(tmp_path / "sched.yaml")))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    for key in ("mode", "policy", "backend", "workers", "global_batch", "epochs", "steps", "wall_time_s",
                "samples_per_s", "final_accuracy", "final_loss", "batch_sizes", "allocations", "compute_ms",
                "imbalance", "ideal_samples_per_s", "hl_changes", "batch_changes"):
        assert key in s and s[key] is not None, key
    assert s["backend"] in ("cgroup-v1", "cgroup-v2", "affinity")
    assert [c["level"] for c in s["hl_changes"]] == ["EVEN", "SKEW"]
    assert sum(s["batch_sizes"]) == 192
    assert s["allocations"] == pytest.approx([0.15, 0.3, 1.2])
    # The controller moved batch away from the 0.15-CPU worker toward the 1.2-CPU one.
    assert s["batch_sizes"][2] > 64 > s["batch_sizes"][0]
    assert s["batch_changes"] >= 1
    # Every request went through the toggler and was applied to the kernel.
    applied = read_audit(out / "logs")
    skew = {rec["target"]: rec["effective"]["cpus"] for rec in applied if rec["level"] == "SKEW"}
    assert skew == pytest.approx({"worker1": 0.15, "worker2": 0.3, "worker3": 1.2})
    # Nothing of the job is left behind.
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    for ctrl in ("cpu", "cpuset"):
        assert not Path(f"/sys/fs/cgroup/{ctrl}/omnilearn/{job_id}").exists()
    assert (out / "run.png").stat().st_size > 10_000
    if os.geteuid() == 0:
        assert s["backend"].startswith("cgroup")
