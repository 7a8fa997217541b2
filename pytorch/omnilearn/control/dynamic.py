"""``dynamic``: the batch controller on a stated model, measured before the first step, deciding by
expected gain.

It estimates ``t_i(b) = c_i (b + k)`` (:class:`~omnilearn.control.model.SpeedModel`) from what a real
cluster gives it: the start-up probe (every worker times a few steps at two batch sizes once its first
allocation is in force) and every step's compute times. One rule decides
(:meth:`DynamicController.decide`):

    move towards the balanced split b* iff  E[G] - confidence * sd[G]  >  C / H

``G`` is the step time the move saves (the slowest worker's predicted time now, less at the new split),
its mean and spread from posterior draws of the speeds and k; the move goes the whole way to b*, or,
where that is not sure, half or a quarter of it (``Priors.strides``); ``C`` the measured cost of a re-split (the first
step at new shapes against the second, seconds); ``H`` the steps the new split is expected to serve
(to the end of the run, at most ``1 / hazard``: the steps until a speed is expected to change). A
balanced job, equal speeds, steps dominated by fixed cost or a noise the evidence cannot resolve give
``G`` small against its spread: the split is kept, and the reason counted (:attr:`holds`).

A trust region keeps every worker within ``Priors.trust`` times the batches it has been measured at: a
worker whose time per sample grows with the batch converges in bounded steps instead of swinging.
Identical inputs give identical decisions on every rank (the posterior draws are seeded by the count
of decisions considered).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.model import SpeedModel
from omnilearn.control.policies import Bounds
from omnilearn.control.priors import PRIORS


@dataclass
class DynamicController:
    """The ``dynamic`` policy (see the module): a :class:`~omnilearn.control.controller.Controller` with
    the start-up probe."""

    config: ControlConfig
    global_batch: int
    bounds: Bounds
    synchronous: bool = True
    batch: list[int] = field(default_factory=list)
    holds: dict[str, int] = field(default_factory=dict)
    """Decisions considered that kept the split, by reason: ``balanced`` (the model sees nothing to
    gain), ``uncertain`` (the gain is within the confidence of the estimate), ``cost`` (the gain does
    not pay the re-split over the steps it would serve), ``unmeasured`` (no measurement yet)."""
    costs: list[float] = field(default_factory=list)
    considered: int = 0
    watch: int = 0
    """Steps still to be measured after a speed changed (the reopened estimate's next evidence)."""
    probed: bool = False
    """The start-up probe measured every worker before step 1."""
    warmed: bool = False
    """BSP without the probe: the run's first step has passed (it carries the process's one-off costs:
    allocations, lazy initialisation, every shape's first use; it says nothing of speeds)."""
    decision: dict[str, Any] | None = None
    """The last decision taken: expected gain, its sd and the cost it had to beat (seconds)."""
    at_stake: float = 0.0
    """Seconds a step the last decision considered would save, when it was held for want of evidence
    (``uncertain``), else 0: what the next measurements may unlock. The control loop measures every
    step while this exceeds a measurement's cost (``Priors.budget``)."""

    def __post_init__(self) -> None:
        n = len(self.bounds.max_batch)
        if not self.batch:
            self.batch = policies.uniform(n, self.global_batch, self.bounds)
        self.model = SpeedModel(n, self.global_batch, drift=self.config.drift, hazard=self.config.hazard,
                                relative=self.synchronous)
        self._first: list[float] | None = None  # the first step's times at a new split (BSP)
        self._moved: tuple[list[int], np.ndarray] | None = None  # the old split and its predicted log times
        self._fresh: dict[int, float] = {}  # ASP: a worker's first time at its new batch
        self._from: dict[int, tuple[int, float]] = {}  # ASP: its batch before, and its log time predicted there
        self.threads: list[float] = [1.0] * n  # each worker's threads and kind of core (0: not reported)
        self.cores: list[float] = [0.0] * n

    # ------------------------------------------------------------------ what the policy is
    policy = property(lambda self: "dynamic")
    workers = property(lambda self: len(self.batch))
    knows_allocation = False
    measures = True
    times_update = True
    bounded_by_memory = True
    per_epoch = False
    skips_steps = True
    """The control loop may leave steps out when measuring every one would cost more than its budget
    (``Priors.budget``): the model counts the steps between two it measured."""
    times_quota = True
    """Under a CPU quota a worker's time is its compute's CPU at the quota's rate where that is longer
    than its wall time (:func:`~omnilearn.train.quota_clock.quota_seconds`): a compute that fits
    a period's quota runs at full speed, the wait for the next period lands in the all-reduce, and the
    wall time alone would not show the quota."""

    @property
    def relative(self) -> bool:
        return self.synchronous

    @property
    def overhead(self) -> float:
        """The posterior mean of k, in samples (the workers' mean, where their kinds' k differ)."""
        return float(np.mean(self.model.k))

    @property
    def overheads(self) -> list[float] | None:
        """Each worker's k, where workers of more than one kind tell theirs apart (else None)."""
        return [round(float(k), 2) for k in self.model.k] if len(set(self.model.group)) > 1 else None

    def set_threads(self, threads: Sequence[float]) -> None:
        """Every worker's threads (a level may change them): a worker's kind is its threads and its kind
        of core, and its k is its kind's (:mod:`~omnilearn.control.fixed_cost`)."""
        threads = [float(t) for t in threads]
        if threads != self.threads:
            self.threads = threads
            self.model.set_kinds(list(zip(self.threads, self.cores, strict=True)))

    def allocations(self, read: Callable[[], Sequence[float | None]]) -> None:
        return None  # measured times only

    def initial(self, cpu_shares: object) -> list[int]:
        return list(self.batch)

    def reallocate(self, cpu_shares: object) -> None:
        return None  # level changes show in the measured times

    def regimes(self) -> list[int]:
        return list(self.model.regimes)

    # ------------------------------------------------------------------ the probe
    def probe_sizes(self) -> tuple[int, int] | None:
        """The two batch sizes every worker times before the first step (None: no probe): those of the
        start-up pass every policy runs (:func:`~omnilearn.control.policies.probe_sizes`)."""
        if self.config.probe_steps <= 0 or self.model.measured:
            return None
        return policies.probe_sizes(self.global_batch, self.workers, self.bounds)

    def observe_probe(self, small: int, large: int, t_small: Sequence[float], t_large: Sequence[float],
                      warm: bool = True, kinds: Sequence[Sequence[float]] | None = None) -> list[int] | None:
        """Every worker's probe times (the median of its steps at each size): k and the speeds; returns
        the first split, balanced before step 1 (None: the equal split stays). ``warm``: the probe ran
        the loop's own step, so the first step is like any other; else (a framework's loop, whose first
        step carries its hooks' and DDP's one-off costs) the first step is left out, as without a probe.
        ``kinds``: each worker's threads and kind of core (its k is its kind's)."""
        self.probed, self.warmed = True, warm
        if kinds is not None:
            self.threads, self.cores = [float(t) for t, _ in kinds], [float(c) for _, c in kinds]
            self.model.set_kinds(list(zip(self.threads, self.cores, strict=True)))
        if self.synchronous:
            self.model.k_from_probe(small, large, t_small, t_large)
        self.model.speeds_from_probe(large, t_large, small, large)
        if self.synchronous:
            # times of one moment: the probe's common scale says how long a step takes
            self.model.scale = float(np.median(np.log(np.asarray(t_large)) - self.model.u
                                               - np.log(large + self.model.k)))
        # The first split meets the same rule as every other, at no cost: every split is new at step 1.
        new = self.decide(steps_left=None, cost=0.0)
        if self.synchronous:
            # The first step tells k as a re-split from the probe's larger size would: each worker's time
            # at its own share against its probe time (the workers' shares differ, the common scale of
            # probe and step drops out). The probe alone sees only small batches, where a core is used
            # less well and k reads larger than at the job's sizes.
            self._moved = ([large] * self.workers, self.model.predict_log([large] * self.workers))
        return new

    # ------------------------------------------------------------------ measurements
    @property
    def wants_step(self) -> bool:
        """The next step must be measured: the first two steps at a new split tell k and a re-split's
        cost, the two after a speed changed tell the new speed, and without the probe the steps until
        the first decision."""
        return (self._moved is not None or self._first is not None or self.watch > 0
                or self.model.measured < self._evidence)

    @property
    def _evidence(self) -> int:
        """Steps measured before the first decision: the probe's, or without it two steps at the first
        split (BSP), so that the noise has one pair to be measured by: one step's spread is speeds and
        noise at once, and a few-millisecond step under a CPU quota can be ten times another."""
        return 1 if self.probed or not self.synchronous else 2

    def observe_step(self, seconds: Sequence[float], steps: int = 1) -> list[int]:
        """BSP: every worker's compute time of one full step at the current split, ``steps`` steps after
        the last one measured. Returns the workers whose speed jumped."""
        times = [float(t) for t in seconds]
        if not self.warmed:
            self.warmed = True
            return []
        if self._first is not None:  # the second step at a new split: what the first one cost more
            # not after the run's first step (the probe's measurement and that step's: two), which
            # carries the run's one-off costs too: no measure of a later re-split's
            if self.model.measured > 2:
                self.costs = [*self.costs, max(self._first) - max(times)][-PRIORS.resplit_costs_kept:]
            self._first = None
        if self._moved is not None:  # the first step at a new split: evidence on k and the re-split's cost
            old, predicted = self._moved
            self._moved = None
            self._first = times
            observed = np.log(np.maximum(np.asarray(times), 1e-9))
            sd = np.sqrt(self.model.var + 2 * self.model.noise2)
            self.model.k_from_move(old, self.batch, predicted, observed, sd)
        changed, _ = self.model.update(self.batch, times, steps)
        self.watch = PRIORS.watch_steps if changed else max(self.watch - 1, 0)
        return changed

    def observe(self, worker: int, batch: int, seconds: float) -> bool:
        """ASP: one worker's compute time of a step at ``batch`` (ignored unless its current batch).

        A worker's second step at a new batch tells k as a BSP re-split does: its time there against
        the time its estimate predicted at the batch it left (the first step also carries the new
        shapes' one-off cost, which the second measures; without a common factor to profile out, a
        step of one worker's own is the evidence)."""
        if batch != self.batch[worker]:
            return False
        first = self._fresh.pop(worker, None)
        if first is not None and math.isinf(first):  # its first step at the new batch
            self._fresh[worker] = seconds
        elif first is not None:  # its second: what the first one cost more, and what the move says of k
            self.costs = [*self.costs, first - seconds][-PRIORS.resplit_costs_kept:]
            before = self._from.pop(worker, None)
            if before is not None:
                m = self.model
                sd = np.sqrt(m.var[worker:worker + 1] + 2 * m.noise2[worker:worker + 1])
                m.k_from_move([before[0]], [batch], np.array([before[1]]), np.log([max(seconds, 1e-9)]), sd,
                              [worker])
        return self.model.update_one(worker, batch, seconds)

    def estimates(self) -> tuple[list[float] | None, list[int]]:
        """Every worker's predicted compute time at its current batch (seconds), and the measurements
        behind the model."""
        if not self.model.measured:
            return None, [0] * self.workers
        return self._seconds(self.batch).tolist(), [self.model.measured] * self.workers

    def _seconds(self, batch: Sequence[int]) -> np.ndarray:
        return np.exp(self.model.predict_log(batch) + (self.model.scale or 0.0))

    # ------------------------------------------------------------------ decisions
    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        interval = self.config.interval
        return end_of_epoch if interval <= 0 else step_in_run % interval == 0

    def decide(self, cpu_shares: object = None, steps_left: int | None = None, cost: float | None = None
               ) -> list[int] | None:
        """The balanced split if moving to it pays (the module's rule), else None. ``cost``: the
        re-split's cost, if known (default: the measured one)."""
        self.at_stake = 0.0
        if self.model.measured < self._evidence:
            return self._hold("unmeasured")
        new = self._balanced()
        if new == self.batch:
            return self._hold("balanced")
        self.considered += 1
        rng = np.random.default_rng(self.considered)
        u, k = self.model.samples(PRIORS.draws, rng)
        scale = math.exp(self.model.scale or 0.0)
        per_sample = np.exp(u)
        slowest_now = (per_sample * (np.asarray(self.batch, float)[None, :] + k)).max(axis=1)

        def gain(split: list[int]) -> tuple[float, float]:
            slowest = (per_sample * (np.asarray(split, float)[None, :] + k)).max(axis=1)
            g = scale * (slowest_now - slowest)
            return float(g.mean()), float(g.std())

        mean, sd = gain(new)
        if mean <= 0:
            return self._hold("balanced")
        step = float(self._seconds(self.batch).max())
        if cost is not None:
            resplit = cost
        else:  # differences of two noisy steps and the prior: their median, never below zero
            resplit = max(statistics.median([*self.costs, *[PRIORS.cost_prior * step] * PRIORS.cost_prior_weight]), 0.0)
        horizon = 1.0 / self.config.hazard
        if steps_left is not None:
            horizon = max(min(horizon, steps_left), 1.0)
        z = self.config.confidence
        for stride in PRIORS.strides:  # the longest move that passes
            split = new if stride == 1.0 else self._partway(new, stride)
            if split == self.batch:
                continue
            m, d = (mean, sd) if stride == 1.0 else gain(split)
            if m - z * d > resplit / horizon:  # the bar is never below zero
                self.decision = {"gain_s": round(m, 6), "gain_sd_s": round(d, 6), "cost_s": round(resplit, 6),
                                 "horizon": round(horizon, 1), "stride": stride}
                return self._adopt(split)
        if mean - z * sd <= 0:
            self.at_stake = mean
            return self._hold("uncertain")
        return self._hold("cost")

    def _partway(self, new: list[int], part: float) -> list[int]:
        """The split ``part`` of the way from the current one to ``new``, in whole samples summing to B."""
        shares = [b + part * (n - b) for b, n in zip(self.batch, new, strict=True)]
        return policies.round_preserving_sum(shares, self.global_batch, self.bounds.min_batch, self.bounds.max_batch)

    def _hold(self, reason: str) -> None:
        self.holds[reason] = self.holds.get(reason, 0) + 1
        return None

    def _balanced(self) -> list[int]:
        """The water-filled split at the posterior mean, within the bounds and the trust region."""
        m = self.model
        lo = np.where(m.lo > 0, np.floor(m.lo / PRIORS.trust), self.bounds.min_batch)
        hi = np.where(m.hi > 0, np.ceil(m.hi * PRIORS.trust), self.global_batch)
        trusted = Bounds(self.bounds.min_batch, tuple(int(min(h, mx)) for h, mx in zip(hi, self.bounds.max_batch,
                                                                                      strict=True)))
        bounds = trusted if trusted.feasible(self.global_batch) else self.bounds
        times = self._seconds(self.batch).tolist()
        new = policies.balanced(self.batch, times, m.k.tolist(), self.global_batch, bounds)
        if min(lo) > self.bounds.min_batch:  # the lower side of the trust region: never below it
            floor = [max(int(x), self.bounds.min_batch) for x in lo]
            if sum(floor) <= self.global_batch and any(b < f for b, f in zip(new, floor, strict=True)):
                lifted = Bounds(self.bounds.min_batch, bounds.max_batch)
                new = [max(b, f) for b, f in zip(new, floor, strict=True)]
                new = policies.round_preserving_sum(new, self.global_batch, lifted.min_batch, lifted.max_batch)
        return new

    def _adopt(self, new: list[int]) -> list[int] | None:
        self.at_stake = 0.0
        if new == self.batch:
            return None
        predicted = self.model.predict_log(self.batch)
        self._moved = (list(self.batch), predicted)
        self._first = None
        if not self.synchronous:
            for i, (a, b) in enumerate(zip(self.batch, new, strict=True)):
                if a != b:
                    self._fresh[i] = math.inf
                    if self.model.lo[i] > 0:  # k is told against a batch it was measured at
                        self._from.setdefault(i, (a, float(predicted[i])))
        self.batch = list(new)
        return list(new)

    def set_bounds(self, bounds: Bounds) -> list[int] | None:
        """Adopt new bounds (memory-aware limits); re-split if the current batch breaks them."""
        self.bounds = bounds
        return None if bounds.admit(self.batch) else self._adopt(policies.split(self.batch, self.global_batch, bounds))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"policy": "dynamic", "batch": list(self.batch),
                "bounds": {"min_batch": self.bounds.min_batch, "max_batch": list(self.bounds.max_batch)},
                "model": self.model.state_dict(), "holds": dict(self.holds), "costs": list(self.costs),
                "considered": self.considered, "decision": self.decision, "at_stake": self.at_stake,
                "first": self._first,
                "watch": self.watch, "probed": self.probed, "warmed": self.warmed, "threads": list(self.threads),
                "cores": list(self.cores),
                "moved": None if self._moved is None else [self._moved[0], self._moved[1].tolist()],
                "fresh": {str(i): t for i, t in self._fresh.items()},
                "fresh_from": {str(i): [b, t] for i, (b, t) in self._from.items()}}

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        """Load ``d``; with ``keep`` (the saved workers that still run, in rank order) only theirs: the
        survivors' batches scaled up to the global batch, their speeds, noise and ranges, and k."""
        self.bounds = Bounds(d["bounds"]["min_batch"], tuple(d["bounds"]["max_batch"]))
        self.model = SpeedModel(len(d["batch"]), self.global_batch, drift=self.config.drift,
                                hazard=self.config.hazard, relative=self.synchronous)
        self.model.load_state_dict(d["model"])
        self.holds, self.costs = dict(d["holds"]), list(d["costs"])
        self.considered, self.decision = int(d["considered"]), d["decision"]
        self.at_stake = float(d.get("at_stake", 0.0))
        self.watch = int(d.get("watch", 0))
        self.probed, self.warmed = bool(d.get("probed", True)), bool(d.get("warmed", True))
        self.batch = list(d["batch"])
        self.threads = [float(t) for t in d.get("threads", [1.0] * len(self.batch))]
        self.cores = [float(c) for c in d.get("cores", [0.0] * len(self.batch))]
        moved = d.get("moved")
        self._first = d.get("first")
        self._moved = None if moved is None else (list(moved[0]), np.asarray(moved[1], float))
        self._fresh = {int(i): float(t) for i, t in (d.get("fresh") or {}).items()}
        self._from = {int(i): (int(b), float(t)) for i, (b, t) in (d.get("fresh_from") or {}).items()}
        if keep is not None and keep != list(range(len(d["batch"]))):
            self.bounds = dataclasses.replace(self.bounds, max_batch=tuple(self.bounds.max_batch[i] for i in keep))
            self.model.keep(keep)
            self.threads, self.cores = [self.threads[i] for i in keep], [self.cores[i] for i in keep]
            self.batch = policies.split([float(self.batch[i]) for i in keep], self.global_batch, self.bounds)
            self._first, self._moved, self._fresh, self._from = None, None, {}, {}
