"""Tests of a change of speed: a shift too small for one step over a window of a worker's innovations
(:func:`window_shifts`, kept and weighed by :class:`ShiftTest`), and a change of the whole cluster read
from a step's common factor (:class:`ClusterEvents`): the change-test half of
:class:`~omnilearn.control.model.SpeedModel` (its others: the speeds, and the noise, :mod:`~.noise`).

A level change, a reallocation or a neighbour's job moves several workers' speeds at the same step,
and every worker's time with them: the step's common factor (BSP: the robust mean of the workers'
residuals, which the relative model otherwise removes) jumps by many times its own step-to-step noise.
That jump is evidence that the cluster changed at this step, and a worker's speed is then far likelier
to have moved than the once-in-``1 / hazard``-steps of a quiet run: the worker's own jump test weighs
its innovation against that likelier prior, and a level change is more often taken at its first step
than at its second (a worker's noise can leave one step of it ambiguous).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaln

from omnilearn.control.priors import PRIORS


def jump_probability(nu: np.ndarray, var: np.ndarray | float, dof: np.ndarray | float, hazard: float,
                     jump: float) -> np.ndarray:
    """The posterior probability that innovations ``nu`` of variance ``var`` (under Student-t noise of
    ``dof`` degrees of freedom) bring a jump (normal, sd ``jump``, on top of that variance) rather than
    none, at a prior chance ``hazard`` of one: a worker's speed (:class:`~.model.SpeedModel`) and the
    step's common factor (:class:`ClusterEvents`) are tested alike."""
    log_stay = (math.log1p(-hazard) - 0.5 * (dof + 1) * np.log1p(nu * nu / var / dof) - 0.5 * np.log(var * dof * math.pi)
                + gammaln((dof + 1) / 2) - gammaln(dof / 2))
    var_jump = var + jump ** 2
    log_jump = math.log(hazard) - 0.5 * nu * nu / var_jump - 0.5 * np.log(2 * math.pi * var_jump)
    return 1.0 / (1.0 + np.exp(np.clip(log_stay - log_jump, -50, 50)))


def window_shifts(nu: np.ndarray, s: np.ndarray, dof: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For innovations ``nu`` (rows: newest first; columns: workers) with variances ``s`` under
    Student-t noise of ``dof`` degrees of freedom (per worker): for every window of the newest m rows,
    the shift that best explains it (an M-estimate: a few reweighted means from the window's mean, or
    its median from three rows on), the log-likelihood ratio of that shift against none, and the
    shift's variance. Each returned array has one row per m. Every window at once: axes (window, row,
    worker), the rows past a window's end masked out."""
    rows, n = nu.shape
    m = np.arange(1, rows + 1)
    inside = (np.arange(rows)[None, :] < m[:, None])[:, :, None]
    x = np.broadcast_to(nu[None], (rows, rows, n))
    v = np.broadcast_to(s[None], (rows, rows, n))
    ordered = np.sort(np.where(inside, x, np.inf), axis=1)  # a window's rows first, in order
    middle = [np.take_along_axis(ordered, np.broadcast_to(i[:, None, None], (rows, 1, n)), 1)[:, 0]
              for i in ((m - 1) // 2, m // 2)]
    mean = np.where(inside, x, 0.0).sum(axis=1) / m[:, None]
    d = np.where((m < 3)[:, None], mean, 0.5 * (middle[0] + middle[1]))
    for _ in range(4):
        w = np.where(inside, (dof + 1) / (dof + (x - d[:, None]) ** 2 / v) / v, 0.0)
        d = (w * x).sum(axis=1) / w.sum(axis=1)
    e, e0 = (x - d[:, None]) ** 2 / (v * dof), x * x / (v * dof)
    lr = np.where(inside, 0.5 * (dof + 1) * (np.log1p(e0) - np.log1p(e)), 0.0).sum(axis=1)
    var = 1.0 / np.where(inside, 1.0 / v, 0.0).sum(axis=1)
    return d, lr, var


@dataclass
class ClusterEvents:
    """The step's common factor from step to step, and the posterior probability that a step brought a
    change of the cluster (see the module). Its noise is the median of its last ``memory`` step-to-step
    changes (as a normal sd), shrunk towards ``prior`` (``weight`` steps of it, as the workers' noise
    is); a change under the jump hypothesis is normal with sd ``jump``, a change under none
    Student-t (``Priors.dof``): a host's slow step is down-weighted, not
    taken for an event."""

    prior: float
    weight: float
    memory: int
    jump: float
    last: float | None = None
    """The common factor of the last step measured (log), in the estimate's current terms."""
    changes: list[float] = field(default_factory=list)
    """The last ``memory`` step-to-step changes of it not taken for an event (absolute, log)."""

    def noise(self) -> float:
        """The sd of one step-to-step change of the common factor (log)."""
        n = len(self.changes)
        own = (1.4826 * float(np.median(self.changes))) ** 2 if n else 0.0
        return math.sqrt((own * n + self.prior ** 2 * self.weight) / (n + self.weight))

    def observe(self, common: float, hazard: float) -> float:
        """This step's common factor (log) and the chance of a change in the steps since the last one
        measured: the posterior probability that the cluster changed (0 on the first step)."""
        last, self.last = self.last, common
        if last is None:
            return 0.0
        d = common - last
        p = float(jump_probability(np.float64(d), self.noise() ** 2, PRIORS.dof, hazard, self.jump))
        if p < 0.5:
            self.changes = [*self.changes, abs(d)][-self.memory:]
        return p

    def shift(self, delta: float) -> None:
        """The estimate's terms moved by ``delta`` (the speeds re-centred): the common factor with them."""
        if self.last is not None:
            self.last += delta

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last, "changes": list(self.changes)}

    def load_state_dict(self, d: dict[str, Any] | None) -> None:
        d = d or {}  # a state without it: no step before
        self.last, self.changes = d.get("last"), [float(x) for x in d.get("changes", [])]


class ShiftTest:
    """Each worker's last ``Priors.shift_steps`` innovations and the test of a shift over them.

    A change too small to show in one step shows in several: for each worker and each window of
        its last m innovations (m = 1..``Priors.shift_steps``), the shift that best explains them and its
        log-likelihood ratio against none, under the Student-t noise (:func:`~.changes.window_shifts`). The ratio
        becomes a Bayes factor as the jump test weighs a jump: the shift's prior is the jump's (normal,
        sd ``Priors.jump``), integrated over by Laplace's approximation (the window's shift variance against
        the prior's, the fitted shift's prior density), and a change at that step has prior odds
        ``hazard``. Where the posterior odds of a change favour it on a window of two steps or more, the
        worker's speed has moved: its estimate takes the shift of the window whose odds peak (the last
        step alone included: a change at the last step is its innovation, not a part of it averaged
        with the steps before), with that window's variance. Heavy tails bound what one outlier adds to
        a window's ratio: a single odd step is the jump test's to judge, never a shift. An innovation's
        variance is the estimate's then (``estimate``: its share of it) and the measurement noise as
        known now (``share`` of it left once the common factor is removed): a noise learned since an
        innovation was kept widens it, and a shift is never believed more precise than the noise allows.
        Returns the workers shifted.
    """

    def __init__(self, workers: int) -> None:
        n = self.workers = workers
        self.nu = np.zeros((PRIORS.shift_steps, n))  # each worker's recent innovations (oldest first)
        self.est = np.zeros((PRIORS.shift_steps, n))  # the estimate's share of each innovation's variance
        self.share = np.ones((PRIORS.shift_steps, n))  # the part of the noise left in each innovation
        self.count = np.zeros(n, int)  # how many of them are since the worker's last change

    def restart(self, workers: np.ndarray) -> None:
        """A change taken for ``workers`` (a mask): their windows start again."""
        self.count[workers] = 0

    def test(self, nu: np.ndarray, estimate: np.ndarray, share: float, live: np.ndarray, noise2: np.ndarray,
             dof: np.ndarray, hazard: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This step's innovations kept (``estimate``: the estimate's share of their variance; ``share``: the
        noise's part left in them; ``noise2``, ``dof``: the noise as known now); returns the workers shifted,
        each one's shift and its variance (of the window whose odds peak), its window started again."""
        h_nu, h_est, h_share, count = self.nu, self.est, self.share, self.count
        for h, new in ((h_nu, nu), (h_est, estimate), (h_share, share)):
            h[:-1, live] = h[1:, live]
            h[-1, live] = np.broadcast_to(new, live.shape)[live]
        count[live] = np.minimum(count[live] + 1, PRIORS.shift_steps)
        h_s = h_est + noise2[None, :] * h_share
        delta, lr, var = window_shifts(h_nu[::-1], h_s[::-1], dof.astype(float))  # rows: m = 1..
        m = np.arange(1, PRIORS.shift_steps + 1)[:, None]
        odds = (lr + math.log(hazard) + 0.5 * np.log(var / PRIORS.jump ** 2) - 0.5 * delta ** 2 / PRIORS.jump ** 2)
        odds = np.where(live & (count >= m), odds, -np.inf)
        shifted = (odds[1:].max(axis=0) > 0) & live
        best, cols = odds.argmax(axis=0), np.arange(self.workers)
        count[shifted] = 0
        return shifted, delta[best, cols], var[best, cols]

    def keep(self, idx: Sequence[int]) -> None:
        """Only the workers ``idx`` remain, in this order."""
        self.nu, self.est, self.share = self.nu[:, idx], self.est[:, idx], self.share[:, idx]
        self.count = self.count[idx]
        self.workers = len(idx)

    def state_dict(self) -> dict[str, Any]:
        return {"hist_nu": self.nu.tolist(), "hist_est": self.est.tolist(), "hist_share": self.share.tolist(),
                "hist_count": self.count.tolist()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.nu, self.est = np.asarray(d["hist_nu"], float), np.asarray(d["hist_est"], float)
        self.share, self.count = np.asarray(d["hist_share"], float), np.asarray(d["hist_count"], int)
        self.workers = self.count.size
