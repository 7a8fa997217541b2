"""The ideal speed-up a policy is judged against: what perfect balance would give over ``uniform``.

Three figures, all for BSP:

- :func:`group_ideal`, the one reports judge by (``ideal_speedup``): from per-worker models
  ``t = c_i (b + k)`` (:mod:`omnilearn.report.worker_models`: one ``k`` for the job's workers, or one
  per kind of worker where the data tell each kind's) fitted over ALL the BSP runs of a
  compare or a bench group, so every policy of the group is judged against the same number, and a
  run at other batch sizes than uniform's (``static``, ``dynamic``) is predicted by the same models
  that predict uniform. For every step of the uniform run (the reference job: its levels, its
  all-reduce) the uniform time under the models is set against the balanced time under the same
  models; the all-reduce's measured cost is added to both. Beside it, ``ideal_speedup_at_scatter``:
  the same with every worker's own step-to-step scatter in both times (a balanced step still waits
  for the slowest of the workers' draws, and at equal times that wait is longest; a uniform step is
  set by its slowest worker almost alone): what perfect balance can reach on the host measured.
- :func:`ideal_speedups`, the earlier figure (``ideal_speedup_uniform_run``): from the uniform run's
  raw measured speeds at its one batch size, step by step. In short runs a policy can beat it, since
  one run's speeds at one batch size are a noisy and biased measure of the workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from omnilearn.config.sections import PEERS
from omnilearn.control.policies import bounded_shares
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank
from omnilearn.records import STEP, of_kind
from omnilearn.report.fidelity import model_speeds
from omnilearn.report.worker_models import WorkerModels, fit_worker_models, k_model_text, run_steps, same_job

SCATTER_Z = tuple(z / 4 for z in range(13))
"""The quantiles (z-scores of each worker's scatter, 0 to 3) :func:`scattered_time` balances at."""
STEP_GRID = 256
"""Points of the integral behind :func:`expected_slowest` (log-spaced over its range)."""
STEP_RANGE = 6.0
"""Standard deviations of each worker's scatter the integral spans on either side."""


def ideal_speedups(uniform_dir: Path) -> tuple[float, float] | None:
    """What perfect balance would give, from what the uniform run measured: (with, without communication).

    For every step of the uniform run, with the measured speeds ``s_i = b_i / t_i`` of that step:
    its compute-bound time is the slowest worker's compute time; perfectly balanced, the same global
    batch computes in ``B / sum_i s_i``. Balancing cannot remove the all-reduce, whose own cost is
    the sync time of the worker that waited least (the last to arrive). The first value models a
    step as compute + that cost, the second as compute alone (an upper bound no BSP job reaches).
    """
    job = JobSpec.load(uniform_dir / "job.json", out_dir=uniform_dir)
    steps = [of_kind(read_rank(uniform_dir, s), STEP) for s in job.slots]
    n = min(len(s) for s in steps)
    slowest = balanced = comm = 0.0
    for k in range(n):
        row = [s[k] for s in steps]
        if any(r["batch"] <= 0 or r["compute_ms"] <= 0 for r in row):
            continue
        slowest += max(r["compute_ms"] for r in row)
        balanced += proportional_time(row[0]["global_batch"], [r["batch"] for r in row], [r["compute_ms"] for r in row])
        comm += min(r["sync_ms"] for r in row)
    if balanced <= 0:
        return None
    return round((slowest + comm) / (balanced + comm), 4), round(slowest / balanced, 4)


def proportional_time(total: float, batch: Sequence[float], times: Sequence[float]) -> float:
    """The time ``total`` samples take split in proportion to the workers' speeds ``batch[i] / times[i]``
    (balance under ``t = c b``, no fixed cost), in the unit of ``times``."""
    speed = sum(b / max(t, 1e-9) for b, t in zip(batch, times, strict=True))
    return total / speed if speed > 0 else 0.0


def per_worker(k: float | Sequence[float], n: int) -> list[float]:
    """Every worker's k: ``k`` one for all, or one each (workers of different kinds)."""
    return [float(k)] * n if isinstance(k, int | float) else [float(x) for x in k]


def balanced_shares(c: Sequence[float], k: float | Sequence[float], global_batch: float, lo: float, hi: float
                    ) -> list[float]:
    """The split of one step perfectly balanced under ``t_i = c_i (b_i + k_i)``: ``b_i + k_i`` in proportion
    to ``1 / c_i`` (the water-filling of :func:`~omnilearn.control.policies.balanced`, in real numbers, so
    that no split into integers does better), each ``b_i`` within ``[lo, hi]``; ``k``: one for all, or
    one each."""
    n = len(c)
    ks = per_worker(k, n)
    lo = min(lo, global_batch / n)
    extra = n * ks[0] if len(set(ks)) == 1 else sum(ks)  # one k: n k exactly, as a sum would not round
    shares = bounded_shares([1 / x for x in c], global_batch + extra, [lo + x for x in ks],
                            [max(hi, global_batch / n) + x for x in ks])
    return [s - x for s, x in zip(shares, ks, strict=True)]


def balanced_time(c: list[float], k: float | Sequence[float], global_batch: float, lo: float, hi: float) -> float:
    """Compute time of one step perfectly balanced under ``t_i = c_i (b_i + k_i)`` (:func:`balanced_shares`)."""
    ks = per_worker(k, len(c))
    return max(ci * (b + x) for ci, b, x in zip(c, balanced_shares(c, ks, global_batch, lo, hi), ks, strict=True))


def expected_slowest(times: Sequence[float], sd: Sequence[float]) -> float:
    """The expected time of a BSP step, its slowest worker's: ``E[max_i t_i f_i]`` for times ``t_i`` and
    independent factors ``log f_i ~ N(0, sd_i^2)``, as ``lo + int_lo^hi (1 - prod_i F_i(x)) dx`` over the
    slowest time's distribution (below ``lo`` some worker is almost surely slower, above ``hi`` none is),
    on a log grid of :data:`STEP_GRID` points."""
    t, s = np.asarray(times, float), np.maximum(np.asarray(sd, float), 1e-6)
    lo, hi = float((t * np.exp(-STEP_RANGE * s)).max()), float((t * np.exp(STEP_RANGE * s)).max())
    x = lo * (hi / lo) ** np.linspace(0.0, 1.0, STEP_GRID)
    log_f = special.log_ndtr((np.log(x)[:, None] - np.log(t)[None, :]) / s[None, :]).sum(axis=1)
    return float(x[0] + np.trapezoid(-np.expm1(log_f), x))


def scattered_time(c: list[float], k: float | Sequence[float], sd: list[float], global_batch: float, lo: float, hi: float) -> float:
    """Expected compute time of one step at the best split for the workers' scatter ``sd`` (log, each
    worker's own: :attr:`~omnilearn.report.worker_models.WorkerModels.spread`): the least
    :func:`expected_slowest` over the splits balanced at a quantile of every worker's time, ``c_i
    exp(z sd_i)`` for ``z`` in :data:`SCATTER_Z` (``z = 0``: balanced at the medians). A worker that
    scatters more is the slowest in more steps and carries less; no split escapes the slowest draw. ``k``:
    one for all, or one each."""
    ks = per_worker(k, len(c))

    def at(z: float) -> float:
        b = balanced_shares([ci * math.exp(z * si) for ci, si in zip(c, sd, strict=True)], ks, global_batch, lo, hi)
        return expected_slowest([ci * (bi + x) for ci, bi, x in zip(c, b, ks, strict=True)], sd)
    return min(at(z) for z in SCATTER_Z)


def model_ideal(models: WorkerModels, steps: list[list[dict[str, Any]]], lo: float, hi: float
                ) -> tuple[float, float, int, float] | None:
    """(with, without communication, steps used, with communication at the workers' scatter): the ideal
    speed-up over the reference run's ``steps`` (per rank), its time per step under ``models`` at its own
    batches against the balanced time (:func:`balanced_time`), the all-reduce's measured cost (the sync
    time of the rank that waited least) added to both. The last figure takes every worker's own scatter
    (:attr:`~omnilearn.report.worker_models.WorkerModels.spread`) into both times: each step's expected
    slowest time at the reference's batches against the best split's (:func:`scattered_time`). Steps at
    a level the models lack for some worker are left out."""
    n = min((len(s) for s in steps), default=0)
    uniform = balanced = comm = noisy_uniform = noisy_balanced = 0.0
    used = 0
    for j in range(n):
        row = [s[j] for s in steps]
        cells = [(i, r.get("level")) for i, r in enumerate(row)]
        if any(r["batch"] <= 0 for r in row) or any(cell not in models.c for cell in cells):
            continue
        times = [models.time(i, lv, r["batch"]) for (i, lv), r in zip(cells, row, strict=True)]
        c = [models.c[cell] for cell in cells]
        k = [models.k_of(*cell) for cell in cells]
        sd = [models.spread.get(cell, 0.0) for cell in cells]
        total = sum(r["batch"] for r in row)
        uniform += max(times)
        balanced += balanced_time(c, k, total, lo, hi)
        noisy_uniform += expected_slowest(times, sd)
        noisy_balanced += scattered_time(c, k, sd, total, lo, hi)
        comm += min(r["sync_ms"] for r in row) / 1e3
        used += 1
    if balanced <= 0:
        return None
    return (round((uniform + comm) / (balanced + comm), 4), round(uniform / balanced, 4), used,
            round((noisy_uniform + comm) / (noisy_balanced + comm), 4))


def group_ideal(runs: dict[str, Path], reference: str = "uniform") -> dict[str, Any] | None:
    """The group's ideal speed-up from per-worker models fitted over all its BSP runs (``runs``: name
    -> run folder; the peer ``ddp``, whose compute time holds its all-reduce, and runs of another job
    are left out and named), measured on the ``reference`` run's steps. None without a reference BSP
    run with steps.

    Returns ``ideal_speedup`` and ``ideal_compute_speedup`` (with and without the all-reduce) and
    ``ideal_from``: the runs the models came from (name, path, steps kept), their total steps, k with
    its standard error, status and model (:class:`~omnilearn.report.worker_models.WorkerModels`), the
    reference and its steps, the batch bounds of the balance, and the runs left out; and
    ``level_speeds``, the workers' speeds per level from the same models
    (:func:`~omnilearn.report.fidelity.model_speeds`).
    """
    if reference not in runs or not (Path(runs[reference]) / "job.json").is_file():
        return None
    ref_job, ref_steps = run_steps(runs[reference])
    if ref_job.config.mode != "bsp" or not all(ref_steps):
        return None
    chosen: dict[str, list[list[dict[str, Any]]]] = {}
    left_out: dict[str, str] = {}
    for name, path in runs.items():
        if name == reference:
            chosen[name] = ref_steps
            continue
        if not (Path(path) / "job.json").is_file():
            left_out[name] = "no job.json"
            continue
        job, steps = run_steps(path)
        if job.config.mode != "bsp" or job.config.control.policy in PEERS:
            left_out[name] = f"{job.config.mode} {job.config.control.policy}: no balanced BSP step to model"
        elif not same_job(ref_job, job):
            left_out[name] = "another job (workers, levels or global batch)"
        else:
            chosen[name] = steps
    models = fit_worker_models(list(chosen.values()), list(chosen))
    control = ref_job.config.control
    lo, hi = control.min_batch, control.max_batch or ref_job.config.train.global_batch
    ideal = model_ideal(models, ref_steps, lo, hi)
    if ideal is None:
        return None
    paths = {name: str(runs[name]) for name in chosen}
    source = models.provenance()
    source["runs"] = [{**r, "path": paths[r["run"]]} for r in source["runs"]]
    return {"ideal_speedup": ideal[0], "ideal_compute_speedup": ideal[1], "ideal_speedup_at_scatter": ideal[3],
            "ideal_from": {**source, "reference": reference, "reference_steps": ideal[2],
                           "bounds": [lo, hi], "left_out": left_out},
            "level_speeds": model_speeds(models, len(ref_steps))}


def describe_source(source: dict[str, Any]) -> str:
    """``per-worker models fitted over runs uniform, static, dynamic (412 steps; one k for the job's
    workers: k = 3.1 ± 0.4 samples)``: the runs and the k model of a fit's provenance
    (:func:`~omnilearn.report.worker_models.k_model_text`)."""
    names = ", ".join(r["run"] for r in source["runs"])
    return f"per-worker models fitted over runs {names} ({source['steps']} steps; {k_model_text(source)})"
