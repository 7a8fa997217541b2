"""The workload's fixed cost ``k`` of a step (in samples): the one home of the fit of ``t = c (b + k)``.

Worker ``i`` computes a step of ``b`` samples in ``t = c_i (b + k)`` seconds: ``c_i`` its seconds per
sample, ``k`` work a step does whatever its batch (the optimizer's update, the framework's own). On one
kind of worker ``k`` is the same for every worker, but it is not the same across kinds. A core with two
threads uses small batches less well than one thread does: the demo's ResNet18 step reads k = 3.5
samples on one thread and 13 on two, alone on the host, and 7-10 against 27.5 in the job's steps under
CPU quotas (``results/2026-11-28_2cpu_k-by-threads.md``). A kind is what a worker reports of itself: its
threads and its kind of core (:func:`~omnilearn.train.step.core_kind`), as the start-up probe pools them.

Every estimate of ``k`` takes ``c`` out of what the times say, leaving a function of ``k`` alone. At a
given ``k`` a worker's best ``log c`` is the (weighted) mean of ``log t - log(b + k)`` over its times
(:func:`profile_log_c`: the fit below, and the ASP controller's evidence); the BSP controller's evidence,
the log ratio of a worker's times at two batches, has ``c`` cancel. Two estimators are built on it:

- **The controller's posterior** (:class:`FixedCost`), for a run in progress: each kind's posterior is a
  log-density on one grid over ``[0, PRIORS.k_max_factor * B / n]`` (prior: ``Priors.k_prior``, small
  until measured: the controller must act before it measures); evidence is a Student-t log-likelihood
  over the grid, added to one kind's row. A kind seen for the first time starts from the prior.
- **The fit of a finished run's steps** (:func:`fit_fixed_cost`), for the report's ideal, the what-if
  and the simulator's replay: least squares in log space over the medians of each worker-level's times
  per batch size (each counted with its steps), the profile's residual sum minimised over
  ``[0, K_MAX_FACTOR * B]`` (a grid of :data:`GRID` points, then a golden section), its standard error
  from the sum's curvature, with a status. Only a worker-level that ran at least two batch sizes at least
  :data:`MIN_SPREAD` apart tells ``k``; where none did, ``k`` is :data:`K_PRIOR` (time in proportion to
  batch) and the status says so. The prior here is no exponential: a report states what the data could
  not tell rather than act on a guess. A kind of worker has its own ``k`` where the data tell every
  kind's (each kind's fit ``fitted``); else one ``k`` for the job's workers, and the fit says which
  (:class:`KModel`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnilearn.control.priors import PRIORS


def t_logpdf(e: np.ndarray) -> np.ndarray:
    """Student-t log density (up to a constant) of standardised residuals ``e``."""
    return -0.5 * (PRIORS.dof + 1) * np.log1p(e * e / PRIORS.dof)


def distinct(x: np.ndarray) -> np.ndarray:
    """The distinct values of ``x``, those within a rounding error of each other (1e-9) taken as one."""
    x = np.sort(x)
    return x[np.concatenate(([True], np.diff(x) > 1e-9 * np.maximum(np.abs(x[1:]), 1.0)))]


def kind_key(kind: Sequence[float] | None) -> tuple[float, ...]:
    """A worker's kind as a key: its threads and kind of core (``()``: not reported)."""
    return () if kind is None else tuple(float(x) for x in kind)


def profile_log_c(b: np.ndarray, log_t: np.ndarray, k: np.ndarray, weight: np.ndarray | None = None,
                  cell: np.ndarray | None = None, cells: int = 1) -> np.ndarray:
    """Each worker's ``log c`` at each ``k``, ``c`` profiled out: the mean of ``log t - log(b + k)`` over
    its times (``weight``: each time's weight; ``cell``: each time's worker, of ``cells``; None: one
    worker). Shape (cells, len(k))."""
    y = log_t[:, None] - np.log(b[:, None] + k[None, :])
    if cell is None:
        return (y.mean(axis=0) if weight is None else weight @ y / weight.sum())[None, :]
    mine = (cell[None, :] == np.arange(cells)[:, None]) * (1.0 if weight is None else weight[None, :])
    return mine @ y / mine.sum(axis=1, keepdims=True)


class FixedCost:
    """k's posterior for each kind of worker: ``log[g]`` over ``grid`` for the kind ``kinds[g]``."""

    def __init__(self, global_batch: int, workers: int) -> None:
        self.grid = PRIORS.k_max_factor * global_batch / workers * np.linspace(0.0, 1.0, PRIORS.k_points) ** 2
        # The prior: exponential with mean PRIORS.k_prior of a worker's equal share, as a mass per grid cell.
        prior = -self.grid / (PRIORS.k_prior * global_batch / workers) + np.log(np.gradient(self.grid))
        self.prior = prior - prior.max()
        self.kinds: list[tuple[float, ...]] = [()]
        self.log = self.prior[None, :].copy()
        self._memo: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def row(self, kind: Hashable) -> int:
        """The row of ``kind`` (a key of :func:`kind_key`), added with the prior when new; the first kind
        reported takes the row of the workers not reported yet, and what it learned."""
        if self.kinds == [()]:
            self.kinds = [kind]  # type: ignore[list-item]
        if kind not in self.kinds:
            self.kinds.append(kind)  # type: ignore[arg-type]
            self.log = np.vstack([self.log, self.prior])
        return self.kinds.index(kind)  # type: ignore[arg-type]

    def posterior(self) -> np.ndarray:
        """Each kind's posterior over the grid (rows sum to one)."""
        return self._moments()[0]

    def mean(self) -> np.ndarray:
        """Each kind's posterior mean of k."""
        return self._moments()[1]

    def sd(self) -> np.ndarray:
        p, mean = self._moments()[:2]
        return np.sqrt(np.maximum(p @ self.grid ** 2 - mean ** 2, 0.0))

    def _moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The posterior and its mean, computed once per ``log`` (every change assigns a new array)."""
        memo = self._memo
        if memo is None or memo[2] is not self.log:
            p = np.exp(self.log - self.log.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            memo = self._memo = (p, p @ self.grid, self.log)
        return memo

    def add(self, row: int, loglik: np.ndarray) -> None:
        """One piece of evidence on the kind ``row``: a log-likelihood over the grid."""
        log = self.log.copy()
        log[row] += loglik
        log[row] -= log[row].max()
        self.log = log

    def draws(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` draws of every kind's k: shape (count, kinds)."""
        p = self.posterior()
        return np.stack([rng.choice(self.grid, size=count, p=p[g]) for g in range(len(self.kinds))], axis=1)

    def state_dict(self) -> dict[str, Any]:
        return {"kinds": [list(k) for k in self.kinds], "log": self.log.tolist()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.kinds = [kind_key(k) for k in d["kinds"]]
        self.log = np.atleast_2d(np.asarray(d["log"], float))


# ---------------------------------------------------------------------- the fit of a finished run's steps
MIN_SPREAD = 1.2
"""A worker-level's batches must span at least this ratio to inform k."""
K_MAX_FACTOR = 1000.0
"""k is searched up to this many global batches: at k = 1000 B a step's time varies by at most 0.1%
across every batch the job can run, indistinguishable from a pure fixed cost."""
GRID = 400
"""Points of the coarse search over k (log-spaced), before the golden section."""
K_PRIOR = 0.0
"""k when the data cannot identify it: time in proportion to batch."""
ONE_K = "one k for the job's workers"
PER_KIND = "one k per kind of worker"


MEDIAN_EFFICIENCY = math.pi / 2
"""The variance of the median of ``n`` normal draws over ``σ² / n`` (large ``n``)."""


def robust_sigma(x: np.ndarray) -> float:
    """1.4826 median absolute deviation: a standard deviation that outliers do not move (0 under three)."""
    if len(x) < 3:
        return 0.0
    return 1.4826 * float(np.median(np.abs(x - np.median(x))))


@dataclass(frozen=True)
class Medians:
    """The fit's data: per worker-level (``cell``, an index below ``cells``) and batch size ``b``, the log
    of the median time and the ``n`` steps behind it; every step's log time over its median (``dev``, of
    the worker-level ``dev_cell``)."""

    cell: np.ndarray
    b: np.ndarray
    log_t: np.ndarray
    n: np.ndarray
    dev: np.ndarray
    dev_cell: np.ndarray
    cells: int

    def of(self, keep: Sequence[int]) -> Medians:
        """The data of the worker-levels ``keep``, numbered in that order."""
        index = np.full(self.cells, -1)
        index[list(keep)] = np.arange(len(keep))
        mine, steps = index[self.cell] >= 0, index[self.dev_cell] >= 0
        return Medians(index[self.cell[mine]], self.b[mine], self.log_t[mine], self.n[mine], self.dev[steps],
                       index[self.dev_cell[steps]], len(keep))

    @property
    def informative(self) -> bool:
        """Whether some worker-level ran two batch sizes at least :data:`MIN_SPREAD` apart."""
        lo = np.full(self.cells, np.inf)
        hi = np.zeros(self.cells)
        np.minimum.at(lo, self.cell, self.b)
        np.maximum.at(hi, self.cell, self.b)
        return bool((hi >= MIN_SPREAD * lo).any())

    def profile(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The weighted residual sum in log space at each ``k``, and each worker-level's ``log c`` there."""
        log_c = profile_log_c(self.b, self.log_t, k, self.n, self.cell, self.cells)
        resid = self.log_t[:, None] - np.log(self.b[:, None] + k[None, :]) - log_c[self.cell]
        return (self.n[:, None] * resid ** 2).sum(axis=0), log_c


@dataclass(frozen=True)
class KFit:
    """One ``k`` fitted: its standard error (None: not identified, or at a bound) and status: ``fitted``,
    ``not identified`` (``k = K_PRIOR``), ``lower bound`` (time grows at least in proportion to batch) or
    ``upper bound`` (time does not grow with batch at the batches seen: a pure fixed cost)."""

    k: float
    se: float | None
    status: str


def _rss(data: Medians, k: float) -> float:
    return float(data.profile(np.array([k]))[0][0])


def _minimise(data: Medians, k_max: float, scale: float) -> float:
    """The k in [0, k_max] of least residual: the best of a log-spaced grid, then a golden section
    between its neighbours (the profile can have more than one dip; the grid picks the deepest)."""
    grid = scale * np.expm1(math.log1p(k_max / scale) * np.arange(GRID) / (GRID - 1))
    j = int(np.argmin(data.profile(grid)[0]))
    lo, hi = float(grid[max(j - 1, 0)]), float(grid[min(j + 1, GRID - 1)])
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = _rss(data, x1), _rss(data, x2)
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = _rss(data, x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = _rss(data, x2)
    return min(((lo + hi) / 2, 0.0, k_max), key=lambda k: _rss(data, k))


def _k_se(data: Medians, k: float, noise_var: float) -> float | None:
    """Standard error of k: ``sqrt(2 sigma^2 / S''(k))``, S the profiled residual sum."""
    h = max(1e-4 * k, 1e-4)
    if k - h < 0:
        return None
    s0, sp, sm = data.profile(np.array([k, k + h, k - h]))[0]
    curvature = (sp - 2 * s0 + sm) / (h * h)
    return math.sqrt(2 * noise_var / curvature) if curvature > 0 else None


def fit_k(data: Medians, global_batch: float) -> KFit:
    """One ``k`` for every worker-level of ``data`` (see the module), searched up to
    ``K_MAX_FACTOR * max(global_batch, the largest batch)``. Its standard error takes as the noise
    variance the larger of the residuals' own and the steps' scatter around their medians (robust, times
    pi/2 for a median)."""
    if not data.informative:
        return KFit(K_PRIOR, None, "not identified")
    scale = max(float(np.median(np.repeat(data.b, data.n.astype(int)))), 1.0)
    k_max = K_MAX_FACTOR * max(global_batch, float(data.b.max()))
    k = _minimise(data, k_max, scale)
    if k <= 1e-9 * scale:
        return KFit(0.0, None, "lower bound")
    if k >= k_max * (1 - 1e-6):
        return KFit(k, None, "upper bound")
    dof = len(data.b) - data.cells - 1
    # A median of n steps has about pi/2 sigma^2 / n variance: weighted by n, each point's unit variance
    # is pi/2 sigma^2, from the steps' scatter, or from the residuals when they say more.
    scatter = MEDIAN_EFFICIENCY * robust_sigma(data.dev) ** 2
    return KFit(k, _k_se(data, k, max(_rss(data, k) / dof if dof > 0 else 0.0, scatter)), "fitted")


@dataclass(frozen=True)
class KModel:
    """``k`` fitted over a job's worker-levels: ``model`` (:data:`PER_KIND` or :data:`ONE_K`); ``why``, why
    one ``k`` where the workers are not all of one reported kind ("" otherwise); ``fits``, the job's one
    fit (key None) or each kind's; each worker-level's kind (``kind``: its key into ``fits``), its ``k`` and
    its ``log c`` at that ``k``."""

    model: str
    why: str
    fits: dict[Hashable, KFit]
    kind: list[Hashable]
    k: np.ndarray
    log_c: np.ndarray

    def mean(self, weight: np.ndarray) -> KFit:
        """The job's k: the mean of the worker-levels' k weighted by ``weight`` (their steps), its standard
        error that of independent kinds' fits; the one fit where there is one ``k``."""
        if self.model == ONE_K:
            return self.fits[None]
        kind = np.asarray([list(self.fits).index(g) for g in self.kind])
        share = np.bincount(kind, weight, minlength=len(self.fits)) / weight.sum()
        k = float(share @ [f.k for f in self.fits.values()])
        ses = [f.se for f in self.fits.values()]
        return KFit(k, None if None in ses else float(np.hypot.reduce(share * np.asarray(ses, float))), "fitted")


def fit_fixed_cost(data: Medians, kinds: Sequence[Hashable | None], global_batch: float,
                   name: Callable[[Hashable], str] = str) -> KModel:
    """``k`` over ``data``, whose worker-levels are of ``kinds`` (one each, sortable; None: not reported):
    one per kind where there are several and the data tell every kind's (:func:`fit_k` on each kind's
    worker-levels gives ``fitted``); else one for the job, ``why`` saying why (``name``: a kind in words)."""
    if None in kinds:
        told = any(x is not None for x in kinds)
        return _one_k(data, "not every worker reports its kind" if told else "the workers do not report their kinds",
                      global_batch)
    distinct = sorted(set(kinds))  # type: ignore[type-var]
    if len(distinct) < 2:
        return _one_k(data, "", global_batch)
    cells = {g: [i for i, x in enumerate(kinds) if x == g] for g in distinct}
    fits = {g: fit_k(data.of(cells[g]), global_batch) for g in distinct}
    untold = [f"{name(g)} ({fits[g].status})" for g in distinct if fits[g].status != "fitted"]
    if untold:
        return _one_k(data, f"the data do not tell the k of {', '.join(untold)}", global_batch)
    log_c = np.empty(data.cells)
    for g, mine in cells.items():
        log_c[mine] = data.of(mine).profile(np.array([fits[g].k]))[1][:, 0]
    return KModel(PER_KIND, "", fits, list(kinds), np.array([fits[g].k for g in kinds], float), log_c)


def _one_k(data: Medians, why: str, global_batch: float) -> KModel:
    return one_k_model(data, fit_k(data, global_batch), why)


def one_k_model(data: Medians, fit: KFit, why: str = "") -> KModel:
    """``fit``'s one ``k`` for every worker-level of ``data``, each one's ``log c`` at it."""
    return KModel(ONE_K, why, {None: fit}, [None] * data.cells, np.full(data.cells, fit.k),
                  data.profile(np.array([fit.k]))[1][:, 0])
