"""The controller's stated model and its estimator.

**Model.** Worker i computes a step of ``b`` samples in ``t_i(b) = c_i (b + k)``: ``c_i`` is its cost per
sample (1 / its speed), ``k`` the workload's fixed cost of a step, in samples (optimizer update, framework
overhead), shared by the workers of one kind (threads, kind of core: :mod:`~.fixed_cost`). A busy host
slows every worker of a step alike: a step's times carry one common factor ``exp(m_t)``.

**Estimator.** State: ``u_i = log c_i`` for every worker (a mean, and its evidence counted in steps of
the worker's own noise: the variance is ``noise2 / count``; workers are estimated independently given
``k``) and ``k`` (a posterior on a grid). One step's observation of worker i is
``z_i = log t_i - log(b_i + k)``; its residual against the prediction, ``z_i - u_i``, holds the step's
common factor (a Student-t weighted mean over the workers, removed: BSP) and the worker's innovation.

- *Noise.* Measurement noise is Student-t (``Priors.dof`` degrees of freedom, fewer while the noise rests on
  few steps) with a per-worker scale: the median of how its innovation changes from step to step at
  one batch (each step's lesser change to the step before and the step after, taken a step late: one
  odd step is one outlier, not two, and a change of speed none, also where a move follows it), over
  ``Priors.noise_memory`` steps, pooled across workers until measured
  (``Priors.noise``). A step that waits a whole CFS period is down-weighted, not chased.
- *Drift and jumps.* Between steps ``u_i`` drifts (a random walk of variance ``drift**2`` a step) and,
  with probability ``hazard``, jumps (its variance grows by ``Priors.jump`` squared). Each step weighs the
  two hypotheses by the innovation's likelihood under each, and the likelier wins: a level change needs
  one step of evidence, an outlier moves the estimate a little. Only the changed worker's speed reopens.
  Where the step's common factor jumped (BSP: a change of the whole cluster, as a level change is), every
  worker's chance of a jump at that step is higher (:mod:`~.changes`). One step cannot always tell a
  slowdown from a one-off stall (a pause of the process, which only ever slows a step): where a jump taken
  slows a worker, the hypothesis not taken (no jump) is kept with its posterior probability until the
  worker's next step judges between the two, and a decision in between draws from both. A shift too small
  for one step shows in a windowed test over the last few innovations.
- *k.* Each kind's log-posterior on a grid (:class:`~.fixed_cost.FixedCost`): the
  start-up probe (every worker timed at two batch sizes) and every re-split (each worker's time
  before and after; BSP profiles out the step's common factor, ASP takes a moved worker's own steps)
  add their Student-t log-likelihood. Only moves of a worker's batch tell ``k``; steps at one split
  never do.

Everything here is plain numpy on a few arrays of length n: a thousand workers update in well under a
millisecond, and identical inputs give identical estimates on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilearn.control.changes import ClusterEvents, ShiftTest, jump_probability
from omnilearn.control.fixed_cost import FixedCost, distinct, kind_key, t_logpdf
from omnilearn.control.noise import NoiseScale
from omnilearn.control.priors import PRIORS


@dataclass
class SpeedModel:
    """The posterior over every worker's speed and the workload's fixed cost (see the module)."""

    workers: int
    global_batch: int
    drift: float = 0.005
    hazard: float = 0.01
    relative: bool = True
    """BSP: times of one step are compared with each other (the common factor removed); ASP: each
    worker's times stand alone."""
    u: np.ndarray = field(default=None)  # type: ignore[assignment]
    count: np.ndarray = field(default=None)  # type: ignore[assignment]
    """Each speed's evidence, in steps of its own noise: its variance is ``noise2 / count``, so it
    scales with the noise measured later, and an early guess of the noise never leaves it overconfident."""
    group: np.ndarray = field(default=None)  # type: ignore[assignment]
    """Each worker's kind of worker: its row of k's posterior (:class:`~omnilearn.control.fixed_cost.FixedCost`)."""
    lo: np.ndarray = field(default=None)  # type: ignore[assignment]
    hi: np.ndarray = field(default=None)  # type: ignore[assignment]
    scale: float | None = None
    """log of the common factor of recent steps: turns relative predictions into seconds."""
    measured: int = 0
    regimes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.workers
        self.noise = NoiseScale(n)  # each worker's noise, learned from its steps
        self.shift_test = ShiftTest(n)  # the test of a shift over each worker's last few steps
        if self.u is None:
            self.u = np.zeros(n)
            self.var = np.full(n, PRIORS.start_var)
            self.lo = np.zeros(n)
            self.hi = np.zeros(n)
        self.fixed = FixedCost(self.global_batch, n)
        if self.group is None:
            self.group = np.zeros(n, int)
        if not self.regimes:
            self.regimes = [0] * n
        # The hypothesis the last step did not take (no jump where it jumped), until the next step judges:
        # its speed, evidence (in steps of the noise, as ``count``) and posterior probability (0: none kept).
        self.alt_u = np.zeros(n)
        self.alt_count = np.ones(n)
        self.alt_p = np.zeros(n)
        self.taken_back = np.zeros(n, bool)  # the workers whose last step took back the change before it
        self.events = ClusterEvents(PRIORS.noise, PRIORS.noise_weight, PRIORS.noise_memory, PRIORS.jump)  # BSP: the step's common factor, step to step

    @property
    def noise2(self) -> np.ndarray:
        """Each worker's measurement noise (a log-time variance: :class:`~.noise.NoiseScale`)."""
        return self.noise.noise2

    @noise2.setter
    def noise2(self, value: np.ndarray) -> None:
        self.noise.noise2 = value

    # ------------------------------------------------------------------ k's posterior

    @property
    def var(self) -> np.ndarray:
        """Each speed's posterior variance (log)."""
        return self.noise2 / self.count

    @var.setter
    def var(self, value: np.ndarray) -> None:
        self.count = self.noise2 / np.maximum(value, 1e-12)

    @property
    def k_grid(self) -> np.ndarray:
        return self.fixed.grid

    def k_posterior(self) -> np.ndarray:
        """Each worker's posterior over k (its kind's): shape (n, grid)."""
        return self.fixed.posterior()[self.group]

    @property
    def k(self) -> np.ndarray:
        """Each worker's k (its kind's posterior mean)."""
        return self.fixed.mean()[self.group]

    @property
    def k_sd(self) -> np.ndarray:
        return self.fixed.sd()[self.group]

    def set_kinds(self, kinds: Sequence[Sequence[float] | None]) -> None:
        """Every worker's kind (its threads and kind of core); a worker whose kind changed takes its new
        kind's k, its prediction at the batch it was measured at kept (``u`` is defined against k)."""
        before = self.k
        self.group = np.asarray([self.fixed.row(kind_key(kind)) for kind in kinds], int)
        self._keep_predictions(before)

    def _keep_predictions(self, before: np.ndarray) -> None:
        """Keep every speed's prediction at the batch it was measured at (:meth:`measured_at`) across a
        change of k from ``before``."""
        ref = np.maximum(self.measured_at(), 1.0)
        moved = np.log(ref + before) - np.log(ref + self.k)
        self.u, self.alt_u = self.u + moved, self.alt_u + moved

    def _add_k_evidence(self, row: int, loglik: np.ndarray) -> None:
        """Add one piece of evidence on the k of the kind ``row`` (a log-likelihood over the grid)."""
        before = self.k
        self.fixed.add(row, loglik)
        self._keep_predictions(before)

    def k_from_probe(self, small: int, large: int, t_small: Sequence[float], t_large: Sequence[float]) -> None:
        """Evidence on each kind's k from every worker timed at two batch sizes (medians of its probe steps).

        Each worker's evidence is its log time ratio ``d``, on its kind's k. Workers of a kind with the
        same ``d`` give one reading, counted once: under a CPU quota the probe pools one kind's CPU
        seconds and the rate drops out of the ratio (:func:`~omnilearn.control.loop.probe_times`), so n
        pooled workers are one measurement, not n. Each reading's sd is the readings' spread about their
        kind's median and ``Priors.probe_shape``, the probe's small sizes read the line the job's sizes
        follow only that well."""
        d = np.log(np.asarray(t_large, float)) - np.log(np.asarray(t_small, float))
        rows = [self.group == g for g in np.unique(self.group)]
        about = np.concatenate([d[r] - np.median(d[r]) for r in rows])
        spread = 1.4826 * float(np.median(np.abs(about - np.median(about)))) if len(d) > 2 else 0.0
        # What the probe says of the noise of one time (d is the difference of two): a floor under
        # every worker's noise until its steps measure it.
        self.noise2 = np.maximum(self.noise2, (spread / math.sqrt(2)) ** 2)
        readings = [distinct(d[r]) for r in rows]
        about = np.concatenate([x - np.median(x) for x in readings])
        spread = 1.4826 * float(np.median(np.abs(about - np.median(about)))) if len(about) > 2 else 0.0
        sd = math.hypot(max(spread, math.sqrt(2) * PRIORS.noise / 2, PRIORS.noise_floor), PRIORS.probe_shape)
        pred = np.log((large + self.k_grid) / (small + self.k_grid))
        for r, x in zip(rows, readings, strict=True):
            self.fixed.add(int(self.group[r][0]), t_logpdf((x[:, None] - pred[None, :]) / sd).sum(axis=0))

    def k_from_move(self, old: Sequence[int], new: Sequence[int], predicted_old: np.ndarray,
                    observed: np.ndarray, sd: np.ndarray, which: Sequence[int] | None = None) -> None:
        """Evidence on k from one re-split: each worker's log time at ``new`` against the log time its
        estimate predicted at ``old`` (``sd``: the uncertainty of each difference), on the k of every kind
        with a worker moved, the other kinds' at their mean. BSP profiles out the common factor of the
        step (the median over workers, at each k). ``which``: the workers the arrays are of (ASP: one)."""
        b0, b1 = np.asarray(old, float), np.asarray(new, float)
        group, k = (self.group, self.k) if which is None else (self.group[list(which)], self.k[list(which)])
        moved = b0 != b1
        if not moved.any() or (self.relative and self.workers < 3):
            return  # two workers' relative times cannot tell k from a change of their ratio
        at_mean = (observed - predicted_old - np.log((b1 + k) / (b0 + k)))[:, None]
        ratio = np.log((b1[:, None] + self.k_grid[None, :]) / (b0[:, None] + self.k_grid[None, :]))
        evidence = []
        for g in np.unique(group[moved]):
            mine = (group == g)[:, None]
            resid = np.where(mine, (observed - predicted_old)[:, None] - ratio, at_mean)
            if self.relative:
                resid = resid - np.median(resid, axis=0, keepdims=True)
            evidence.append((int(g), t_logpdf(resid / sd[:, None]).sum(axis=0)))
        for g, loglik in evidence:  # each kind's evidence at the others' k before any moved
            self._add_k_evidence(g, loglik)

    # ------------------------------------------------------------------ speeds

    def predict_log(self, batch: Sequence[int], k: np.ndarray | None = None) -> np.ndarray:
        """Each worker's relative log time at ``batch`` under the posterior mean."""
        k = self.k if k is None else k
        return self.u + np.log(np.asarray(batch, float) + k)

    def speeds_from_probe(self, batch: int, times: Sequence[float], small: int, large: int) -> None:
        """Every worker's speed from its probe times at ``batch`` (relative to the others), and the
        batch range it was measured over."""
        t = np.log(np.asarray(times, float))
        z = t - np.log(batch + self.k)
        common = float(np.median(z)) if self.relative else 0.0
        self.u = z - common
        self.var = self.noise2.copy()
        self.lo[:] = small
        self.hi[:] = large
        self.scale = common
        self.measured += 1

    def update(self, batch: Sequence[int], times: Sequence[float], steps: int = 1) -> tuple[list[int], np.ndarray]:
        """One step's compute times at ``batch`` (every worker's: BSP), ``steps`` steps after the last
        one measured (the speeds drifted, and may have jumped, over each). Returns the workers whose speed
        jumped (posterior probability above one half) and the innovations (log)."""
        b = np.asarray(batch, float)
        live = b > 0
        self._extrapolate(b, live)
        z = np.log(np.maximum(np.asarray(times, float), 1e-9)) - np.log(np.maximum(b, 1e-9) + self.k)
        resid = z - self.u
        common = self._common(resid, live) if self.relative else 0.0
        share = 1.0 - 1.0 / max(int(live.sum()), 2) if self.relative else 1.0
        hazard = self._hazard(steps)
        event = self.events.observe(common, hazard) if self.relative else 0.0
        hazard = 1.0 - (1.0 - hazard) * (1.0 - PRIORS.event_share * event)
        changed = self._filter(np.where(live, resid - common, 0.0), live, b, share, steps, hazard=hazard)
        self.scale = common if self.scale is None else (1 - PRIORS.scale_weight) * self.scale + PRIORS.scale_weight * common
        self.lo = np.where(live & ((self.lo == 0) | (b < self.lo)), b, self.lo)
        self.hi = np.where(live & (b > self.hi), b, self.hi)
        self.measured += 1
        if self.relative:
            shift = float(self.u.mean())
            self.u -= shift
            self.alt_u -= shift
            self.scale += shift
            self.events.shift(shift)
        return changed, resid - common

    def _extrapolate(self, batch: np.ndarray, live: np.ndarray) -> None:
        """The predict step for a worker measured next at another batch than its speed was measured at
        (a re-split, or the first step after the probe): its prediction there is only as good as k is
        known, so its speed's variance grows by k's share of it, the posterior variance over k of
        ``log(b + k) - log(at + k)``. The step's time then moves the speed as far as that uncertainty
        allows, where a speed measured elsewhere would otherwise hold it back as if measured here."""
        at = self.measured_at()
        moved = live & (at > 0) & (batch != at)
        if not moved.any():
            return
        p = self.k_posterior()[moved]
        x = np.log(batch[moved, None] + self.k_grid[None, :]) - np.log(at[moved, None] + self.k_grid[None, :])
        mean = (x * p).sum(axis=1)
        var = self.var.copy()
        grown = np.maximum((x * x * p).sum(axis=1) - mean * mean, 0.0)
        var[moved] += grown
        self.var = var
        self.alt_count[moved] = self.noise2[moved] / (self.noise2[moved] / self.alt_count[moved] + grown)

    def _common(self, resid: np.ndarray, live: np.ndarray) -> float:
        """The step's common factor: a Student-t weighted mean of the live workers' residuals (a few
        reweighting passes from their median), so one changed worker does not move it. The passes start
        from the plain median, not one weighted by precision: the quietest worker would hold most of
        the weight, and a change of its own speed would read as every other worker's."""
        r = resid[live]
        if r.size == 1:
            return float(r[0])
        s = self.var[live] + self.noise2[live]
        m = float(np.median(r))
        for _ in range(PRIORS.reweight_passes):
            w = (PRIORS.dof + 1) / (PRIORS.dof + (r - m) ** 2 / s) / s
            m = float((w * r).sum() / w.sum())
        return m

    def update_one(self, worker: int, batch: int, seconds: float) -> bool:
        """ASP: one worker's compute time at ``batch``; True when its speed jumped."""
        live = np.zeros(self.workers, bool)
        live[worker] = True
        z = math.log(max(seconds, 1e-9)) - math.log(batch + self.k[worker])
        resid = np.zeros(self.workers)
        resid[worker] = z - self.u[worker]
        at = np.zeros(self.workers)
        at[worker] = batch
        self._extrapolate(at, live)
        changed = self._filter(resid, live, at, hazard=self._hazard(1))
        self.scale = 0.0
        self.lo[worker] = batch if self.lo[worker] == 0 else min(self.lo[worker], batch)
        self.hi[worker] = max(self.hi[worker], batch)
        self.measured += 1
        return bool(changed)

    def _hazard(self, steps: int) -> float:
        """The chance of a worker's jump in ``steps`` steps, at ``hazard`` a step."""
        return -math.expm1(steps * math.log1p(-self.hazard))

    def _filter(self, nu: np.ndarray, live: np.ndarray, batch: np.ndarray, share: float = 1.0, steps: int = 1, *,
                hazard: float) -> list[int]:
        """The Kalman step of every live worker on its innovation ``nu``, a mixture of 'no jump' (a
        Student-t weighted update) and 'jump' (the variance reopened), weighed by their likelihoods.
        ``share``: the part of a worker's noise left in its innovation once the step's common factor
        (estimated from the same n times) is removed, about ``1 - 1/n``; ``steps``: the steps since the
        worker's last measurement (its drift and its chance of a jump add up over each); ``hazard``: the
        chance of a jump since then, where the step's common factor says more (:mod:`~.changes`)."""
        before, kept_nu = self.u.copy(), nu
        taken_back = self._judge(nu, live, share, steps)
        nu = np.where(taken_back, nu + before - self.u, nu)
        prior = self.var + steps * self.drift ** 2
        s = (prior + self.noise2) * share
        e2 = nu * nu / s
        # Student-t tails: the measurement noise's (PRIORS.dof), heavier while the noise scale itself rests on
        # few steps (its own estimate's degrees of freedom).
        dof = self.noise.dof()
        w = (dof + 1) / (dof + e2)  # the Student-t's weight of this residual
        p_jump = jump_probability(nu, s, dof, hazard, PRIORS.jump)
        gain0 = prior / (prior + self.noise2 / w)
        u0, v0 = self.u + gain0 * nu, (1 - gain0) * prior
        jumped = prior + PRIORS.jump ** 2
        gain1 = jumped / (jumped + self.noise2)
        u1, v1 = self.u + gain1 * nu, (1 - gain1) * jumped
        # The more likely hypothesis wins (a mixture's variance would hold the ambiguity of one step
        # for many and delay the answer to a jump it already saw).
        jump = live & (p_jump >= PRIORS.jump_belief)
        self.u = np.where(live, np.where(jump, u1, u0), self.u)
        self.var = np.where(live, np.where(jump, v1, v0), prior)
        stall = jump & (nu > 0)  # a one-off pause only ever slows a step
        self.alt_u = np.where(stall, u0, self.alt_u)
        self.alt_count = np.where(stall, self.noise2 / np.maximum(v0, 1e-12), self.alt_count)
        self.alt_p = np.where(live, np.where(stall, 1.0 - p_jump, 0.0), self.alt_p)
        self.shift_test.restart(jump)
        shifted = self._shifts(nu, prior * share, share, live & ~jump)
        jump = jump | shifted | taken_back
        # Every step after a worker's first tells the noise, a jump taken back at the next step included:
        # one odd step is one outlier to a median, but a worker that "jumps" step after step (waits of
        # whole CFS periods on steps shorter than one) is noisy, and then no longer chased.
        self.noise.learn(kept_nu / math.sqrt(share), (self.u - before) / math.sqrt(share), live, batch, jump)
        changed = [int(i) for i in np.flatnonzero(jump)]
        for i in changed:
            self.regimes[i] += 1
        return changed

    def _judge(self, nu: np.ndarray, live: np.ndarray, share: float, steps: int) -> np.ndarray:
        """Where a worker's last step kept the hypothesis it did not take (:attr:`alt_p`: a slowdown
        taken for a jump that a one-off stall would also explain), this step judges between the two by their
        posterior odds: the kept one's prior probability and each one's Student-t likelihood of this
        step's innovation (``nu``, against the hypothesis taken). Where the kept one wins, the worker's
        speed and variance become its: a stall taken for a change is taken back. The kept hypotheses
        are then dropped; returns the workers taken back."""
        judged = live & (self.alt_p > 0)
        self.taken_back = np.zeros(self.workers, bool)
        if not judged.any():
            return judged
        dof = self.noise.dof()

        def loglik(e: np.ndarray, var: np.ndarray) -> np.ndarray:
            s = (var + steps * self.drift ** 2 + self.noise2) * share
            return -0.5 * (dof + 1) * np.log1p(e * e / (s * dof)) - 0.5 * np.log(s)

        p = np.where(judged, self.alt_p, 0.5)
        alt_var = self.noise2 / self.alt_count
        odds = np.log(p) - np.log1p(-p) + loglik(nu + self.u - self.alt_u, alt_var) - loglik(nu, self.var)
        back = judged & (odds > 0)
        self.u, self.var = np.where(back, self.alt_u, self.u), np.where(back, alt_var, self.var)
        self.alt_p = np.where(live, 0.0, self.alt_p)
        self.taken_back = back
        return back

    def _shifts(self, nu: np.ndarray, estimate: np.ndarray, share: float, live: np.ndarray) -> np.ndarray:
        """A change too small for one step, over the last few (:class:`~.changes.ShiftTest`): a worker
        shifted takes the shift and its variance. Returns the workers shifted."""
        shifted, delta, var = self.shift_test.test(nu, estimate, share, live, self.noise2, self.noise.dof(),
                                                   self.hazard)
        if shifted.any():
            self.u = np.where(shifted, self.u + delta, self.u)
            self.var = np.where(shifted, var + self.drift ** 2, self.var)
        return shifted

    # ------------------------------------------------------------------ samples and state

    def measured_at(self) -> np.ndarray:
        """The batch each worker's speed was last measured at: its last step's, or before any step the
        probe's larger size (0 where never measured)."""
        return np.where(self.noise.last_b > 0, self.noise.last_b, self.hi)

    def samples(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``count`` draws of (u, k) from the posterior: u and each worker's k, of shape (count, n).

        ``u`` and ``k`` are not independent: a speed was estimated from times at the batch it was
        measured at (:meth:`measured_at`) under the mean k, so a draw of k moves each u with it and
        leaves the prediction there where the times put it: k's uncertainty shows in how far a split
        extrapolates from it, the current split's own time included (after the probe, every worker's
        equal share is itself an extrapolation from the probe's sizes)."""
        # The noise scale is itself estimated: with m steps behind it, a speed's posterior is Student-t with
        # m + PRIORS.noise_dof degrees of freedom (normal-inverse-gamma), wide until the noise is measured.
        dof = (self.noise.count + PRIORS.noise_dof)[None, :]
        u = self.u[None, :] + np.sqrt(self.var)[None, :] * rng.standard_t(dof, (count, self.workers))
        k = self.fixed.draws(count, rng)[:, self.group]
        if (self.alt_p > 0).any():  # a hypothesis kept from the last step: a draw is of it with its probability
            spread = np.sqrt(self.noise2 / self.alt_count)[None, :]
            alt = self.alt_u[None, :] + spread * rng.standard_t(dof, (count, self.workers))
            u = np.where(rng.random((count, self.workers)) < self.alt_p[None, :], alt, u)
        at = np.maximum(self.measured_at(), 1.0)[None, :]
        u = u + np.log(at + self.k) - np.log(at + k)
        return u, k

    def keep(self, workers: Sequence[int]) -> None:
        """Only ``workers`` remain (the survivors of a lost one), in this order."""
        idx = np.asarray(workers, int)
        self.workers = len(idx)
        self.u, self.count = self.u[idx], self.count[idx]
        self.noise.keep(idx)
        self.shift_test.keep(idx)
        self.lo, self.hi = self.lo[idx], self.hi[idx]
        self.alt_u, self.alt_count, self.alt_p = self.alt_u[idx], self.alt_count[idx], self.alt_p[idx]
        self.taken_back = self.taken_back[idx]
        self.regimes = [self.regimes[i] for i in workers]
        self.group = self.group[idx]
        self.events.last = None  # the common factor of other workers: no step to compare the next with
        if self.relative:
            shift = self.u.mean()
            self.u -= shift
            self.alt_u -= shift

    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.tolist(), "count": self.count.tolist(), **self.noise.state_dict(),
                "k": self.fixed.state_dict(), "group": self.group.tolist(), "lo": self.lo.tolist(), "hi": self.hi.tolist(),
                "scale": self.scale, "measured": self.measured, "regimes": list(self.regimes),
                **self.shift_test.state_dict(), "alt_u": self.alt_u.tolist(),
                "alt_count": self.alt_count.tolist(), "alt_p": self.alt_p.tolist(), "events": self.events.state_dict()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.noise.load_state_dict(d)  # before count: a speed's evidence is in steps of its noise
        for key in ("u", "count", "lo", "hi"):
            setattr(self, key, np.asarray(d[key], float))
        self.shift_test.load_state_dict(d)
        n = len(self.u)
        self.alt_u = np.asarray(d.get("alt_u", [0.0] * n), float)  # a state without a kept hypothesis: none
        self.alt_count = np.asarray(d.get("alt_count", [1.0] * n), float)
        self.alt_p = np.asarray(d.get("alt_p", [0.0] * n), float)
        self.scale, self.measured, self.regimes = d["scale"], int(d["measured"]), list(d["regimes"])
        self.events.load_state_dict(d.get("events"))
        if "k" in d:
            self.fixed.load_state_dict(d["k"])
            self.group = np.asarray(d["group"], int)
        else:  # a state of one k for every worker
            self.fixed.log, self.group = np.atleast_2d(np.asarray(d["k_log"], float)), np.zeros(n, int)
