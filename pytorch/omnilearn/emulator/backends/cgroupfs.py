"""The cgroup file system: reading and writing its files, finding a process's cgroups, reading limits back.

The one place that knows where cgroups are and how v1 and v2 spell their limits: the cgroup backends
write allocations through it, workers read their own CPU and memory limits through it
(:func:`read_own_allocation`, :func:`memory_limit`), and ``omnilearn cleanup`` sweeps with it.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from omnilearn.emulator.spec.levels import Allocation, format_cpuset, parse_cpuset
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.backends")

CGROUP_ROOT = Path("/sys/fs/cgroup")
TOP = "omnilearn"  # every job's cgroups live under <controller>/omnilearn/<job_id>/
# The CFS period the emulator gives its workers. Under a quota a process runs at a core's speed until
# its quota for the period is spent, then waits for the next period: a step holding less CPU than a
# period runs at full speed or waits whole periods, by the step's phase against the period. With a
# short period a step spans many, and a share of a core behaves like a slower core.
PERIOD_US = 10_000
KERNEL_PERIOD_US = 100_000  # the kernel's (and Docker's) period where none was set
MAX_PERIOD_US = 1_000_000  # the kernel's longest CFS period (the config checks the range a user asks for)
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller CFS quota
UNLIMITED_MEMORY = 2**62  # v1 prints "no limit" as a page-rounded LONG_MAX; anything this big is none
NAME = re.compile(r"[A-Za-z0-9_.-]+")

def read(path: Path) -> str:
    return path.read_text().strip()


def try_read(path: Path) -> str | None:
    try:
        return read(path)
    except (FileNotFoundError, PermissionError):
        return None


def write(path: Path, value: str) -> None:
    """One write(2) of ``value``: cgroup files take a whole value per write, and report errors there."""
    # O_CREAT only matters for a fake tree in tests; the kernel's files always exist.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def procs(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in read(cgroup / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def check_name(kind: str, name: str) -> None:
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise UserError(f"{kind} {name!r} cannot name a cgroup: use letters, digits, '_', '-' or '.'")


def membership(pid: int | str) -> dict[str, str]:
    """/proc/<pid>/cgroup as controller -> path; the unified (v2) hierarchy is under key ""."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return parse_membership(text)


def parse_membership(text: str) -> dict[str, str]:
    """The text of a /proc/<pid>/cgroup as controller -> path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def rmdir_tree(path: Path) -> bool:
    """Remove a cgroup directory and its child cgroups, deepest first. True if it is gone."""
    if not path.is_dir():
        return True
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            rmdir_tree(child)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove cgroup %s: %s", path, e)
        return False
    return True


def move_out(cgroup: Path, dest_of: dict[int, Path], default: Path, attempts: int = 5) -> None:
    """Move every process of ``cgroup`` to where it came from (or ``default``), then rmdir it.

    Retries because a process can fork between reading cgroup.procs and rmdir (EBUSY).
    """
    for _ in range(attempts):
        for pid in procs(cgroup):
            dest = dest_of.get(pid, default)
            if not dest.is_dir():
                dest = default
            try:
                write(dest / "cgroup.procs", str(pid))
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


def cfs_limits(cpus: float, period_us: int = PERIOD_US) -> tuple[int, int]:
    """The CFS (quota, period) in microseconds for ``cpus`` CPUs: ``period_us``, lengthened where the
    quota would fall below the kernel's 1 ms (0.05 CPUs get 20 ms periods)."""
    period = min(MAX_PERIOD_US, max(period_us, math.ceil(MIN_QUOTA_US / cpus - 1e-9)))
    return max(MIN_QUOTA_US, round(cpus * period)), period


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
            if any(procs(d) for d in [job, *(p for p in job.rglob("*") if p.is_dir())]):
                continue
            if rmdir_tree(job):
                removed.append(str(job))
        try:
            top.rmdir()
        except OSError:
            pass
    return removed


def mounts() -> list[tuple[Path, str, int, set[str]]]:
    """(mount point, its root inside the hierarchy, version, controllers) of each cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            point = Path(fields[4].replace("\\040", " "))
            mounts.append((point, fields[3], 2 if fs[0] == "cgroup2" else 1, set(fs[2].split(","))))
    return mounts


def own_dir(point: Path, mount_root: str, path: str) -> Path:
    """Where our cgroup ``path`` appears under a mount.

    With a cgroup namespace ``path`` is "/" and the mount is the namespace root; without one
    (e.g. Docker without cgroupns) the mount's root already is our cgroup.
    """
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        path = path[len(mount_root):]
    d = point / path.lstrip("/")
    return d if d.is_dir() else point


def own_cgroups() -> list[tuple[int, set[str], Path, list[Path]]]:
    """The calling process's cgroups: (version, controllers, its own directory, it and its ancestors).

    Ancestors stop at the mount point: inside a container or a cgroup namespace that is the
    namespace's root, above which nothing is visible.
    """
    member = membership("self")
    out = []
    for point, mount_root, version, controllers in mounts():
        path = member.get("") if version == 2 else next((member[c] for c in controllers if c in member), None)
        if path is None:
            continue
        own = own_dir(point, mount_root, path)
        out.append((version, controllers, own, [p for p in (own, *own.parents) if p == point or point in p.parents]))
    return out


def _memory_limit_of(d: Path) -> int | None:
    for f in ("memory.max", "memory.limit_in_bytes"):
        text = try_read(d / f)
        if text is not None and text != "max" and text.lstrip("-").isdigit() and 0 < int(text) < UNLIMITED_MEMORY:
            return int(text)
    return None


def memory_limit() -> tuple[int, str] | None:
    """The tightest memory limit on the calling process's cgroup and its ancestors, and where it is set."""
    found: list[tuple[int, str]] = []
    for version, controllers, _, chain in own_cgroups():
        if version == 1 and "memory" not in controllers:
            continue
        for d in chain:
            limit = _memory_limit_of(d)
            if limit is not None:
                found.append((limit, f"cgroup v{version} {d}"))
    return min(found) if found else None


def _alone_in(cgroup: Path) -> bool:
    """Whether the calling process is the only one in ``cgroup`` (its peak counts nobody else's memory)."""
    procs = try_read(cgroup / "cgroup.procs")
    return procs is not None and procs.split() == [str(os.getpid())]


def memory_peak_file() -> Path | None:
    """The peak-usage counter of the calling process's own memory cgroup, if it has one of its own.

    None in the root cgroup or a container's namespace root, in a cgroup other processes share (a
    login session's, a job's that holds every worker: their memory is not ours), and where no
    memory controller is mounted.
    """
    for version, controllers, own, chain in own_cgroups():
        if version == 1 and "memory" not in controllers:
            continue
        if len(chain) <= 1 or not _alone_in(own):
            return None
        return own / ("memory.peak" if version == 2 else "memory.max_usage_in_bytes")
    return None


def dir_quota(d: Path, reader: Callable[[Path], str | None] = try_read) -> float | None:
    """The CPUs the quota set on cgroup directory ``d`` allows (``cpu.max``, v2; ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, v1; the tighter where both read), or None: no quota there."""
    v2 = (reader(d / "cpu.max") or "max").split()
    v1 = [reader(d / "cpu.cfs_quota_us"), reader(d / "cpu.cfs_period_us")]
    quotas = [int(quota) / int(period) for quota, period in ([v2] if v2[0] != "max" else []) + ([v1] if None not in v1 else [])
              if int(quota) > 0]
    return min(quotas) if quotas else None


def read_own_allocation() -> Allocation:
    """What the kernel limits the calling process to: cgroup quota, cpuset and memory, and affinity.

    ``cpus`` is the tightest quota of our cgroup and its ancestors (None if unlimited); ``cpuset``
    is None when we may run on every online CPU; ``memory`` the tightest memory limit.
    """
    quotas: list[float] = []
    cpus = set(os.sched_getaffinity(0))
    for _, _, own, chain in own_cgroups():
        quotas += [q for q in map(dir_quota, chain) if q is not None]
        text = try_read(own / "cpuset.cpus.effective") or try_read(own / "cpuset.effective_cpus")
        if text:
            cpus &= set(parse_cpuset(text))
    online = try_read(Path("/sys/devices/system/cpu/online"))
    everything = set(parse_cpuset(online)) if online else set(range(os.cpu_count() or 1))
    limit = memory_limit()
    return Allocation(
        cpuset=None if cpus >= everything else format_cpuset(cpus),
        cpus=min(quotas) if quotas else None,
        memory=limit[0] if limit else None,
    )
