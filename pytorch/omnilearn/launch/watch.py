"""Failure detection while a job runs: a worker that died, or one that made no step for ``fault.timeout_s``.

A rank's heartbeat is its metrics file (one line per step, flushed as it goes): its modification time
is the rank's last step. A rank silent for the timeout is hung; its process state names the likely
cause (``T``: stopped, e.g. by SIGSTOP). In BSP one stopped rank silences its peers too (they wait in
the all-reduce), so a stopped rank is named first, then the one silent longest.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from omnilearn.metrics import metrics_path
from omnilearn.train.lifecycle import STOPPED_STATUS

STATES = {"T": "stopped (SIGSTOP?)", "t": "stopped by a debugger", "D": "in uninterruptible sleep (I/O?)",
          "Z": "exited, not reaped", "R": "running but not stepping", "S": "waiting (blocked on a peer?)"}
STARTUP_FACTOR = 3.0
"""Before its first record a rank gets this many timeouts (imports, data, rendezvous) unless stopped."""


def describe_status(status: int) -> str:
    """``died: SIGKILL`` for a death by a signal (Popen's negative status, or 128 + signal), else the status."""
    number = -status if status < 0 else status - 128 if status > 128 else 0
    if number:
        try:
            return f"died: {signal.Signals(number).name}"
        except ValueError:
            return f"died: signal {number}"
    if status == STOPPED_STATUS:
        return f"stopped on request (SIGTERM) at a step boundary (status {status})"
    return f"exited with status {status}"


def proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def stopped_ranks(pids: dict[int, int], samples: int = 4, interval: float = 0.1) -> list[int]:
    """Ranks whose process stays stopped over a few samples (a duty-cycle pause lasts less)."""
    seen = [r for r, pid in pids.items() if proc_state(pid) == "T"]
    for _ in range(samples - 1):
        if not seen:
            break
        time.sleep(interval)
        seen = [r for r in seen if proc_state(pids[r]) == "T"]
    return seen


class HangWatch:
    """Which watched rank has made no step for ``timeout_s`` (checked at the launcher's pace)."""

    def __init__(self, out_dir: Path, pids: dict[int, int], timeout_s: float, started: float | None = None) -> None:
        self.out_dir, self.pids, self.timeout_s = Path(out_dir), pids, timeout_s
        self.started = time.time() if started is None else started
        self.culprit: int | None = None
        """The rank the last message named."""

    def last_step(self, rank: int) -> float | None:
        try:
            return metrics_path(self.out_dir, rank).stat().st_mtime
        except OSError:
            return None

    def silent(self, now: float | None = None) -> dict[int, float]:
        """``{rank: seconds since its last step}`` for each rank past its timeout."""
        now = time.time() if now is None else now
        out = {}
        for rank, pid in self.pids.items():
            last = self.last_step(rank)
            quiet = now - (self.started if last is None else max(last, self.started))
            limit = self.timeout_s if last is not None or proc_state(pid) == "T" else STARTUP_FACTOR * self.timeout_s
            if quiet >= limit:
                out[rank] = quiet
        return out

    def check(self, name: Callable[[int], str]) -> str | None:
        """The message naming the hung rank and its cause, or None. ``name(rank)`` words a rank."""
        silent = self.silent()
        if not silent:
            return None
        # a stopped rank is what its peers wait for, past its own timeout or not yet: a peer whose last
        # step is older than the stopped rank's times out first, waiting for it
        stopped = self.check_stopped(name)
        if stopped is not None:
            return stopped
        rank = self.culprit = max(silent, key=lambda r: (silent[r], -r))
        cause = STATES.get(proc_state(self.pids[rank]) or "", "gone")
        return f"{name(rank)} made no step for {silent[rank]:.0f} s (fault.timeout_s {self.timeout_s:g}): {cause}"

    def check_stopped(self, name: Callable[[int], str]) -> str | None:
        """After a failure: a rank that stays stopped caused it (its peers timed out waiting for it)."""
        stopped = stopped_ranks(self.pids)
        if not stopped:
            return None
        rank = self.culprit = min(stopped)
        quiet = time.time() - max(self.last_step(rank) or self.started, self.started)
        return f"{name(rank)} made no step for {quiet:.0f} s (fault.timeout_s {self.timeout_s:g}): stopped (SIGSTOP?)"
