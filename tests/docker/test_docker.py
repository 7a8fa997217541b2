"""The container emulator for real: BSP workers in Swarm containers, HL changes by container update.

Needs a Docker daemon (the session fixture starts one with docker_install.sh where it can); the
worker image is built once per checkout (minutes the first time, seconds after a code change). A whole
BSP job with a live HL change in its containers is test_docker_security's first test: the job it attacks
from inside is the same job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import job_id_of
from omnilearn.emulator.backends.docker import LABEL_JOB, DockerBackend, ForeignContainer
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.launch.docker import swarm

pytestmark = pytest.mark.docker


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

