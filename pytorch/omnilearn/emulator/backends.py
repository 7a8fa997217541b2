"""How an allocation reaches the kernel: cgroup v1, cgroup v2, CPU affinity + throttling, or nothing.

Every backend returns the *effective* allocation it reads back after applying (from the cgroup
files or sched_getaffinity), so the toggler's audit records what the kernel enforces, not what was
asked. Processes are only ever moved into this job's own ``omnilearn/<job_id>/<target>`` cgroups and
moved back where they came from on ``close``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from omnilearn.emulator.levels import Allocation, format_cpuset, host_cpus, parse_cpuset
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.backends")

CGROUP_ROOT = Path("/sys/fs/cgroup")
TOP = "omnilearn"  # every job's cgroups live under <controller>/omnilearn/<job_id>/
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller CFS quota
UNLIMITED_MEMORY = 2**62  # v1 prints "no limit" as a page-rounded LONG_MAX; anything this big is none
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@runtime_checkable
class Backend(Protocol):
    """What the toggler and the launchers need from a way of enforcing allocations."""

    name: str

    def add_process(self, target: str, pid: int) -> None:
        """Put process ``pid`` (all its threads) under ``target``'s allocation."""

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        """Enforce ``allocation`` on ``target``; returns the allocation read back from the kernel."""

    def close(self) -> None:
        """Undo everything; idempotent, and safe when the processes have already exited."""


# ---------------------------------------------------------------- kernel files

def _read(path: Path) -> str:
    return path.read_text().strip()


def _try_read(path: Path) -> str | None:
    try:
        return _read(path)
    except (FileNotFoundError, PermissionError):
        return None


def _write(path: Path, value: str) -> None:
    """One write(2) of ``value``: cgroup files take a whole value per write, and report errors there."""
    # O_CREAT only matters for a fake tree in tests; the kernel's files always exist.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in _read(cgroup / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def _check_name(kind: str, name: str) -> None:
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise UserError(f"{kind} {name!r} cannot name a cgroup: use letters, digits, '_', '-' or '.'")


def _cgroup_membership(pid: int | str) -> dict[str, str]:
    """/proc/<pid>/cgroup as controller -> path; the unified (v2) hierarchy is under key ""."""
    out: dict[str, str] = {}
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return out
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _rmdir_tree(path: Path) -> bool:
    """Remove a cgroup directory and its child cgroups, deepest first. True if it is gone."""
    if not path.is_dir():
        return True
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            _rmdir_tree(child)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove cgroup %s: %s", path, e)
        return False
    return True


def _move_out(cgroup: Path, dest_of: dict[int, Path], default: Path, attempts: int = 5) -> None:
    """Move every process of ``cgroup`` to where it came from (or ``default``), then rmdir it.

    Retries because a process can fork between reading cgroup.procs and rmdir (EBUSY).
    """
    for _ in range(attempts):
        for pid in _procs(cgroup):
            dest = dest_of.get(pid, default)
            if not dest.is_dir():
                dest = default
            try:
                _write(dest / "cgroup.procs", str(pid))
            except ProcessLookupError:
                pass  # exited meanwhile
            except OSError as e:
                log.warning("cannot move pid %d out of %s to %s: %s", pid, cgroup, dest, e)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                log.warning("cannot remove cgroup %s: %s", cgroup, e)
                return
        time.sleep(0.01)
    log.warning("cgroup %s still busy after %d attempts; left in place", cgroup, attempts)


def _cpuset_or_none(kernel: str, requested: str | None, full: str) -> str | None:
    """The cpuset read back; None ("no narrower than the parent") when none was asked and none is set."""
    if requested is None and (not kernel or not full or parse_cpuset(kernel) == parse_cpuset(full)):
        return None
    return format_cpuset(parse_cpuset(kernel)) if kernel else None


def _quota_us(cpus: float) -> int:
    return max(MIN_QUOTA_US, round(cpus * PERIOD_US))


# ---------------------------------------------------------------- cgroup v1

class _CgroupBackend:
    """What both cgroup versions share: checked names, one cgroup per target, known pids."""

    def __init__(self, job_id: str, targets: list[str], root: Path) -> None:
        _check_name("job id", job_id)
        for t in targets:
            _check_name("target", t)
        self.job_id = job_id
        self.targets = list(targets)
        self.root = Path(root)
        self._pids: dict[str, list[int]] = {t: [] for t in self.targets}

    def _known(self, target: str) -> None:
        if target not in self._pids:
            raise ValueError(f"target {target!r} is not one of this job's cgroups ({', '.join(self.targets)})")


class CgroupV1Backend(_CgroupBackend):
    """One cgroup per target in the v1 ``cpu``, ``cpuset`` (and, when limited, ``memory``) hierarchies."""

    name = "cgroup-v1"

    def __init__(self, job_id: str, targets: list[str], root: Path = CGROUP_ROOT, memory: bool = False) -> None:
        super().__init__(job_id, targets, root)
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
                    if not _read(d / f):
                        _write(d / f, _read(d.parent / f))

    def add_process(self, target: str, pid: int) -> None:
        self._known(target)
        ctrls = ["cpu", "cpuset"] + (["memory"] if self._memory else [])
        member = _cgroup_membership(pid)
        for ctrl in ctrls:
            self._remember_origin(ctrl, pid, member)
            _write(self._dir(ctrl, target) / "cgroup.procs", str(pid))
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
        _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", "-1" if allocation.cpus is None else str(_quota_us(allocation.cpus)))
        full = _read(self._dir("cpuset") / "cpuset.cpus")
        _write(cpuset / "cpuset.cpus", allocation.cpuset if allocation.cpuset is not None else full)
        if allocation.memory is not None and not self._memory:
            self._enable_memory()
        if self._memory:
            _write(self._dir("memory", target) / "memory.limit_in_bytes",
                   "-1" if allocation.memory is None else str(allocation.memory))
        return self._read_back(target, allocation, full)

    def _enable_memory(self) -> None:
        if not (self.root / "memory").is_dir():
            raise UserError(f"a memory limit needs the v1 memory controller at {self.root / 'memory'}")
        self._make("memory")
        self._memory = True
        for target, pids in self._pids.items():
            for pid in pids:
                try:
                    self._remember_origin("memory", pid, _cgroup_membership(pid))
                    _write(self._dir("memory", target) / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass

    def _read_back(self, target: str, requested: Allocation, full: str) -> Allocation:
        quota = int(_read(self._dir("cpu", target) / "cpu.cfs_quota_us"))
        period = int(_read(self._dir("cpu", target) / "cpu.cfs_period_us"))
        memory = None
        if self._memory:
            limit = int(_read(self._dir("memory", target) / "memory.limit_in_bytes"))
            memory = None if limit >= UNLIMITED_MEMORY else limit
        return Allocation(
            cpuset=_cpuset_or_none(_read(self._dir("cpuset", target) / "cpuset.cpus"), requested.cpuset, full),
            cpus=None if quota < 0 else quota / period,
            memory=memory,
        )

    def close(self) -> None:
        """Move remaining tasks back where they came from and remove this job's cgroups."""
        for ctrl in ("cpu", "cpuset", "memory"):
            job = self._dir(ctrl)
            if not job.is_dir():
                continue
            origin = self._origin.get(ctrl, {})
            for t in self.targets:
                _move_out(self._dir(ctrl, t), origin, self.root / ctrl)
            _move_out(job, origin, self.root / ctrl)
            try:
                (self.root / ctrl / TOP).rmdir()
            except OSError:
                pass  # another job still has cgroups there


# ---------------------------------------------------------------- cgroup v2

class CgroupV2Backend(_CgroupBackend):
    """One cgroup per target in the unified hierarchy: ``cpu.max``, ``cpuset.cpus``, ``memory.max``."""

    name = "cgroup-v2"

    def __init__(self, job_id: str, targets: list[str], root: Path = CGROUP_ROOT) -> None:
        super().__init__(job_id, targets, root)
        self._origin: dict[int, Path] = {}
        try:
            available = _read(self.root / "cgroup.controllers").split()
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
            enabled = _read(cgroup / "cgroup.subtree_control").split()
        except FileNotFoundError:
            enabled = []
        missing = [f"+{c}" for c in self.controllers if c not in enabled]
        if missing:
            _write(cgroup / "cgroup.subtree_control", " ".join(missing))

    def add_process(self, target: str, pid: int) -> None:
        self._known(target)
        path = _cgroup_membership(pid).get("", "/")
        origin = self.root / path.lstrip("/")
        self._origin.setdefault(pid, self.root if TOP in Path(path).parts[:2] else origin)
        _write(self._dir(target) / "cgroup.procs", str(pid))
        self._pids[target].append(pid)

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self._known(target)
        d = self._dir(target)
        quota = "max" if allocation.cpus is None else str(_quota_us(allocation.cpus))
        _write(d / "cpu.max", f"{quota} {PERIOD_US}")
        # An empty cpuset.cpus means "the parent's CPUs".
        _write(d / "cpuset.cpus", allocation.cpuset or "")
        if allocation.memory is not None and "memory" not in self.controllers:
            raise UserError(f"a memory limit needs the cgroup v2 memory controller at {self.root}")
        if "memory" in self.controllers:
            _write(d / "memory.max", "max" if allocation.memory is None else str(allocation.memory))
        return self._read_back(target, allocation)

    def _read_back(self, target: str, requested: Allocation) -> Allocation:
        d = self._dir(target)
        quota, period = _read(d / "cpu.max").split()
        # The kernel's cpuset.cpus.effective is what is enforced; a fake tree may only have cpuset.cpus.
        kernel = _try_read(d / "cpuset.cpus.effective") or _read(d / "cpuset.cpus")
        full = _try_read(self._dir() / "cpuset.cpus.effective") or kernel
        memory = None
        if "memory" in self.controllers and (d / "memory.max").exists():
            raw = _read(d / "memory.max")
            memory = None if raw == "max" else int(raw)
        return Allocation(
            cpuset=_cpuset_or_none(kernel, requested.cpuset, full),
            cpus=None if quota == "max" else int(quota) / int(period),
            memory=memory,
        )

    def close(self) -> None:
        """Move remaining processes back where they came from and remove this job's cgroups."""
        if not self._dir().is_dir():
            return
        for t in self.targets:
            _move_out(self._dir(t), self._origin, self.root)
        _move_out(self._dir(), self._origin, self.root)
        try:
            (self.root / TOP).rmdir()
        except OSError:
            pass


# ---------------------------------------------------------------- affinity + duty-cycle throttle

def _open_pidfd(pid: int) -> int | None:
    """A pidfd, so a throttle never signals an unrelated process that reused a dead worker's pid."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@dataclass
class _Proc:
    pid: int
    pidfd: int | None

    def signal(self, sig: int) -> bool:
        """Send ``sig``; False once the process is gone."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def set_affinity(self, cpus: set[int]) -> None:
        """Every existing thread; new threads inherit the mask from the thread that creates them."""
        if not self.signal(0):  # gone (via the pidfd: not some process that reused the pid)
            return
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except FileNotFoundError:
            return
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                pass  # the thread exited meanwhile, or is not ours to change


@dataclass
class _Target:
    procs: list[_Proc] = field(default_factory=list)
    allocation: Allocation = field(default_factory=Allocation)
    fraction: float = 1.0  # of each period the processes may run
    thread: threading.Thread | None = None


class AffinityBackend:
    """For unprivileged users: cpusets via sched_setaffinity, quotas via SIGSTOP/SIGCONT duty cycles.

    A quota of ``cpus`` for a worker running ``Allocation.threads()`` compute threads lets the
    process run ``cpus / threads`` of every 100 ms period. If the host process dies while a worker
    is stopped, the worker stays stopped: ``close()`` must run (the launcher's finally).
    """

    name = "affinity"
    period = 0.1

    def __init__(self) -> None:
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._host = set(host_cpus())

    def add_process(self, target: str, pid: int) -> None:
        proc = _Proc(pid, _open_pidfd(pid))
        with self._lock:
            t = self._targets.setdefault(target, _Target())
            t.procs.append(proc)
            cpus = self._cpus(t.allocation)
        proc.set_affinity(cpus)
        self._ensure_thread(target)

    def _cpus(self, allocation: Allocation) -> set[int]:
        return set(parse_cpuset(allocation.cpuset)) if allocation.cpuset is not None else self._host

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if allocation.memory is not None:
            log.warning("affinity backend cannot limit memory; %s runs without a memory limit", target)
        fraction = 1.0 if allocation.cpus is None else min(1.0, allocation.cpus / allocation.threads())
        with self._lock:
            t = self._targets.setdefault(target, _Target())
            t.allocation, t.fraction = allocation, fraction
            procs = list(t.procs)
        cpus = self._cpus(allocation)
        for p in procs:
            p.set_affinity(cpus)
        self._ensure_thread(target)
        cpuset = allocation.cpuset  # nothing to read back before a process is added
        for p in procs:
            try:
                kernel = format_cpuset(os.sched_getaffinity(p.pid))
            except ProcessLookupError:
                continue
            cpuset = _cpuset_or_none(kernel, allocation.cpuset, format_cpuset(self._host))
            break
        return Allocation(cpuset=cpuset, cpus=allocation.cpus, memory=None)

    def _ensure_thread(self, target: str) -> None:
        with self._lock:
            t = self._targets[target]
            if t.thread is not None or not t.procs or self._stop.is_set():
                return
            t.thread = threading.Thread(target=self._throttle, args=(target,), daemon=True,
                                        name=f"omnilearn-throttle-{target}")
            t.thread.start()

    def _throttle(self, target: str) -> None:
        """Run ``fraction`` of each period, stopped for the rest; re-pin threads born since."""
        stopped = False
        procs: list[_Proc] = []
        try:
            # The quota leaks if the throttler wakes late; a busy worker of higher weight can delay a
            # nice-0 thread by hundreds of ms. Real-time priority (if allowed) makes it run on time.
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except (AttributeError, OSError):
            pass
        try:
            while not self._stop.is_set():
                with self._lock:
                    t = self._targets[target]
                    procs, fraction, cpus = list(t.procs), t.fraction, self._cpus(t.allocation)
                for p in procs:
                    try:
                        p.set_affinity(cpus)
                    except OSError as e:  # must not kill the throttle (the apply reported it already)
                        log.debug("re-pinning pid %d: %s", p.pid, e)
                if fraction >= 1.0:
                    self._stop.wait(self.period)
                    continue
                if self._stop.wait(self.period * fraction):
                    break
                stopped = True
                for p in procs:
                    p.signal(signal.SIGSTOP)
                self._stop.wait(self.period * (1.0 - fraction))
                for p in procs:
                    p.signal(signal.SIGCONT)
                stopped = False
        finally:
            if stopped:
                for p in procs:
                    p.signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the throttles and let every process run again."""
        self._stop.set()
        with self._lock:
            targets = list(self._targets.values())
        for t in targets:
            if t.thread is not None:
                t.thread.join()
        for t in targets:
            for p in t.procs:
                p.signal(signal.SIGCONT)
                if p.pidfd is not None:
                    os.close(p.pidfd)
                    p.pidfd = None
            t.procs.clear()


# ---------------------------------------------------------------- no emulation

class NullBackend:
    """Applies nothing: the requested allocation is reported as effective (tests, ``--backend none``)."""

    name = "none"

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        return allocation

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- choosing, sweeping, reading back

def _make_cgroup(job_id: str, targets: list[str], root: Path = CGROUP_ROOT, memory: bool = False) -> Backend:
    """v2 if the unified hierarchy is mounted at ``root``, else v1; UserError saying why neither works."""
    if os.geteuid() != 0:
        raise UserError("the cgroup backend needs root (uid 0); use --backend affinity")
    v2 = (root / "cgroup.controllers").exists()
    dirs = [root] if v2 else [root / "cpu", root / "cpuset"]
    for d in dirs:
        if not d.is_dir():
            raise UserError(f"no cgroup controller at {d}; use --backend affinity")
        if not os.access(d, os.W_OK):
            raise UserError(f"{d} is not writable (read-only cgroup mount?); use --backend affinity")
    return CgroupV2Backend(job_id, targets, root) if v2 else CgroupV1Backend(job_id, targets, root, memory)


def select_backend(name: str, job_id: str, targets: list[str], memory: bool = False) -> Backend:
    """The backend called ``name``; "auto" is cgroups when possible, else affinity.

    ``memory``: the job limits memory, so memory cgroups are set up before any worker starts.
    """
    if name == "auto":
        try:
            return _make_cgroup(job_id, targets, memory=memory)
        except UserError as e:
            log.info("cgroup backend unavailable (%s); using affinity", e)
            return AffinityBackend()
    if name == "cgroup":
        return _make_cgroup(job_id, targets, memory=memory)
    if name == "affinity":
        return AffinityBackend()
    if name == "none":
        return NullBackend()
    raise UserError(f"unknown backend {name!r} (known: auto, cgroup, affinity, none, docker)")


def sweep_stale(root: Path = CGROUP_ROOT, jobs: Iterable[str] | None = None, min_age: float = 60.0) -> list[str]:
    """Remove ``omnilearn/<job>`` cgroups left by a killed launcher; returns the removed paths.

    A job's cgroup is left alone while any of its cgroups has a process, or if it is younger than
    ``min_age`` seconds (a launcher may be between creating it and adding its workers).
    ``jobs`` limits the sweep to those job ids.
    """
    wanted = set(jobs) if jobs is not None else None
    tops = [root / TOP] + ([d / TOP for d in root.iterdir() if d.is_dir()] if root.is_dir() else [])
    removed: list[str] = []
    now = time.time()
    for top in tops:
        if not top.is_dir():
            continue
        for job in sorted(top.iterdir()):
            if not job.is_dir() or (wanted is not None and job.name not in wanted):
                continue
            try:
                if now - job.stat().st_mtime < min_age:
                    continue
            except FileNotFoundError:
                continue
            if any(_procs(d) for d in [job, *(p for p in job.rglob("*") if p.is_dir())]):
                continue
            if _rmdir_tree(job):
                removed.append(str(job))
        try:
            top.rmdir()
        except OSError:
            pass
    return removed


def _cgroup_mounts() -> list[tuple[Path, str, int, set[str]]]:
    """(mount point, its root inside the hierarchy, version, controllers) of each cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            point = Path(fields[4].replace("\\040", " "))
            mounts.append((point, fields[3], 2 if fs[0] == "cgroup2" else 1, set(fs[2].split(","))))
    return mounts


def _own_dir(point: Path, mount_root: str, path: str) -> Path:
    """Where our cgroup ``path`` appears under a mount.

    With a cgroup namespace ``path`` is "/" and the mount is the namespace root; without one
    (e.g. Docker without cgroupns) the mount's root already is our cgroup.
    """
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        path = path[len(mount_root):]
    d = point / path.lstrip("/")
    return d if d.is_dir() else point


def read_own_allocation() -> Allocation:
    """What the kernel limits the calling process to: cgroup quota, cpuset and memory, and affinity.

    ``cpus`` is the tightest quota of our cgroup and its ancestors (None if unlimited); ``cpuset``
    is None when we may run on every online CPU; ``memory`` the tightest memory limit.
    """
    member = _cgroup_membership("self")
    quotas: list[float] = []
    limits: list[int] = []
    cpus = set(os.sched_getaffinity(0))
    for point, mount_root, version, controllers in _cgroup_mounts():
        path = member.get("") if version == 2 else next((member[c] for c in controllers if c in member), None)
        if path is None:
            continue
        own = _own_dir(point, mount_root, path)
        for d in (p for p in (own, *own.parents) if p == point or point in p.parents):
            v2 = (_try_read(d / "cpu.max") or "max").split()
            v1 = [_try_read(d / "cpu.cfs_quota_us"), _try_read(d / "cpu.cfs_period_us")]
            for quota, period in ([v2] if v2[0] != "max" else []) + ([v1] if None not in v1 else []):
                if int(quota) > 0:
                    quotas.append(int(quota) / int(period))
            for f in ("memory.max", "memory.limit_in_bytes"):
                text = _try_read(d / f)
                if text is not None and text != "max" and int(text) < UNLIMITED_MEMORY:
                    limits.append(int(text))
        text = _try_read(own / "cpuset.cpus.effective") or _try_read(own / "cpuset.effective_cpus")
        if text:
            cpus &= set(parse_cpuset(text))
    online = _try_read(Path("/sys/devices/system/cpu/online"))
    everything = set(parse_cpuset(online)) if online else set(range(os.cpu_count() or 1))
    return Allocation(
        cpuset=None if cpus >= everything else format_cpuset(cpus),
        cpus=min(quotas) if quotas else None,
        memory=min(limits) if limits else None,
    )
