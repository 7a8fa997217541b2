"""The measured models a simulation runs on, fitted from a finished BSP run folder.

- **Compute time** of each worker at each level against its batch: ``t = a + c * b`` (seconds), from
  the run's step records (``batch``, ``compute_ms``, ``level``). Steps are grouped by batch size (the
  first step after a change and partial last steps left out) and the line is fitted to the median
  time of each batch. A worker that ran one batch size at a level (a uniform run) cannot tell ``a``
  from ``c``: its line is ``c * (b + k)`` with ``k = a / c`` the median of the workers and levels
  that could tell, else 0 (time proportional to batch). ``sigma``: the step-to-step noise, the
  robust standard deviation of ``log(t / median)`` at a batch.
- **All-reduce** against size and workers, ring: ``latency * (N - 1) + 2 (N - 1) / N * bytes / bandwidth``.
  From the run alone only one point is known (its own cost at its worker count: the sync time of the
  rank that waited least, median over steps), so it is scaled by the ring's bandwidth term; a
  calibration file (``omnilearn calibrate``) gives both terms from gloo measured at 2 and n workers.
- **Per-step overhead** beyond compute and all-reduce (the gather of compute times, metrics), from
  rank 0's step timestamps; **evaluation** seconds per evaluation, from wall minus training time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.errors import UserError
from omnilearn.files import load_yaml
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank

MIN_SPREAD = 1.2  # batches at a level must span at least this ratio to fit a and c apart


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
    return [r for r in records if r.get("kind") == "step"]


def _robust_sigma(logs: list[float]) -> float:
    if len(logs) < 3:
        return 0.0
    m = statistics.median(logs)
    return 1.4826 * statistics.median(abs(x - m) for x in logs)


def fit_compute(per_rank: list[list[dict[str, Any]]]) -> dict[tuple[int, str], ComputeModel]:
    """``(rank, level) -> ComputeModel`` from every rank's step records."""
    full = max((r["global_batch"] for s in per_rank for r in s), default=0)
    groups: dict[tuple[int, str], dict[int, list[float]]] = {}
    for rank, steps in enumerate(per_rank):
        previous = None
        for r in steps:
            fresh = previous is not None and r["batch"] != previous
            previous = r["batch"]
            if fresh or r["global_batch"] != full or r["batch"] <= 0 or r["compute_ms"] <= 0:
                continue
            groups.setdefault((rank, r["level"]), {}).setdefault(r["batch"], []).append(r["compute_ms"] / 1e3)
    lines: dict[tuple[int, str], tuple[float, float]] = {}
    for key, by_batch in groups.items():
        bs = sorted(by_batch)
        if len(bs) < 2 or bs[-1] / bs[0] < MIN_SPREAD:
            continue
        w = [len(by_batch[b]) for b in bs]
        y = [statistics.median(by_batch[b]) for b in bs]
        mx = sum(wi * b for wi, b in zip(w, bs, strict=True)) / sum(w)
        my = sum(wi * t for wi, t in zip(w, y, strict=True)) / sum(w)
        var = sum(wi * (b - mx) ** 2 for wi, b in zip(w, bs, strict=True))
        c = sum(wi * (b - mx) * (t - my) for wi, b, t in zip(w, bs, y, strict=True)) / var
        if c > 0:
            lines[key] = (max(0.0, my - c * mx), c)
    ks = [a / c for a, c in lines.values()]
    k = statistics.median(ks) if ks else 0.0
    out: dict[tuple[int, str], ComputeModel] = {}
    for key, by_batch in groups.items():
        logs = [math.log(t / statistics.median(ts)) for ts in by_batch.values() for t in ts]
        count = sum(len(ts) for ts in by_batch.values())
        if key in lines:
            a, c = lines[key]
        else:  # one batch size: t = c (b + k)
            c = statistics.median(t / (b + k) for b, ts in by_batch.items() for t in ts)
            a = c * k
        out[key] = ComputeModel(a, c, _robust_sigma(logs), count)
    return out


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
    ends = [[r for r in recs if r.get("kind") == "end"] for recs in records]
    if not all(ends) or not all(_steps(s) for s in records):
        raise UserError(f"--replay {run}: the run did not finish (a rank has no steps or no end record)")
    start = next(r for r in records[0] if r.get("kind") == "start")
    end = ends[0][-1]
    evals = [r for r in records[0] if r.get("kind") == "eval"]
    params = int(start["params"])
    allreduce = (allreduce_from_calibration(calibration, params) if calibration
                 else allreduce_from_run(records, params))
    return RunModels(job=job, records=records, compute=fit_compute([_steps(s) for s in records]),
                     allreduce=allreduce, overhead_s=step_overhead(records[0]),
                     eval_s=(end["wall_time_s"] - end["train_time_s"]) / len(evals) if evals else 0.0,
                     train_samples=int(start["train_samples"]))
