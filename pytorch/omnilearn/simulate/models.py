"""The measured models a simulation runs on, fitted from a finished BSP run folder.

- **Compute time** of each worker at each level against its batch: ``t = a + c * b`` (seconds) with
  ``a = c * k``, from the run's step records: the per-worker models of
  :mod:`omnilearn.report.worker_models` (a fixed cost ``k`` in samples, one for every worker and level
  or one per kind of worker (its threads) where the data tell each kind's, fitted where the batches
  changed, else 0; medians per batch size; the first step after a change
  and partial last steps left out). Step-to-step noise, log-normal, in two parts: each worker's own
  (``sigma``: the robust sd of its log time less the step's median over the workers,
  :attr:`~omnilearn.report.worker_models.WorkerModels.spread`) and the step's, one draw for every
  worker of a step (``RunModels.common``, per level: a host that slows a whole step). Drawn for
  each worker apart, a shared slowdown would make every balanced step wait for the slowest of
  independent draws, which a recorded run at one split does not say (on the demo job's ``uniform``
  runs most of the scatter is shared: ``results/2026-12-06_2cpu_whatif-noise-and-hook-teardown.md``).
  The start-up pass draws each worker's own only. Where the run has no steps shared by its ranks
  (ASP), ``sigma`` is the whole scatter.
- **All-reduce** against size and workers, ring: ``latency * (N - 1) + 2 (N - 1) / N * bytes / bandwidth``.
  From the run alone only one point is known (its own cost at its worker count: the sync time of the
  rank that waited least, median over steps), so it is scaled by the ring's bandwidth term; a
  calibration file (``omnilearn calibrate``) gives both terms from gloo measured at 2 and n workers.
- **Per-step overhead** beyond compute and all-reduce (the gather of compute times, metrics), from
  rank 0's step timestamps; **evaluation** seconds per evaluation, from wall minus training time.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilearn.control.fixed_cost import KFit
from omnilearn.errors import UserError
from omnilearn.files import load_yaml
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank
from omnilearn.records import END, EVAL, START, STEP, of_kind
from omnilearn.report.summary import busy_ms
from omnilearn.report.worker_models import fit_worker_models, start_up_k


@dataclass(frozen=True)
class ComputeModel:
    """One worker's compute time at one level: ``a + c * b`` seconds, log-normal noise ``sigma``."""

    a: float
    c: float
    sigma: float
    steps: int  # measured steps behind it (0: derived from another level by CPU share)

    def at(self, batch: int) -> float:
        return self.a + self.c * batch

    def scaled(self, factor: float) -> ComputeModel:
        """The same worker ``factor`` times slower (a smaller CPU share)."""
        return ComputeModel(self.a * factor, self.c * factor, self.sigma, 0)


@dataclass(frozen=True)
class AllReduceModel:
    """Ring all-reduce cost in seconds for ``bytes`` over ``workers``."""

    latency_s: float
    bandwidth: float  # bytes/s of the ring's per-link transfer; inf: no bandwidth term
    bytes: int
    source: str

    def seconds(self, workers: int) -> float:
        if workers <= 1:
            return 0.0
        return self.latency_s * (workers - 1) + 2 * (workers - 1) / workers * self.bytes / self.bandwidth


@dataclass
class RunModels:
    """Everything a simulation takes from a run: its job, per-rank records and the fitted models."""

    job: JobSpec
    records: list[list[dict[str, Any]]]
    compute: dict[tuple[int, str], ComputeModel]
    allreduce: AllReduceModel
    overhead_s: float
    eval_s: float
    train_samples: int
    common: dict[str, float] = field(default_factory=dict)
    """Per level, the log-normal sd of the noise a step's workers share (see the module)."""

    def step_draw(self, level: str, rng: random.Random, noise: float) -> float:
        """A step's factor at ``level``, shared by its workers (``noise``: the scale on the measured sd);
        a level the run did not measure takes the largest measured."""
        sigma = self.common.get(level, max(self.common.values(), default=0.0)) * noise
        return rng.lognormvariate(0.0, sigma) if sigma > 0 else 1.0

    @property
    def workers(self) -> int:
        return self.job.config.workers

    def model(self, rank: int, level: str) -> ComputeModel:
        """Rank ``rank``'s model at ``level``; a level the run did not measure for it is its model at a
        measured level scaled by the CPU shares (speed in proportion to share: an assumption, said so)."""
        found = self.compute.get((rank, level))
        if found is not None:
            return found
        plan, target = self.job.plan, self.job.plan.targets[rank]
        want = plan.allocation(level, target).share if level in plan.levels else None
        for (r, lv), m in sorted(self.compute.items()):
            have = plan.allocation(lv, target).share if lv in plan.levels else None
            if r == rank and want and have:
                model = m.scaled(have / want)
                self.compute[(rank, level)] = model
                return model
        raise UserError(f"{self.job.out_dir}: no measured steps of worker{rank + 1} to model level {level}")


def _steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(records, STEP)


def busy_steps(per_rank: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Every rank's step records with ``compute_ms`` its busy time: its compute and the wait for its CPU
    quota beyond it (``held_ms``), which lands in the all-reduce but is the rank's own: a step waits for it."""
    return [[{**r, "compute_ms": busy_ms(r)} for r in steps] for steps in per_rank]


def fit_compute(per_rank: list[list[dict[str, Any]]], start_up: KFit | None = None
                ) -> tuple[dict[tuple[int, str], ComputeModel], dict[str, float]]:
    """``(rank, level) -> ComputeModel`` from every rank's step records, and per level the noise a step's
    workers share: the run's per-worker models (:func:`~omnilearn.report.worker_models.fit_worker_models`,
    ``t = c (b + k)``, ``k`` the job's or the worker's kind's) on the ranks' busy times (:func:`busy_steps`),
    as lines ``a + c b`` with ``a = c k``, each with its own noise (see the module); ``start_up``: the ``k``
    of the workers' start-up passes, where the steps cannot tell one."""
    models = fit_worker_models([busy_steps(per_rank)], ["replayed run"], start_up)
    compute = {key: ComputeModel(c * models.k_of(*key), c, models.spread.get(key, models.sigma[key]),
                                 models.steps[key]) for key, c in models.c.items()}
    return compute, dict(models.common)


def allreduce_from_run(per_rank: list[list[dict[str, Any]]], params: int) -> AllReduceModel:
    """The run's own all-reduce cost, as a ring's bandwidth term (its one measured point)."""
    n = len(per_rank)
    k = min(len(_steps(s)) for s in per_rank) if per_rank else 0
    steps = [_steps(s) for s in per_rank]
    cost = statistics.median(min(s[i]["sync_ms"] for s in steps) for i in range(k)) / 1e3 if k else 0.0
    size = 4 * params
    ring = 2 * (n - 1) / n
    bandwidth = ring * size / cost if cost > 0 else math.inf
    return AllReduceModel(0.0, bandwidth, size, f"the run's all-reduce, {cost * 1e3:.1f} ms at {n} workers")


def allreduce_from_calibration(path: Path, params: int) -> AllReduceModel:
    """Latency and bandwidth of the ring model, least squares over ``omnilearn calibrate``'s all-reduce
    measurements (bytes, workers, seconds)."""
    data = load_yaml(path, "calibration file")
    points = (data.get("allreduce") or {}).get("measurements") if isinstance(data, dict) else None
    if not points:
        raise UserError(f"--calibration {path}: no all-reduce measurements (write it with omnilearn calibrate)")
    rows = [(m["workers"] - 1, 2 * (m["workers"] - 1) / m["workers"] * m["bytes"], m["seconds"]) for m in points]
    sxx = sum(x * x for x, _, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxt = sum(x * t for x, _, t in rows)
    syt = sum(y * t for _, y, t in rows)
    det = sxx * syy - sxy * sxy
    if det <= 0:
        raise UserError(f"--calibration {path}: the all-reduce measurements cannot separate latency and bandwidth")
    latency, per_byte = (syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det
    return AllReduceModel(max(latency, 0.0), 1 / per_byte if per_byte > 0 else math.inf, 4 * params,
                          f"calibration {path}")


def step_overhead(records: list[dict[str, Any]]) -> float:
    """Rank 0's seconds per step beyond compute and sync (the gather of times, metrics), median over
    consecutive steps of one epoch."""
    steps = _steps(records)
    gaps = [(b["time"] - a["time"]) - (b["compute_ms"] + b["sync_ms"]) / 1e3
            for a, b in zip(steps, steps[1:], strict=False) if a["epoch"] == b["epoch"]]
    return max(0.0, statistics.median(gaps)) if gaps else 0.0


def load_run(run: Path, calibration: Path | None = None) -> RunModels:
    """Fit every model from the finished BSP run folder ``run``."""
    run = Path(run)
    if not (run / "job.json").is_file():
        raise UserError(f"--replay {run}: not a run folder (no job.json)")
    job = JobSpec.load(run / "job.json", out_dir=run)
    if job.config.mode != "bsp":
        raise UserError(f"--replay {run}: an {job.config.mode.upper()} run; the simulator replays BSP runs")
    records = [read_rank(run, r) for r in range(job.config.workers)]
    ends = [of_kind(recs, END) for recs in records]
    if not all(ends) or not all(_steps(s) for s in records):
        raise UserError(f"--replay {run}: the run did not finish (a rank has no steps or no end record)")
    start = next(r for r in records[0] if r.get("kind") == START)
    end = ends[0][-1]
    evals = [r for r in records[0] if r.get("kind") == EVAL]
    params = int(start["params"])
    allreduce = (allreduce_from_calibration(calibration, params) if calibration
                 else allreduce_from_run(records, params))
    compute, common = fit_compute([_steps(s) for s in records], start_up_k(records))
    return RunModels(job=job, records=records, compute=compute, common=common,
                     allreduce=allreduce, overhead_s=step_overhead(records[0]),
                     eval_s=(end["wall_time_s"] - end["train_time_s"]) / len(evals) if evals else 0.0,
                     # an unmodified DDP script's start knows no dataset: the samples its steps trained on
                     train_samples=int(start["train_samples"]) or int(end["samples"]))
