"""Per-worker compute-time models fitted from step records: the one home of that fit.

The model, per worker ``i`` at level ``l``, for a step at local batch ``b``::

    t = c[i, l] * (b + k)      seconds

``c[i, l]`` is the worker's seconds per sample at that level (its speed is ``1 / c``) and ``k``, in
samples, is the workload's fixed cost per step (the forward/backward work that does not grow with the
batch), ONE value shared by every worker and level of the job: it is a property of the model and the
data, not of the CPU share. It is the model :func:`omnilearn.control.policies.balanced` balances.

The fit, from the step records of one run folder or of several runs of the same job (same workers,
levels and global batch; the policies of a compare or a bench group):

- **Steps kept**: positive batch and compute time, full steps only (a partial last step of an epoch
  is left out), and not the first step of a worker after its batch changed (it carries the change).
  ASP steps have no global batch: all of them count.
- **Robust to outliers**: per worker, level and batch size the median of the kept times; each median
  counts with the number of steps behind it.
- **k by least squares in log space** over those medians: for a given ``k`` each ``log c[i, l]`` is the
  weighted mean of ``log t - log(b + k)`` of its medians, which leaves the residual sum a function of
  ``k`` alone; it is minimised over ``[0, K_MAX_FACTOR * global batch]`` (a grid, then a golden
  section). Only a worker-level that ran at least two batch sizes at least MIN_SPREAD apart says
  anything about ``k`` (several policies of a group run different splits: that is what identifies it).
- **k's standard error** from the curvature of that residual sum, with the noise variance the larger
  of the residuals' own and the steps' scatter around their medians (robust, times pi/2 for a median).
- **When the data cannot identify k** (every worker-level ran one batch size, a uniform run alone):
  the prior ``k = 0``, time proportional to batch, and ``k_status`` says so. The fit at a bound says
  so too: ``lower bound`` (time grows at least in proportion to batch), ``upper bound`` (time does not
  grow with batch at all at the batches seen: a pure fixed cost).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank
from omnilearn.records import STEP, of_kind

MIN_SPREAD = 1.2
"""A worker-level's batches must span at least this ratio to inform k."""
K_MAX_FACTOR = 1000.0
"""k is searched up to this many global batches: at k = 1000 B a step's time varies by at most 0.1%
across every batch the job can run, indistinguishable from a pure fixed cost."""
GRID = 400
"""Points of the coarse search over k (log-spaced), before the golden section."""
K_PRIOR = 0.0
"""k when the data cannot identify it: time in proportion to batch."""

Cell = tuple[int, str]  # (rank, level)


def _robust_sigma(logs: list[float]) -> float:
    """1.4826 median absolute deviation: a standard deviation that outliers do not move."""
    if len(logs) < 3:
        return 0.0
    m = statistics.median(logs)
    return 1.4826 * statistics.median(abs(x - m) for x in logs)


@dataclass(frozen=True)
class WorkerModels:
    """``t = c[(rank, level)] * (b + k)`` seconds, with where it came from."""

    c: dict[Cell, float]
    k: float
    k_se: float | None
    """k's standard error (samples); None when k is not identified or at a bound."""
    k_status: str
    """``fitted``, ``not identified`` (k = K_PRIOR), ``lower bound`` or ``upper bound``."""
    sigma: dict[Cell, float]
    """Step-to-step noise of each worker-level: robust sd of log(t / median at its batch)."""
    steps: dict[Cell, int]
    """Kept steps behind each worker-level."""
    spread: dict[Cell, float] = field(default_factory=dict)
    """Each worker-level's scatter against the other workers of its steps: robust sd of its log time
    (over its median at its batch) less the step's median over the workers, scaled back by
    ``sqrt(n / (n - 1))``. A host that slows a whole step is left out: it slows every split alike,
    where a worker's own scatter makes a step wait for the slowest of the workers' draws."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """``{"run": name, "steps": kept steps}`` per run the fit used, in order."""
    mean_batch: float = 0.0
    """Mean local batch over the kept steps (B / n for a BSP job)."""

    def time(self, rank: int, level: str, batch: float) -> float:
        return self.c[(rank, level)] * (batch + self.k)

    def speed(self, rank: int, level: str, batch: float) -> float:
        """Samples per second of compute at local batch ``batch``: ``b / (c (b + k))``."""
        return batch / self.time(rank, level, batch)

    def provenance(self) -> dict[str, Any]:
        """What the models came from, for a report: the runs, their steps, k."""
        return {"runs": [dict(r) for r in self.runs], "steps": sum(r["steps"] for r in self.runs),
                "k": round(self.k, 3), "k_se": None if self.k_se is None else round(self.k_se, 3),
                "k_status": self.k_status}


def _kept(per_rank: Sequence[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Each rank's steps a fit may use (see the module's docstring)."""
    full = max((r["global_batch"] for s in per_rank for r in s if r.get("global_batch")), default=None)
    out = []
    for steps in per_rank:
        mine, previous = [], None
        for r in steps:
            if r.get("kind", "step") != "step":
                continue
            fresh = previous is not None and r["batch"] != previous
            previous = r["batch"]
            partial = full is not None and r.get("global_batch") is not None and r["global_batch"] != full
            if fresh or partial or r["batch"] <= 0 or r["compute_ms"] <= 0 or r.get("level") is None:
                continue
            mine.append(r)
        out.append(mine)
    return out


class _Points:
    """The fit's data: per worker-level and batch size, the median time and its number of steps."""

    def __init__(self, points: list[tuple[Cell, float, float, int]]) -> None:
        self.cells = sorted({p[0] for p in points})
        index = {cell: j for j, cell in enumerate(self.cells)}
        self.cell = np.array([index[p[0]] for p in points], dtype=np.int64)
        self.b = np.array([p[1] for p in points], dtype=float)
        self.logt = np.log(np.array([p[2] for p in points], dtype=float))
        self.n = np.array([p[3] for p in points], dtype=float)
        self.weight = np.bincount(self.cell, self.n, minlength=len(self.cells))

    def __len__(self) -> int:
        return len(self.b)


def _profile(points: _Points, k: float) -> tuple[float, dict[Cell, float]]:
    """Weighted residual sum in log space at ``k``, and each cell's best ``log c`` there."""
    y = points.logt - np.log(points.b + k)
    logc = np.bincount(points.cell, points.n * y, minlength=len(points.cells)) / points.weight
    rss = float(np.sum(points.n * (y - logc[points.cell]) ** 2))
    return rss, {cell: float(v) for cell, v in zip(points.cells, logc, strict=True)}


def _minimise(points: _Points, k_max: float, scale: float) -> float:
    """The k in [0, k_max] of least residual: the best of a log-spaced grid, then a golden section
    between its neighbours (the profile can have more than one dip; the grid picks the deepest)."""
    top = math.log1p(k_max / scale)
    grid = [scale * math.expm1(top * j / (GRID - 1)) for j in range(GRID)]
    values = [_profile(points, k)[0] for k in grid]
    j = min(range(GRID), key=values.__getitem__)
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, GRID - 1)]
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = _profile(points, x1)[0], _profile(points, x2)[0]
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = _profile(points, x1)[0]
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = _profile(points, x2)[0]
    best = (lo + hi) / 2
    return min((best, 0.0, k_max), key=lambda k: _profile(points, k)[0])


def _k_se(points: _Points, k: float, noise_var: float) -> float | None:
    """Standard error of k: ``sqrt(2 sigma^2 / S''(k))``, S the profiled residual sum."""
    h = max(1e-4 * k, 1e-4)
    if k - h < 0:
        return None
    s0, sp, sm = (_profile(points, x)[0] for x in (k, k + h, k - h))
    curvature = (sp - 2 * s0 + sm) / (h * h)
    return math.sqrt(2 * noise_var / curvature) if curvature > 0 else None


def fit_worker_models(runs: Sequence[Sequence[Sequence[dict[str, Any]]]], names: Sequence[str] | None = None
                      ) -> WorkerModels:
    """Fit :class:`WorkerModels` over ``runs``: each a list of per-rank step records of one run of the
    same job (rank ``i`` is the same worker in every run). ``names`` name the runs in the provenance."""
    names = list(names) if names is not None else [f"run{j + 1}" for j in range(len(runs))]
    assert len(names) == len(runs)
    by_batch: dict[Cell, dict[int, list[float]]] = {}
    used, batches_seen, full = [], [], 0
    for name, per_rank in zip(names, runs, strict=True):
        kept = _kept(per_rank)
        for rank, steps in enumerate(kept):
            for r in steps:
                by_batch.setdefault((rank, r["level"]), {}).setdefault(r["batch"], []).append(r["compute_ms"] / 1e3)
                batches_seen.append(r["batch"])
                full = max(full, r.get("global_batch") or 0)
        used.append({"run": name, "steps": min((len(s) for s in kept), default=0)})
    points = _Points([(cell, float(b), statistics.median(ts), len(ts))
                      for cell, bs in by_batch.items() for b, ts in bs.items()])
    logs = {cell: [math.log(t / statistics.median(ts)) for ts in bs.values() for t in ts]
            for cell, bs in by_batch.items()}
    informative = any(len(bs) >= 2 and max(bs) / min(bs) >= MIN_SPREAD for bs in by_batch.values())
    mean_batch = statistics.fmean(batches_seen) if batches_seen else 0.0
    k, k_se, status = K_PRIOR, None, "not identified"
    if informative:
        scale = max(statistics.median(batches_seen), 1.0)
        k_max = K_MAX_FACTOR * max(full, max(batches_seen))
        k = _minimise(points, k_max, scale)
        if k <= 1e-9 * scale:
            k, status = 0.0, "lower bound"
        elif k >= k_max * (1 - 1e-6):
            status = "upper bound"
        else:
            status = "fitted"
            rss = _profile(points, k)[0]
            dof = len(points) - len(by_batch) - 1
            # A median of n steps has about pi/2 sigma^2 / n variance: weighted by n, each point's unit
            # variance is pi/2 sigma^2, from the steps' scatter, or from the residuals when they say more.
            scatter = (math.pi / 2) * _robust_sigma([x for v in logs.values() for x in v]) ** 2
            k_se = _k_se(points, k, max(rss / dof if dof > 0 else 0.0, scatter))
    logc = _profile(points, k)[1] if points else {}
    return WorkerModels(c={cell: math.exp(v) for cell, v in sorted(logc.items())}, k=k, k_se=k_se, k_status=status,
                        sigma={cell: _robust_sigma(v) for cell, v in logs.items()},
                        steps={cell: sum(len(ts) for ts in bs.values()) for cell, bs in by_batch.items()},
                        spread=_spread(runs, {cell: {b: statistics.median(ts) for b, ts in bs.items()}
                                              for cell, bs in by_batch.items()}),
                        runs=used, mean_batch=mean_batch)


def _spread(runs: Sequence[Sequence[Sequence[dict[str, Any]]]], medians: dict[Cell, dict[int, float]]
            ) -> dict[Cell, float]:
    """:attr:`WorkerModels.spread` from each run's kept steps (``medians``: each worker-level's median
    time per batch): the steps every rank kept, matched by their step number. ASP runs, whose workers
    share no step (their records have no global batch), give none."""
    own: dict[Cell, list[float]] = {}
    for per_rank in runs:
        kept = _kept(per_rank)
        n = len(kept)
        if n < 2 or not any(r.get("global_batch") for steps in kept for r in steps):
            continue
        by_step = [{r["step"]: r for r in steps if "step" in r} for steps in kept]
        for step in set.intersection(*(set(d) for d in by_step)):
            row = [d[step] for d in by_step]
            logs = [math.log(r["compute_ms"] / 1e3 / medians[(i, r["level"])][r["batch"]]) for i, r in enumerate(row)]
            centre = statistics.median(logs)
            for i, (r, x) in enumerate(zip(row, logs, strict=True)):
                own.setdefault((i, r["level"]), []).append((x - centre) * math.sqrt(n / (n - 1)))
    return {cell: _robust_sigma(v) for cell, v in own.items()}


def run_steps(run: Path) -> tuple[JobSpec, list[list[dict[str, Any]]]]:
    """A finished run folder's job and each rank's step records (the workers' ranks: ASP's server left out)."""
    job = JobSpec.load(Path(run) / "job.json", out_dir=Path(run))
    slots = job.slots[1:] if job.config.mode == "asp" else job.slots
    return job, [of_kind(read_rank(run, s), STEP) for s in slots]


def same_job(a: JobSpec, b: JobSpec) -> bool:
    """Whether two runs are of the same job for a shared fit: workers, levels, global batch."""
    return (len(a.slots) == len(b.slots) and a.config.train.global_batch == b.config.train.global_batch
            and [a.plan.targets[s] for s in a.slots] == [b.plan.targets[s] for s in b.slots]
            and list(a.plan.levels) == list(b.plan.levels))


def fit_runs(runs: dict[str, Path]) -> tuple[WorkerModels, dict[str, tuple[JobSpec, list[list[dict[str, Any]]]]]]:
    """:func:`fit_worker_models` over the named run folders (of one job), and what was read from each."""
    read = {name: run_steps(path) for name, path in runs.items()}
    first = next(iter(read.values()))[0]
    odd = [name for name, (job, _) in read.items() if not same_job(first, job)]
    if odd:
        raise ValueError(f"runs {odd} are not of the same job as {next(iter(read))} (workers, levels, global batch)")
    return fit_worker_models([steps for _, steps in read.values()], list(read)), read
