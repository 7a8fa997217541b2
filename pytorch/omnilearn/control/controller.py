"""The batch controller: turns per-worker compute-time measurements into batch-size decisions.

Rank-local bookkeeping (a window of this worker's own compute times) plus a pure decision taken
from every worker's estimate. The trainer gathers the estimates (BSP: an all-gather; ASP: reports to
the parameter server) and every rank calls :meth:`BatchController.decide` with the same inputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from omnilearn.control import policies
from omnilearn.control.policies import Bounds


@dataclass
class ComputeWindow:
    """Recent compute times of one worker at its current batch size and allocation.

    The first ``skip`` steps after a change are dropped: they carry thread start-up, cache refill
    and the kernel's new quota settling in, not the steady state.
    """

    size: int
    skip: int = 1
    times: list[float] = field(default_factory=list)
    _to_skip: int = 0

    def __post_init__(self) -> None:
        self._to_skip = self.skip

    def reset(self) -> None:
        self.times.clear()
        self._to_skip = self.skip

    def add(self, seconds: float) -> None:
        if self._to_skip > 0:
            self._to_skip -= 1
            return
        self.times.append(seconds)
        del self.times[: -self.size]

    @property
    def count(self) -> int:
        return len(self.times)

    def estimate(self) -> float | None:
        """Median of the window: robust to the odd slow step (a GC pause, a throttled period)."""
        return statistics.median(self.times) if self.times else None


@dataclass
class BatchController:
    """Holds the current batch sizes of all workers and decides new ones.

    ``interval``: decide every ``interval`` steps (0: only at epoch ends, see ``due``).
    A decision needs at least ``min_samples`` fresh measurements on every worker.
    """

    policy: str
    global_batch: int
    bounds: Bounds
    interval: int = 4
    window: int = 4
    min_samples: int = 2
    deadband: float = 0.05
    skip: int = 1
    batch: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.policy in policies.POLICIES, self.policy
        workers = len(self.bounds.max_batch)
        if not self.batch:
            self.batch = policies.uniform(workers, self.global_batch, self.bounds)
        self.own = ComputeWindow(size=self.window, skip=self.skip)

    @property
    def workers(self) -> int:
        return len(self.batch)

    def initial(self, cpu_shares: Sequence[float | None]) -> list[int]:
        """Batch sizes before any measurement: static uses the allocation, the others start equal."""
        if self.policy == "static":
            self.batch = policies.static(cpu_shares, self.global_batch, self.bounds)
        return list(self.batch)

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        """Whether this step (1-based count of steps done) is a decision point."""
        if self.policy == "uniform":
            return False
        if self.interval <= 0:
            return end_of_epoch
        return step_in_run % self.interval == 0

    def decide(
        self,
        estimates: Sequence[float | None],
        counts: Sequence[int],
        cpu_shares: Sequence[float | None],
    ) -> list[int] | None:
        """New batch sizes from every worker's estimate, or None to keep the current ones.

        Identical inputs give identical outputs on every rank (no randomness, no local state
        beyond ``batch``, which all ranks hold in common).
        """
        if self.policy == "uniform":
            return None
        if self.policy == "static":
            new = policies.static(cpu_shares, self.global_batch, self.bounds)
        else:
            if min(counts) < self.min_samples or any(e is None for e in estimates):
                return None
            new = policies.dynamic(self.batch, [float(e) for e in estimates], self.global_batch,
                                   self.bounds, self.deadband)
        if new == self.batch:
            return None
        self.batch = new
        return new

    def set_bounds(self, bounds: Bounds) -> list[int] | None:
        """Adopt new bounds (memory-aware limits); re-split if the current batch breaks them."""
        self.bounds = bounds
        if all(bounds.min_batch <= b <= m for b, m in zip(self.batch, bounds.max_batch, strict=True)):
            return None
        self.batch = policies.split(self.batch, self.global_batch, bounds)
        return list(self.batch)
