"""``omnilearn simulate --replay RUN --out DIR [--workers N]``: a BSP job predicted from a finished run.
(``omnilearn simulate --scenarios [FILE] --out DIR``, the controllers scored against an oracle on known
models, is :mod:`.scenarios`.)

The run's measurements become models (:mod:`.models`: each worker's compute time against batch per
level, the ring all-reduce against size and workers, the per-step overhead); the job is replayed on
a simulated clock with the trainers' own controller (:mod:`.engine`); the records it writes are the
trainers' records, so ``summary.json`` and ``run.png`` come from the report code a real run uses.
``summary.json`` adds ``decision_ms`` (the controller's mean decision time, measured here),
``epoch_time_s`` and ``simulated`` (where the models came from).

With ``--workers N`` above the run's ``n``, worker ``j`` runs worker ``j mod n``'s models and
allocation (the run's level table repeated, as the quota tables tile it), the global batch and the
training set grow by ``N / n`` (the same local batches and steps per epoch: weak scaling), and the
all-reduce follows the ring model. The held-out metric is replayed from the run only when the global
batch is the run's (BSP's update does not depend on the split); otherwise it is null.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from omnilearn.config import JobConfig
from omnilearn.emulator.spec.plan import EmulationPlan, worker_target
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.records import EVAL
from omnilearn.simulate.engine import Recorder, mean, run_replay
from omnilearn.simulate.models import RunModels, load_run

__all__ = ["simulate", "load_run"]
PLOTTED = 32  # workers drawn in run.png


def scaled_job(models: RunModels, workers: int, policy: str | None, epochs: int | None) -> tuple[JobConfig, EmulationPlan]:
    """The run's job for ``workers`` workers (its models and allocations repeated in turn)."""
    cfg, plan, n = models.job.config, models.job.plan, models.workers
    if workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    train = dataclasses.replace(cfg.train, global_batch=cfg.train.global_batch * workers // n,
                                epochs=epochs if epochs is not None else cfg.train.epochs)
    if train.epochs < 1:
        raise UserError(f"--epochs {train.epochs}: must be at least 1")
    control = dataclasses.replace(cfg.control, policy=policy) if policy else cfg.control
    new = dataclasses.replace(cfg, workers=workers, train=train, control=control)
    targets = tuple(worker_target("bsp", r) for r in range(workers))
    old = plan.targets

    def tiled(per: dict[str, Any]) -> dict[str, Any]:
        return {tg: per[old[r % n]] for r, tg in enumerate(targets) if old[r % n] in per}

    scaled = EmulationPlan(mode=plan.mode, targets=targets, levels={lv: tiled(a) for lv, a in plan.levels.items()},
                           schedule=plan.schedule, links={}, stalls={lv: tiled(s) for lv, s in plan.stalls.items()})
    return new, scaled


def simulate(replay: Path, out: Path, workers: int | None = None, policy: str | None = None,
             epochs: int | None = None, seed: int = 0, noise: float = 1.0, calibration: Path | None = None,
             figures: bool = True) -> dict[str, Any]:
    """Predict the run ``replay``'s job (for ``workers`` workers, ``policy``, ``epochs``) into ``out``;
    returns the summary written to ``out/summary.json``."""
    from omnilearn.report.plot import plot_run
    from omnilearn.report.summary import summarize

    models = load_run(replay, calibration)
    n = workers or models.workers
    cfg, plan = scaled_job(models, n, policy, epochs)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: exists and is not empty")
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=out.resolve(), backend="simulated")
    job.save()
    same_batch = cfg.train.global_batch == models.job.config.train.global_batch
    evals = {r["epoch"]: r for r in models.records[0] if r.get("kind") == EVAL} if same_batch else None
    rec = Recorder(n)
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 3)

    result = run_replay(models, cfg, plan, rec, seed, noise, evals)
    seconds = {"replay": lap()}
    rec.save(out)
    summary = summarize(out)
    seconds["records_and_summary"] = lap()
    summary["decision_ms"] = mean(result.decision_ms)
    summary["epoch_time_s"] = round(result.train_time_s / max(summary["epochs_done"], 1e-9), 4)
    summary["simulated"] = {
        "replay": str(Path(replay).resolve()), "measured_workers": models.workers, "seed": seed, "noise": noise,
        "decisions": len(result.decision_ms), "decision_ms_max": round(max(result.decision_ms), 4)
        if result.decision_ms else None, "observe_ms": mean(result.observe_ms),
        "allreduce": {"model": models.allreduce.source, "seconds": round(models.allreduce.seconds(n), 6)},
        "step_overhead_s": round(models.overhead_s, 4), "eval_s": round(models.eval_s, 4),
        "compute_models": {f"worker{r + 1}@{lv}": {"a_ms": round(m.a * 1e3, 3), "c_ms": round(m.c * 1e3, 4),
                                                   "sigma": round(m.sigma, 4), "steps": m.steps}
                           for (r, lv), m in sorted(models.compute.items())},
        "common_sigma": {lv: round(v, 4) for lv, v in sorted(models.common.items())},
    }
    if figures:  # a figure of a thousand lines says nothing: the first PLOTTED workers
        drawn = f"the first {PLOTTED} of " if n > PLOTTED else ""
        plot_run(out, min(n, PLOTTED), f"simulated · {cfg.control.policy} · {drawn}{n} workers · schedule "
                                       f"{plan.schedule.name}")
        seconds["figure"] = lap()
    summary["simulated"]["seconds"] = seconds
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    return summary
