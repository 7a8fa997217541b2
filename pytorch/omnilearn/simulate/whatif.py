"""``omnilearn whatif RUN``: what balancing would give a recorded BSP job, from its step records alone.

The run's per-rank models ``t_i(b) = c_i (b + k)`` are fitted by the code the report's ideal uses
(:func:`~omnilearn.report.worker_models.fit_worker_models`), on each rank's busy time (below): one ``k``
for the job's workers, or one per kind of worker (its threads) where the ranks are of several kinds and
the times tell each kind's; ``whatif.json`` says which (``models.k_model``). Where every rank ran one batch
size (a ``uniform`` run, an unmodified DDP job), ``k`` cannot be told from the steps: it is taken from the
ranks' start-up passes where every rank recorded one (``omnilearn run`` times each worker at two batch
sizes before the clock starts, whatever the policy), else as 0 (time in proportion to the batch), and
``whatif.json`` says which.

Per step ``j`` the records give every rank's own work ``t_ij`` (``compute_ms``, and under a CPU quota
the wait for its CPU beyond that, ``held_ms``: a compute that fits what is left of a CFS period runs at
a core's speed and its quota's wait lands in the all-reduce) and its wait in the all-reduce
(``sync_ms``, less that quota wait). The step lasts ``D_j``, the median over ranks of ``t_ij + sync_ij`` (every rank
leaves the all-reduce together), of which ``C_j = D_j - max_i t_ij`` is the exchange and what surrounds
it: what balancing cannot remove. Per rank:

- ``work_s``, ``wait_s``: its mean work and wait a step;
- ``cost_to_others_s``: the time the other ranks lost to it a step, ``(n - 1) max(0, t_ij - max_{k != i}
  t_kj)`` averaged over the steps (the steps it held up, by how much it was the last).

For the job, its training seconds (``train_time_s`` of its end record):

- ``recorded_s``: as recorded;
- ``no_straggler_s``: had no rank been slower than the median rank (each step ``median_i t_ij + C_j``);
- ``balanced_s``: every step split in proportion to the fitted speeds (each step the balanced time of
  :func:`~omnilearn.report.ideal.balanced_time` at its level, plus ``C_j``);
- ``dynamic_s``: the real ``dynamic`` controller replayed through the simulator on the fitted models
  with the recorded noise (:func:`~omnilearn.simulate.simulate`: the step's, one draw for all its ranks,
  and each rank's own, ``models.noise``), as a ratio to the simulator's replay
  of the run's own policy, times ``recorded_s``: what the simulator gets wrong of both cancels;
- ``static_s``: the same for ``static`` (the split of the allocations the run's plan gives each level).

The time outside the steps (``train_time_s`` less the steps' sum) is added to every prediction.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from omnilearn.control.fixed_cost import KFit
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank
from omnilearn.records import END, STEP, of_kind
from omnilearn.report.ideal import balanced_time
from omnilearn.report.worker_models import (
    FROM_START_UP,
    WorkerModels,
    fit_worker_models,
    k_model_text,
    start_up_k,
)
from omnilearn.simulate.models import busy_steps

WHATIF_FILE = "whatif.json"
FIGURE_FILE = "whatif.png"


def read_steps(run: Path) -> tuple[JobSpec, list[list[dict[str, Any]]], dict[str, Any], KFit | None]:
    """The run's job, every rank's step records, rank 0's last end record and the ``k`` of the ranks'
    start-up passes (None: not every rank has one); one clear error where a folder has no job file, is
    not BSP, or a rank has no step records or no end record."""
    if not (run / "job.json").is_file():
        raise UserError(f"whatif {run}: not a run folder (no job.json)")
    job = JobSpec.load(run / "job.json", out_dir=run)
    if job.config.mode != "bsp":
        raise UserError(f"whatif {run}: an {job.config.mode.upper()} run; the what-if is for synchronous (BSP) jobs")
    records = [read_rank(run, slot) for slot in job.slots]
    steps = [of_kind(r, STEP) for r in records]
    missing = [str(slot) for slot, s in zip(job.slots, steps, strict=True) if not s]
    if missing:
        raise UserError(f"whatif {run}: no step records for rank(s) {', '.join(missing)} "
                        f"(metrics/rank-<r>.jsonl): nothing to fit")
    ends = of_kind(records[0], END)
    if not ends:
        raise UserError(f"whatif {run}: rank 0 has no end record: the run did not finish")
    return job, steps, ends[-1], start_up_k(records)


def _table(steps: Sequence[Sequence[dict[str, Any]]], key: str) -> np.ndarray:
    """(steps, ranks) seconds of ``key`` over the steps every rank recorded (a null or absent value: 0)."""
    m = min(len(s) for s in steps)
    return np.array([[float(s[j].get(key) or 0.0) / 1e3 for s in steps] for j in range(m)])


def rank_costs(work: np.ndarray, wait: np.ndarray) -> list[dict[str, float]]:
    """Per rank: its mean work and wait a step, and the others' time lost to it a step (see the module)."""
    n = work.shape[1]
    out = []
    for i in range(n):
        others = np.delete(work, i, axis=1).max(axis=1) if n > 1 else np.zeros(len(work))
        lost = (n - 1) * np.maximum(work[:, i] - others, 0.0)
        out.append({"work_s": round(float(work[:, i].mean()), 6), "wait_s": round(float(wait[:, i].mean()), 6),
                    "cost_to_others_s": round(float(lost.mean()), 6)})
    return out


def step_times(work: np.ndarray, wait: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's duration ``D_j`` and the part of it balancing cannot remove ``C_j``."""
    duration = np.median(work + wait, axis=1)
    return duration, np.maximum(duration - work.max(axis=1), 0.0)


def balanced_steps(models: WorkerModels, steps: Sequence[Sequence[dict[str, Any]]], lo: float, hi: float
                   ) -> np.ndarray:
    """Each step's compute time split in proportion to the fitted speeds at its level (its global batch)."""
    m = min(len(s) for s in steps)
    out = np.empty(m)
    for j in range(m):
        level = steps[0][j]["level"]
        c = [models.c[(i, level)] for i in range(len(steps))]
        k = [models.k_of(i, level) for i in range(len(steps))]
        out[j] = balanced_time(c, k, float(steps[0][j]["global_batch"]), lo, hi)
    return out


REPLAYED = ("dynamic", "static")
"""The policies the what-if replays beside the run's own."""


def replayed(run: Path) -> dict[str, float]:
    """The training seconds of the run's own policy (``own``) and of each of :data:`REPLAYED`, replayed by
    the simulator on the run's fitted models with its recorded noise."""
    from omnilearn.simulate import simulate

    with tempfile.TemporaryDirectory(prefix="omnilearn-whatif-") as tmp:
        out = {"own": simulate(run, Path(tmp) / "own", figures=False)["train_time_s"]}
        for policy in REPLAYED:
            out[policy] = simulate(run, Path(tmp) / policy, policy=policy, figures=False)["train_time_s"]
    return out


def whatif(run: Path | str, out: Path | str | None = None, figure: bool = True) -> dict[str, Any]:
    """The what-if of the run folder ``run`` (see the module): ``whatif.json`` and ``whatif.png`` in
    ``out`` (default: the run folder); returns what ``whatif.json`` holds."""
    run = Path(run)
    job, steps, end, start_up = read_steps(run)
    models = fit_worker_models([busy_steps(steps)], [run.name], start_up)  # the quota's waits are the ranks' own
    held = _table(steps, "held_ms")  # the quota's wait: the rank's own, though it lands in the all-reduce
    work, wait = _table(steps, "compute_ms") + held, np.maximum(_table(steps, "sync_ms") - held, 0.0)
    duration, exchange = step_times(work, wait)
    recorded = float(end["train_time_s"])
    outside = max(recorded - float(duration.sum()), 0.0)
    c = job.config.control
    lo, hi = float(c.min_batch), float(c.max_batch or job.config.train.global_batch)
    balanced = balanced_steps(models, steps, lo, hi)
    times = replayed(run)
    how = ("fitted from the run's batch changes" if models.k_status == "fitted" else
           "from every rank's start-up pass (its times at two batch sizes; the steps ran one)"
           if models.k_status == FROM_START_UP else
           f"assumed {models.k:g} ({models.k_status}: every rank ran one batch size, so time is taken "
           f"as proportional to the batch)" if models.k_status == "not identified" else
           f"{models.k_status} of the fit")
    k_source = f"{how}; {k_model_text(models.provenance(), values=False)}"
    result = {
        "run": str(run.resolve()), "policy": c.policy, "workers": len(steps), "steps": int(len(duration)),
        "ranks": [{"rank": r, **costs} for r, costs in enumerate(rank_costs(work, wait))],
        "job": {"recorded_s": round(recorded, 4),
                "no_straggler_s": round(float((np.median(work, axis=1) + exchange).sum()) + outside, 4),
                "balanced_s": round(float((balanced + exchange).sum()) + outside, 4),
                **{f"{p}_s": round(recorded * times[p] / times["own"], 4) for p in REPLAYED}},
        "replayed": {"own_policy_s": round(times["own"], 4), **{f"{p}_s": round(times[p], 4) for p in REPLAYED}},
        "models": {"k": round(models.k, 3), "k_status": models.k_status, "k_source": k_source,
                   "k_se": None if models.k_se is None else round(models.k_se, 3), "k_model": models.k_model,
                   **({"k_by_kind": [dict(g) for g in models.k_by_kind]} if models.k_by_kind else {}),
                   "c_ms_per_sample": {f"rank{r}@{lv}": round(v * 1e3, 5) for (r, lv), v in sorted(models.c.items())},
                   "noise": {"step": {lv: round(v, 4) for lv, v in sorted(models.common.items())},
                             "own": {f"rank{r}@{lv}": round(v, 4) for (r, lv), v in sorted(models.spread.items())}}},
        "exchange_s": round(float(exchange.mean()), 6),
        "outside_steps_s": round(outside, 4),
    }
    dest = Path(out) if out is not None else run
    dest.mkdir(parents=True, exist_ok=True)
    write_atomic(dest / WHATIF_FILE, json.dumps(result, indent=2))
    if figure:
        plot(result, float(np.median(balanced)), dest / FIGURE_FILE)
    return result


def plot(result: dict[str, Any], balanced_s: float, path: Path) -> None:
    """Per rank, its recorded work and wait a step beside the work a step at the balanced split
    (``balanced_s``, the median over the steps: every rank's, balanced)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = result["ranks"]
    x = np.arange(len(ranks))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(ranks) + 2), 3.2))
    ax.bar(x - 0.2, [r["work_s"] * 1e3 for r in ranks], 0.4, label="recorded work")
    ax.bar(x - 0.2, [r["wait_s"] * 1e3 for r in ranks], 0.4, bottom=[r["work_s"] * 1e3 for r in ranks],
           label="recorded wait", alpha=0.5)
    ax.bar(x + 0.2, [balanced_s * 1e3] * len(ranks), 0.4, label="work, balanced (predicted)")
    ax.set_xticks(x, [f"rank {r['rank']}" for r in ranks])
    ax.set_ylabel("ms a step")
    job = result["job"]
    ax.set_title(f"recorded {job['recorded_s']:.1f} s · balanced {job['balanced_s']:.1f} s · "
                 f"dynamic {job['dynamic_s']:.1f} s", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
