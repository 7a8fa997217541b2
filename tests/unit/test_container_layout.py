"""What a container of a job may see and write, and how it is confined: checked without a daemon."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.protocol.audit import recover
from omnilearn.emulator.protocol.requests import MAX_STRAY_REPORTS
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec
from omnilearn.launch.docker import mounts, swarm
from omnilearn.launch.docker.containers import save_logs
from omnilearn.launch.docker.mounts import RUN_MOUNT, container_mounts, prepare_run_folder


def job(tmp_path: Path, mode: str = "bsp", *sets: str) -> JobSpec:
    cfg = config.build(None, [("mode", mode), ("workers", 2), ("emulation.backend", "docker"),
                              *(config.parse_assignment(s) for s in sets)])
    spec = JobSpec(job_id="j", config=cfg, plan=build_plan(cfg, host=[0, 1]), out_dir=tmp_path / "run",
                   backend="docker")
    spec.save()
    return spec


def table(mount_list: list) -> dict[str, tuple[str, bool]]:
    return {m["Target"]: (m["Source"], m["ReadOnly"]) for m in mount_list if m["Type"] == "bind"}


def test_a_worker_mounts_its_own_files_only(tmp_path: Path) -> None:
    spec = job(tmp_path)
    out = spec.out_dir
    assert table(container_mounts(spec, 1, Path("/srv/data"))) == {
        f"{RUN_MOUNT}/job.json": (str(out / "job.json"), True),
        f"{RUN_MOUNT}/logs/cpu-1.log": (str(out / "logs" / "cpu-1.log"), False),
        f"{RUN_MOUNT}/logs/toggler-audit.jsonl": (str(out / "logs" / "toggler-audit.jsonl"), True),
        f"{RUN_MOUNT}/metrics/rank-1.jsonl": (str(out / "metrics" / "rank-1.jsonl"), False),
        f"{RUN_MOUNT}/checkpoints": (str(out / "checkpoints"), True),  # read when the job resumes
        "/data": ("/srv/data", True),
    }
    assert table(container_mounts(spec, 0, None))[f"{RUN_MOUNT}/checkpoints"] == (str(out / "checkpoints"), False)


def test_the_parameter_server_alone_writes_the_snapshot_folder(tmp_path: Path) -> None:
    spec = job(tmp_path, "asp")
    server, worker = table(container_mounts(spec, 0, None)), table(container_mounts(spec, 1, None))
    assert server[f"{RUN_MOUNT}/snapshots"] == (str(spec.out_dir / "snapshots"), False)
    assert not any("snapshots" in target for target in worker)
    assert [t for t, (_, ro) in worker.items() if not ro] == [f"{RUN_MOUNT}/logs/cpu-1.log",
                                                              f"{RUN_MOUNT}/metrics/rank-1.jsonl"]


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user: needs root")
def test_prepare_creates_each_mounted_file_for_its_owner(tmp_path: Path) -> None:
    spec = job(tmp_path, "asp")
    prepare_run_folder(spec, (10001, 10002))
    out = spec.out_dir
    for path in (out / "logs" / "cpu-0.log", out / "logs" / "cpu-2.log", out / "metrics" / "rank-1.jsonl",
                 out / "snapshots"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (10001, 10002), path
    audit = (out / "logs" / "toggler-audit.jsonl").lstat()
    assert audit.st_uid == os.geteuid() and audit.st_size == 0
    assert (out / "job.json").stat().st_uid == os.geteuid()
    prepare_run_folder(spec, (10001, 10002))  # again (cluster up after a failed start): the same files


def test_prepare_refuses_a_planted_link(tmp_path: Path) -> None:
    spec = job(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("x")
    (spec.log_dir / "cpu-1.log").symlink_to(victim)
    with pytest.raises(UserError, match="cpu-1.log"):
        prepare_run_folder(spec, mounts.container_user())
    assert victim.stat().st_uid == os.geteuid()


def test_containers_are_confined_as_documented(tmp_path: Path) -> None:
    cfg = config.build(None, [])
    assert swarm.confinement(cfg.docker, (10001, 10001)) == {
        "user": "10001:10001", "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "pids_limit": 4096,
        "read_only": True, "tmpfs": {"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"}}
    assert mounts.container_user() == ((10001, 10001) if os.geteuid() == 0 else (os.geteuid(), os.getegid()))
    with pytest.raises(UserError, match="docker.pids_limit"):
        config.build(None, [("docker.pids_limit", 10)])


def test_overlay_encryption_follows_the_hosts_unless_set() -> None:
    one = config.build(None, [])
    spread = config.build(None, [("docker.hosts", {"worker2": "ssh://u@host2"})])
    assert not swarm.overlay_encrypted(one.docker) and swarm.overlay_encrypted(spread.docker)
    assert swarm.overlay_encrypted(config.build(None, [("docker.encrypted", True)]).docker)
    off = config.build(None, [("docker.hosts", {"worker2": "ssh://u@host2"}), ("docker.encrypted", False)])
    assert not swarm.overlay_encrypted(off.docker)


def test_recovery_state_is_bounded_whatever_the_audit_holds() -> None:
    forged = ({"status": "refused", "reason": "unexpected-log-name", "file": f"cpu-{i}x.log"} for i in range(10**5))
    count, strays = recover(forged, {})
    assert count == 10**5 and len(strays) == MAX_STRAY_REPORTS


def test_saved_container_output_never_goes_through_a_planted_link(tmp_path: Path) -> None:
    class Container:
        def logs(self) -> bytes:
            return b"worker output\n"

    class Client:
        containers = type("Containers", (), {"get": staticmethod(lambda cid: Container())})

    victim = tmp_path / "victim"
    victim.write_text("keep")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker-0.out").symlink_to(victim)
    save_logs(Client(), {}, {"worker1": "a", "worker2": "b"}, logs, ["worker1", "worker2"])
    assert victim.read_text() == "keep" and (logs / "worker-0.out").is_symlink()
    assert (logs / "worker-1.out").read_bytes() == b"worker output\n"
