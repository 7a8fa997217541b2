"""Restarts: a job whose worker is lost starts again from its last checkpoint, up to ``fault.max_restarts``.

The whole rank set restarts (same workers, same cgroups or containers set up afresh) through the
same launcher call, with the job file's ``resume`` set: each rank loads the run folder's checkpoint,
or, before the first one, starts over with the failed attempt's metrics cut. A worker (BSP, or an
ASP worker, never the parameter server) lost ``fault.drop_after`` attempts in a row is taken to be unable to come back (a broken node): the job
goes on with the survivors (:attr:`~omnilearn.jobfile.JobSpec.members`), re-ranked, each keeping its
target, allocations and files; the global batch is re-split among them from the checkpoint's
batches. BSP's data order stays that of the uninterrupted run (each step takes the same global batch
of the same permutation); an ASP survivor goes on in its own data stream. torch.distributed's
elastic agent is not used: it starts the worker processes itself, while each rank must be placed in
its own cgroup (or network namespace, or container) as it starts, which the launchers do.

Every restart and every ``--resume`` is one line of ``OUT/restarts.jsonl`` (time, cause, attempt, the
checkpoint it went on from); the summary lists them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from omnilearn.control.controller import configured_bounds
from omnilearn.files import read_records
from omnilearn.jobfile import JobSpec
from omnilearn.launch.failures import WorkerFailed
from omnilearn.metrics import restarts_path


def record_restart(out_dir: Path, cause: str, attempt: int, checkpoint: Path, workers: list[str] | None = None,
                   dropped: list[str] | None = None) -> dict[str, Any]:
    """Append one restart to ``OUT/restarts.jsonl`` (``workers``: the targets it goes on with; ``dropped``:
    those it goes on without from now on); returns the record."""
    record = {"time": time.time(), "cause": cause, "attempt": attempt,
              "checkpoint_time": checkpoint.stat().st_mtime if checkpoint.is_file() else None,
              "workers": workers, "dropped": dropped or []}
    with open(restarts_path(out_dir), "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def read_restarts(out_dir: Path) -> list[dict[str, Any]]:
    return read_records(restarts_path(out_dir))


def without_lost(job: JobSpec, slot: int | None, streak: int) -> tuple[list[int] | None, str]:
    """The survivors to go on with when the worker in ``slot`` was lost ``streak`` attempts in a row and
    cannot come back (``fault.drop_after``), else None; and why not, when it was its turn but it may not."""
    if slot is None or not job.config.fault.drop_after or streak < job.config.fault.drop_after:
        return None, ""
    return survivors_without(job, [slot])


def survivors_without(job: JobSpec, lost: list[int]) -> tuple[list[int] | None, str]:
    """The ranks' slots without ``lost``, or None and why the job may not go on without them."""
    cfg = job.config
    if cfg.mode == "asp" and 0 in lost:
        return None, "the parameter server cannot be left behind"
    survivors = [s for s in job.slots if s not in lost]
    workers = len(survivors) - (1 if cfg.mode == "asp" else 0)
    if workers < cfg.fault.min_workers:
        return None, f"fewer than fault.min_workers ({cfg.fault.min_workers}) would be left"
    batch = cfg.train.global_batch
    bounds = configured_bounds(cfg.control, batch, workers)
    if not bounds.feasible(batch):
        return None, (f"{workers} workers cannot hold the global batch {batch} within control.max_batch "
                      f"{max(bounds.max_batch)}")
    return survivors, ""


def run_with_restarts(job: JobSpec, run_once: Callable[[JobSpec], None], console: Console, label: str,
                      unreachable: Callable[[JobSpec], list[int]] | None = None) -> None:
    """``run_once(job)`` to the end, restarting it after a worker loss (WorkerFailed) while restarts are
    left; a user error, an interrupt, a failure that is not ``restartable`` (the Docker daemon went
    away) or the last failure is raised. A worker lost ``fault.drop_after`` attempts in a row cannot
    come back: the next attempt goes on with the survivors, re-ranked (its metrics cut back to the
    checkpoint they go on from). ``unreachable(job)``: the workers that cannot come back now, asked after
    a failure (Docker: those on another host whose daemon does not answer); the next attempt goes on
    without them."""
    from omnilearn.train.checkpoint import checkpoint_path, cut_lost_worker

    limit = job.config.fault.max_restarts
    attempt, streak, last_lost = 0, 0, None
    while True:
        try:
            run_once(job)
            return
        except WorkerFailed as e:
            if attempt >= limit or not e.restartable:
                raise
            attempt += 1
            streak = streak + 1 if e.slot is not None and e.slot == last_lost else 1
            last_lost = e.slot
            cause = str(e).split(";")[0].splitlines()[0]
            path = checkpoint_path(job.out_dir, job.config.mode)
            gone = e.gone or (unreachable(job) if unreachable is not None else [])
            if gone:  # their host is gone: they cannot come back, whatever fault.drop_after says
                survivors, kept_because = survivors_without(job, gone)
                if survivors is None:
                    console.print(f"{label}: cannot go on without {', '.join(job.plan.targets[s] for s in gone)}: "
                                  f"{kept_because}", style="red", markup=False)
                    raise
                lost, why = gone, "their daemon does not answer"
            else:
                survivors, kept_because = without_lost(job, e.slot, streak)
                lost, why = [e.slot] if e.slot is not None else [], f"lost {job.config.fault.drop_after} times in a row"
            dropped: list[str] = []
            if survivors is not None:
                for slot in lost:
                    cut_lost_worker(job.out_dir, job.config, slot)
                dropped = [job.plan.targets[s] for s in lost]
                job.members, streak, last_lost = survivors, 0, None
            targets = [job.plan.targets[s] for s in job.slots]
            record_restart(job.out_dir, cause, attempt, path, workers=targets, dropped=dropped)
            where = f"its checkpoint {path}" if path.is_file() else "the start (no checkpoint yet)"
            how = ""
            if dropped:
                how = f" without {', '.join(dropped)} ({why}), with the {len(targets)} survivors {', '.join(targets)}"
            elif kept_because:
                how = f" with every worker ({job.plan.targets[e.slot or 0]} lost again, but {kept_because})"
            console.print(f"{label}: {cause}; restarting from {where}{how} (restart {attempt} of {limit})",
                          style="yellow", markup=False)
            job.resume = True
