"""cgroup backends: one cgroup per target under ``omnilearn/<job_id>/``, v1 or v2.

Processes are only ever moved into this job's own cgroups and moved back where they came from on
``close``; every ``apply`` returns the allocation read back from the kernel's files.
"""

from __future__ import annotations

import os
from pathlib import Path

from omnilearn.emulator.backends.cgroupfs import (
    CGROUP_ROOT,
    PERIOD_US,
    TOP,
    UNLIMITED_MEMORY,
    cfs_limits,
    check_name,
    membership,
    move_out,
    read,
    try_read,
    write,
)
from omnilearn.emulator.backends.pauses import CONT, STOP, Pauses, signal_all
from omnilearn.emulator.spec.levels import Allocation, effective_cpuset
from omnilearn.errors import UserError


def _weigh(parents: list[Path], name: str, one: int, most: int, workers: int) -> None:
    """Give the job's parent cgroups the scheduling weight of ``workers`` processes.

    Unweighted, the whole job's tree competes with the host's other processes as one process does
    (``one``: the default weight), so under load the workers together get one process's share and the
    quotas are not delivered. A container sits in a cgroup of its own and weighs one process, as a
    worker here now does. The top cgroup, shared by concurrent jobs, keeps the largest weight asked.
    """
    for i, d in enumerate(parents):
        weight = min(one * workers, most)
        if i == 0:
            weight = max(weight, int(try_read(d / name) or 0))
        write(d / name, str(weight))


class _CgroupBackend:
    """What both cgroup versions share: checked names, one cgroup per target, known pids, the CFS
    period a quota is given against (:func:`~.cgroupfs.cfs_limits`)."""

    def __init__(self, job_id: str, targets: list[str], root: Path, period_us: int = PERIOD_US) -> None:
        check_name("job id", job_id)
        for t in targets:
            check_name("target", t)
        self.job_id = job_id
        self.period_us = period_us
        self.targets = list(targets)
        self.root = Path(root)
        self._pids: dict[str, list[int]] = {t: [] for t in self.targets}
        self._pauses = Pauses()

    def _known(self, target: str) -> None:
        if target not in self._pids:
            raise ValueError(f"target {target!r} is not one of this job's cgroups ({', '.join(self.targets)})")

    def stall(self, target: str, seconds: float) -> None:
        """SIGSTOP the target's processes, SIGCONT them ``seconds`` later (or at ``close``)."""
        self._known(target)
        pids = list(self._pids[target])
        self._pauses.pause(target, seconds, signal_all(pids, STOP), signal_all(pids, CONT))


class CgroupV1Backend(_CgroupBackend):
    """One cgroup per target in the v1 ``cpu``, ``cpuset`` (and, when limited, ``memory``) hierarchies."""

    name = "cgroup-v1"

    def __init__(self, job_id: str, targets: list[str], root: Path = CGROUP_ROOT, memory: bool = False,
                 period_us: int = PERIOD_US) -> None:
        super().__init__(job_id, targets, root, period_us)
        self._origin: dict[str, dict[int, Path]] = {}  # controller -> pid -> cgroup it came from
        # Memory cgroups only when the job limits memory. Then they exist before the workers start: a
        # page is charged where it was first touched (this kernel cannot move charges), so a process
        # joining later would leave its first pages, torch included, outside the limit.
        self._memory = False
        for ctrl in ("cpu", "cpuset"):
            if not (self.root / ctrl).is_dir():
                raise UserError(f"cgroup v1 controller {ctrl!r} is not mounted at {self.root / ctrl}")
        try:
            for ctrl in ("cpu", "cpuset"):
                self._make(ctrl)
            _weigh([self.root / "cpu" / TOP, self._dir("cpu")], "cpu.shares", 1024, 262144, len(targets))
        except OSError as e:
            self.close()
            raise UserError(f"cannot create cgroups under {self.root} ({e.strerror}): "
                            f"run as root with cgroup v1 writable, or use --backend affinity") from None
        if memory:
            self._enable_memory()

    def _dir(self, ctrl: str, target: str | None = None) -> Path:
        d = self.root / ctrl / TOP / self.job_id
        return d / target if target is not None else d

    def _make(self, ctrl: str) -> None:
        chain = [self.root / ctrl / TOP, self._dir(ctrl)] + [self._dir(ctrl, t) for t in self.targets]
        for d in chain:
            d.mkdir(exist_ok=True)
            if ctrl == "cpuset":
                # A new cpuset has no CPUs and no memory nodes; no task may join until it has both.
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not read(d / f):
                        write(d / f, read(d.parent / f))

    def add_process(self, target: str, pid: int) -> None:
        self._known(target)
        ctrls = ["cpu", "cpuset"] + (["memory"] if self._memory else [])
        member = membership(pid)
        for ctrl in ctrls:
            self._remember_origin(ctrl, pid, member)
            write(self._dir(ctrl, target) / "cgroup.procs", str(pid))
        self._pids[target].append(pid)

    def _remember_origin(self, ctrl: str, pid: int, member: dict[str, str]) -> None:
        path = member.get(ctrl, "/")
        origin = self.root / ctrl / path.lstrip("/")
        if TOP in Path(path).parts[:2]:  # already in an omnilearn cgroup: send it to the root later
            origin = self.root / ctrl
        self._origin.setdefault(ctrl, {}).setdefault(pid, origin)

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self._known(target)
        cpu, cpuset = self._dir("cpu", target), self._dir("cpuset", target)
        if allocation.cpus is None:
            write(cpu / "cpu.cfs_quota_us", "-1")
        else:
            quota, period = cfs_limits(allocation.cpus, self.period_us)
            write(cpu / "cpu.cfs_period_us", str(period))
            write(cpu / "cpu.cfs_quota_us", str(quota))
        full = read(self._dir("cpuset") / "cpuset.cpus")
        write(cpuset / "cpuset.cpus", allocation.cpuset if allocation.cpuset is not None else full)
        if allocation.memory is not None and not self._memory:
            self._enable_memory()
        if self._memory:
            write(self._dir("memory", target) / "memory.limit_in_bytes",
                   "-1" if allocation.memory is None else str(allocation.memory))
        return self._read_back(target, allocation, full)

    def current(self, target: str) -> Allocation:
        self._known(target)
        return self._read_back(target, Allocation(), read(self._dir("cpuset") / "cpuset.cpus"))

    def _enable_memory(self) -> None:
        if not (self.root / "memory").is_dir():
            raise UserError(f"a memory limit needs the v1 memory controller at {self.root / 'memory'}")
        self._make("memory")
        self._memory = True
        for target, pids in self._pids.items():
            for pid in pids:
                try:
                    self._remember_origin("memory", pid, membership(pid))
                    write(self._dir("memory", target) / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass

    def _read_back(self, target: str, requested: Allocation, full: str) -> Allocation:
        quota = int(read(self._dir("cpu", target) / "cpu.cfs_quota_us"))
        period = int(read(self._dir("cpu", target) / "cpu.cfs_period_us"))
        memory = None
        if self._memory:
            limit = int(read(self._dir("memory", target) / "memory.limit_in_bytes"))
            memory = None if limit >= UNLIMITED_MEMORY else limit
        return Allocation(
            cpuset=effective_cpuset(read(self._dir("cpuset", target) / "cpuset.cpus"), requested.cpuset, full),
            cpus=None if quota < 0 else quota / period,
            memory=memory,
        )

    def close(self) -> None:
        """Move remaining tasks back where they came from and remove this job's cgroups."""
        self._pauses.close()
        for ctrl in ("cpu", "cpuset", "memory"):
            job = self._dir(ctrl)
            if not job.is_dir():
                continue
            origin = self._origin.get(ctrl, {})
            for t in self.targets:
                move_out(self._dir(ctrl, t), origin, self.root / ctrl)
            move_out(job, origin, self.root / ctrl)
            try:
                (self.root / ctrl / TOP).rmdir()
            except OSError:
                pass  # another job still has cgroups there


class CgroupV2Backend(_CgroupBackend):
    """One cgroup per target in the unified hierarchy: ``cpu.max``, ``cpuset.cpus``, ``memory.max``."""

    name = "cgroup-v2"

    def __init__(self, job_id: str, targets: list[str], root: Path = CGROUP_ROOT, period_us: int = PERIOD_US) -> None:
        super().__init__(job_id, targets, root, period_us)
        self._origin: dict[int, Path] = {}
        try:
            available = read(self.root / "cgroup.controllers").split()
        except FileNotFoundError:
            raise UserError(f"{self.root} is not a cgroup v2 (unified) hierarchy") from None
        missing = [c for c in ("cpu", "cpuset") if c not in available]
        if missing:
            raise UserError(f"cgroup v2 at {self.root} lacks the {', '.join(missing)} controller(s) "
                            f"(has: {' '.join(available) or 'none'}); use --backend affinity")
        self.controllers = ["cpu", "cpuset"] + (["memory"] if "memory" in available else [])
        try:
            for parent in (self.root, self.root / TOP, self._dir()):
                if parent != self.root:
                    parent.mkdir(exist_ok=True)
                self._enable(parent)
            for t in self.targets:
                self._dir(t).mkdir(exist_ok=True)
            _weigh([self.root / TOP, self._dir()], "cpu.weight", 100, 10000, len(targets))
        except OSError as e:
            self.close()
            raise UserError(f"cannot set up cgroups under {self.root} ({e.strerror}): "
                            f"run as root with cgroup v2 writable, or use --backend affinity") from None

    def _dir(self, target: str | None = None) -> Path:
        d = self.root / TOP / self.job_id
        return d / target if target is not None else d

    def _enable(self, cgroup: Path) -> None:
        """Delegate the controllers to ``cgroup``'s children."""
        try:
            enabled = read(cgroup / "cgroup.subtree_control").split()
        except FileNotFoundError:
            enabled = []
        missing = [f"+{c}" for c in self.controllers if c not in enabled]
        if missing:
            write(cgroup / "cgroup.subtree_control", " ".join(missing))

    def add_process(self, target: str, pid: int) -> None:
        self._known(target)
        path = membership(pid).get("", "/")
        origin = self.root / path.lstrip("/")
        self._origin.setdefault(pid, self.root if TOP in Path(path).parts[:2] else origin)
        write(self._dir(target) / "cgroup.procs", str(pid))
        self._pids[target].append(pid)

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self._known(target)
        d = self._dir(target)
        quota, period = ("max", self.period_us) if allocation.cpus is None else cfs_limits(allocation.cpus, self.period_us)
        write(d / "cpu.max", f"{quota} {period}")
        # An empty cpuset.cpus means "the parent's CPUs".
        write(d / "cpuset.cpus", allocation.cpuset or "")
        if allocation.memory is not None and "memory" not in self.controllers:
            raise UserError(f"a memory limit needs the cgroup v2 memory controller at {self.root}")
        if "memory" in self.controllers:
            write(d / "memory.max", "max" if allocation.memory is None else str(allocation.memory))
        return self._read_back(target, allocation)

    def current(self, target: str) -> Allocation:
        self._known(target)
        return self._read_back(target, Allocation())

    def _read_back(self, target: str, requested: Allocation) -> Allocation:
        d = self._dir(target)
        quota, period = read(d / "cpu.max").split()
        # The kernel's cpuset.cpus.effective is what is enforced; a fake tree may only have cpuset.cpus.
        kernel = try_read(d / "cpuset.cpus.effective") or read(d / "cpuset.cpus")
        full = try_read(self._dir() / "cpuset.cpus.effective") or kernel
        memory = None
        if "memory" in self.controllers and (d / "memory.max").exists():
            raw = read(d / "memory.max")
            memory = None if raw == "max" else int(raw)
        return Allocation(
            cpuset=effective_cpuset(kernel, requested.cpuset, full),
            cpus=None if quota == "max" else int(quota) / int(period),
            memory=memory,
        )

    def close(self) -> None:
        """Move remaining processes back where they came from and remove this job's cgroups."""
        self._pauses.close()
        if not self._dir().is_dir():
            return
        for t in self.targets:
            move_out(self._dir(t), self._origin, self.root)
        move_out(self._dir(), self._origin, self.root)
        try:
            (self.root / TOP).rmdir()
        except OSError:
            pass


def make_cgroup(job_id: str, targets: list[str], root: Path = CGROUP_ROOT, memory: bool = False,
                period_us: int = PERIOD_US) -> CgroupV1Backend | CgroupV2Backend:
    """v2 if the unified hierarchy is mounted at ``root``, else v1; UserError saying why neither works.
    ``period_us``: the CFS period of the workers' quotas (``emulation.cpu_period_us``)."""
    if os.geteuid() != 0:
        raise UserError("the cgroup backend needs root (uid 0); use --backend affinity")
    v2 = (root / "cgroup.controllers").exists()
    dirs = [root] if v2 else [root / "cpu", root / "cpuset"]
    for d in dirs:
        if not d.is_dir():
            raise UserError(f"no cgroup controller at {d}; use --backend affinity")
        if not os.access(d, os.W_OK):
            raise UserError(f"{d} is not writable (read-only cgroup mount?); use --backend affinity")
    if v2:
        return CgroupV2Backend(job_id, targets, root, period_us)
    return CgroupV1Backend(job_id, targets, root, memory, period_us)
