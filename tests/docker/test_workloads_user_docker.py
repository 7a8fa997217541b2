"""A user's workload in containers: its code folder mounted read-only at the same path, on PYTHONPATH."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import job_id_of

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


def test_example_trains_in_containers_with_its_code_mounted(tmp_path: Path, docker_client, worker_image: str,
                                                             cleanup: list[str]) -> None:
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(ROOT / "examples" / "tabular_mlp.py", code / "mine.py")  # a folder the image has never seen
    code.chmod(0o755)
    (code / "mine.py").chmod(0o644)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--set", f"workload={code / 'mine.py'}:workload",
                             "--set", "emulation.backend=docker", "--workers", "2", "--set", "train.epochs=1",
                             "--hl", "HL2", "--out", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cleanup.append(job_id_of(out, timeout=600))
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.35

