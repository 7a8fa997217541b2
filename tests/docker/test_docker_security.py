"""A worker's container, attacked from inside while its job runs: nothing beyond its own allowance changes.

Needs a Docker daemon (see test_docker.py). One small BSP job (3 ranks, a tiny model, 5 epochs) is run;
rank 1's container tries every way out it has, and the test checks what the host, the toggler and the
other containers saw. The same job is the container emulator's live level change: EVEN, then SKEW from
epoch 1, read back inside every container, the batch moved and nothing of the job left. A small ASP job
checks that the parameter server (TensorPipe, the one container that writes a folder) runs under the
same confinement.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import job_id_of, write_skew_job
from omnilearn.emulator.backends.docker import LABEL_JOB
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.launch.docker.mounts import container_user

pytestmark = pytest.mark.docker

RUN = "/run/omnilearn"

# Run inside rank 1's container (worker2) as the container's user: every way out, each reported as
# "done" or the error it met. The forged lines name rank 0 (worker1) or break the plan.
ATTACK = r'''
import errno, json, os
R = "/run/omnilearn"
FORGED = json.dumps({"seq": 1, "rank": 0, "target": "worker1", "level": "SKEW", "cpus": 0.15}) + "\n"
OUT_OF_PLAN = json.dumps({"seq": 1, "level": "EVEN", "cpus": 2.0}) + "\n"
def append(path, line):
    with open(path, "a") as f:
        f.write(line)
def write(path, text="{}"):
    with open(path, "w") as f:
        f.write(text)
attempts = {
    "own log: forged line for rank 0": lambda: append(f"{R}/logs/cpu-1.log", FORGED),
    "own log: allocation not in the plan": lambda: append(f"{R}/logs/cpu-1.log", OUT_OF_PLAN),
    "rank 0's log": lambda: append(f"{R}/logs/cpu-0.log", FORGED),
    "rank 2's log": lambda: append(f"{R}/logs/cpu-2.log", FORGED),
    "forged audit record": lambda: append(f"{R}/logs/toggler-audit.jsonl", json.dumps(
        {"file": "cpu-0.log", "status": "applying", "offset_end": 0, "seq": 9, "level": "SKEW"}) + "\n"),
    "job.json": lambda: write(f"{R}/job.json"),
    "new job.json beside it": lambda: write(f"{R}/job.json.new"),
    "symlink where the host saves output": lambda: os.symlink("/etc/passwd", f"{R}/logs/worker-1.out"),
    "symlink to /etc in the log folder": lambda: os.symlink("/etc", f"{R}/logs/etc"),
    "own log removed (to put a symlink there)": lambda: os.unlink(f"{R}/logs/cpu-1.log"),
    "own log renamed": lambda: os.rename(f"{R}/logs/cpu-1.log", f"{R}/logs/cpu-1.old"),
    "own log hard-linked": lambda: os.link(f"{R}/logs/cpu-1.log", "/tmp/cpu-0.log"),
    "toggler lock": lambda: write(f"{R}/logs/toggler.lock"),
    "metrics of rank 0": lambda: append(f"{R}/metrics/rank-0.jsonl", "{}\n"),
    "snapshots folder": lambda: os.mkdir(f"{R}/snapshots"),
    "own cgroup quota": lambda: write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1"),
    "image code": lambda: append("/opt/omnilearn/pytorch/omnilearn/__init__.py", "\n"),
    "become root": lambda: os.setuid(0),
}
results = {}
for name, attempt in attempts.items():
    try:
        attempt()
        results[name] = "done"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
# What this user may write: only on a mount that is read-write (the root is read-only); /proc, /sys and
# /dev aside. Each read-write mount is walked whole.
def unescape(field):
    return field.encode().decode("unicode_escape")
mounts = {}
with open("/proc/self/mountinfo") as f:
    for line in f:
        parts = line.split()
        mounts[unescape(parts[4])] = parts[5].split(",")[0]
writable = []
for point, mode in mounts.items():
    if mode != "rw" or point.split("/")[1] in ("proc", "sys", "dev"):
        continue
    paths = [point]
    if os.path.isdir(point) and point != "/":
        for root, dirs, files in os.walk(point):
            paths += [os.path.join(root, n) for n in dirs + files]
    writable += [p for p in paths if not p.startswith("/tmp/") and not os.path.islink(p) and os.access(p, os.W_OK)]
print(json.dumps({"results": results, "writable": sorted(writable), "root": mounts["/"], "uid": os.getuid(), "gid": os.getgid()}))
'''


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def quota(container) -> float:
    code, q = container.exec_run(["cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"])
    assert code == 0
    _, period = container.exec_run(["cat", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"])
    return int(q) / int(period)


def assert_confined(container, uid: int, gid: int) -> None:
    """The container as documented (README, "Security model"): rank 1's (worker2's) mounts."""
    a = container.attrs
    hc = a["HostConfig"]
    assert a["Config"]["User"] == f"{uid}:{gid}"
    assert hc["CapDrop"] == ["ALL"] and not hc["CapAdd"] and not hc["Privileged"]
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["PidsLimit"] == 4096
    assert hc["ReadonlyRootfs"] is True and set(hc["Tmpfs"]) == {"/tmp"}
    assert {(m["Destination"], m["RW"]) for m in a["Mounts"] if m["Destination"] != "/data"} == {
        (f"{RUN}/job.json", False), (f"{RUN}/logs/cpu-1.log", True),
        (f"{RUN}/logs/toggler-audit.jsonl", False), (f"{RUN}/metrics/rank-1.jsonl", True),
        (f"{RUN}/checkpoints", False)}
    assert a["Config"]["Labels"]["omnilearn.rank"] == "1" and a["Config"]["Labels"]["omnilearn.target"] == "worker2"


def assert_attack_refused(docker_client, victim, out: Path, proc: subprocess.Popen, uid: int, gid: int) -> None:
    """Every way out, tried from inside worker2; the toggler refuses its forged lines, and the other
    containers keep what their own logs asked."""
    code, raw = victim.exec_run(["python", "-c", ATTACK])
    assert code == 0, raw.decode(errors="replace")
    seen = json.loads(raw.decode().strip().splitlines()[-1])
    assert (seen["uid"], seen["gid"]) == (uid, gid)
    done = sorted(k for k, v in seen["results"].items() if v == "done")
    assert done == ["own log: allocation not in the plan", "own log: forged line for rank 0"], seen["results"]
    assert seen["root"] == "ro"
    assert seen["writable"] == [f"{RUN}/logs/cpu-1.log", f"{RUN}/metrics/rank-1.jsonl", "/tmp"]

    def refusals() -> set[str]:
        return {r["reason"] for r in read_audit(out / "logs", status=None)
                if r["file"] == "cpu-1.log" and r["status"] == "refused"}
    wait_for(lambda: refusals() >= {"wrong-rank", "not-in-plan"}, "the refusals", proc)
    for target in ("worker1", "worker3"):
        for _ in range(5):  # a level change of the target's own may land between the two reads
            last = [r for r in read_audit(out / "logs") if r["target"] == target][-1]
            cpus = quota(docker_client.containers.get(target))
            if last == [r for r in read_audit(out / "logs") if r["target"] == target][-1]:
                break
        assert cpus == pytest.approx(last["effective"]["cpus"], abs=1e-3), target
        assert last["file"] == f"cpu-{int(target[-1]) - 1}.log"
        inspected = docker_client.containers.get(target).attrs["HostConfig"]
        assert inspected["CpuQuota"] / inspected["CpuPeriod"] == pytest.approx(cpus, abs=1e-3)


def assert_skew_inside(docker_client, out: Path, proc: subprocess.Popen, job_id: str) -> None:
    """The live level change: once the toggler has applied SKEW to every container, look inside them."""
    def skew_applied() -> dict[str, dict] | None:
        found = {r["target"]: r for r in read_audit(out / "logs") if r["level"] == "SKEW"}
        return found if len(found) == 3 else None

    skew = wait_for(skew_applied, "SKEW in every container", proc)
    for target, cpus in {"worker1": 0.15, "worker2": 0.3, "worker3": 1.2}.items():
        c = docker_client.containers.get(target)
        assert c.labels[LABEL_JOB] == job_id
        assert quota(c) == pytest.approx(cpus, abs=1e-3), target
        assert skew[target]["effective"]["cpus"] == pytest.approx(cpus, abs=1e-3)


def assert_run_folder_kept(out: Path, job_sha: str, job_doc: dict) -> None:
    """After the job: the job file as written, no planted file or link, each log with its own rank's lines."""
    assert sha(out / "job.json") == job_sha and json.loads((out / "job.json").read_text()) == job_doc
    assert not (out / "job.json.new").exists()
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "cpu-0.log", "cpu-1.log", "cpu-2.log", "toggler-audit.jsonl", "toggler.lock",
        "worker-0.out", "worker-1.out", "worker-2.out"]
    assert all(not p.is_symlink() for p in out.rglob("*"))
    for rank in (0, 2):  # the other ranks' logs hold their own workers' lines only
        lines = [json.loads(x) for x in (out / "logs" / f"cpu-{rank}.log").read_text().splitlines()]
        assert lines and all(x["rank"] == rank for x in lines)
    applied = read_audit(out / "logs")
    assert all(r["file"] == f"cpu-{int(r['target'][-1]) - 1}.log" for r in applied)
    assert not [r for r in read_audit(out / "logs", status=None) if r["seq"] == 9]  # the forged record is nowhere
    assert (out / "logs" / "worker-0.out").stat().st_size > 0  # container output kept


def test_a_live_level_change_reaches_the_containers_and_none_reaches_beyond_its_own_files(
        tmp_path: Path, docker_client, worker_image: str, cleanup: list[str]) -> None:
    cfg = write_skew_job(tmp_path, "docker", synthetic_size=2048, epochs=5)
    uid, gid = container_user()
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = job_id_of(out)
        cleanup.append(job_id)
        wait_for(lambda: len({r["target"] for r in read_audit(out / "logs")}) == 3, "the first level", proc)
        job_sha, job_doc = sha(out / "job.json"), json.loads((out / "job.json").read_text())
        victim = docker_client.containers.get("worker2")
        assert_confined(victim, uid, gid)
        assert_attack_refused(docker_client, victim, out, proc, uid, gid)
        assert_skew_inside(docker_client, out, proc, job_id)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert_run_folder_kept(out, job_sha, job_doc)
    s = json.loads((out / "summary.json").read_text())
    assert s["backend"] == "docker"
    assert [c["level"] for c in s["hl_changes"]] == ["EVEN", "SKEW"]
    assert s["allocations"] == pytest.approx([0.15, 0.3, 1.2])
    assert sum(s["batch_sizes"]) == 192 and s["batch_sizes"][2] > 64 > s["batch_sizes"][0]
    for key in ("samples_per_s", "final_accuracy", "compute_ms", "imbalance", "ideal_samples_per_s"):
        assert s[key] is not None, key
    # Nothing of the job is left: containers, network.
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"})
    assert not docker_client.networks.list(filters={"label": f"{LABEL_JOB}={job_id}"})


def test_the_parameter_server_runs_confined_and_writes_only_its_folder(tmp_path: Path, docker_client,
                                                                       worker_image: str, cleanup: list[str]) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnilearn", "run", "--backend", "docker", "--mode", "asp", "--workers", "2",
         "--model", "smallcnn", "--dataset", "synthetic", "--epochs", "2", "--global-batch", "64", "--hl", "HL1",
         "--set", "data.synthetic_size=512", "--set", "data.image_size=16", "--set", "asp.eval_interval=1",
         "--out", str(out), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cleanup.append(job_id_of(out))
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    snapshots = sorted(p.name for p in (out / "snapshots").iterdir())
    assert "snapshot-000.pt" in snapshots and snapshots[-1].startswith("snapshot-")
    assert all((out / "snapshots" / name).stat().st_uid == container_user()[0] for name in snapshots)
    s = json.loads((out / "summary.json").read_text())
    assert s["final_accuracy"] is not None
