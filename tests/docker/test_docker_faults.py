"""Docker faults: a stopped job's workers get SIGTERM and end at a step boundary; a vanished container is named."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import job_id_of

pytestmark = pytest.mark.docker


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--backend", "docker", "--model", "smallcnn",
                             "--dataset", "synthetic", "--workers", "2", "--epochs", "50", "--hl", "HL8",
                             "--out", str(out), "--no-progress", "--set", "docker.stop_timeout=30"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(proc: subprocess.Popen, out: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    metrics = [out / "metrics" / f"rank-{r}.jsonl" for r in (0, 1)]
    while time.time() < deadline and not all(m.exists() and '"kind":"step"' in m.read_text() for m in metrics):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.3)


def _records(out: Path, rank: int, kind: str) -> list[dict]:
    lines = (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_stopping_a_job_sends_sigterm_and_workers_end_at_a_step(tmp_path: Path, docker_client, worker_image: str,
                                                              cleanup: list[str]) -> None:
    out = tmp_path / "run"
    proc = _start(out)
    cleanup.append(job_id_of(out))
    _wait_for_steps(proc, out)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    stopped = [_records(out, r, "stopped") for r in (0, 1)]
    assert all(len(s) == 1 for s in stopped), output  # each worker's SIGTERM handler ran
    assert stopped[0][0]["step"] == stopped[1][0]["step"]  # and both ended after the same step
    assert not docker_client.containers.list(all=True, filters={"label": f"omnilearn.job={cleanup[0]}"})


def test_a_vanished_container_is_named(tmp_path: Path, docker_client, worker_image: str,
                                       cleanup: list[str]) -> None:
    out = tmp_path / "run"
    proc = _start(out)
    cleanup.append(job_id_of(out))
    _wait_for_steps(proc, out)
    docker_client.containers.get("worker2").remove(force=True)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert "container worker2 (rank 1) vanished" in output, output
    assert "Traceback" not in output
