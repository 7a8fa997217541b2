"""Backends without the kernel: a fake cgroup v2 tree, the null backend, stalls on a fake clock, CFS limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakes import FakeClock
from omnilearn.emulator.backends import NullBackend
from omnilearn.emulator.backends.cgroup import CgroupV1Backend, CgroupV2Backend
from omnilearn.emulator.backends.cgroupfs import cfs_limits, read_own_allocation
from omnilearn.emulator.spec.levels import Allocation, format_cpuset, parse_cpuset
from omnilearn.errors import UserError

# ---------------------------------------------------------------- cgroup v1 (real)


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


def test_pauses_resume_after_the_duration_and_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator.backends import pauses

    clock = FakeClock()
    monkeypatch.setattr(pauses, "Timer", clock.timer)
    calls: list[str] = []
    p = pauses.Pauses()
    p.pause("w0", 0.05, lambda: calls.append("stop w0"), lambda: calls.append("cont w0"))
    p.pause("w0", 0.2, lambda: calls.append("stop again"), lambda: calls.append("cont w0"))  # extends
    assert p.paused("w0") and calls == ["stop w0"]
    clock.advance(0.1)
    assert calls == ["stop w0"]  # the first timer was replaced by the longer one
    clock.advance(0.1)
    assert calls == ["stop w0", "cont w0"] and not p.paused("w0")
    p.pause("w1", 60, lambda: calls.append("stop w1"), lambda: calls.append("cont w1"))
    p.close()
    assert calls[-2:] == ["stop w1", "cont w1"]


def test_cfs_limits_keep_the_share_within_the_kernels_ranges() -> None:
    assert cfs_limits(0.15) == (1_500, 10_000)
    assert cfs_limits(1.2, 20_000) == (24_000, 20_000)
    assert cfs_limits(0.05) == (1_000, 20_000)  # a quota under 1 ms stretches the period
    assert cfs_limits(0.01) == (1_000, 100_000)
    assert cfs_limits(0.0001) == (1_000, 1_000_000)  # no longer than the kernel's longest period


def test_a_share_of_a_step_under_a_quota_is_its_cpu_at_the_quotas_rate() -> None:
    """Under a sixth of a core, 2 ms of CPU that ran at a core's speed within a period (2 ms of wall
    time) cost the step 12 ms; a compute that spanned periods shows the quota in its wall time already;
    threads' CPU counts as the quota counts it; without a quota the wall time stands."""
    from omnilearn.train.quota_clock import quota_seconds

    assert quota_seconds(0.002, 0.002, 1 / 6) == pytest.approx(0.012)
    assert quota_seconds(1.200, 0.190, 1 / 6) == pytest.approx(1.200)
    assert quota_seconds(0.010, 0.040, 2.0) == pytest.approx(0.020)
    assert quota_seconds(0.002, 0.004, None) == 0.002
