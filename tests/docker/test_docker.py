"""The container emulator for real: BSP workers in Swarm containers, HL changes by container update.

Needs a Docker daemon (the session fixture starts one with docker_install.sh where it can); the
worker image is built once per checkout (minutes the first time, seconds after a code change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import job_id_of, write_skew_job
from omnilearn.emulator.backends.docker import LABEL_JOB, DockerBackend, ForeignContainer
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.launch.docker import swarm

pytestmark = pytest.mark.docker


def test_bsp_in_containers_with_a_live_hl_change(tmp_path: Path, docker_client, worker_image: str,
                                                 cleanup: list[str]) -> None:
    cfg = write_skew_job(tmp_path, "docker", synthetic_size=2048)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = job_id_of(out)
        cleanup.append(job_id)
        # Wait until the toggler has applied the SKEW level to every container, then look inside them.
        deadline = time.time() + 300
        skew: dict[str, dict] = {}
        while time.time() < deadline and len(skew) < 3:
            assert proc.poll() is None, proc.stdout.read()
            skew = {r["target"]: r for r in read_audit(out / "logs") if r["level"] == "SKEW"}
            time.sleep(0.2)
        assert len(skew) == 3, "the SKEW level was not applied to all containers"
        wanted = {"worker1": 0.15, "worker2": 0.3, "worker3": 1.2}
        for target, cpus in wanted.items():
            c = docker_client.containers.get(target)
            assert c.labels[LABEL_JOB] == job_id
            code, quota = c.exec_run(["cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"])
            assert code == 0
            _, period = c.exec_run(["cat", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"])
            assert int(quota) / int(period) == pytest.approx(cpus, abs=1e-3), target
            assert skew[target]["effective"]["cpus"] == pytest.approx(cpus, abs=1e-3)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    s = json.loads((out / "summary.json").read_text())
    assert s["backend"] == "docker"
    assert [c["level"] for c in s["hl_changes"]] == ["EVEN", "SKEW"]
    assert s["allocations"] == pytest.approx([0.15, 0.3, 1.2])
    assert sum(s["batch_sizes"]) == 192 and s["batch_sizes"][2] > 64 > s["batch_sizes"][0]
    for key in ("samples_per_s", "final_accuracy", "compute_ms", "imbalance", "ideal_samples_per_s"):
        assert s[key] is not None, key
    assert (out / "logs" / "worker-0.out").stat().st_size > 0  # container output kept
    # Nothing of the job is left: containers, network.
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"})
    assert not docker_client.networks.list(filters={"label": f"{LABEL_JOB}={job_id}"})


def test_toggler_never_touches_a_container_of_another_job(tmp_path: Path, docker_client, worker_image: str) -> None:
    foreign = docker_client.containers.run(worker_image, ["sleep", "60"], name="omnilearn-test-foreign",
                                           detach=True, labels={LABEL_JOB: "someone-else"})
    try:
        backend = DockerBackend("my-job", docker_client)
        with pytest.raises(ForeignContainer):
            backend.apply("omnilearn-test-foreign", Allocation(cpus=0.5))
        # Through the protocol: even a request naming it as a target of this job is rejected, unapplied.
        plan = EmulationPlan("quota", ("omnilearn-test-foreign",),
                             {"HL8": {"omnilearn-test-foreign": Allocation(cpus=0.5)}}, Schedule.pinned("HL8"))
        toggler = Toggler(tmp_path, backend, plan)
        RequestWriter(tmp_path, 0).submit("omnilearn-test-foreign", "HL8", Allocation(cpus=0.5), 0)
        (record,) = toggler.poll_once()
        assert record["status"] == "rejected" and "someone-else" in record["detail"]
        foreign.reload()
        assert not foreign.attrs["HostConfig"]["CpuQuota"]
    finally:
        foreign.remove(force=True)


def test_cluster_up_toggle_down_as_the_papers_scripts(tmp_path: Path, docker_client, worker_image: str,
                                                      cleanup: list[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMNILEARN=str(Path(sys.executable).parent / "omnilearn"))
    out = tmp_path / "run"
    up = subprocess.run([str(root / "scripts" / "omnilearnBSP.sh"), "--out", str(out), "--workers", "2",
                         "--model", "smallcnn", "--dataset", "synthetic", "--epochs", "2", "--schedule", "demo",
                         "--set", "data.synthetic_size=512", "--set", "data.image_size=16"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    cleanup.append(job_id_of(out))
    rows = swarm.status(out)
    assert [r["target"] for r in rows] == ["worker1", "worker2"]
    toggle = subprocess.run([str(root / "scripts" / "exec_HL.sh"), str(out)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert toggle.returncode == 0, toggle.stdout + toggle.stderr
    levels = [(r["target"], r["level"]) for r in read_audit(out / "logs")]
    assert ("worker1", "HL2") in levels and ("worker2", "HL4") in levels
    assert all(r["status"] == "exited" and r["exit_code"] == 0 for r in swarm.status(out))
    down = subprocess.run([env["OMNILEARN"], "cluster", "down", "--out", str(out)], capture_output=True, text=True)
    assert down.returncode == 0 and "container worker1" in down.stdout
    assert all(r["status"] == "absent" for r in swarm.status(out))


def test_run_without_a_daemon_is_one_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nobody.sock")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--backend", "docker", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert "no Docker daemon" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()

