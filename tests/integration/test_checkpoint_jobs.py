"""BSP checkpoints in whole jobs: a changed config is refused on resume (a killed worker's restart from its
checkpoint: test_survivors_jobs, whose first restart is one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omnilearn import config
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
