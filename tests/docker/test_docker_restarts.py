"""Docker jobs that lose a worker or their launcher go on from their checkpoint, and see every sample
once per epoch: a kill -9 of a worker's container restarts the job (``fault.max_restarts``); a kill -9 of
the launcher, and a restart of the daemon, each leave a job that ``omnilearn cleanup`` clears and
``omnilearn run --resume`` completes (one job, stopped both ways in turn)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import job_id_of
from omnilearn.files import read_records

pytestmark = pytest.mark.docker

EPOCHS, TRAIN_SAMPLES, BATCH = 3, 1024, 64  # data.synthetic_size 1280: 1024 training samples, 16 steps/epoch


def docker_job(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "omnilearn", "run", "--backend", "docker", "--model", "smallcnn", "--dataset",
            "synthetic", "--workers", "2", "--epochs", str(EPOCHS), "--global-batch", str(BATCH), "--policy",
            "uniform", "--set", f"data.synthetic_size={TRAIN_SAMPLES * 5 // 4}", "--set", "checkpoint.every=1",
            "--out", str(out), "--no-progress", *extra]


def wait_for_record(proc: subprocess.Popen, out: Path, rank: int, text: str, timeout: float = 300) -> None:
    metrics = out / "metrics" / f"rank-{rank}.jsonl"
    deadline = time.time() + timeout
    while not (metrics.exists() and text in metrics.read_text()):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, f"no {text} in {metrics} after {timeout} s"
        time.sleep(0.2)


def assert_whole_run(out: Path) -> dict:
    """Every step of the run kept once, and each epoch's steps took every training sample once."""
    ranks = [[r for r in read_records(out / "metrics" / f"rank-{k}.jsonl") if r["kind"] == "step"] for k in (0, 1)]
    steps = EPOCHS * TRAIN_SAMPLES // BATCH
    assert [r["step"] for r in ranks[0]] == [r["step"] for r in ranks[1]] == list(range(1, steps + 1))
    for epoch in range(EPOCHS):
        total = sum(r["sample_sum"] for rank in ranks for r in rank if r["epoch"] == epoch)
        assert total == TRAIN_SAMPLES * (TRAIN_SAMPLES - 1) // 2, f"epoch {epoch}: a sample missed or seen twice"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == EPOCHS * TRAIN_SAMPLES and summary["epochs_done"] == EPOCHS
    return summary


def job_containers(client, job_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"omnilearn.job={job_id}"})


def test_rank_0_lost_twice_in_a_row_leaves_the_job_to_the_other_container(tmp_path: Path, docker_client,
                                                                          worker_image: str,
                                                                          cleanup: list[str]) -> None:
    """worker1 (rank 0: the rendezvous, the checkpoint's writer) is killed: the same two containers restart
    from the checkpoint. Killed again, it cannot come back: worker2 goes on alone as rank 0, writes the
    checkpoints, and the run still takes every sample once per epoch."""
    out = tmp_path / "run"
    proc = subprocess.Popen(docker_job(out, "--set", "fault.max_restarts=2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    cleanup.append(job_id_of(out))
    wait_for_record(proc, out, 0, '"epoch":1')
    docker_client.containers.get("worker1").kill(signal="SIGKILL")
    wait_for_record(proc, out, 0, '"kind":"resume"')  # the same workers again, from the checkpoint
    docker_client.containers.get("worker1").kill(signal="SIGKILL")
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, output
    assert "restarting from its checkpoint" in output, output
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["cause"], r["dropped"]) for r in summary["restarts"]] == [
        ("container worker1 (rank 0) ended: exited, exit code 137", []),
        ("container worker1 (rank 0) ended: exited, exit code 137", ["worker1"])], summary["restarts"]
    resumed = [r for r in read_records(out / "metrics" / "rank-1.jsonl") if r["kind"] == "resume"]
    assert resumed[0]["epoch"] >= 1 and resumed[0]["step_in_epoch"] == 0, resumed
    assert summary["worker_targets"] == ["worker2"] and summary["batch_sizes"] == [BATCH]
    assert summary["samples"] == EPOCHS * TRAIN_SAMPLES and summary["epochs_done"] == EPOCHS
    ranks = [[r for r in read_records(out / "metrics" / f"rank-{k}.jsonl") if r["kind"] == "step"] for k in (0, 1)]
    assert [r["step"] for r in ranks[1]] == list(range(1, EPOCHS * TRAIN_SAMPLES // BATCH + 1))
    for epoch in range(EPOCHS):
        total = sum(r["sample_sum"] for rank in ranks for r in rank if r["epoch"] == epoch)
        assert total == TRAIN_SAMPLES * (TRAIN_SAMPLES - 1) // 2, f"epoch {epoch}: a sample missed or seen twice"
    saved = [r for r in read_records(out / "metrics" / "rank-1.jsonl") if r["kind"] == "checkpoint"]
    assert saved and saved[-1]["epoch"] == EPOCHS  # worker2, now rank 0, wrote the last checkpoint
    assert not job_containers(docker_client, cleanup[0])


# ------------------------------------------------------------------ a daemon restart (last: it stops every container)

DOCKERD_PID = Path("/var/run/docker.pid")
DOCKERD_LOG = "/var/log/dockerd.log"
RESTART_LOCK = "/tmp/omnilearn-docker-restart.lock"


def start_dockerd(client) -> None:
    """Start the local daemon again as docker_install.sh does without systemd, and wait until it answers
    as a Swarm manager (a single-node swarm survives a restart: its state is on disk)."""
    subprocess.Popen(["setsid", "nohup", "bash", "-c", 'exec dockerd >>"$1" 2>&1 </dev/null', "dockerd-launcher",
                      DOCKERD_LOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    deadline = time.time() + 120
    while True:
        try:
            if client.info()["Swarm"].get("ControlAvailable"):
                return
        except Exception:  # noqa: BLE001 - not answering yet
            pass
        assert time.time() < deadline, f"dockerd did not come back within 120 s (see {DOCKERD_LOG})"
        time.sleep(0.5)


def kill_the_launcher(proc: subprocess.Popen, out: Path, client, job_id: str) -> None:
    """kill -9 of the launcher: its reaper stops the job's containers and says so in its log."""
    t0 = time.time()
    proc.kill()
    proc.communicate()
    while any(c.status == "running" for c in job_containers(client, job_id)) and time.time() - t0 < 10:
        time.sleep(0.1)
    stopped_after = time.time() - t0
    print(f"no container of the job ran {stopped_after:.1f} s after kill -9 of the launcher")
    assert not any(c.status == "running" for c in job_containers(client, job_id))
    # The reaper writes its line once its stop calls returned, which may be after the test saw the
    # containers stopped: wait for the line, with a deadline.
    reaped = out / "logs" / "reaper.log"
    while not (reaped.exists() and "died: " in reaped.read_text()) and time.time() - t0 < 30:
        time.sleep(0.1)
    assert "died: stopped worker" in reaped.read_text()


def restart_the_daemon(proc: subprocess.Popen, client) -> tuple[str, float]:
    """SIGTERM to the local daemon while the job runs, and the daemon started again; returns the
    launcher's output and how long it took to say that the daemon stopped answering."""
    import fcntl
    import os

    with open(RESTART_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one daemon restart at a time on this host
        try:
            pid = int(DOCKERD_PID.read_text())
            t0 = time.time()
            os.kill(pid, signal.SIGTERM)
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if "stopped answering while the job ran" in line:
                    break
            detected = time.time() - t0
            output = "".join(lines) + proc.stdout.read()  # read, not communicate(): the buffered rest too
            proc.wait(timeout=60)
            while Path(f"/proc/{pid}").exists():
                if time.time() > t0 + 60:  # a hang guard
                    pytest.fail("dockerd did not stop within 60 s of SIGTERM")
                time.sleep(0.2)
        finally:
            start_dockerd(client)
    return output, detected


def cleanup_clears(client, job_id: str, *expected: str) -> None:
    """``omnilearn cleanup`` removes what the job left: its containers and its network."""
    r = subprocess.run([sys.executable, "-m", "omnilearn", "cleanup"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for text in expected:
        assert text in r.stdout, r.stdout + r.stderr
    assert not job_containers(client, job_id)
    assert not client.networks.list(filters={"label": f"omnilearn.job={job_id}"})


def test_a_killed_launcher_and_a_daemon_restart_each_leave_a_job_that_cleanup_clears_and_resume_completes(
        tmp_path: Path, docker_client, worker_image: str, cleanup: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One job, stopped twice: kill -9 of its launcher after the first checkpoint (the reaper stops the
    containers, cleanup removes them), then, once ``run --resume`` has its workers going again, a restart of
    the daemon (one message, the job left for cleanup). A second ``--resume`` completes the run: every step
    once, every sample once per epoch."""
    from omnilearn.launch import pidfile

    monkeypatch.setenv(pidfile.STATE_ENV, str(tmp_path / "state"))
    out = tmp_path / "run"
    proc = subprocess.Popen(docker_job(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job_id = job_id_of(out)
    cleanup.append(job_id)
    wait_for_record(proc, out, 0, '"kind":"checkpoint"')
    kill_the_launcher(proc, out, docker_client, job_id)
    cleanup_clears(docker_client, job_id, "container worker1")

    resume = [sys.executable, "-m", "omnilearn", "run", "--resume", str(out), "--no-progress"]
    proc = subprocess.Popen(resume, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_record(proc, out, 0, '"kind":"resume"')  # the workers go on from the checkpoint
    job_id = json.loads((out / "job.json").read_text())["job_id"]  # the resumed run's own
    cleanup.append(job_id)
    output, detected = restart_the_daemon(proc, docker_client)
    print(f"daemon stop reported after {detected:.1f} s")
    assert proc.returncode == 1, output
    assert "the Docker daemon at unix:///var/run/docker.sock stopped answering" in output, output
    assert f"omnilearn run --resume {out}" in output and "Traceback" not in output, output
    assert "restarting" not in output
    assert (out / "checkpoints" / "checkpoint.pt").is_file()
    assert [r["job_id"] for _, r in pidfile.records()] == [job_id]  # left for cleanup
    cleanup_clears(docker_client, job_id)

    r = subprocess.run(resume, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = assert_whole_run(out)
    assert [x["cause"] for x in summary["restarts"]] == ["resumed (--resume)"] * 2
