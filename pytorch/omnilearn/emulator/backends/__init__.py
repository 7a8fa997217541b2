"""How an allocation reaches the kernel: cgroup v1, cgroup v2, CPU affinity + throttling, Docker, or nothing.

Every backend returns the *effective* allocation it reads back after applying (from the cgroup
files, sched_getaffinity or Docker), so the toggler's audit records what the kernel enforces, not
what was asked; ``current`` reads the allocation in force without changing it (what the toggler
records while a change fails). Every backend can also pause a target for a while (a trace's stalls, :mod:`.pauses`).
A job with links has a :class:`LinkApplier` beside its backend: the workers' network namespaces
(:mod:`omnilearn.emulator.network.netns`) or the containers' veths (:mod:`.docker_net`). Modules:
:mod:`.cgroupfs` (the cgroup files), :mod:`.cgroup`, :mod:`.affinity`, :mod:`.docker`.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from omnilearn.emulator.backends.cgroupfs import PERIOD_US
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.links import Link
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.backends")


@runtime_checkable
class Backend(Protocol):
    """What the toggler and the launchers need from a way of enforcing allocations."""

    name: str

    def add_process(self, target: str, pid: int) -> None:
        """Put process ``pid`` (all its threads) under ``target``'s allocation."""

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        """Enforce ``allocation`` on ``target``; returns the allocation read back from the kernel."""

    def current(self, target: str) -> Allocation | None:
        """The allocation in force on ``target``, read back from the kernel or Docker without changing it
        (None: nothing to read); what the audit records while a change fails."""

    def stall(self, target: str, seconds: float) -> None:
        """Pause ``target`` for ``seconds`` from now; returns at once (a timer resumes it, and ``close``)."""

    def close(self) -> None:
        """Undo everything; idempotent, and safe when the processes have already exited."""


@runtime_checkable
class LinkApplier(Protocol):
    """Shapes the network links of a job's targets."""

    def apply_link(self, target: str, link: Link | None) -> Link | None:
        """Give ``target`` ``link`` both ways (None: unshaped); returns the link read back from the kernel."""

    def close(self) -> None:
        """Remove every shaping (and device) this applier made."""


class NullBackend:
    """Applies nothing: the requested allocation is reported as effective (tests, ``--backend none``)."""

    name = "none"

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        return allocation

    def current(self, target: str) -> Allocation | None:
        return None  # nothing is enforced, so nothing can be read back

    def stall(self, target: str, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


def select_backend(name: str, job_id: str, targets: list[str], memory: bool = False,
                   period_us: int = PERIOD_US) -> Backend:
    """The backend called ``name``; "auto" is cgroups when possible, else affinity.

    ``memory``: the job limits memory, so memory cgroups are set up before any worker starts.
    ``period_us``: the CFS period of the cgroup backend's quotas; the affinity backend's throttle
    keeps its own.
    """
    from omnilearn.emulator.backends.affinity import AffinityBackend
    from omnilearn.emulator.backends.cgroup import make_cgroup

    if name == "auto":
        try:
            return make_cgroup(job_id, targets, memory=memory, period_us=period_us)
        except UserError as e:
            log.info("cgroup backend unavailable (%s); using affinity", e)
            return AffinityBackend()
    if name == "cgroup":
        return make_cgroup(job_id, targets, memory=memory, period_us=period_us)
    if name == "affinity":
        return AffinityBackend()
    if name == "none":
        return NullBackend()
    raise UserError(f"unknown backend {name!r} (known: auto, cgroup, affinity, none, docker)")
