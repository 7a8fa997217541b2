"""omnilearn calibrate with cgroup quotas (root), and a run that uses its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnilearn import config
from omnilearn.emulator.spec.calibration import (
    FORMAT,
)
from omnilearn.emulator.spec.plan import build_plan


@pytest.mark.skipif(os.geteuid() != 0, reason="calibrates with cgroup quotas (root)")
def test_calibrate_writes_a_table_run_can_use(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "calibrate", "--out", str(out), "--rounds", "1",
                        "--seconds", "0.3",
                        "--set", "model.name=smallcnn", "--set", "data.name=synthetic", "--set", "workers=2",
                        "--set", "data.image_size=16", "--set", "train.global_batch=32"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = yaml.safe_load((out / "calibration.yaml").read_text())
    assert data["format"] == FORMAT and data["job"]["workers"] == 2
    assert {m["slot"] for m in data["speed"]["measurements"]} == {"worker1", "worker2"}
    assert set(data["levels"]) == {"HL1", "HL2", "HL4", "HL8"} and data["allreduce"]["fit"]["2"]["latency_s"] >= 0
    for row in data["levels"].values():
        assert len(row["quotas"]) == 2 and row["verified_ratio"] > 0 and sum(row["quotas"]) <= 2.01
    cfg = config.build(None, [("workers", 2), ("emulation.calibration", str(out / "calibration.yaml")),
                              ("emulation.hl", "HL8")])
    assert build_plan(cfg).allocation("HL8", "worker2").cpus == data["levels"]["HL8"]["quotas"][1]
    assert "where the host cannot" in r.stdout
