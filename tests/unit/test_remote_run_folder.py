"""The run folder of a container on another daemon (omnilearn.launch.docker.remote), checked without a
daemon: what is put in its volume, and how what comes back is taken (a worker may shape it)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec
from omnilearn.launch.docker import mounts, remote, swarm
from omnilearn.launch.docker.mounts import RUN_MOUNT


def job(tmp_path: Path, hosts: dict[str, str] | None = None) -> JobSpec:
    sets = [("mode", "bsp"), ("workers", 3), ("emulation.backend", "docker")]
    sets += [(f"docker.hosts.{t}", u) for t, u in (hosts or {}).items()]
    cfg = config.build(None, sets)
    spec = JobSpec(job_id="j", config=cfg, plan=build_plan(cfg, host=[0, 1]), out_dir=tmp_path / "run",
                   backend="docker")
    spec.save()
    return spec


def tar_of(*entries: tarfile.TarInfo, data: bytes = b"") -> list[bytes]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buf.getvalue()
    return [raw[i:i + 1000] for i in range(0, len(raw), 1000)]  # as a daemon streams it, in chunks


def member(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/shadow"
    return info


class FakeContainer:
    """A container whose volume is a dict: path -> bytes; records what was put."""

    name = "worker3"

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.puts: list[tuple[str, list[tarfile.TarInfo]]] = []

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
            for m in members:
                if m.isreg():
                    self.files[f"{path}/{m.name}"] = tar.extractfile(m).read()
        self.puts.append((path, members))
        return True

    def get_archive(self, path: str) -> tuple[list[bytes], dict]:
        data = self.files[path]
        return tar_of(member(path.rsplit("/", 1)[1], len(data)), data=data), {"size": len(data)}


def test_only_one_regular_file_of_the_expected_name_comes_back() -> None:
    assert remote.read_member(tar_of(member("cpu-2.log", 3), data=b"ab\n"), "cpu-2.log", 100) == b"ab\n"
    for chunks in (tar_of(member("cpu-2.log", kind=tarfile.SYMTYPE)), tar_of(member("cpu-1.log", 3), data=b"ab\n"),
                   tar_of(member("cpu-2.log", kind=tarfile.DIRTYPE)), tar_of(member("cpu-2.log", kind=tarfile.FIFOTYPE)),
                   tar_of(member("cpu-2.log", 3), member("x", 3), data=b"ab\n"), [b"not a tar" * 100]):
        with pytest.raises(ValueError):
            remote.read_member(chunks, "cpu-2.log", 100)


def test_a_stream_over_the_bound_is_not_read_to_its_end() -> None:
    read = []

    def endless():
        while True:
            read.append(1)
            yield b"\0" * 4096

    with pytest.raises(remote.TarTooLarge):
        remote.read_member(endless(), "cpu-2.log", 1000)
    assert len(read) * 4096 <= 1000 + remote.TAR_OVERHEAD + 4096
    with pytest.raises(remote.TarTooLarge):
        remote.read_member(tar_of(member("cpu-2.log", 2000), data=b"x" * 2000), "cpu-2.log", 1000)


def test_mirror_appends_what_grew_and_replaces_what_shrank(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"one\n")
    assert remote.mirror(tmp_path, "f", b"one\ntwo\n") == 8
    assert (tmp_path / "f").read_bytes() == b"one\ntwo\n"
    remote.mirror(tmp_path, "f", b"x\n")
    assert (tmp_path / "f").read_bytes() == b"x\n"
    os.symlink(tmp_path / "f", tmp_path / "link")
    with pytest.raises(OSError):  # never written through a link
        remote.mirror(tmp_path, "link", b"y\n")
    assert (tmp_path / "f").read_bytes() == b"x\n"


def test_the_volume_holds_the_ranks_files_the_worker_owning_its_own_two(tmp_path: Path) -> None:
    spec = job(tmp_path)
    mounts.prepare_run_folder(spec, (os.geteuid(), os.getegid()))
    (spec.log_dir / "cpu-2.log").write_bytes(b"earlier\n")  # a restarted job goes on from its files
    c = FakeContainer()
    remote.seed(c, spec, 2, (10001, 10001), RUN_MOUNT)
    ((path, members),) = c.puts
    assert path == RUN_MOUNT
    owners = {m.name: (m.uid, m.mode, m.type) for m in members}
    assert owners == {"logs": (0, 0o755, tarfile.DIRTYPE), "metrics": (0, 0o755, tarfile.DIRTYPE),
                      "job.json": (0, 0o644, tarfile.REGTYPE),
                      "logs/toggler-audit.jsonl": (0, 0o644, tarfile.REGTYPE),
                      "logs/cpu-2.log": (10001, 0o644, tarfile.REGTYPE),
                      "metrics/rank-2.jsonl": (10001, 0o644, tarfile.REGTYPE)}
    assert c.files[f"{RUN_MOUNT}/logs/cpu-2.log"] == b"earlier\n"
    assert c.files[f"{RUN_MOUNT}/job.json"] == (spec.out_dir / "job.json").read_bytes()


def test_a_poll_pulls_requests_and_metrics_and_pushes_the_audit_once_it_grew(tmp_path: Path) -> None:
    spec = job(tmp_path)
    mounts.prepare_run_folder(spec, (os.geteuid(), os.getegid()))
    c = FakeContainer()
    remote.seed(c, spec, 2, (10001, 10001), RUN_MOUNT)
    folders = remote.RemoteRunFolders(spec, {2: c}, RUN_MOUNT)
    c.files[f"{RUN_MOUNT}/logs/cpu-2.log"] = b'{"seq": 0}\n'
    c.files[f"{RUN_MOUNT}/metrics/rank-2.jsonl"] = b'{"kind": "step"}\n'
    (spec.log_dir / "toggler-audit.jsonl").write_bytes(b'{"status": "applied"}\n')
    folders.poll(metrics=False)
    assert (spec.log_dir / "cpu-2.log").read_bytes() == b'{"seq": 0}\n'
    assert (spec.out_dir / "metrics" / "rank-2.jsonl").read_bytes() == b""  # metrics: every few seconds
    assert c.files[f"{RUN_MOUNT}/logs/toggler-audit.jsonl"] == b'{"status": "applied"}\n'
    pushes = len(c.puts)
    folders.poll(metrics=True)
    assert len(c.puts) == pushes  # the audit did not grow: not pushed again
    assert (spec.out_dir / "metrics" / "rank-2.jsonl").read_bytes() == b'{"kind": "step"}\n'
    c.files[f"{RUN_MOUNT}/logs/cpu-2.log"] = b"x" * 100  # shaped into something else: refused from now on
    c.get_archive = lambda path: (tar_of(member("cpu-2.log", kind=tarfile.SYMTYPE)), {})
    folders.poll()
    assert (2, "cpu-2.log") in folders.refused
    assert (spec.log_dir / "cpu-2.log").read_bytes() == b'{"seq": 0}\n'


def test_remote_mounts_share_no_file_of_this_host(tmp_path: Path) -> None:
    spec = job(tmp_path, {"worker2": "ssh://me@host2"})
    (run,) = mounts.remote_mounts(spec, "vol", None)
    assert (run["Type"], run["Source"], run["Target"]) == ("volume", "vol", RUN_MOUNT)


def test_rank_0_stays_on_the_launchers_daemon(tmp_path: Path) -> None:
    spec = job(tmp_path, {"worker1": "ssh://me@host2"})
    with pytest.raises(UserError, match="rank 0"):
        swarm.clients_for(spec)


def test_only_targets_on_other_daemons_are_kept_in_step(tmp_path: Path) -> None:
    spec = job(tmp_path, {"worker3": "ssh://me@host2"})

    class Client:
        class containers:  # noqa: N801 - the SDK's attribute
            get = staticmethod(lambda cid: f"container {cid}")

    assert remote.remote_containers(spec, {"worker1": "a", "worker2": "b", "worker3": "c"},
                                    {"worker3": Client()}) == {2: "container c"}
