"""The affinity backend: CPU affinity for cpusets, a SIGSTOP/SIGCONT duty cycle for quotas (no root needed).

What it reports for a quota is the duty cycle it achieves, not the one asked: the throttle times each
window it lets the process run, from the moment it sends SIGCONT to the moment it sends SIGSTOP, and
:meth:`AffinityBackend.apply` returns ``threads x`` (time let run / wall time) over the first
:data:`MEASURE_PERIODS` periods of the new quota. A throttle that wakes late lets the process run
longer than asked (a real-time priority, where allowed, keeps that small); the audit shows it. (The
process's own CPU time would say less: at a level change the worker is idle, waiting for the toggler.)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from omnilearn.emulator.backends.pauses import Pauses
from omnilearn.emulator.spec.levels import (
    Allocation,
    effective_cpuset,
    format_cpuset,
    host_cpus,
    parse_cpuset,
)

log = logging.getLogger("omnilearn.backends")

MEASURE_PERIODS = 3  # periods of a new quota timed before apply returns the achieved duty cycle


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
    ran_s: float = 0.0  # time let run, and wall time, of the periods throttled since the last apply
    wall_s: float = 0.0


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
        self._pauses = Pauses()

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
            t.ran_s = t.wall_s = 0.0
            procs = list(t.procs)
        cpus = self._cpus(allocation)
        for p in procs:
            p.set_affinity(cpus)
        self._ensure_thread(target)
        cpuset = self._affinity(procs, allocation.cpuset)
        return Allocation(cpuset=cpuset, cpus=self._achieved(target, allocation, bool(procs)), memory=None)

    def current(self, target: str) -> Allocation:
        """The mask of the target's first live process and the duty cycle achieved since the last apply."""
        with self._lock:
            t = self._targets.get(target, _Target())
            procs, allocation, ran, wall = list(t.procs), t.allocation, t.ran_s, t.wall_s
        cpus = round(allocation.threads() * ran / wall, 4) if wall > 0 else allocation.cpus
        return Allocation(cpuset=self._affinity(procs, allocation.cpuset), cpus=cpus, memory=None)

    def _affinity(self, procs: list[_Proc], requested: str | None) -> str | None:
        """The cpuset read back from the first live process (``requested`` before any process is added)."""
        for p in procs:
            try:
                kernel = format_cpuset(os.sched_getaffinity(p.pid))
            except ProcessLookupError:
                continue
            return effective_cpuset(kernel, requested, format_cpuset(self._host))
        return requested

    def _achieved(self, target: str, allocation: Allocation, throttled: bool) -> float | None:
        """The quota the throttle achieves over its first periods: threads x time let run / wall time."""
        if allocation.cpus is None or not throttled or allocation.cpus >= allocation.threads():
            return allocation.cpus  # nothing throttled: the processes run freely on their CPUs
        deadline = time.monotonic() + 2 * MEASURE_PERIODS * self.period
        while time.monotonic() < deadline and not self._stop.is_set():
            with self._lock:
                t = self._targets[target]
                if t.wall_s >= MEASURE_PERIODS * self.period:
                    return round(allocation.threads() * t.ran_s / t.wall_s, 4)
            time.sleep(self.period / 2)
        return allocation.cpus  # the throttle did not run (stopping): nothing measured

    def stall(self, target: str, seconds: float) -> None:
        """Stop the target's processes for ``seconds``; its throttle leaves them stopped meanwhile."""
        with self._lock:
            procs = list(self._targets.setdefault(target, _Target()).procs)

        def send(sig: int) -> None:
            for p in procs:
                p.signal(sig)
        self._pauses.pause(target, seconds, lambda: send(signal.SIGSTOP), lambda: send(signal.SIGCONT))

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
        running_since = time.monotonic()  # when the processes were last let run (SIGCONT)
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
                if fraction >= 1.0 or self._pauses.paused(target):
                    self._stop.wait(self.period)
                    running_since = time.monotonic()
                    continue
                if self._stop.wait(self.period * fraction):
                    break
                stopped = True
                for p in procs:
                    p.signal(signal.SIGSTOP)
                ran = time.monotonic() - running_since
                self._stop.wait(self.period * (1.0 - fraction))
                if not self._pauses.paused(target):  # a stall began: its timer resumes the processes
                    for p in procs:
                        p.signal(signal.SIGCONT)
                stopped = False
                now = time.monotonic()
                with self._lock:
                    t = self._targets[target]
                    t.ran_s, t.wall_s = t.ran_s + ran, t.wall_s + now - running_since
                running_since = now
        finally:
            if stopped and not self._pauses.paused(target):
                for p in procs:
                    p.signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the throttles and let every process run again."""
        self._stop.set()
        self._pauses.close()
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
