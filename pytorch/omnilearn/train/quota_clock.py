"""A trainer's clock for its CPU quota: how long the quota held the process back (:class:`QuotaClock`),
and a stretch of work timed as its share of a step under that quota (:func:`quota_seconds`). The BSP
trainer, the ASP worker and ``omnilearn.torch`` time their steps with them; the cgroups they read are
the emulator's (:mod:`omnilearn.emulator.backends.cgroupfs`)."""

from __future__ import annotations

import os
from pathlib import Path

from omnilearn.emulator.backends.cgroupfs import dir_quota, mounts, own_dir, parse_membership


def quota_seconds(wall_s: float, cpu_s: float, cpus: float | None) -> float:
    """A stretch of a worker's work timed as its share of a step: its wall time, or under a CPU quota of
    ``cpus`` its CPU seconds at the quota's rate where that is longer.

    A process under a CFS quota runs at a core's speed until the period's quota is spent, then waits
    for the next period: a compute shorter than what is left of a period runs at full speed, and the
    wait for its CPU lands later, in the all-reduce, where it holds the exchange back with the
    exchange's own work. Its CPU at the quota's rate is what it costs the step, however the periods
    fell; a compute that spans many periods shows the quota in its wall time already (and a worker
    waiting at the all-reduce for another's data uses no CPU: the exchange's own work at the quota's
    rate runs after the last arrival, a cost of every step that no split shortens). ``cpu_s``: the
    process's CPU seconds over the stretch, every thread's, as the quota counts them."""
    return wall_s if cpus is None else max(wall_s, cpu_s / cpus)


class QuotaClock:
    """Seconds the calling process's own CPU cgroup has been held back by its quota so far: the
    ``throttled_time`` (v1, ns) or ``throttled_usec`` (v2) of its ``cpu.stat``, which any process,
    a container's included, can read of itself.

    A process under a CFS quota runs at a core's speed until the period's quota is spent, then waits
    for the next period, wherever it is: a step's compute that fits in what is left of a period runs
    at full speed, and the wait lands later (in the step's all-reduce, or the next step). A worker's
    time for its share of a step is its compute time plus the waits it caused elsewhere; this clock
    measures those waits. Every reading checks which cgroup the process is in (the emulator may move
    the process between readings): :meth:`since` is 0.0 across a move, and where no cgroup counts throttling.

    A worker reads it every step, and on a rank under a quota its CPU is wall time at the quota's
    rate, so the files it reads (``/proc/self/cgroup``, ``cpu.stat``, the quota's) stay open and a
    reading is a few ``pread`` calls; the cgroup's directory is looked up again, and its files opened
    again, only when ``/proc/self/cgroup`` changes (or in a forked child).
    """

    def __init__(self) -> None:
        self._mounts = [(point, root, version) for point, root, version, controllers in mounts()
                        if version == 2 or "cpu" in controllers]
        self._seen: str | None = None  # /proc/self/cgroup as last read
        self._dirs: list[Path] = []  # the cgroups that may count throttling, for that membership
        self._fds: dict[str, int] = {}  # open files by path (-1: could not be opened, for that membership)
        self._pid = os.getpid()

    def _text(self, path: str | Path) -> str | None:
        """A kernel file's text from its open descriptor (opened on first use), or None where it cannot be read."""
        key = str(path)
        fd = self._fds.get(key)
        if fd is None:
            try:
                fd = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._fds[key] = fd
        if fd < 0:
            return None
        try:
            return os.pread(fd, 65536, 0).decode().strip()
        except OSError:  # the cgroup was removed: open it again next time
            os.close(self._fds.pop(key))
            return None

    def close(self) -> None:
        """Close the files it keeps open (a later reading opens them again)."""
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds, self._seen, self._dirs = {}, None, []

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():  # a forked child's copies are its own to close
                self.close()
        except (AttributeError, TypeError, OSError):  # half-built, or at interpreter exit
            pass

    def _counting(self) -> list[Path]:
        if self._pid != os.getpid():  # a forked child: its own /proc/self
            self._fds, self._seen, self._dirs, self._pid = {}, None, [], os.getpid()
        text = self._text("/proc/self/cgroup")
        if text != self._seen:
            self.close()  # the files of the cgroup it left
            self._seen = text
            member = parse_membership(text or "")
            for point, root, version in self._mounts:
                path = member.get("") if version == 2 else member.get("cpu")
                if path is not None:
                    self._dirs.append(own_dir(point, root, path))
        return self._dirs

    def read(self) -> tuple[Path, float] | None:
        """(the counting cgroup, seconds held back so far), or None where nothing counts."""
        for d in self._counting():
            for line in (self._text(d / "cpu.stat") or "").splitlines():
                name, _, value = line.partition(" ")
                if name == "throttled_time" and value.isdigit():
                    return d, int(value) / 1e9
                if name == "throttled_usec" and value.isdigit():
                    return d, int(value) / 1e6
        return None

    def rate(self, reading: tuple[Path, float] | None) -> float:
        """The CPUs the quota of the cgroup of ``reading`` lets this process use, at most one (what a
        single thread, like the controller's, can run at): 1.0 without a quota or a reading."""
        cpus = self.cpus(reading)
        return 1.0 if cpus is None else min(cpus, 1.0)

    def cpus(self, reading: tuple[Path, float] | None) -> float | None:
        """The CPUs the quota of the cgroup of ``reading`` allows (None: no quota, or no reading)."""
        return None if reading is None else dir_quota(reading[0], self._text)

    def limited(self) -> bool:
        """Whether this process's CPU cgroup has a quota now (a worker whose quota may hold it in the
        middle of a step, where a round's wall time need not show it)."""
        return self.cpus(self.read()) is not None

    def held_since(self, before: tuple[Path, float] | None) -> float:
        """Seconds held back since the reading ``before`` (0.0, and no reading, when it is None)."""
        return 0.0 if before is None else self.since(before, self.read())

    @staticmethod
    def since(before: tuple[Path, float] | None, after: tuple[Path, float] | None) -> float:
        """Seconds held back between two readings (0.0 unless both read the same cgroup)."""
        if before is None or after is None or before[0] != after[0]:
            return 0.0
        return max(after[1] - before[1], 0.0)
