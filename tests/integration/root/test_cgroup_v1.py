"""The cgroup v1 backend against the real kernel (root): quota and cpuset, cleanup, read-back, the toggler through real cgroups, stalls."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from omnilearn.emulator.backends import NullBackend, cgroup, select_backend
from omnilearn.emulator.backends.affinity import AffinityBackend
from omnilearn.emulator.backends.cgroup import CgroupV1Backend
from omnilearn.emulator.backends.cgroupfs import CGROUP_ROOT, sweep_stale
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.errors import UserError

two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")


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


@pytest.fixture
def job() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def job_dirs(job: str) -> list[Path]:
    return [d for ctrl in ("cpu", "cpuset", "memory") if (d := CGROUP_ROOT / ctrl / "omnilearn" / job).exists()]


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


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Polls ``cond`` until it holds; a hang guard, not a timing: fails only past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.05)


def cgroup_line(pid: int, ctrl: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.split(":")[1].split(",").count(ctrl):
            return line.split(":", 2)[2]
    raise AssertionError(f"no {ctrl} line")




@pytest.fixture
def v1(job: str) -> Iterator[CgroupV1Backend]:
    b = CgroupV1Backend(job, ["w0", "w1"])
    yield b
    b.close()


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
    eff = v1.apply("w0", Allocation(cpus=0.25))
    assert eff == Allocation(cpus=0.25)
    cpu_dir = CGROUP_ROOT / "cpu/omnilearn" / job / "w0"
    assert (cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "2500"
    assert (cpu_dir / "cpu.cfs_period_us").read_text().strip() == "10000"
    # The kernel's own count of the periods it cut the busy child short: the quota is enforced. How fast
    # the child then runs on a shared host is a measurement (omnilearn calibrate), not a test.
    wait_for(lambda: int(dict(line.split() for line in (cpu_dir / "cpu.stat").read_text().splitlines())
                         ["nr_throttled"]) > 0, "the quota never throttled the busy child")

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


QUOTA_CLOCK_CHILD = """
import json, sys, time
from omnilearn.train.quota_clock import QuotaClock
sys.stdin.readline()
clock = QuotaClock()
before, cpu0 = clock.read(), time.process_time()
while time.process_time() - cpu0 < 0.05:
    pass
after = clock.read()
print(json.dumps({"held": QuotaClock.since(before, after), "where": str(after[0]) if after else None,
                  "outside": QuotaClock.since(before, (after[0].parent, after[1])) if after else None,
                  "limited": clock.limited()}))
"""


@needs_v1
def test_quota_clock_reads_the_processs_own_throttling(v1: CgroupV1Backend, job: str, spawn) -> None:
    """A busy process under a tenth of a core reads its own cgroup's throttled time: 50 ms of CPU at
    1 ms a 10-ms period are at least a few periods held back, whatever else the host runs."""
    child = spawn(QUOTA_CLOCK_CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    v1.add_process("w0", child.pid)
    v1.apply("w0", Allocation(cpus=0.1))
    out, _ = child.communicate("go\n", timeout=60)
    got = json.loads(out)
    assert got["where"] == str(CGROUP_ROOT / "cpu/omnilearn" / job / "w0")
    assert got["held"] >= 0.02, got  # 50 periods' worth of work; a loaded host only adds throttled periods
    assert got["outside"] == 0.0  # readings of two cgroups are never subtracted
    assert got["limited"] is True


@needs_v1
def test_quota_clock_tells_a_core_set_from_a_quota(v1: CgroupV1Backend, job: str, spawn) -> None:
    """A process given cores and no quota reads no quota (its start-up pass then keeps wall times)."""
    child = spawn(QUOTA_CLOCK_CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    v1.add_process("w0", child.pid)
    v1.apply("w0", Allocation(cpuset="0"))
    out, _ = child.communicate("go\n", timeout=60)
    got = json.loads(out)
    assert got["where"] == str(CGROUP_ROOT / "cpu/omnilearn" / job / "w0")
    assert got["limited"] is False and got["held"] == 0.0


QUOTA_CLOCK_FOLLOWS = """
import json, sys
from omnilearn.train.quota_clock import QuotaClock
clock = QuotaClock()
for _ in range(3):
    reading = clock.read()
    print(json.dumps([str(reading[0]) if reading else None, clock.cpus(reading)]), flush=True)
    sys.stdin.readline()
"""


@needs_v1
def test_quota_clock_follows_a_move_and_a_new_quota_with_its_files_kept_open(v1: CgroupV1Backend, job: str,
                                                                            spawn) -> None:
    """One clock, read before the process is moved into a cgroup, after, and after its quota changes:
    each reading names the cgroup the process is in and the quota in force then."""
    child = spawn(QUOTA_CLOCK_FOLLOWS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    first = json.loads(child.stdout.readline())
    v1.add_process("w0", child.pid)
    v1.apply("w0", Allocation(cpus=0.1))
    child.stdin.write("moved\n")
    child.stdin.flush()
    second = json.loads(child.stdout.readline())
    v1.apply("w0", Allocation(cpus=0.5))
    child.stdin.write("changed\n")
    child.stdin.flush()
    third = json.loads(child.stdout.readline())
    child.communicate("end\n", timeout=20)
    where = str(CGROUP_ROOT / "cpu/omnilearn" / job / "w0")
    assert first[0] != where
    assert second == [where, 0.1]
    assert third == [where, 0.5]


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


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


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
