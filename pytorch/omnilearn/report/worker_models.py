"""Per-worker compute-time models fitted from step records, for the report's ideal, the what-if and
the simulator's replay.

The model, per worker ``i`` at level ``l``, for a step at local batch ``b``::

    t = c[i, l] * (b + k)      seconds

``c[i, l]`` is the worker's seconds per sample at that level (its speed is ``1 / c``) and ``k``, in
samples, is the workload's fixed cost per step (the forward/backward work that does not grow with the
batch). ``k`` is a property of the model, the data and the kind of worker, not of the CPU share: the
workers of one kind share it (:mod:`omnilearn.control.fixed_cost`, which fits it for the controller and
here). It is the model :func:`omnilearn.control.policies.balanced` balances.

This module reads the step records of one run folder or of several runs of the same job (same workers,
levels and global batch; the policies of a compare or a bench group) into the fit's data:

- **Steps kept**: positive batch and compute time, full steps only (a partial last step of an epoch
  is left out), and not the first step of a worker after its batch changed (it carries the change).
  ASP steps have no global batch: all of them count.
- **Robust to outliers**: per worker, level and batch size the median of the kept times; each median
  counts with the number of steps behind it.
- **Kinds of worker**: a worker-level's kind is the ``threads`` its steps report. The step records do not
  carry the kind of core: within one job the workers share a host's, or the report takes workers on
  different cores with as many threads as one kind.

The fit (:func:`~omnilearn.control.fixed_cost.fit_fixed_cost`) gives one ``k`` per kind where the
workers are of several kinds and the data tell every kind's, else one ``k`` for the job's workers; the
models say which (``k_model``, ``k_why``), and each worker-level's ``k`` (``k_cell``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnilearn.control.fixed_cost import (
    ONE_K,
    PER_KIND,
    KFit,
    KModel,
    Medians,
    fit_fixed_cost,
    fit_k,
    one_k_model,
    robust_sigma,
)
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank
from omnilearn.records import START_UP, STEP, of_kind

Cell = tuple[int, str]  # (rank, level)


@dataclass(frozen=True)
class WorkerModels:
    """``t = c[(rank, level)] * (b + k)`` seconds, ``k`` the worker-level's (``k_cell``), with where it came from."""

    c: dict[Cell, float]
    k: float
    """The job's k (samples): the one k, or with one k per kind the kinds' mean weighted by their steps."""
    k_se: float | None
    """k's standard error (samples); None when k is not identified or at a bound."""
    k_status: str
    """``fitted``, ``not identified`` (k = K_PRIOR), ``lower bound``, ``upper bound``, or
    :data:`FROM_START_UP` (the steps could not tell it; the workers' start-up passes did)."""
    sigma: dict[Cell, float]
    """Step-to-step noise of each worker-level: robust sd of log(t / median at its batch)."""
    steps: dict[Cell, int]
    """Kept steps behind each worker-level."""
    spread: dict[Cell, float] = field(default_factory=dict)
    """Each worker-level's scatter against the other workers of its steps: robust sd of its log time
    (over its median at its batch) less the step's median over the workers, scaled back by
    ``sqrt(n / (n - 1))``. A host that slows a whole step is left out: it slows every split alike,
    where a worker's own scatter makes a step wait for the slowest of the workers' draws."""
    common: dict[str, float] = field(default_factory=dict)
    """Per level, the scatter a whole step shares (a host that slows every worker of it): robust sd of the
    steps' median over the workers of their log times (over their medians at their batches). With
    :attr:`spread` it splits :attr:`sigma`: a recorded step's noise is the step's and each worker's own."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """``{"run": name, "steps": kept steps}`` per run the fit used, in order."""
    mean_batch: float = 0.0
    """Mean local batch over the kept steps (B / n for a BSP job)."""
    k_model: str = ONE_K
    """Which k model the fit used: ``one k for the job's workers`` or ``one k per kind of worker``."""
    k_why: str = ""
    """Why one k where the workers are not all of one reported kind, "" otherwise
    (:func:`~omnilearn.control.fixed_cost.fit_fixed_cost`)."""
    k_cell: dict[Cell, float] = field(default_factory=dict)
    """Each worker-level's k: its kind's (``k`` where absent)."""
    k_by_kind: list[dict[str, Any]] = field(default_factory=list)
    """With one k per kind, each kind's: ``threads``, ``k``, ``k_se``, ``k_status`` and its ``workers``
    (``rank@level``); empty with one k."""

    def k_of(self, rank: int, level: str) -> float:
        """The k of worker ``rank`` at ``level``."""
        return self.k_cell.get((rank, level), self.k)

    def time(self, rank: int, level: str, batch: float) -> float:
        return self.c[(rank, level)] * (batch + self.k_of(rank, level))

    def speed(self, rank: int, level: str, batch: float) -> float:
        """Samples per second of compute at local batch ``batch``: ``b / (c (b + k))``."""
        return batch / self.time(rank, level, batch)

    def provenance(self) -> dict[str, Any]:
        """What the models came from, for a report: the runs, their steps, k and its model."""
        return {"runs": [dict(r) for r in self.runs], "steps": sum(r["steps"] for r in self.runs),
                "k": round(self.k, 3), "k_se": None if self.k_se is None else round(self.k_se, 3),
                "k_status": self.k_status, "k_model": self.k_model, "k_why": self.k_why,
                **({"k_by_kind": [dict(g) for g in self.k_by_kind]} if self.k_by_kind else {})}


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


FROM_START_UP = "start-up pass"
"""The ``k_status`` of a ``k`` the workers' start-up passes told (:func:`start_up_k`) where the steps ran one
batch size."""


def start_up_k(per_rank: Sequence[Sequence[dict[str, Any]]]) -> KFit | None:
    """One ``k`` for the job's workers from their start-up passes: each worker's last ``start_up`` record,
    its time at two batch sizes (``per_rank``: every rank's records). None where a worker has no such
    record or the times do not tell ``k`` (a fit neither ``fitted`` nor at its lower bound, 0)."""
    ups = [of_kind(records, START_UP) for records in per_rank]
    if not ups or not all(ups):
        return None
    times: dict[Cell, dict[int, float]] = {
        (j, u[-1].get("level") or ""): {b: t / 1e3 for b, t in zip(u[-1]["sizes"], u[-1]["times_ms"], strict=True)
                                        if b > 0 and t > 0}
        for j, u in enumerate(ups)}
    cells = [cell for cell, at in times.items() if at]
    if not cells:
        return None
    data = _medians(cells, {cell: {b: [t] for b, t in times[cell].items()} for cell in cells}, times)
    fit = fit_k(data, float(data.b.max()))
    return fit if fit.status in ("fitted", "lower bound") else None


def fit_worker_models(runs: Sequence[Sequence[Sequence[dict[str, Any]]]], names: Sequence[str] | None = None,
                      start_up: KFit | None = None) -> WorkerModels:
    """Fit :class:`WorkerModels` over ``runs``: each a list of per-rank step records of one run of the
    same job (rank ``i`` is the same worker in every run). ``names`` name the runs in the provenance.
    ``start_up``: the ``k`` of the workers' start-up passes (:func:`start_up_k`), taken where the steps
    cannot tell one (every worker ran one batch size)."""
    names = list(names) if names is not None else [f"run{j + 1}" for j in range(len(runs))]
    assert len(names) == len(runs)
    by_batch: dict[Cell, dict[int, list[float]]] = {}
    threads: dict[Cell, set[Any]] = {}
    used, batches_seen, full = [], [], 0
    for name, per_rank in zip(names, runs, strict=True):
        kept = _kept(per_rank)
        for rank, steps in enumerate(kept):
            for r in steps:
                by_batch.setdefault((rank, r["level"]), {}).setdefault(r["batch"], []).append(r["compute_ms"] / 1e3)
                threads.setdefault((rank, r["level"]), set()).add(r.get("threads"))
                batches_seen.append(r["batch"])
                full = max(full, r.get("global_batch") or 0)
        used.append({"run": name, "steps": min((len(s) for s in kept), default=0)})
    cells = sorted(by_batch)
    medians = {cell: {b: statistics.median(ts) for b, ts in by_batch[cell].items()} for cell in cells}
    data = _medians(cells, by_batch, medians)
    fit = fit_fixed_cost(data, [_kind(threads[cell]) for cell in cells], full, name=_kind_name)
    if start_up is not None and fit.model == ONE_K and fit.fits[None].status == "not identified":
        fit = one_k_model(data, KFit(start_up.k, start_up.se, FROM_START_UP), fit.why)
    steps = {cell: sum(len(ts) for ts in by_batch[cell].values()) for cell in cells}
    job = fit.mean(np.asarray([steps[cell] for cell in cells], float))
    logs = {cell: [math.log(t / medians[cell][b]) for b, ts in by_batch[cell].items() for t in ts] for cell in cells}
    spread, common = _scatter(runs, medians)
    return WorkerModels(c={cell: math.exp(v) for cell, v in zip(cells, fit.log_c, strict=True)}, k=job.k,
                        k_se=job.se, k_status=job.status,
                        sigma={cell: robust_sigma(np.asarray(v)) for cell, v in logs.items()}, steps=steps,
                        spread=spread, common=common, runs=used,
                        mean_batch=statistics.fmean(batches_seen) if batches_seen else 0.0,
                        k_model=fit.model, k_why=fit.why,
                        k_cell={cell: float(k) for cell, k in zip(cells, fit.k, strict=True)},
                        k_by_kind=_by_kind(fit, cells))


def _medians(cells: list[Cell], by_batch: dict[Cell, dict[int, list[float]]], medians: dict[Cell, dict[int, float]]
             ) -> Medians:
    """The fit's data (:class:`~omnilearn.control.fixed_cost.Medians`): each worker-level's median time per
    batch and the steps behind it, and every step's log time over its median."""
    points = [(j, b, medians[cell][b], len(ts)) for j, cell in enumerate(cells) for b, ts in by_batch[cell].items()]
    devs = [(j, math.log(t / medians[cell][b])) for j, cell in enumerate(cells)
            for b, ts in by_batch[cell].items() for t in ts]
    return Medians(cell=np.asarray([p[0] for p in points], np.int64), b=np.asarray([p[1] for p in points], float),
                   log_t=np.log(np.asarray([p[2] for p in points], float)),
                   n=np.asarray([p[3] for p in points], float), dev=np.asarray([d[1] for d in devs], float),
                   dev_cell=np.asarray([d[0] for d in devs], np.int64), cells=len(cells))


def _kind(threads: set[Any]) -> tuple[float] | None:
    """A worker-level's kind: the threads its steps report (None: not reported, or not one number)."""
    if len(threads) != 1 or None in threads:
        return None
    return (float(next(iter(threads))),)


def threads_name(threads: float) -> str:
    """A kind of worker in words: ``1 thread``, ``2 threads``."""
    return f"{threads:g} thread" + ("" if threads == 1 else "s")


def _kind_name(kind: Hashable) -> str:
    return threads_name(kind[0])  # type: ignore[index]


def k_model_text(source: dict[str, Any], values: bool = True) -> str:
    """The k model of a fit's provenance (:meth:`WorkerModels.provenance`) in words: ``one k for the job's
    workers: k = 3.1 ± 0.4 samples`` (``values``: with k), or ``one k per kind of worker: 1 thread k = 3.1 ±
    0.4 samples, 2 threads k = 12 ± 3 samples``; why one k where the workers are of several kinds."""
    kinds = source.get("k_by_kind")
    if kinds:
        return f"{PER_KIND}: " + ", ".join(f"{threads_name(g['threads'])} {k_text(g)}" for g in kinds)
    why = source.get("k_why")
    return source.get("k_model", ONE_K) + (f" ({why})" if why else "") + (f": {k_text(source)}" if values else "")


def k_text(fit: dict[str, Any]) -> str:
    """One fit's k in words (``k``, ``k_se``, ``k_status``)."""
    k = fit["k"]
    if fit["k_status"] in ("fitted", FROM_START_UP):
        text = f"k = {k:.3g}" + (f" ± {fit['k_se']:.2g}" if fit.get("k_se") is not None else "") + " samples"
        if fit["k_status"] == FROM_START_UP:
            text += " (from the workers' start-up passes: the steps ran one batch size)"
        return text
    if fit["k_status"] == "not identified":
        return f"k = {k:g} (not identified: no worker ran two batch sizes; time taken as proportional to batch)"
    if fit["k_status"] == "upper bound":
        return f"k = {k:.3g} (at its bound: time does not grow with batch)"
    return "k = 0 (at its bound: time grows at least in proportion to batch)"


def _by_kind(fit: KModel, cells: list[Cell]) -> list[dict[str, Any]]:
    """:attr:`WorkerModels.k_by_kind` of ``fit``."""
    if fit.model == ONE_K:
        return []
    return [{"threads": kind[0], "k": round(f.k, 3), "k_se": None if f.se is None else round(f.se, 3),  # type: ignore[index]
             "k_status": f.status, "workers": [f"rank{r}@{lv}" for (r, lv), x in zip(cells, fit.kind, strict=True)
                                               if x == kind]}
            for kind, f in fit.fits.items()]


def _scatter(runs: Sequence[Sequence[Sequence[dict[str, Any]]]], medians: dict[Cell, dict[int, float]]
             ) -> tuple[dict[Cell, float], dict[str, float]]:
    """:attr:`WorkerModels.spread` and :attr:`WorkerModels.common` from each run's kept steps (``medians``:
    each worker-level's median time per batch): the steps every rank kept, matched by their step number.
    ASP runs, whose workers share no step (their records have no global batch), give neither."""
    own: dict[Cell, list[float]] = {}
    shared: dict[str, list[float]] = {}
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
            shared.setdefault(row[0]["level"], []).append(centre)
            for i, (r, x) in enumerate(zip(row, logs, strict=True)):
                own.setdefault((i, r["level"]), []).append((x - centre) * math.sqrt(n / (n - 1)))
    return ({cell: robust_sigma(np.asarray(v)) for cell, v in own.items()},
            {level: robust_sigma(np.asarray(v)) for level, v in shared.items()})


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
