"""The batch controller: turns per-worker compute-time measurements into batch-size decisions.

Rank-local bookkeeping (a window of this worker's own compute times) plus a pure decision taken
from every worker's estimate. The trainer gathers the estimates (BSP: an all-gather; ASP: reports to
the parameter server) and every rank calls :meth:`BatchController.decide` with the same inputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from omnilearn.config import ControlConfig
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

    Its settings are the job's ``control`` section (:class:`~omnilearn.config.ControlConfig`: one set of
    defaults, one mapping): decide every ``interval`` steps (0: only at epoch ends, see ``due``), each
    decision needing at least ``min_samples`` fresh measurements on every worker.
    """

    config: ControlConfig
    global_batch: int
    bounds: Bounds
    batch: list[int] = field(default_factory=list)
    # Per-worker samples/s at the last decision, and the CPU shares they were measured under: the
    # dynamic policy's starting point after a level change.
    speeds: list[float] | None = None
    shares: list[float | None] | None = None

    def __post_init__(self) -> None:
        assert self.policy in policies.POLICIES, self.policy
        workers = len(self.bounds.max_batch)
        if not self.batch:
            self.batch = policies.uniform(workers, self.global_batch, self.bounds)
        self.own = ComputeWindow(size=self.config.window, skip=self.config.skip_after_change)

    @property
    def policy(self) -> str:
        return self.config.policy

    @property
    def workers(self) -> int:
        return len(self.batch)

    def _use_prior(self, cpu_shares: Sequence[float | None]) -> bool:
        return self.policy == "dynamic" and self.config.prior == "allocation" and all(cpu_shares)

    def initial(self, cpu_shares: Sequence[float | None]) -> list[int]:
        """Batch sizes before any measurement.

        ``static`` splits by allocated CPU; ``dynamic`` does too when its prior is the allocation
        (and every share is known), then corrects by measurement; otherwise batches start equal.
        """
        self.shares = list(cpu_shares)
        if self.policy == "static" or self._use_prior(cpu_shares):
            self.batch = policies.static(cpu_shares, self.global_batch, self.bounds)
        return list(self.batch)

    def reallocate(self, cpu_shares: Sequence[float | None]) -> list[int] | None:
        """A level change: new batch sizes before any new measurement, or None to keep them.

        ``static`` follows the new allocation. ``dynamic`` with the allocation prior expects each
        worker's speed to scale with its CPU share: the speeds measured before the change, times
        new share / old share (the new shares alone when nothing was measured yet). Measurement
        then corrects whatever the CPU share does not explain.
        """
        old, self.shares = self.shares, list(cpu_shares)
        if self.policy == "static":
            new = policies.static(cpu_shares, self.global_batch, self.bounds)
        elif self._use_prior(cpu_shares):
            if self.speeds is not None and old is not None and all(old):
                weights = [s * n / o for s, n, o in zip(self.speeds, cpu_shares, old, strict=True)]
            else:
                weights = [float(x) for x in cpu_shares]
            new = policies.split(weights, self.global_batch, self.bounds)
        else:
            return None
        self.speeds = None  # measured under the old allocation
        if new == self.batch:
            return None
        self.batch = new
        return new

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        """Whether this step (1-based count of steps done) is a decision point."""
        if self.policy == "uniform":
            return False
        if self.config.interval <= 0:
            return end_of_epoch
        return step_in_run % self.config.interval == 0

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
            if min(counts) < self.config.min_samples or any(e is None for e in estimates):
                return None
            self.speeds = [b / max(float(e), 1e-9) for b, e in zip(self.batch, estimates, strict=True)]
            new = policies.dynamic(self.batch, [float(e) for e in estimates], self.global_batch,
                                   self.bounds, self.config.deadband)
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
