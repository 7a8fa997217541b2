"""A whole local job: launcher, toggler, cgroup/affinity emulation, 3 gloo workers, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import live_workers, write_skew_job
from omnilearn.emulator.protocol.audit import read_audit


def test_local_job_moves_batch_toward_the_faster_worker(tmp_path: Path) -> None:
    cfg = write_skew_job(tmp_path, "auto", synthetic_size=1536)
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
    # The reactive controller starts from equal batches, is not told of the level change, and moved
    # batch away from the 0.15-CPU worker toward the 1.2-CPU one from measured times alone.
    assert s["policy"] == "dynamic" and "measured compute times only" in s["policy_knows"]
    records = [json.loads(line) for line in (out / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    changes = [r for r in records if r["kind"] == "batch_change"]
    assert changes[0]["reason"] == "initial" and changes[0]["batch"] == [64, 64, 64]
    assert {r["reason"] for r in changes[1:]} <= {"probe", "compute-time"}  # measured: the probe, then steps
    assert s["batch_sizes"][2] > 64 > s["batch_sizes"][0]
    assert s["batch_changes"] >= 1
    assert [(r["from_level"], r["level"]) for r in s["settle"]] == [(None, "EVEN"), ("EVEN", "SKEW")]
    assert s["settle"][1]["decisions"] is None or s["settle"][1]["decisions"] >= 1
    # Every request went through the toggler and was applied to the kernel.
    applied = read_audit(out / "logs")
    skew = {rec["target"]: rec["effective"]["cpus"] for rec in applied if rec["level"] == "SKEW"}
    assert skew == pytest.approx({"worker1": 0.15, "worker2": 0.3, "worker3": 1.2})
    assert s["allocation_changes"] == {"changes": 6, "retried": 0, "never_held": 0, "listed": []}
    # Nothing of the job is left behind.
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    for ctrl in ("cpu", "cpuset"):
        assert not Path(f"/sys/fs/cgroup/{ctrl}/omnilearn/{job_id}").exists()
    assert (out / "run.png").stat().st_size > 10_000
    if os.geteuid() == 0:
        assert s["backend"].startswith("cgroup")


def test_ctrl_c_stops_workers_and_removes_cgroups(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset",
                             "synthetic", "--workers", "2", "--epochs", "50", "--hl", "HL8", "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics" / "rank-0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"kind":"step"' in metrics.read_text()):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    job = json.loads((out / "job.json").read_text())
    worker_pids = list(live_workers(out).values())
    assert len(worker_pids) == 2
    proc.send_signal(signal.SIGINT)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the launcher prints its threads' stacks: why it did not stop
        time.sleep(2)
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"the launcher did not stop within 120 s of Ctrl-C:\n{output}") from None
    assert proc.returncode == 130, output
    assert "interrupted" in output
    for pid in worker_pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    for ctrl in ("cpu", "cpuset"):
        assert not Path(f"/sys/fs/cgroup/{ctrl}/omnilearn/{job['job_id']}").exists()


def test_a_killed_worker_stops_the_job_with_its_rank(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset",
                             "synthetic", "--workers", "3", "--epochs", "50", "--out", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics" / "rank-1.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"kind":"step"' in metrics.read_text()):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    job = json.loads((out / "job.json").read_text())
    victim = [live_workers(out)[1]]
    os.kill(victim[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert "worker rank 1 died: SIGKILL" in output  # within communicate's timeout: the job does not hang
    for ctrl in ("cpu", "cpuset"):
        assert not Path(f"/sys/fs/cgroup/{ctrl}/omnilearn/{job['job_id']}").exists()


def test_first_failure_names_the_cause_not_its_consequences() -> None:
    from omnilearn.launch.failures import first_failure

    # Seen in the same poll: the killed rank, not the peers that failed on the broken connection.
    assert first_failure({0: (5.0, 1), 1: (5.0, -9), 2: (5.0, 1)}) == 1
    assert first_failure({0: (5.0, 1), 3: (5.0, 137)}) == 3  # a container killed by SIGKILL
    assert first_failure({0: (5.0, 1), 2: (5.0, 2)}) == 2  # a user error explains the others
    assert first_failure({0: (4.0, 1), 1: (5.0, -9)}) == 0  # but an earlier failure came first
    assert first_failure({2: (5.0, 1), 1: (5.0, 1)}) == 1


def test_a_forked_worker_reports_to_its_log_and_exits_with_the_workers_status(tmp_path: Path) -> None:
    from omnilearn.launch.forked import ForkedWorker

    log = tmp_path / "worker-0.out"
    log.write_text("")
    proc = ForkedWorker(["worker", "--job", str(tmp_path / "missing.json")], {"PATH": os.environ["PATH"]}, log)
    assert proc.wait(timeout=60) == 2  # the worker's user error, as `omnilearn worker` exits with it
    assert f"--job {tmp_path / 'missing.json'}: job file not found" in log.read_text()
