"""The batch controller of ``uniform``, ``static``, ``dynamic-v1``, ``dynamic+prior`` and ``paper``: turns
compute-time measurements into batch-size decisions with windows, a change detector and a deadband
(``dynamic`` is :mod:`omnilearn.control.dynamic`).

Every rank (BSP) or the parameter server (ASP) holds the same :class:`BatchController`, fed only
with data all of them hold: BSP gathers every worker's compute time after each step
(:meth:`BatchController.observe_step`), the server receives each worker's time with its push
(:meth:`BatchController.observe`). The windows, the noticed speed changes and the fitted time model
are therefore the same everywhere, and so is every decision: nothing needs broadcasting.

Knowledge is structural: the allocated CPU shares reach a controller only through
:meth:`BatchController.allocations`, which reads them for the policies that say so in their name
(``static``, ``dynamic+prior``) and for no other.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.policies import Bounds
from omnilearn.control.windows import ComputeWindow, StepWindow

Shares = Sequence[float | None]
PAIRS = 8  # pairs of consecutive splits (with their measured times) kept for fitting the fixed cost k
DECISION_ERROR = 0.1  # a decision waits for enough steps that its estimates are good to about 10%
NOISE_PRIOR = 0.15  # step-to-step noise (log sd) assumed for the deadband until the window has measured it


@dataclass
class BatchController:
    """Holds the current batch sizes of all workers and decides new ones.

    Its settings are the job's ``control`` section, resolved for the policy
    (:func:`~omnilearn.control.policies.effective`). A measuring policy considers a decision
    every ``interval`` steps (0: at epoch ends) and takes one once every worker has enough fresh
    measurements (:meth:`samples_needed`); the deadband widens while few measurements back the
    estimates (:meth:`deadband`), so a small correction needs more evidence.
    ``dynamic-v1`` balances the time model ``t_i(b) = c_i (b + k)``; ``k`` is fitted from how the
    workers' times moved between the last splits, where those pairs of splits agree within the
    step noise (:func:`~omnilearn.control.policies.fit_overhead`): a pair measured across a speed
    change nobody flagged can fit any ``k``. Without an estimate the last ``k`` stays.
    """

    config: ControlConfig
    global_batch: int
    bounds: Bounds
    synchronous: bool = True
    """BSP (every worker's time of each step, :meth:`observe_step`) or ASP (:meth:`observe`)."""
    batch: list[int] = field(default_factory=list)
    # dynamic+prior: per-worker samples/s at the last decision and the CPU shares they were measured
    # under, its starting point after a level change.
    speeds: list[float] | None = None
    shares: list[float | None] | None = None
    overhead: float = 0.0
    # The last split left, with the times measured at it, the workers' regimes then and the steps
    # behind the times (b, t, regimes, n), and pairs of consecutive splits measured under unchanged
    # speeds, as far as the detector saw (b, t, b2, t2, 1/n + 1/n2): k's evidence, weighed by the
    # steps behind it. k belongs to the workload, not to a level: pairs from earlier regimes count.
    last: tuple[list[int], list[float], list[int], int] | None = None
    pairs: list[tuple[list[int], list[float], list[int], list[float], float]] = field(default_factory=list)
    settled: bool = False
    """A check found the workers within the plain deadband and no split or speed change came since:
    the next split needs ``hysteresis`` times the deadband."""

    def __post_init__(self) -> None:
        assert self.policy in policies.POLICIES and self.policy != "dynamic", self.policy
        workers = len(self.bounds.max_batch)
        if not self.batch:
            self.batch = policies.uniform(workers, self.global_batch, self.bounds)
        c, paper = self.config, self.policy == "paper"
        # BSP: one window over every worker's steps (relative times); ASP and the paper: one per worker.
        # The start is measured: the memory probe ran the model already, and a first step slower on
        # every worker alike divides out of relative times.
        self.steps = StepWindow(workers, c.window, skip=c.skip_after_change, change=c.change_threshold)
        self.windows = [ComputeWindow(c.window, skip=c.skip_after_change, change=c.change_threshold, mean=paper)
                        for _ in range(workers)]
        self.forget(skip=0)

    @property
    def policy(self) -> str:
        return self.config.policy

    @property
    def workers(self) -> int:
        return len(self.batch)

    @property
    def knows_allocation(self) -> bool:
        return self.policy in policies.USES_ALLOCATION

    @property
    def measures(self) -> bool:
        return self.policy in policies.MEASURED

    @property
    def times_update(self) -> bool:
        """Whether compute time includes the optimizer step (the paper timed forward+backward only)."""
        return self.policy != "paper"

    times_quota = False
    """Whether a worker's time includes the waits its CPU quota put into the all-reduce (``dynamic``'s)."""
    skips_steps = False
    """Whether the control loop may leave steps out to keep its cost in budget (``dynamic``'s): this one
    measures every step (its windows count steps)."""
    wants_step = False
    at_stake = 0.0

    @property
    def relative(self) -> bool:
        """Whether steps are compared as relative times (BSP, except the paper, which means raw ones)."""
        return self.synchronous and self.policy != "paper"

    def allocations(self, read: Callable[[], Shares]) -> Shares | None:
        """The allocated CPU shares, read (``read()``) only for a policy whose name says it uses them."""
        return read() if self.knows_allocation else None

    # ------------------------------------------------------------------ measurements

    def observe_step(self, seconds: Sequence[float], steps: int = 1) -> list[int]:
        """BSP: every worker's compute time of one full step at the current batches (gathered, so the
        same on every rank). Returns the workers found to have changed speed. ``steps`` is always 1
        here (it measures every step)."""
        if not self.measures:
            return []
        if self.relative:
            before, regimes = (self.steps.estimates() if self.steps.count else None), list(self.steps.regimes)
            count = self.steps.count
            changed = self.steps.add(seconds)
            if changed and before is not None and self.last is not None and self.last[2] == regimes \
                    and self.last[0] != self.batch:  # the current split, measured before the change: k shows
                pair = (self.last[0], self.last[1], list(self.batch), before, 1 / self.last[3] + 1 / count)
                self.pairs = [*self.pairs, pair][-PAIRS:]
            if changed:
                self.last = None
                self.settled = False
            return changed
        for w, t in zip(self.windows, seconds, strict=True):
            w.add(t)
        return []

    def observe(self, worker: int, batch: int, seconds: float) -> bool:
        """ASP: one worker's compute time of a step at ``batch`` (ignored unless its current batch).
        True when it showed a change of that worker's speed."""
        if not self.measures or batch != self.batch[worker]:
            return False
        changed = self.windows[worker].add(seconds)
        if changed:
            self.settled = False
        return changed

    def forget(self, workers: Sequence[int] | None = None, skip: int | None = None) -> None:
        """Drop measurements (all, or those of ``workers``); the next ``skip`` steps are not measured."""
        self.steps.reset(skip)
        for i in range(self.workers) if workers is None else workers:
            self.windows[i].reset(skip)

    def estimates(self) -> tuple[list[float] | None, list[int]]:
        """Every worker's compute-time estimate at its current batch (None until each has one), and
        the measurements behind each."""
        if self.relative:
            return self.steps.estimates(), [self.steps.count] * self.workers
        est = [w.estimate() for w in self.windows]
        counts = [w.count for w in self.windows]
        if min(counts) == 0:
            return None, counts
        return [float(e) for e in est if e is not None], counts

    def regimes(self) -> list[int]:
        return list(self.steps.regimes) if self.relative else [w.regime for w in self.windows]

    # ------------------------------------------------------------------ decisions

    def initial(self, cpu_shares: Shares | None) -> list[int]:
        """Batch sizes before any measurement: by allocated CPU for ``static`` and ``dynamic+prior``
        (when every share is known), else equal."""
        if not self.knows_allocation:
            return list(self.batch)
        assert cpu_shares is not None
        self.shares = list(cpu_shares)
        if self.policy == "static" or all(cpu_shares):
            self.batch = policies.static(cpu_shares, self.global_batch, self.bounds)
        return list(self.batch)

    def reallocate(self, cpu_shares: Shares | None) -> list[int] | None:
        """A level change the policy is told of: new batch sizes before any new measurement, or None.

        Only the allocation-aware policies are told (the others return None, untouched). ``static``
        follows the new allocation. ``dynamic+prior`` drops its measurements and expects each
        worker's speed to scale with its CPU share: the speeds measured before the change, times new
        share / old share (the new shares alone when nothing was measured yet).
        """
        if not self.knows_allocation:
            return None
        assert cpu_shares is not None
        old, self.shares = self.shares, list(cpu_shares)
        self.forget()
        self.last = None
        self.settled = False
        if self.policy == "static":
            new = policies.static(cpu_shares, self.global_batch, self.bounds)
        elif all(cpu_shares):
            if self.speeds is not None and old is not None and all(old):
                weights = [s * n / o for s, n, o in zip(self.speeds, cpu_shares, old, strict=True)]
            else:
                weights = [float(x) for x in cpu_shares]
            new = policies.split(weights, self.global_batch, self.bounds)
        else:
            return None
        self.speeds = None  # measured under the old allocation
        return self._adopt(new)

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        """Whether this step (1-based count of steps done) is a decision point."""
        if self.policy == "uniform":
            return False
        if self.config.interval <= 0:
            return end_of_epoch
        return step_in_run % self.config.interval == 0

    def probe_sizes(self) -> None:
        """No start-up probe: these policies begin from equal batches or from allocations."""
        return None

    @property
    def holds(self) -> dict[str, int]:
        return {}

    def decide(self, cpu_shares: Shares | None = None, steps_left: int | None = None) -> list[int] | None:
        """New batch sizes from the measurements so far, or None to keep the current ones.

        Identical measurements give identical outputs on every rank (no randomness, no state beyond
        what the common measurements built).
        """
        if self.policy == "uniform":
            return None
        if self.policy == "static":
            assert cpu_shares is not None
            return self._adopt(policies.static(cpu_shares, self.global_batch, self.bounds))
        times, counts = self.estimates()
        n = min(counts)
        if times is None or n < self.samples_needed():
            return None
        self.speeds = [b / max(t, 1e-9) for b, t in zip(self.batch, times, strict=True)]
        if self.policy == "paper":
            new = policies.paper(self.batch, times, self.global_batch, self.bounds, self.config.deadband)
            self.forget()  # each epoch is its own mean
            return self._adopt(new)
        spread = policies.imbalance(times)
        if spread <= self.config.deadband:  # balanced on the plain deadband, however few the steps
            self.settled = True
        deadband = self.deadband(n) * (self.config.hysteresis if self.settled else 1.0)
        if spread <= deadband:
            return None
        now = self.regimes()
        pair = None
        if self.last is not None and self.last[2] == now and self.last[0] != self.batch:  # the same speeds: k shows
            pair = (self.last[0], self.last[1], list(self.batch), list(times), 1 / self.last[3] + 1 / n)
        if self.config.fit_overhead:
            evidence = self.pairs + ([pair] if pair else [])
            fitted = policies.fit_overhead([p[:4] for p in evidence], cap=float(self.global_batch),
                                           noise=[self.pair_noise(p[4]) for p in evidence])
            self.overhead = self.overhead if fitted is None else fitted
        new = policies.dynamic(self.batch, times, self.global_batch, self.bounds, deadband, self.overhead)
        if new != self.batch and self.config.damp_reversals and self.last is not None and self.last[2] == now:
            new = policies.damped(self.last[0], self.batch, new, self.global_batch, self.bounds)
        if new != self.batch:
            if pair:
                self.pairs = [*self.pairs, pair][-PAIRS:]
            self.last = (list(self.batch), list(times), now, n)
        return self._adopt(new)

    def deadband(self, n: int) -> float:
        """The spread below which nothing changes, with ``n`` measurements per worker: ``deadband``
        with a full window, ``deadband * sqrt(window / n)`` with fewer, and never below three standard
        deviations of the difference of two workers' mean times under the measured noise (BSP; until
        it is measured, :data:`NOISE_PRIOR`: a job that decides every other step never measures it)."""
        c = self.config
        band = c.deadband * math.sqrt(c.window / n) if n < c.window else c.deadband
        if not self.relative:
            return band
        noise = self.steps.noise()
        return max(band, math.expm1(3 * (NOISE_PRIOR if noise is None else noise) * math.sqrt(2 / n)))

    def pair_noise(self, weight: float) -> float:
        """The standard deviation of a worker's ``log(t2 / t)`` between two splits whose estimates are
        medians of ``n`` and ``n2`` steps (``weight = 1/n + 1/n2``): the median's error, about
        1.25 noise / sqrt(n), on either side, under the measured step noise (BSP) or, until it is
        measured and for ASP, :data:`NOISE_PRIOR`. It sets which values of ``k`` a pair supports
        (:func:`~omnilearn.control.policies.fit_overhead`)."""
        noise = self.steps.noise() if self.relative else None
        return 1.25 * (NOISE_PRIOR if noise is None else noise) * math.sqrt(weight)

    def samples_needed(self) -> int:
        """``min_samples``, or more where the measured noise says so (BSP): enough steps that the
        median's error, about 1.25 noise / sqrt(n), is within DECISION_ERROR, up to half a window.
        Until the noise is measured, BSP takes the first decision since the start or a speed change on
        ``min_samples`` steps (a large imbalance shows in one), then waits for two steps at each split
        (when the window holds two): the change between them is what measures the noise; decisions on
        one step each would never learn it, and would chase the noise of steps of a few CFS periods."""
        noise = self.steps.noise() if self.relative else None
        if noise is None:
            if not self.relative or self.last is None:
                return self.config.min_samples
            return max(self.config.min_samples, min(2, self.config.window))
        wanted = math.ceil((1.25 * noise / DECISION_ERROR) ** 2)
        return max(self.config.min_samples, min(wanted, max(self.config.window // 2, 1)))

    def _adopt(self, new: list[int]) -> list[int] | None:
        if new == self.batch:
            return None
        changed = [i for i, (a, b) in enumerate(zip(self.batch, new, strict=True)) if a != b]
        self.batch = new
        self.settled = False
        self.steps.reset()  # relative times: any worker's change moves everyone's
        self.forget(changed)
        return new

    def set_threads(self, threads: Sequence[float]) -> None:
        return None  # one k for every worker

    def set_bounds(self, bounds: Bounds) -> list[int] | None:
        """Adopt new bounds (memory-aware limits); re-split if the current batch breaks them."""
        self.bounds = bounds
        if all(bounds.min_batch <= b <= m for b, m in zip(self.batch, bounds.max_batch, strict=True)):
            return None
        return self._adopt(policies.split(self.batch, self.global_batch, bounds))

    # ------------------------------------------------------------------ state

    FIELDS = ("batch", "speeds", "shares", "overhead", "last", "pairs", "settled")

    def state_dict(self) -> dict[str, Any]:
        """Batches, bounds, measurement windows, the fitted k and its evidence, and the hysteresis flag."""
        return _plain({**{k: getattr(self, k) for k in self.FIELDS}, "policy": self.policy,
                       "bounds": {"min_batch": self.bounds.min_batch, "max_batch": list(self.bounds.max_batch)},
                       "steps": vars(self.steps), "windows": [vars(w) for w in self.windows]})

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        """Load ``d``; with ``keep`` (the saved workers that still run, in rank order) only theirs, as
        :meth:`load_survivors` does."""
        d = _plain(d)
        if keep is not None and keep != list(range(len(d["batch"]))):
            self.load_survivors(d, keep)
            return
        assert len(d["batch"]) == self.workers, (d["batch"], self.workers)
        for k in self.FIELDS:
            setattr(self, k, d.get(k, False) if k == "settled" else d[k])
        self.bounds = dataclasses.replace(self.bounds, min_batch=d["bounds"]["min_batch"],
                                          max_batch=tuple(d["bounds"]["max_batch"]))
        vars(self.steps).update(d["steps"])
        for w, saved in zip(self.windows, d["windows"], strict=True):
            vars(w).update(saved)

    def load_survivors(self, d: dict[str, Any], keep: list[int]) -> None:
        """After a worker was lost for good: the survivors' batches scaled up to the global batch (their
        ratios are what the controller had learnt of their speeds), their bounds, speeds and shares, their
        measured step noise, and the fitted fixed cost k (the workload's, not a worker's). Measurement
        windows and the pairs of splits behind k described another set of workers: they start empty."""
        assert len(keep) == self.workers, (keep, self.workers)
        self.bounds = dataclasses.replace(self.bounds, min_batch=d["bounds"]["min_batch"],
                                          max_batch=tuple(d["bounds"]["max_batch"][i] for i in keep))
        self.batch = policies.split([float(d["batch"][i]) for i in keep], self.global_batch, self.bounds)
        self.speeds = [d["speeds"][i] for i in keep] if d["speeds"] is not None else None
        self.shares = [d["shares"][i] for i in keep] if d["shares"] is not None else None
        self.overhead, self.last, self.pairs, self.settled = float(d["overhead"]), None, [], False
        self.forget()
        # The step-to-step noise measured so far is the survivors' own: without it, decisions would
        # wait on no more than min_samples steps until it is measured again.
        self.steps.changes = [[row[i] for i in keep] for row in d["steps"].get("changes", [])]


def _plain(value: Any) -> Any:
    """A deep copy of plain data through JSON: a checkpoint never shares state with the live object."""
    return json.loads(json.dumps(value))
