"""Backends against the real kernel (cgroup v1, affinity) and a fake cgroup v2 tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from omnilearn.emulator.backends import NullBackend, cgroup, select_backend
from omnilearn.emulator.backends.affinity import AffinityBackend
from omnilearn.emulator.backends.cgroup import CgroupV1Backend, CgroupV2Backend
from omnilearn.emulator.backends.cgroupfs import CGROUP_ROOT, cfs_limits, read_own_allocation, sweep_stale
from omnilearn.emulator.client import RequestWriter
from omnilearn.emulator.levels import Allocation, format_cpuset, parse_cpuset
from omnilearn.emulator.plan import EmulationPlan
from omnilearn.emulator.schedule import Schedule
from omnilearn.emulator.toggler import Toggler
from omnilearn.errors import UserError


def _v1_writable() -> str | None:
    """Why the real cgroup v1 tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root"
    for ctrl in ("cpu", "cpuset"):
        d = CGROUP_ROOT / ctrl
        if not (d / "cpu.cfs_quota_us" if ctrl == "cpu" else d / "cpuset.cpus").exists():
            return f"cgroup v1 {ctrl} controller not mounted at {d}"
        if not os.access(d, os.W_OK):
            return f"{d} is not writable"
    return None


needs_v1 = pytest.mark.skipif(_v1_writable() is not None, reason=str(_v1_writable()))
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")

BUSY = "while True: pass"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (the kernel's own accounting of the work it did)."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, seconds: float = 1.0) -> float:
    """CPU seconds the process got per wall second over ``seconds``."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def boost(pid: int) -> None:
    """Give a measured child a high CPU weight so that other load on this small host does not eat
    into its unlimited speed (a quota or throttle still caps it: that is what is measured)."""
    if os.geteuid() == 0:
        os.setpriority(os.PRIO_PROCESS, pid, -20)


@contextmanager
def boosted_cgroup(job: str) -> Iterator[None]:
    """The same for a cgroup: its weight competes as one entity at each level of the hierarchy."""
    top = CGROUP_ROOT / "cpu/omnilearn"
    old = (top / "cpu.shares").read_text().strip()
    for d in (top, top / job):
        (d / "cpu.shares").write_text("262144")
    try:
        yield
    finally:
        if top.is_dir():
            (top / "cpu.shares").write_text(old)


def cgroup_line(pid: int, ctrl: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.split(":")[1].split(",").count(ctrl):
            return line.split(":", 2)[2]
    raise AssertionError(f"no {ctrl} line")


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(code: str, **kw: object) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait()


@pytest.fixture
def job() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def v1(job: str) -> Iterator[CgroupV1Backend]:
    b = CgroupV1Backend(job, ["w0", "w1"])
    yield b
    b.close()


def job_dirs(job: str) -> list[Path]:
    return [d for ctrl in ("cpu", "cpuset", "memory") if (d := CGROUP_ROOT / ctrl / "omnilearn" / job).exists()]


# ---------------------------------------------------------------- cgroup v1 (real)


@needs_v1
@two_cpus
def test_v1_quota_and_cpuset_are_enforced(v1: CgroupV1Backend, job: str, spawn) -> None:
    child = spawn(BUSY)
    v1.add_process("w0", child.pid)
    assert cgroup_line(child.pid, "cpu") == f"/omnilearn/{job}/w0"
    assert cgroup_line(child.pid, "cpuset") == f"/omnilearn/{job}/w0"
    assert v1.apply("w0", Allocation()) == Allocation()
    assert (CGROUP_ROOT / "cpu/omnilearn" / job / "w0/cpu.cfs_quota_us").read_text().strip() == "-1"
    # two workers weigh two processes against the host's, at each level of the hierarchy
    assert (CGROUP_ROOT / "cpu/omnilearn" / job / "cpu.shares").read_text().strip() == "2048"
    assert int((CGROUP_ROOT / "cpu/omnilearn/cpu.shares").read_text()) >= 2048
    with boosted_cgroup(job):
        free = cpu_rate(child.pid)
        eff = v1.apply("w0", Allocation(cpus=0.25))
        assert eff == Allocation(cpus=0.25)
        cpu_dir = CGROUP_ROOT / "cpu/omnilearn" / job / "w0"
        assert (cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "2500"
        assert (cpu_dir / "cpu.cfs_period_us").read_text().strip() == "10000"
        limited = cpu_rate(child.pid)
    assert free / limited > 2.5, (free, limited)
    assert 0.15 < limited < 0.35, limited
    stat = dict(line.split() for line in (cpu_dir / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0

    eff = v1.apply("w0", Allocation(cpuset="1", cpus=0.5))
    assert eff == Allocation(cpuset="1", cpus=0.5)
    assert (CGROUP_ROOT / "cpuset/omnilearn" / job / "w0/cpuset.cpus").read_text().strip() == "1"
    assert os.sched_getaffinity(child.pid) == {1}
    # Back to unlimited: the cpuset widens to the parent's again.
    assert v1.apply("w0", Allocation()) == Allocation()
    assert os.sched_getaffinity(child.pid) == set(os.sched_getaffinity(0))


@needs_v1
def test_v1_rejects_cpus_the_kernel_lacks(v1: CgroupV1Backend) -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(OSError):
        v1.apply("w1", Allocation(cpuset=str(missing)))
    with pytest.raises(ValueError, match="not one of this job"):
        v1.apply("w9", Allocation())


@needs_v1
def test_v1_close_with_live_process_restores_and_removes(job: str, spawn) -> None:
    child = spawn("import time; time.sleep(60)")
    memory_before = cgroup_line(child.pid, "memory")
    b = CgroupV1Backend(job, ["w0"])
    b.add_process("w0", child.pid)
    eff = b.apply("w0", Allocation(cpus=0.5, memory=256 * 2**20))
    assert eff == Allocation(cpus=0.5, memory=256 * 2**20)
    mem_dir = CGROUP_ROOT / "memory/omnilearn" / job / "w0"
    assert int((mem_dir / "memory.limit_in_bytes").read_text()) == 256 * 2**20
    assert cgroup_line(child.pid, "memory") == f"/omnilearn/{job}/w0"
    assert len(job_dirs(job)) == 3
    b.close()
    assert job_dirs(job) == []
    assert child.poll() is None  # alive, and back where it came from
    assert cgroup_line(child.pid, "cpu") == "/"
    assert cgroup_line(child.pid, "memory") == memory_before
    b.close()  # idempotent


@needs_v1
def test_v1_close_after_process_died(job: str, spawn) -> None:
    child = spawn("import time; time.sleep(60)")
    b = CgroupV1Backend(job, ["w0", "w1"])
    b.add_process("w0", child.pid)
    b.apply("w0", Allocation(cpus=0.5))
    child.kill()
    child.wait()
    b.close()
    assert job_dirs(job) == []
    b.close()


@needs_v1
@two_cpus
def test_read_own_allocation_inside_the_cgroup(v1: CgroupV1Backend, spawn) -> None:
    code = ("import json, sys; sys.stdin.readline(); "
            "from omnilearn.emulator.backends.cgroupfs import read_own_allocation; "
            "print(json.dumps(read_own_allocation().to_dict()))")
    child = spawn(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    v1.add_process("w1", child.pid)
    v1.apply("w1", Allocation(cpuset="1", cpus=0.5))
    out, _ = child.communicate("go\n", timeout=20)
    assert json.loads(out) == {"cpuset": "1", "cpus": 0.5, "memory": None}


@needs_v1
@two_cpus
def test_toggler_through_real_cgroups(v1: CgroupV1Backend, job: str, tmp_path: Path, spawn) -> None:
    child = spawn("import time; time.sleep(60)")
    v1.add_process("w1", child.pid)
    plan = EmulationPlan("cpuset", ("w0", "w1"), {"HL4": {"w0": Allocation(), "w1": Allocation(cpuset="1", cpus=0.5)}},
                         Schedule.pinned("HL4"))
    toggler = Toggler(tmp_path, v1, plan)
    writer = RequestWriter(tmp_path, 1)
    req = writer.submit("w1", "HL4", Allocation(cpuset="1", cpus=0.5), epoch=3)
    toggler.poll_once()
    rec = writer.wait_applied(req, timeout=1)
    assert rec is not None and rec["status"] == "applied"
    assert rec["effective"] == {"cpuset": "1", "cpus": 0.5, "memory": None}
    assert (CGROUP_ROOT / "cpu/omnilearn" / job / "w1/cpu.cfs_quota_us").read_text().strip() == "5000"
    assert os.sched_getaffinity(child.pid) == {1}
    # What is in force, read back without changing it: w0 was never given a level (its parent's CPUs, no quota).
    assert (v1.current("w1"), v1.current("w0")) == (Allocation(cpuset="1", cpus=0.5), Allocation())


@needs_v1
def test_sweep_stale_removes_only_abandoned_jobs(job: str, spawn) -> None:
    abandoned = CgroupV1Backend(job, ["w0"])  # its launcher "was SIGKILLed": never closed
    abandoned.apply("w0", Allocation(cpus=0.5))
    live_job = job + "-live"
    live = CgroupV1Backend(live_job, ["w0"])
    child = spawn("import time; time.sleep(60)")
    live.add_process("w0", child.pid)
    try:
        assert sweep_stale(jobs=[job, live_job]) == []  # both too young for the default min_age
        removed = sweep_stale(jobs=[job, live_job], min_age=0)
        assert sorted(removed) == sorted(str(CGROUP_ROOT / c / "omnilearn" / job) for c in ("cpu", "cpuset"))
        assert job_dirs(job) == []
        assert len(job_dirs(live_job)) == 2
    finally:
        live.close()
        abandoned.close()
    assert job_dirs(live_job) == []


@needs_v1
def test_select_backend(job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(select_backend("none", job, ["w0"]), NullBackend)
    assert isinstance(select_backend("affinity", job, ["w0"]), AffinityBackend)
    b = select_backend("auto", job, ["w0"])
    try:
        assert b.name == ("cgroup-v2" if (CGROUP_ROOT / "cgroup.controllers").exists() else "cgroup-v1")
    finally:
        b.close()
    with pytest.raises(UserError, match="unknown backend 'bogus'"):
        select_backend("bogus", job, ["w0"])
    monkeypatch.setattr(cgroup.os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root"):
        select_backend("cgroup", job, ["w0"])
    assert isinstance(select_backend("auto", job, ["w0"]), AffinityBackend)
    assert job_dirs(job) == []


def test_bad_names_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="job id"):
        CgroupV1Backend("../etc", ["w0"], root=tmp_path)
    with pytest.raises(UserError, match="target"):
        CgroupV2Backend("job", ["a/b"], root=tmp_path)


# ---------------------------------------------------------------- cgroup v2 (fake tree)


def fake_v2(tmp_path: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    """The files the kernel shows at the root of a unified hierarchy."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("\n")
    (root / "cgroup.procs").write_text("1\n")
    (root / "cpuset.cpus.effective").write_text("0-1\n")
    return root


def test_v2_writes_the_unified_files(tmp_path: Path) -> None:
    root = fake_v2(tmp_path)
    b = CgroupV2Backend("job1", ["w0", "w1"], root=root)
    for parent in (root, root / "omnilearn", root / "omnilearn/job1"):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory"
    w0, w1 = root / "omnilearn/job1/w0", root / "omnilearn/job1/w1"
    assert w0.is_dir() and w1.is_dir()
    assert (root / "omnilearn/job1/cpu.weight").read_text() == "200"  # two workers: two processes' weight

    eff = b.apply("w0", Allocation(cpuset="1", cpus=0.25, memory=2**28))
    assert (w0 / "cpu.max").read_text() == "2500 10000"
    assert (w0 / "cpuset.cpus").read_text() == "1"
    assert (w0 / "memory.max").read_text() == str(2**28)
    assert eff == Allocation(cpuset="1", cpus=0.25, memory=2**28)

    eff = b.apply("w1", Allocation(cpus=1.5))
    assert (w1 / "cpu.max").read_text() == "15000 10000"
    assert (w1 / "cpuset.cpus").read_text() == ""
    assert (w1 / "memory.max").read_text() == "max"
    assert eff == Allocation(cpus=1.5) == b.current("w1")  # read back again, unchanged
    assert b.apply("w1", Allocation()) == Allocation()
    assert (w1 / "cpu.max").read_text() == "max 10000"

    b.add_process("w0", os.getpid())
    assert (w0 / "cgroup.procs").read_text() == str(os.getpid())
    b.close()  # moves the process back to its cgroup ("/" here); a fake dir cannot be rmdir'ed
    assert (root / "cgroup.procs").read_text() == str(os.getpid())
    b.close()


def test_v2_kernel_effective_cpuset_is_read_back(tmp_path: Path) -> None:
    root = fake_v2(tmp_path, "cpuset cpu")
    b = CgroupV2Backend("job1", ["w0"], root=root)
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +cpuset"
    d = root / "omnilearn/job1/w0"
    (root / "omnilearn/job1/cpuset.cpus.effective").write_text("0-1\n")
    (d / "cpuset.cpus.effective").write_text("0-1\n")  # the kernel: empty cpuset.cpus = the parent's
    assert b.apply("w0", Allocation()) == Allocation()
    with pytest.raises(UserError, match="memory controller"):
        b.apply("w0", Allocation(memory=2**20))


def test_v2_missing_controllers_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="lacks the cpuset controller"):
        CgroupV2Backend("job1", ["w0"], root=fake_v2(tmp_path, "cpu io memory"))
    with pytest.raises(UserError, match="not a cgroup v2"):
        CgroupV2Backend("job1", ["w0"], root=tmp_path)


# ---------------------------------------------------------------- affinity + throttle (real)


@two_cpus
def test_affinity_pins_every_thread(spawn) -> None:
    code = ("import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
            "print('ready', flush=True); time.sleep(60)")
    child = spawn(code, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    b = AffinityBackend()
    try:
        b.add_process("w0", child.pid)
        eff = b.apply("w0", Allocation(cpuset="0"))
        assert eff == Allocation(cpuset="0")
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) == 2
        assert all(os.sched_getaffinity(int(t)) == {0} for t in tids)
        assert b.current("w0") == Allocation(cpuset="0") and b.current("w1") == Allocation()
        assert b.apply("w0", Allocation()) == Allocation()
        assert os.sched_getaffinity(child.pid) == set(os.sched_getaffinity(0))
    finally:
        b.close()


def test_affinity_throttle_slows_a_busy_child(spawn) -> None:
    child = spawn(BUSY)
    boost(child.pid)
    b = AffinityBackend()
    try:
        b.add_process("w0", child.pid)
        assert b.apply("w0", Allocation()) == Allocation()
        free = cpu_rate(child.pid)
        achieved = b.apply("w0", Allocation(cpus=0.25))  # the duty cycle the throttle achieved, measured
        assert achieved.cpuset is None and 0.2 < achieved.cpus < 0.4, achieved
        limited = cpu_rate(child.pid)
        assert free / limited > 2, (free, limited)
        b.stall("w0", 0.6)  # a stall holds through the throttle's periods
        assert cpu_rate(child.pid, 0.4) < 0.05
        time.sleep(0.4)
        assert cpu_rate(child.pid, 0.5) > 0.05
    finally:
        b.close()
    b.close()
    state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state != "T"  # close() let it run again
    assert cpu_rate(child.pid, 0.3) > 0.5 * free


def test_null_backend_reports_the_request() -> None:
    b = NullBackend()
    b.add_process("w0", os.getpid())
    assert b.apply("w0", Allocation(cpuset="0", cpus=0.5)) == Allocation(cpuset="0", cpus=0.5)
    assert b.current("w0") is None  # nothing is enforced, so nothing is read back
    b.close()


def test_read_own_allocation_matches_affinity() -> None:
    own = read_own_allocation()
    affinity = os.sched_getaffinity(0)
    online = set(parse_cpuset(Path("/sys/devices/system/cpu/online").read_text()))
    assert own.cpuset == (None if affinity >= online else format_cpuset(affinity))
    assert own.cpus is None or 0 < own.cpus <= len(online)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_pauses_resume_after_the_duration_and_at_close() -> None:
    from omnilearn.emulator.backends.pauses import Pauses

    calls: list[str] = []
    p = Pauses()
    p.pause("w0", 0.05, lambda: calls.append("stop w0"), lambda: calls.append("cont w0"))
    p.pause("w0", 0.2, lambda: calls.append("stop again"), lambda: calls.append("cont w0"))  # extends
    assert p.paused("w0") and calls == ["stop w0"]
    time.sleep(0.1)
    assert calls == ["stop w0"]  # the first timer was replaced by the longer one
    time.sleep(0.3)
    assert calls == ["stop w0", "cont w0"] and not p.paused("w0")
    p.pause("w1", 60, lambda: calls.append("stop w1"), lambda: calls.append("cont w1"))
    p.close()
    assert calls[-2:] == ["stop w1", "cont w1"]


@needs_v1
def test_v1_stall_stops_the_worker_for_its_duration(v1: CgroupV1Backend, spawn) -> None:
    child = spawn(BUSY)
    v1.add_process("w1", child.pid)
    v1.stall("w1", 0.5)
    time.sleep(0.1)
    assert _state(child.pid) == "T"
    time.sleep(0.6)
    assert _state(child.pid) in ("R", "S")
    v1.stall("w1", 60)
    v1.close()  # never leaves a worker stopped
    assert _state(child.pid) in ("R", "S")


def test_cfs_limits_keep_the_share_within_the_kernels_ranges() -> None:
    assert cfs_limits(0.15) == (1_500, 10_000)
    assert cfs_limits(1.2, 20_000) == (24_000, 20_000)
    assert cfs_limits(0.05) == (1_000, 20_000)  # a quota under 1 ms stretches the period
    assert cfs_limits(0.01) == (1_000, 100_000)
    assert cfs_limits(0.0001) == (1_000, 1_000_000)  # no longer than the kernel's longest period
