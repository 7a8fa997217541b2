"""A toggler thread killed in a Docker job is restarted by its host: the job (launched in process, so that
the test can kill the thread) ends well and every level change is applied once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from jobs import write_skew_job
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.spec.levels import Allocation

pytestmark = pytest.mark.docker


def test_a_killed_toggler_thread_in_a_docker_job_is_restarted(tmp_path: Path, docker_client, worker_image: str,
                                                               cleanup: list[str], monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from omnilearn.cli import main
    from omnilearn.emulator.backends.docker import DockerBackend

    real_apply = DockerBackend.apply
    killed: list[str] = []

    def apply_dies_once(self: DockerBackend, target: str, allocation: Allocation) -> Allocation:
        if not killed:
            killed.append(target)
            raise SystemExit("toggler thread killed")  # in the toggler's thread: it ends there
        return real_apply(self, target, allocation)

    monkeypatch.setattr(DockerBackend, "apply", apply_dies_once)
    cfg = write_skew_job(tmp_path, "docker", synthetic_size=384, epochs=2)
    out = tmp_path / "run"
    try:
        with caplog.at_level(logging.WARNING, logger="omnilearn.toggler"):
            status = main(["run", "--config", str(cfg), "--out", str(out), "--no-progress"])
    finally:
        if (out / "job.json").is_file():
            cleanup.append(json.loads((out / "job.json").read_text())["job_id"])
    assert status == 0 and killed
    assert "toggler thread died: restarting it from its audit" in caplog.text
    applied = [(r["target"], r["level"]) for r in read_audit(out / "logs")]
    targets = ("worker1", "worker2", "worker3")
    assert sorted(applied) == sorted((t, level) for t in targets for level in ("EVEN", "SKEW"))  # each once
