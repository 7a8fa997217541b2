"""How an allocation reaches the kernel: cgroup v1, cgroup v2, CPU affinity + throttling, Docker, or nothing.

Every backend returns the *effective* allocation it reads back after applying (from the cgroup
files, sched_getaffinity or Docker), so the toggler's audit records what the kernel enforces, not
what was asked. Modules: :mod:`.cgroupfs` (the cgroup files), :mod:`.cgroup`, :mod:`.affinity`,
:mod:`.docker`.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from omnilearn.emulator.levels import Allocation
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

    def close(self) -> None:
        """Undo everything; idempotent, and safe when the processes have already exited."""


class NullBackend:
    """Applies nothing: the requested allocation is reported as effective (tests, ``--backend none``)."""

    name = "none"

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        return allocation

    def close(self) -> None:
        pass


def select_backend(name: str, job_id: str, targets: list[str], memory: bool = False) -> Backend:
    """The backend called ``name``; "auto" is cgroups when possible, else affinity.

    ``memory``: the job limits memory, so memory cgroups are set up before any worker starts.
    """
    from omnilearn.emulator.backends.affinity import AffinityBackend
    from omnilearn.emulator.backends.cgroup import make_cgroup

    if name == "auto":
        try:
            return make_cgroup(job_id, targets, memory=memory)
        except UserError as e:
            log.info("cgroup backend unavailable (%s); using affinity", e)
            return AffinityBackend()
    if name == "cgroup":
        return make_cgroup(job_id, targets, memory=memory)
    if name == "affinity":
        return AffinityBackend()
    if name == "none":
        return NullBackend()
    raise UserError(f"unknown backend {name!r} (known: auto, cgroup, affinity, none, docker)")
