"""The Docker backend: an allocation is a container update (what ``docker update`` does), via the SDK.

The toggler calls :meth:`DockerBackend.apply` for a target (a container name such as ``worker2``).
Only containers labelled with this job are ever touched. After an update the backend reads back
what the daemon recorded (``HostConfig``) and, when the container's cgroup is visible on this host,
what the kernel enforces (cgroup v1 or v2, Docker's cgroupfs or systemd driver: :func:`read_kernel`),
and returns that as the effective allocation. A stall pauses the container (Docker's freezer).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.cgroupfs import KERNEL_PERIOD_US, PERIOD_US, cfs_limits, try_read
from omnilearn.emulator.backends.pauses import Pauses
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.docker")

LABEL_JOB = "omnilearn.job"
LABEL_TARGET = "omnilearn.target"
LABEL_RANK = "omnilearn.rank"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class ForeignContainer(Exception):
    """A container of that name exists but belongs to another job (or to nobody we know)."""


def update_kwargs(allocation: Allocation, host_cpus: int, period_us: int = PERIOD_US) -> dict[str, Any]:
    """``Container.update`` arguments for an allocation; ``None`` fields lift the limit. A quota is
    given against ``period_us`` (:func:`~.cgroupfs.cfs_limits`)."""
    # -1 is "no limit" (0 would leave the previous quota in place).
    quota, period = (-1, period_us) if allocation.cpus is None else cfs_limits(allocation.cpus, period_us)
    kwargs: dict[str, Any] = {
        "cpu_period": period,
        "cpu_quota": quota,
        "cpuset_cpus": allocation.cpuset if allocation.cpuset is not None else f"0-{host_cpus - 1}",
    }
    if allocation.memory is not None:
        kwargs["mem_limit"] = allocation.memory
        kwargs["memswap_limit"] = allocation.memory
    return kwargs


def run_kwargs(allocation: Allocation, period_us: int = PERIOD_US) -> dict[str, Any]:
    """``containers.run`` arguments giving a new container its first allocation."""
    kwargs: dict[str, Any] = {}
    if allocation.cpus is not None:
        quota, period = cfs_limits(allocation.cpus, period_us)
        kwargs.update(cpu_period=period, cpu_quota=quota)
    if allocation.cpuset is not None:
        kwargs["cpuset_cpus"] = allocation.cpuset
    if allocation.memory is not None:
        kwargs.update(mem_limit=allocation.memory, memswap_limit=allocation.memory)
    return kwargs


def effective_allocation(attrs: Mapping[str, Any], kernel: Mapping[str, str] | None = None) -> Allocation:
    """What a container is limited to: the kernel's cgroup values when given, else the daemon's record."""
    hc = attrs.get("HostConfig", {})
    quota, period = hc.get("CpuQuota") or 0, hc.get("CpuPeriod") or KERNEL_PERIOD_US
    nano = hc.get("NanoCpus") or 0
    cpuset = hc.get("CpusetCpus") or None
    memory = hc.get("Memory") or None
    if kernel:
        if "quota" in kernel and "period" in kernel:
            quota, period = int(kernel["quota"]), int(kernel["period"])
        cpuset = kernel.get("cpuset", cpuset) or None
    cpus = quota / period if quota and quota > 0 else (nano / 1e9 if nano else None)
    return Allocation(cpuset=cpuset, cpus=round(cpus, 4) if cpus is not None else None, memory=memory)


def container_cgroup(container_id: str, controller: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The container's cgroup folder for ``controller`` on this host, or None where it is not visible.

    cgroup v2 (one hierarchy) or v1 (one per controller), each with Docker's ``cgroupfs`` driver
    (``docker/<id>``) or its ``systemd`` driver (``system.slice/docker-<id>.scope``).
    """
    base = root if (root / "cgroup.controllers").exists() else root / controller
    for d in (base / "system.slice" / f"docker-{container_id}.scope", base / "docker" / container_id):
        if d.is_dir():
            return d
    return None


def read_kernel(container_id: str, root: Path = CGROUP_ROOT) -> dict[str, str] | None:
    """The container's CFS quota and period and its enforced cpuset, from its cgroup files (v1 or v2)."""
    cpu = container_cgroup(container_id, "cpu", root)
    if cpu is None:
        return None
    out: dict[str, str] = {}
    if (root / "cgroup.controllers").exists():
        quota, _, period = (try_read(cpu / "cpu.max") or "max").partition(" ")
        out.update(quota="-1" if quota == "max" else quota, period=period or str(KERNEL_PERIOD_US))
    else:
        out.update(quota=try_read(cpu / "cpu.cfs_quota_us") or "-1",
                   period=try_read(cpu / "cpu.cfs_period_us") or str(KERNEL_PERIOD_US))
    cpuset = container_cgroup(container_id, "cpuset", root)
    text = cpuset and (try_read(cpuset / "cpuset.cpus.effective") or try_read(cpuset / "cpuset.cpus"))
    if text:
        out["cpuset"] = text
    return out


def cpu_usage_seconds(container_id: str, root: Path = CGROUP_ROOT) -> float | None:
    """CPU time the container's processes have used so far (its cgroup's cpuacct.usage, or cpu.stat's
    usage_usec on cgroup v2), None where its cgroup is not visible on this host."""
    if (root / "cgroup.controllers").exists():
        cpu = container_cgroup(container_id, "cpu", root)
        for line in (try_read(cpu / "cpu.stat") or "").splitlines() if cpu else ():
            key, _, value = line.partition(" ")
            if key == "usage_usec" and value.isdigit():
                return int(value) / 1e6
        return None
    acct = container_cgroup(container_id, "cpuacct", root)
    text = try_read(acct / "cpuacct.usage") if acct else None
    return int(text) / 1e9 if text and text.isdigit() else None


@dataclass
class DockerBackend:
    """Applies allocations to this job's containers; ``clients`` maps a target to its host's daemon.

    Targets without an entry use ``default``. A target whose container has vanished, or a daemon
    that does not answer, raises: the toggler records the request as rejected and goes on. Quotas
    are given against ``period_us`` (``emulation.cpu_period_us``).
    """

    job_id: str
    default: Any  # docker.DockerClient
    clients: dict[str, Any] = field(default_factory=dict)
    host_cpus: dict[str, int] = field(default_factory=dict)
    period_us: int = PERIOD_US
    name: str = "docker"
    _pauses: Pauses = field(default_factory=Pauses, init=False, repr=False)

    def _client(self, target: str) -> Any:
        return self.clients.get(target, self.default)

    def container(self, target: str) -> Any:
        container = self._client(target).containers.get(target)
        labels = container.labels or {}
        if labels.get(LABEL_JOB) != self.job_id:
            raise ForeignContainer(f"container {target} belongs to job {labels.get(LABEL_JOB)!r}, not "
                                   f"{self.job_id!r}: not touched")
        return container

    def add_process(self, target: str, pid: int) -> None:  # noqa: ARG002 - containers carry their own cgroup
        return None

    def _ncpus(self, target: str) -> int:
        if target not in self.host_cpus:
            self.host_cpus[target] = int(self._client(target).info().get("NCPU", 1))
        return self.host_cpus[target]

    def _update(self, target: str, container: Any, allocation: Allocation) -> None:
        """The ``docker update`` that gives ``container`` ``allocation``."""
        container.update(**update_kwargs(allocation, self._ncpus(target), self.period_us))

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        container = self.container(target)
        self._update(target, container, allocation)
        container.reload()
        kernel = read_kernel(container.id) if self._client(target) is self.default else None
        effective = effective_allocation(container.attrs, kernel)
        if allocation.cpus is not None and effective.cpus is not None and abs(effective.cpus - allocation.cpus) > 0.01:
            raise RuntimeError(f"{target}: asked for {allocation.cpus} CPUs, the container reports {effective.cpus}")
        if allocation.cpuset is not None and effective.cpuset != allocation.cpuset:
            raise RuntimeError(f"{target}: asked for cpuset {allocation.cpuset}, the container reports "
                               f"{effective.cpuset}")
        return effective

    def current(self, target: str) -> Allocation:
        container = self.container(target)
        container.reload()
        kernel = read_kernel(container.id) if self._client(target) is self.default else None
        return effective_allocation(container.attrs, kernel)

    def stall(self, target: str, seconds: float) -> None:
        """Pause the container (its cgroup freezer) for ``seconds``."""
        container = self.container(target)

        def unpause() -> None:
            with contextlib.suppress(Exception):  # gone meanwhile: nothing left to resume
                container.unpause()
        self._pauses.pause(target, seconds, container.pause, unpause)

    def close(self) -> None:
        self._pauses.close()


def docker_sdk() -> Any:
    """The SDK, imported on first use (workers never need it)."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - a pinned dependency
        raise UserError("the Docker SDK for Python (package 'docker') is not installed") from e
    return docker
