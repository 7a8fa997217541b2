"""``dynamic`` in ASP: the split that maximises the progress a second the model predicts.

ASP has no barrier: whatever the split, the workers process about the samples a second their
speeds allow. What the split changes is the updates the server sees, their batches and their
staleness, and so what they are worth (``docs/design/asp.md``). The model, every symbol measured:

- Worker ``i``'s step of ``b`` samples computes for ``t_i(b) = c_i (b + k)`` seconds; its cycle
  (pull, compute, push and the server's queue) lasts ``T_i(b) = t_i(b) + o_i``. It pushes
  ``1 / T_i`` times a second, ``b / T_i`` samples.
- Its push waits, between its pull and its application, for the pushes of the others in that
  time, each the step it takes, ``s_j = min(κ_j, ρ_b)`` units of the optimiser's time (``κ_j = b_j /
  b_ref``; :mod:`omnilearn.train.asp_update`): its staleness is ``τ_i = Σ_{j≠i} s_j N_ij``,
  ``N_ij`` the floor or the ceiling of ``x_ij = T_i / T_j`` at a random phase: mean ``λ_i = Σ_j s_j x_ij``, variance ``σ_i² = Σ_j s_j² f_ij (1 − f_ij)`` (``f``
  the fractional part of ``x``).
- The server's update weighs a gradient ``τ`` late by ``a(τ) = min(1, ρ / τ)`` (``ρ`` is
  ``asp.delay_tolerance``), so worker ``i``'s samples count ``E[a(τ_i)]`` (:func:`expected_factor`).
- The update moves the model by at most ``ρ`` units of the optimiser's step: a push of more than
  ``ρ b_ref`` samples counts ``ρ b_ref`` (the rest only averages its noise).

It maximises the effective samples a second

    P(b) = Σ_i  min(b_i, ρ b_ref) / T_i(b_i) · E[a(τ_i(b))]        subject to  Σ_i b_i ≤ B,  within the bounds,

over a family of splits (:meth:`AsyncController.candidates`), and moves when ``P`` gains more than
:data:`ASYNC_PRIORS`' ``min_gain``. ASP has no step that the batches make together: ``B``
(``train.global_batch``) sets ``b_ref = B / n`` (or ``asp.lr_reference_batch``) and the most samples the
workers hold at once, and the split may sum to less. A smaller push is fresher: its staleness is the
samples the others push while it computes, so pushes of a quarter of ``b_ref`` from four workers wait
for three quarters of a unit, where pushes of ``b_ref`` wait for three units; what it costs is the
throughput a step's fixed cost ``k`` and a cycle's overhead take from small batches, and the
server's time per update. Whatever the split, an update waits on average for ``n − 1`` updates
(one of each other worker); the split moves the spread, and how many samples those updates hold:
a fast worker's push waits for few samples whatever its rate, a slow worker's for many. Where the
cut is mild (``ρ`` near ``n``), evening the update rates keeps most samples at their full weight;
where it is harsh, the fast worker's fresh pushes are most of what counts, and evening the rates
would give it batches its step cannot take whole. Where every split is worth about the same (equal
speeds, or an infinite ``ρ``) the split is kept, and the reason counted (:attr:`AsyncController.holds`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilearn.control import policies
from omnilearn.control.asp_window import ScatterPool, Worker, median_sorted, padded, pooled_medians
from omnilearn.control.fixed_cost import FixedCost, profile_log_c, t_logpdf
from omnilearn.control.policies import Bounds
from omnilearn.control.priors import PRIORS


@dataclass(frozen=True)
class AsyncPriors:
    """What the ASP controller assumes before it measures, and the margins of its decisions."""

    window: int = 8
    """Measurements kept per worker (its times at its batches, its cycles' overheads)."""
    fresh: int = 2
    """Measurements every worker needs at its current batch before a decision (after a move, too)."""
    min_gain: float = 0.05
    """The least relative gain in effective samples a second a move must promise: the model's own
    estimates (speeds from a few noisy steps, staleness from a phase model) are not finer."""
    change: float = 0.3
    """A worker whose time per sample departs this far from its window's median twice running has
    changed speed: its older measurements are dropped."""
    change_sds: float = 3.0
    """Where the measured noise is larger, a departure counts only beyond this many of its sds (log): a
    fixed cut inside the noise reads changes of speed in it (``results/2026-12-06_2cpu_asp-shrunk-speeds.md``)."""
    overhead_floor: float = 1e-4
    """The smallest scatter of a cycle's overhead believed, in seconds: a timer's and a scheduler's."""
    trust: float = 4.0
    """A decision moves each worker's batch at most this factor up or down: a fixed cost ``k`` not yet
    measured (at one batch size per worker it cannot be) shows in the times the move brings."""
    utilisation: float = 0.8
    """The most of its time the server may spend applying updates: a split that needs more is not taken."""
    gammas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    """The powers of the speeds the candidate splits follow (0: equal batches; 1: equal compute times)."""
    totals: tuple[float, ...] = (1.0, 0.75, 0.5, 0.375, 0.25, 0.1875, 0.125)
    """The fractions of ``B`` the candidate splits sum to (a decision moves the sum at most ``trust`` times):
    smaller pushes are fresher, at the throughput small batches lose. Down to an eighth (two samples a worker
    at the ASP demo's 64 over 4): equal workers choose among equal pushes, not unequal ones' roundings."""
    fastest: tuple[float, ...] = (1.0, 0.75, 0.5, 0.375, 0.25, 0.1875, 0.125)
    """The fastest worker's batch, in units of the step's cap, of the candidates scaled from it (``b_i =
    b_fast (s_i / max s)^γ``, each in its bounds): where the slow workers' batches are at their floor,
    a split fitted to a sum spends it on them, and these keep the fast worker's share."""
    idle_below: tuple[float, ...] = (0.125, 0.25, 0.5)
    """The current split and the candidates scaled from the fastest worker's batch are also weighed with the
    workers slower than each of these fractions of the fastest worker's speed idle (batch 0: they push nothing). Each push waits for the others' pushes: where many slow
    workers' pushes, late and cut, add more to the fast workers' staleness than their own samples count, the
    split without them is worth more (``results/2026-12-06_2cpu_asp-idle-workers.md``)."""
    min_active: int = 2
    """The fewest workers a split leaves active. One worker alone is sequential training at the step's cap,
    a regime the step configured for asynchronous pushes was not measured in: the image job at HL8 with its
    three slow workers idle diverged on one seed of five (``results/2026-12-06_2cpu_asp-idle-workers.md``)."""
    probe_after: int = 8
    """Decisions a worker stays idle before one push at the smallest batch measures it again (its speed may have changed)."""


ASYNC_PRIORS = AsyncPriors()


_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def expected_factor(mean: np.ndarray, var: np.ndarray, rho: float) -> np.ndarray:
    """``E[min(1, ρ / τ)]`` for staleness ``τ`` of each mean and variance, ``τ`` taken as a normal
    (nine Gauss-Hermite nodes, cut at 0)."""
    if math.isinf(rho):
        return np.ones_like(mean)
    tau = np.maximum(mean[:, None] + np.sqrt(np.maximum(var, 0.0))[:, None] * _NODES[None, :], 0.0)
    return (np.minimum(1.0, rho / np.maximum(tau, 1e-12)) * _WEIGHTS[None, :]).sum(axis=1)


@dataclass
class AsyncController:
    """The ASP ``dynamic`` policy (see the module). ``delay_tolerance``: the update rule's ``ρ``."""

    global_batch: int
    bounds: Bounds
    delay_tolerance: float
    priors: AsyncPriors = ASYNC_PRIORS
    parameters: bool = False
    """``asp.push: parameters``: no rule weighs a push, and a push overwrites every update applied
    since its pull; the controller then evens the update rates (the paper's aim: every push extends the
    latest state), moving to equal cycles when their spread passes ``min_gain``."""
    batch: list[int] = field(default_factory=list)
    holds: dict[str, int] = field(default_factory=dict)
    """Decisions considered that kept the split, by reason: ``unmeasured`` (a worker has no time
    yet), ``no-gain`` (no candidate beats the split by ``min_gain``), ``server`` (the better splits
    need more updates a second than the server can apply)."""
    decision: dict[str, Any] | None = None
    """The last move: the effective samples a second before and after, and the staleness predicted."""
    server_s: float = 0.0
    """The server's seconds per update applied (measured by its owner)."""
    batch_tolerance: float | None = None
    """The rule's cap on one push's step, in units (``asp.batch_tolerance``; None: ``delay_tolerance``)."""
    reference_batch: float | None = None
    """``b_ref``, the samples of one unit of the optimiser's time (``asp.lr_reference_batch``; None:
    ``global_batch / workers``)."""

    def __post_init__(self) -> None:
        n = len(self.bounds.max_batch)
        if not self.batch:
            self.batch = policies.uniform(n, self.global_batch, self.bounds)
        self.workers = [Worker(self.priors.window) for _ in range(n)]
        self._pool = ScatterPool(n)
        self.b_ref = float(self.reference_batch or self.global_batch / n)
        self.fixed = FixedCost(max(round(self.b_ref * n), n), n)
        """``k``'s posterior over the run: every measurement told once (:meth:`_tell_k`)."""
        self.told = 0
        """Measurements that told ``k`` something (a worker's time beside its times at other batches)."""
        self.k = self.k_prior
        """The fixed cost per step in samples, as last fitted (:meth:`_fit_k`)."""
        self._wait = self.priors.fresh  # measurements every worker needs before the next decision
        self._lagging = 0  # the worker last found short of them
        self._noise_cut = 0.0
        """Beside the priors' ``change``, the departure (log) a change of speed must pass: ``change_sds``
        sds of the noise measured at the last decision."""

    policy = property(lambda self: "dynamic")
    knows_allocation = False  # measured times only
    bounded_by_memory = True
    times_quota = True
    """A worker's compute time counts the waits its CPU quota put into its last push and this pull."""

    # ------------------------------------------------------------------ measurements
    def push(self, worker: int, batch: int, compute_s: float, cycle_s: float) -> list[int] | None:
        """One push applied: its worker, batch, compute time and cycle (seconds since that worker's
        last push was applied; 0 for its first). Returns a new split, or None."""
        w = self.workers[worker]
        if batch == self.batch[worker] and batch > 0 and compute_s > 0:
            self._observe(w, batch, compute_s)
            if cycle_s > compute_s and not w.woken:
                w.overheads.append(cycle_s - compute_s)
            w.woken = False
        return None if self._short() else self.decide()

    def _short(self) -> bool:
        """Whether an active worker has fewer fresh measurements than the next decision waits for (the
        one found short last time asked first)."""
        j = self._lagging
        if j < len(self.batch) and self.batch[j] > 0 and self.workers[j].fresh < self._wait:
            return True
        for j, (w, b) in enumerate(zip(self.workers, self.batch, strict=True)):
            if b > 0 and w.fresh < self._wait:
                self._lagging = j
                return True
        return False

    def _observe(self, w: Worker, batch: int, compute_s: float) -> None:
        per = compute_s / (batch + self.k)
        if len(w.times) >= 3:
            mid = median_sorted(w.per_sample(self.k))
            far = abs(per / mid - 1) > self.priors.change and abs(math.log(per / mid)) > self._noise_cut
            w.strikes = w.strikes + 1 if far else 0
            if w.strikes >= 2:  # a new speed: the older measurements are of another worker
                w.restart()
                w.strikes = 0
                self._wait = self.priors.fresh  # decide again soon
        if w.strikes == 0:
            self._tell_k(w, batch, compute_s)
        w.record(batch, compute_s)
        w.fresh += 1

    def _tell_k(self, w: Worker, batch: int, compute_s: float) -> None:
        """Add what one time says of ``k`` to its posterior: the time's Student-t likelihood at each
        ``k`` of the grid, ``c`` profiled out from the worker's times before it (``log t = log c + log(b
        + k)``, :func:`~omnilearn.control.fixed_cost.profile_log_c`; the chain rule of the window's
        evidence, each time counted once). Only a window that holds another batch tells anything; a time
        that may be of a new speed (a strike) tells nothing."""
        if w.only_batch(batch):
            return
        grid = self.fixed.grid
        log_c = profile_log_c(np.asarray([b for b, _ in w.times], float),
                              np.log(np.asarray([t for _, t in w.times], float)), grid)[0]
        resid = math.log(compute_s) - np.log(batch + grid) - log_c
        sd = max(self._scatter(), PRIORS.noise_floor) * math.sqrt(1.0 + 1.0 / len(w.times))
        self.fixed.add(0, t_logpdf(resid / sd))
        self.told += 1

    # ------------------------------------------------------------------ estimates
    @property
    def k_prior(self) -> float:
        """``k`` before two batch sizes of a worker have told it: the BSP controller's prior mean
        (:attr:`~omnilearn.control.priors.Priors.k_prior` of the equal share ``b_ref``). Taken as 0, a
        smaller push would look free of the throughput a step's fixed cost takes from it."""
        return PRIORS.k_prior * self.b_ref

    def _fit_k(self) -> float:
        """The fixed cost per step in samples: the posterior mean of ``k`` on the BSP controller's grid
        and prior (:class:`~omnilearn.control.fixed_cost.FixedCost`), given every time told so far
        (:meth:`_tell_k`); the prior's mean until one has. The evidence is the run's, not the windows':
        a settled split leaves every window at one batch, which tells ``k`` nothing
        (``docs/design/asp.md``). A posterior, not a point estimate: a few noisy times at nearby batches
        would swing that from 0 (small pushes free) to the bound."""
        if not self.told:
            return self.k_prior
        return float(self.fixed.mean()[0])

    def _scatter(self) -> float:
        """The sd of a log compute time about its worker's median at the same batch (robust, pooled over
        the windows); the prior's measurement noise where no batch has three times yet."""
        about = self._pool.median(self.workers)
        return PRIORS.noise if about is None else 1.4826 * about

    def estimates(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Every worker's seconds per sample ``c_i`` and cycle overhead ``o_i``; None until every
        worker has a measurement. Each is the median of its window, shrunk toward the others' by the
        noise of that median (:func:`pooled_medians`): speeds and overheads that differ by their noise
        alone are taken as equal, or the candidates scaled from them, and the split of equal cycles,
        would follow the noise. A worker with no overhead measured yet takes the others'."""
        if any(not w.times for w in self.workers):
            return None
        k = self.k
        width = self.priors.window
        log_c, within = pooled_medians(np.log(padded([[t / (b + k) for b, t in w.times] for w in self.workers], width)),
                                       PRIORS.noise ** 2, PRIORS.noise_floor ** 2)
        self._noise_cut = self.priors.change_sds * math.sqrt(within)
        o, _ = pooled_medians(padded([list(w.overheads) for w in self.workers], width), 0.0,
                              self.priors.overhead_floor ** 2)
        return np.exp(log_c), o

    def worth(self, splits: np.ndarray, c: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each row of ``splits`` (candidates x workers; a batch of 0: an idle worker): ``P`` (effective
        samples a second), each worker's predicted mean staleness, and the server's predicted share of time busy."""
        cycle = c * (splits + self.k) + o  # (C, n)
        moved = np.minimum(splits, self._cap_units * self.b_ref)  # the step's cap
        kappa = moved / self.b_ref  # each worker's step, in units: what its push adds to the others' τ
        lam = np.maximum(cycle * (kappa / cycle).sum(axis=1, keepdims=True) - kappa, 0.0)  # Σ_{j≠i} κ_j T_i / T_j
        x = cycle[:, :, None] / cycle[:, None, :]
        f = np.subtract(x, np.floor(x), out=x)  # the fractional part, 0 on the diagonal (x_ii = 1)
        f *= 1.0 - f
        var = np.matmul(f, (kappa * kappa)[:, :, None])[:, :, 0]
        rate = np.where(splits > 0, 1.0 / cycle, 0.0)  # an idle worker pushes nothing
        a = expected_factor(lam.ravel(), var.ravel(), self.delay_tolerance).reshape(lam.shape)
        return (moved * rate * a).sum(axis=1), lam, rate.sum(axis=1) * self.server_s

    def candidates(self, c: np.ndarray, o: np.ndarray) -> np.ndarray:
        """The splits a decision weighs (rows x workers): the current one; and for every sum of the priors' ``totals``
        (within the bounds and the trust region), equal cycles (every worker's pull, compute and push as
        long as the others': equal update rates) and the ways a quarter, half and three quarters to
        them from the current split's shape, and ``b_i ∝ s_i^γ`` for each of the priors' powers (``s_i =
        1 / c_i``, the speeds): a faster worker never gets less than a slower one. Every one but the
        current split is cut to the step's cap. The current split and those scaled from the fastest worker's
        batch are also weighed with the slowest workers idle (:meth:`_idle_masks`); a worker idle now is woken
        by every candidate that gives it a batch. No candidate sums past ``B`` or leaves fewer than ``min_active`` active."""
        speed = 1.0 / c
        now = self._anchor()
        sums = np.asarray(self._totals(), float)[:, None, None]  # (T, 1, 1)
        shape = now * (sums / now.sum())
        equal = self._equal_cycles(c, o, sums)
        towards = shape + np.asarray([0.25, 0.5, 0.75, 1.0])[:, None] * (equal - shape)  # (T, 4, n)
        powers = np.broadcast_to(np.stack([speed ** g for g in self.priors.gammas]), (len(sums), len(self.priors.gammas), len(c)))
        weights = np.concatenate([towards, powers], axis=1)
        fits = self._fit(weights.reshape(-1, len(c)), np.repeat(sums.ravel(), weights.shape[1]))
        fastest = self._capped(self._from_fastest(speed))
        rows = np.concatenate([self._capped(np.asarray([self.batch, *fits])), fastest])
        # the slowest workers idle, the others' batches the current ones or scaled from the fastest's
        idle = [np.where(mask[None, :], 0, np.concatenate([[self.batch], fastest])) for mask in self._idle_masks(speed)]
        rows = np.concatenate([rows, *idle])  # below: the workers idle now count against min_active too
        keep = (rows.sum(axis=1) <= self.global_batch) & ((rows > 0).sum(axis=1) >= min(self.priors.min_active, len(c)))
        return np.concatenate([[self.batch], rows[keep]])

    def _idle_masks(self, speed: np.ndarray) -> list[np.ndarray]:
        """The workers a candidate may idle: for each ``idle_below``, those slower than that share of the fastest's
        speed (each set once, leaving at least ``min_active``); with those idle now, :meth:`candidates` checks."""
        out: list[np.ndarray] = []
        for q in self.priors.idle_below:
            mask = speed < q * speed.max()
            if mask.any() and (~mask).sum() >= self.priors.min_active and not any((mask == m).all() for m in out):
                out.append(mask)
        return out

    def _anchor(self) -> np.ndarray:
        """The current split, each idle worker at its batch before it was idled: where the trust region and shapes start."""
        return np.asarray([b if b > 0 else max(w.last_batch, self.bounds.min_batch)
                           for b, w in zip(self.batch, self.workers, strict=True)], float)

    def _from_fastest(self, speed: np.ndarray) -> np.ndarray:
        """The candidates scaled from the fastest worker's batch (:attr:`AsyncPriors.fastest`), each batch
        within its bounds and the trust region, in whole samples."""
        fastest = [f * self._cap_units * self.b_ref for f in self.priors.fastest]
        lo, hi = self._trust_bounds()
        return np.clip(np.rint(policies.from_fastest(speed, fastest, self.priors.gammas)), lo, hi)

    @property
    def _cap_units(self) -> float:
        """The step's cap on one push, in units (``ρ_b``: the batch tolerance, or the delay tolerance)."""
        return self.delay_tolerance if self.batch_tolerance is None else self.batch_tolerance

    def _capped(self, splits: np.ndarray) -> np.ndarray:
        """``splits`` (rows x workers) with every batch cut to the step's cap (``ρ_b b_ref``, within the
        bounds): the samples beyond it move the model no farther, and cost their worker time."""
        return np.minimum(splits, max(self.bounds.min_batch, math.ceil(self._cap_units * self.b_ref)))

    def _trust_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each worker's least and most batch of a move: a factor ``trust`` of its batch (an idle worker's:
        its batch before), within its bounds."""
        now = self._anchor()
        lo = np.maximum(np.floor(now / self.priors.trust), float(self.bounds.min_batch))
        hi = np.minimum(np.ceil(now * self.priors.trust), np.asarray(self.bounds.max_batch, float))
        return lo, hi

    def _totals(self) -> list[int]:
        """The sums a decision's splits may have: the priors' fractions of ``B``, within the bounds and
        a factor ``trust`` of the current sum."""
        now, n = float(self._anchor().sum()), len(self.batch)
        lo = max(n * self.bounds.min_batch, math.ceil(now / self.priors.trust))
        hi = min(self.global_batch, sum(self.bounds.max_batch), math.floor(now * self.priors.trust))
        return sorted({min(max(round(f * self.global_batch), lo), hi) for f in self.priors.totals}, reverse=True)

    def _equal_cycles(self, c: np.ndarray, o: np.ndarray, total: float | np.ndarray) -> np.ndarray:
        """The (fractional) split whose cycles ``c_i (b_i + k) + o_i`` are all equal, ``Σ b_i = total`` (an
        array of totals: a split along its last axis for each)."""
        k = self.k
        cycle = (total + k * len(c) + float((o / c).sum())) / float((1.0 / c).sum())
        return np.maximum((cycle - o) / c - k, 0.0)

    def _fit(self, weights: np.ndarray, totals: np.ndarray) -> np.ndarray:
        """For each row of ``weights`` (rows x workers), the split of its total in proportion to it
        within the bounds and the trust region (the bounds alone where the region cannot hold the
        total), in whole samples."""
        floor = float(self.bounds.min_batch)
        most = np.asarray(self.bounds.max_batch, float)
        lo, hi = self._trust_bounds()
        outside = (lo.sum() > totals) | (hi.sum() < totals)
        lo = np.where(outside[:, None], floor, lo[None, :])
        hi = np.where(outside[:, None], most[None, :], hi[None, :])
        shares = policies.bounded_shares_rows(weights, totals, lo, hi)
        return policies.round_rows(shares, totals, self.bounds.min_batch, hi)

    # ------------------------------------------------------------------ decisions
    def decide(self) -> list[int] | None:
        """The best candidate if it gains more than ``min_gain`` (see the module), else None."""
        for w in self.workers:
            w.fresh = 0
        self.k = self._fit_k()
        found = self.estimates()
        if found is None:
            return self._hold("unmeasured")
        c, o = found
        if self.parameters:
            return self._even_rates(c, o)
        probe = self._due_probes()
        if probe:
            self.decision = {"probe": probe, "k": round(self.k, 3)}
            return self._adopt([self.bounds.min_batch if i in probe else b for i, b in enumerate(self.batch)])
        splits = policies.unique_rows(self.candidates(c, o).astype(float))
        worth, lam, busy = self.worth(splits, c, o)
        now = float(worth[(splits == np.asarray(self.batch, float)).all(axis=1)][0])  # the current split's row
        bar = now * (1 + self.priors.min_gain)
        allowed = busy <= self.priors.utilisation
        if not (allowed & (worth > bar)).any():
            return self._hold("server" if (worth > bar).any() else "no-gain")
        best = int(np.argmax(np.where(allowed, worth, -np.inf)))
        self.decision = {"worth": round(now, 4), "worth_new": round(float(worth[best]), 4), "k": round(self.k, 3),
                         "staleness_predicted": [round(float(x), 2) for x in lam[best]]}
        return self._adopt([int(b) for b in splits[best]])

    def _due_probes(self) -> list[int]:
        """The idle workers that have been idle for the priors' ``probe_after`` decisions (this one counted):
        each pushes once at the smallest batch, and the next decision weighs it again on that time."""
        idle = [(i, w) for i, (b, w) in enumerate(zip(self.batch, self.workers, strict=True)) if b == 0]
        for _, w in idle:
            w.idle_for += 1
        return [i for i, w in idle if w.idle_for >= self.priors.probe_after]

    def _even_rates(self, c: np.ndarray, o: np.ndarray) -> list[int] | None:
        """Parameter pushes: equal cycles, when the cycles' spread (max / min) passes ``1 + min_gain``."""
        cycle = c * (np.asarray(self.batch, float) + self.k) + o
        if cycle.max() / cycle.min() <= 1 + self.priors.min_gain:
            return self._hold("no-gain")
        total = sum(self.batch)
        new = self._fit(self._equal_cycles(c, o, total)[None, :], np.asarray([float(total)]))[0].tolist()
        if new == self.batch:
            return self._hold("no-gain")
        self.decision = {"spread": round(float(cycle.max() / cycle.min()), 4), "k": round(self.k, 3)}
        return self._adopt(new)

    def _hold(self, reason: str) -> None:
        """Keep the split; the next decision waits for twice the measurements (up to the window)."""
        self.holds[reason] = self.holds.get(reason, 0) + 1
        self._wait = min(2 * self._wait, self.priors.window)

    def _adopt(self, new: list[int]) -> list[int]:
        for w, old, b in zip(self.workers, self.batch, new, strict=True):
            if old > 0 and b == 0:
                w.last_batch, w.idle_for = old, 0
            w.woken = w.woken or (old == 0 and b > 0)
        self.batch = list(new)
        self._wait = self.priors.fresh
        return list(new)

    def set_bounds(self, bounds: Bounds) -> list[int] | None:
        """Adopt new bounds (memory); re-split if an active worker's batch breaks them (every worker then
        takes a share: the next decision may idle some again)."""
        self.bounds = bounds
        if bounds.admit([b if b > 0 else bounds.min_batch for b in self.batch]):
            return None
        total = min(sum(self.batch), sum(bounds.max_batch))
        return self._adopt(policies.split(list(self._anchor()), total, bounds))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"policy": "dynamic", "asp": True, "batch": list(self.batch), "holds": dict(self.holds),
                "bounds": {"min_batch": self.bounds.min_batch, "max_batch": list(self.bounds.max_batch)},
                "decision": self.decision, "server_s": self.server_s,
                "workers": [{"times": [list(t) for t in w.times], "overheads": list(w.overheads),
                             "idle_for": w.idle_for, "last_batch": w.last_batch} for w in self.workers],
                "fixed_cost": {"grid": self.fixed.grid.tolist(), "log": self.fixed.log[0].tolist(), "told": self.told}}

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        """Load ``d``; with ``keep`` (the saved workers that still run) only theirs, the split scaled
        up to the saved split's sum."""
        keep = keep if keep is not None else list(range(len(d["batch"])))
        bounds = d["bounds"]
        self.bounds = Bounds(bounds["min_batch"], tuple(bounds["max_batch"][i] for i in keep))
        self.holds, self.decision = dict(d["holds"]), d["decision"]
        self.server_s = float(d.get("server_s", 0.0))
        if "fixed_cost" in d:  # a state saved before k's posterior was kept starts from its prior
            self._load_k(d["fixed_cost"])
        self.batch = self._resplit([int(d["batch"][i]) for i in keep], sum(int(b) for b in d["batch"]))
        self.workers, self._pool = [], ScatterPool(len(keep))
        for i in keep:
            saved = d["workers"][i]
            w = Worker(self.priors.window)
            for b, t in saved["times"]:
                w.record(int(b), float(t))
            w.overheads.extend(float(x) for x in saved["overheads"])
            w.idle_for, w.last_batch = int(saved.get("idle_for", 0)), int(saved.get("last_batch", 0))
            w.woken = int(d["batch"][i]) == 0 and self.batch[len(self.workers)] > 0
            self.workers.append(w)

    def _resplit(self, saved: list[int], total: int) -> list[int]:
        """``saved``'s active workers' split scaled to ``total`` within the bounds, its idle workers kept idle
        (every worker active where fewer than ``min_active`` of ``saved`` are: survivors of a lost worker)."""
        active = [j for j, b in enumerate(saved) if b > 0]
        active = active if len(active) >= min(self.priors.min_active, len(saved)) else list(range(len(saved)))
        bounds = Bounds(self.bounds.min_batch, tuple(self.bounds.max_batch[j] for j in active))
        share = policies.split([float(saved[j]) or 1.0 for j in active], min(total, sum(bounds.max_batch)), bounds)
        out = [0] * len(saved)
        for j, b in zip(active, share, strict=True):
            out[j] = b
        return out

    def _load_k(self, saved: dict[str, Any]) -> None:
        """``k``'s saved posterior, read onto this controller's grid (survivors have another ``b_ref``,
        and so another grid; ``k`` itself, in samples, is the same)."""
        log = np.interp(self.fixed.grid, np.asarray(saved["grid"], float), np.asarray(saved["log"], float))
        self.fixed.log = (log - log.max())[None, :]
        self.told = int(saved["told"])
        self.k = self._fit_k()


@dataclass
class AsyncLoop:
    """Drives an :class:`AsyncController` for its owner (the parameter server): every push, timed, and
    the ``batch_change`` record of each move it takes (reason ``progress``), through ``write``."""

    controller: AsyncController
    write: Any
    overhead_s: float = 0.0
    calls: int = 0

    def push(self, index: int, batch: int, compute_s: float, cycle_s: float, **where: Any) -> list[int] | None:
        """Worker ``index``'s push (see :meth:`AsyncController.push`); ``where``: the record's fields."""
        t0 = time.perf_counter()
        old = list(self.controller.batch)
        new = self.controller.push(index, batch, compute_s, cycle_s)
        self.overhead_s += time.perf_counter() - t0
        self.calls += 1
        if new is not None:
            self.write("batch_change", **where, old=old, batch=list(new), reason="progress",
                       **(self.controller.decision or {}))
        return new

    def summary(self) -> dict[str, Any]:
        """What the end record says of the controller: its cost and the decisions it held."""
        holds = dict(self.controller.holds)
        return {"controller_overhead_ms": round(1e3 * self.overhead_s / max(self.calls, 1), 4),
                "controller_steps_measured": self.calls, "holds": {"count": sum(holds.values()), "reasons": holds}}
