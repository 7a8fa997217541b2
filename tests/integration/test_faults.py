"""Faults of local jobs: a killed launcher leaves nothing, a hung worker is named, cleanup spares live jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import live_workers
from omnilearn.launch import cleanup, pidfile
from omnilearn.launch.watch import describe_status


def _start(out: Path, env: dict[str, str], *extra: str, workers: int = 2) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset",
                             "synthetic", "--workers", str(workers), "--epochs", "50", "--hl", "HL8",
                             "--out", str(out), "--no-progress", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_step(proc: subprocess.Popen, out: Path, rank: int = 0, timeout: float = 120) -> None:
    metrics = out / "metrics" / f"rank-{rank}.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline and not (metrics.exists() and '"kind":"step"' in metrics.read_text()):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)


def _workers(out: Path) -> dict[int, int]:
    """rank -> pid of the job's live worker processes (zombies excluded)."""
    return live_workers(out)


def _cgroups(job_id: str) -> list[Path]:
    return [p for p in Path("/sys/fs/cgroup").glob(f"*/omnilearn/{job_id}") if p.exists()]


@pytest.fixture
def state_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv(pidfile.STATE_ENV, str(tmp_path / "state"))
    return dict(os.environ)


def test_killed_launcher_takes_its_workers_and_cleanup_removes_the_rest(tmp_path: Path, state_env) -> None:
    out = tmp_path / "run"
    proc = _start(out, state_env)
    _wait_for_step(proc, out)
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    assert len(_workers(out)) == 2
    assert json.loads((out / pidfile.RUN_FILE).read_text())["launcher"]["pid"] == proc.pid
    t0 = time.time()
    proc.kill()
    proc.wait()
    while _workers(out) and time.time() - t0 < 10:
        time.sleep(0.05)
    gone_after = time.time() - t0
    assert not _workers(out), f"workers still running {gone_after:.1f} s after the launcher's SIGKILL"
    print(f"no worker ran {gone_after:.2f} s after kill -9 of the launcher")
    r = subprocess.run([sys.executable, "-m", "omnilearn", "cleanup"], env=state_env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not _cgroups(job_id), r.stdout
    assert not list(Path(state_env[pidfile.STATE_ENV]).glob("*.json"))


def test_a_stopped_worker_is_named_within_the_timeout(tmp_path: Path, state_env) -> None:
    out = tmp_path / "run"
    timeout_s = 6  # a running rank at HL8 records a step well within it, evaluation included
    proc = _start(out, state_env, "--set", f"fault.timeout_s={timeout_s}")
    _wait_for_step(proc, out, rank=1)
    victim = _workers(out)[1]
    os.kill(victim, signal.SIGSTOP)
    lines = []
    for line in proc.stdout:  # the report comes before the teardown, which lets the stopped worker go
        lines.append(line)
        if "made no step" in line:
            break
    output = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, output
    assert "worker rank 1 made no step for" in output and "stopped (SIGSTOP?)" in output, output
    assert "made no step for" in output and str(timeout_s) in output, output  # named with its timeout
    assert not _workers(out)  # the stopped worker was let go and ended too


def test_cleanup_spares_a_live_job_and_clears_a_dead_ones(state_env) -> None:
    live_worker = subprocess.Popen(["sleep", "60"])
    dead_worker = subprocess.Popen(["sleep", "60"])
    gone_launcher = subprocess.Popen(["sleep", "60"])
    try:
        live = pidfile.JobRecord("live-job", Path(state_env[pidfile.STATE_ENV]), "affinity")  # launcher: us
        live.add(0, live_worker.pid)
        dead = pidfile.JobRecord("dead-job", Path(state_env[pidfile.STATE_ENV]), "affinity")
        dead.data["launcher"] = {"pid": gone_launcher.pid, "start": pidfile.start_time(gone_launcher.pid)}
        dead.add(0, dead_worker.pid)
        dead.data["workers"].append({"rank": 1, "pid": live_worker.pid, "start": 1})  # a reused pid: not ours
        dead._write()
        gone_launcher.kill()
        gone_launcher.wait()
        removed = cleanup.cleanup_dead()
        assert dead_worker.wait(timeout=5) == -signal.SIGKILL
        assert f"process {dead_worker.pid} (rank 0)" in removed
        assert live_worker.poll() is None  # the live job's worker, and the reused pid, are untouched
        assert live.path.exists() and not dead.path.exists()
        live.close()
        assert not live.path.exists()
    finally:
        for p in (live_worker, dead_worker, gone_launcher):
            p.kill()
            p.wait()


def test_cleanup_keeps_a_docker_jobs_record_while_another_hosts_daemon_does_not_answer(
        state_env, monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator.backends import dockerd
    from omnilearn.errors import UserError
    from omnilearn.launch.docker import swarm

    gone = subprocess.Popen(["true"])
    gone.wait()
    record = pidfile.JobRecord("docker-job", Path(state_env[pidfile.STATE_ENV]), "docker",
                               {"worker3": "unix:///nowhere.sock"})
    record.data["launcher"] = {"pid": gone.pid, "start": 1}
    record._write()
    monkeypatch.setattr(dockerd, "daemon_client", lambda: object())

    def silent(job_id: str, hosts: dict[str, str]) -> list[str]:
        raise UserError(f"job {job_id}: removed container worker1; the Docker daemon at {hosts['worker3']} "
                        f"does not answer")

    monkeypatch.setattr(swarm, "down", silent)
    removed = cleanup.cleanup_dead()
    assert record.path.exists() and any("not all removed" in r and "nowhere.sock" in r for r in removed), removed
    monkeypatch.setattr(swarm, "down", lambda job_id, hosts: ["container worker3"])
    assert "container worker3" in cleanup.cleanup_dead() and not record.path.exists()  # once it answers


def test_exit_statuses_are_worded() -> None:
    assert describe_status(-9) == "died: SIGKILL"
    assert describe_status(137) == "died: SIGKILL"
    assert describe_status(1) == "exited with status 1"
    assert describe_status(3).startswith("stopped on request (SIGTERM)")
