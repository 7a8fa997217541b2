"""Containers the user started (``omnilearn emulate --containers``): levels by ``docker update``, then
their own limits back.

The user ran ``docker run`` themselves, so the containers carry no job label: the names given on the
command line are what makes them the job's, bound to their ids when the job starts (a container
removed and started again under the same name is not the one adopted, and is not touched).

Before anything changes, every container's CPU limits are read (:class:`Limits`), so that an unknown
name stops the job with nothing changed. Docker keeps two forms of a CPU limit that it refuses to mix
on update: ``--cpus`` (``NanoCpus``) and ``--cpu-quota``/``--cpu-period``. A level is written in the
form the container already has, a quota against the container's own period, and a cpuset only when
the level has one. The daemon's record and the kernel's cgroup are read back as for the job's own
containers (:class:`~omnilearn.emulator.backends.docker.DockerBackend`). ``close`` writes back the
original limits of every container a level reached.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from omnilearn.emulator.backends.cgroupfs import KERNEL_PERIOD_US
from omnilearn.emulator.backends.docker import DockerBackend, cpu_usage_seconds, docker_sdk
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.docker")

NANO = 1_000_000_000


@dataclass(frozen=True)
class Limits:
    """A container's CPU limits as the daemon records them (``HostConfig``); 0 and "" are "not set"."""

    nano_cpus: int = 0
    cpu_quota: int = 0
    cpu_period: int = 0
    cpuset_cpus: str = ""

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> Limits:
        hc = attrs.get("HostConfig") or {}
        return cls(nano_cpus=int(hc.get("NanoCpus") or 0), cpu_quota=int(hc.get("CpuQuota") or 0),
                   cpu_period=int(hc.get("CpuPeriod") or 0), cpuset_cpus=hc.get("CpusetCpus") or "")


def cpu_update(original: Limits, cpus: float | None, host_cpus: int) -> dict[str, int]:
    """The update body (Engine API names) that limits a container first limited by ``original`` to
    ``cpus`` (None: no limit), in the form Docker lets it change."""
    if original.nano_cpus > 0:  # set with --cpus: NanoCpus cannot be lifted, only widened to the host
        return {"NanoCpus": round((cpus if cpus is not None else host_cpus) * NANO)}
    # A quota against the container's own period (0: the kernel's default); -1 lifts it.
    return {"CpuQuota": round(cpus * (original.cpu_period or KERNEL_PERIOD_US)) if cpus is not None else -1}


def restore_update(original: Limits, host_cpus: int) -> dict[str, Any]:
    """The update body that gives a container back its ``original`` limits.

    The update call reads 0 and "" as "leave as is", so a limit that was never set is written as its
    equivalent: quota -1 (no limit), the cpuset of every CPU of the host.
    """
    body: dict[str, Any] = ({"NanoCpus": original.nano_cpus} if original.nano_cpus > 0
                            else {"CpuQuota": original.cpu_quota or -1})
    body["CpusetCpus"] = original.cpuset_cpus or f"0-{host_cpus - 1}"
    return body


@dataclass
class UserContainers(DockerBackend):
    """Targets are the user's containers, named on the command line; see the module's docstring."""

    ids: dict[str, str] = field(default_factory=dict)  # target -> container id
    names: dict[str, str] = field(default_factory=dict)  # target -> the name the user gave
    originals: dict[str, Limits] = field(default_factory=dict)  # target -> limits before the job
    touched: set[str] = field(default_factory=set)  # targets a level has reached (restored at close)
    cpuset_changed: set[str] = field(default_factory=set)
    cpu_at_start: dict[str, float | None] = field(default_factory=dict)  # target -> its CPU time when adopted

    @classmethod
    def adopt(cls, job_id: str, client: Any, targets: list[str], names: list[str]) -> UserContainers:
        """Bind ``targets`` to the containers ``names`` (rank order) and read their limits; an unknown
        name raises UserError before any container is changed."""
        dk = docker_sdk()
        backend = cls(job_id, client)
        for target, name in zip(targets, names, strict=True):
            try:
                container = client.containers.get(name)
            except dk.errors.NotFound:
                raise UserError(f"--containers: no container named {name!r} on this Docker daemon "
                                f"(`docker ps -a` lists them)") from None
            backend.ids[target], backend.names[target] = container.id, name
            backend.originals[target] = Limits.of(container.attrs)
        for target in backend.ids:
            backend.cpu_at_start[target] = backend.cpu_total(target)
        return backend

    def container(self, target: str) -> Any:
        return self.default.containers.get(self.ids[target])

    def _post_update(self, target: str, body: dict[str, Any]) -> None:
        """POST /containers/{id}/update: what ``docker update`` sends. The SDK's ``update`` has no
        NanoCpus argument, so the body goes through its HTTP session, named as the Engine API names it."""
        api = self.default.api
        url = f"{api.base_url}/v{api.api_version}/containers/{self.ids[target]}/update"
        res = api.post(url, json=body, timeout=api.timeout)
        if not res.ok:
            try:
                message = res.json().get("message", res.text)
            except ValueError:
                message = res.text or res.reason
            raise RuntimeError(f"docker update {self.names[target]}: {message}")

    def _update(self, target: str, container: Any, allocation: Allocation) -> None:  # noqa: ARG002
        body: dict[str, Any] = cpu_update(self.originals[target], allocation.cpus, self._ncpus(target))
        if allocation.cpuset is not None:
            body["CpusetCpus"] = allocation.cpuset
            self.cpuset_changed.add(target)
        elif target in self.cpuset_changed:  # a level without a cpuset after one with: the container's own
            body["CpusetCpus"] = self.originals[target].cpuset_cpus or f"0-{self._ncpus(target) - 1}"
        if allocation.memory is not None:
            raise RuntimeError(f"{self.names[target]}: levels with memory limits are not applied to "
                               f"containers the user started")
        self.touched.add(target)
        self._post_update(target, body)

    def cpu_seconds(self, target: str) -> float | None:
        """CPU time the container's processes have used since it was adopted (None: not measurable)."""
        now, start = self.cpu_total(target), self.cpu_at_start.get(target)
        return round(now - start, 6) if now is not None and start is not None else None

    def cpu_total(self, target: str) -> float | None:
        """CPU time the container's processes have used so far: its cgroup, else ``docker stats``."""
        seconds = cpu_usage_seconds(self.ids[target])
        if seconds is not None:
            return seconds
        try:
            stats = self.container(target).stats(stream=False, one_shot=True)
            return int(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / NANO
        except Exception as e:  # noqa: BLE001 - a gone container or daemon: no measurement, not a failure
            log.warning("no CPU time for container %s: %s", self.names[target], e)
            return None

    def restore(self) -> list[str]:
        """Give every container a level reached its original limits; returns the names restored."""
        done = []
        for target in sorted(self.touched):
            body = restore_update(self.originals[target], self._ncpus(target))
            if target not in self.cpuset_changed:
                del body["CpusetCpus"]
            try:
                self._post_update(target, body)
            except Exception as e:  # noqa: BLE001 - the others are still restored; the user is told which
                log.error("could not restore the limits of container %s (%s); they were %s before the job",
                          self.names[target], e, self.originals[target])
                continue
            self.touched.discard(target)
            done.append(self.names[target])
        return done

    def close(self) -> None:
        super().close()  # a paused container is resumed first
        self.restore()
