"""Restarts: a job whose worker is lost starts again from its last checkpoint, up to ``fault.max_restarts``.

The whole rank set restarts (same workers, same cgroups or containers set up afresh) through the
same launcher call, with the job file's ``resume`` set: each rank loads the run folder's checkpoint,
or, before the first one, starts over with the failed attempt's metrics cut. torch.distributed's
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

from omnilearn.files import read_records
from omnilearn.jobfile import JobSpec
from omnilearn.launch.failures import WorkerFailed
from omnilearn.metrics import restarts_path


def record_restart(out_dir: Path, cause: str, attempt: int, checkpoint: Path) -> dict[str, Any]:
    """Append one restart to ``OUT/restarts.jsonl``; returns the record."""
    record = {"time": time.time(), "cause": cause, "attempt": attempt,
              "checkpoint_time": checkpoint.stat().st_mtime if checkpoint.is_file() else None}
    with open(restarts_path(out_dir), "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def read_restarts(out_dir: Path) -> list[dict[str, Any]]:
    return read_records(restarts_path(out_dir))


def run_with_restarts(job: JobSpec, run_once: Callable[[JobSpec], None], console: Console, label: str) -> None:
    """``run_once(job)`` to the end, restarting it after a worker loss (WorkerFailed) while restarts are
    left; a user error, an interrupt, a failure that is not ``restartable`` (the Docker daemon went
    away) or the last failure is raised."""
    from omnilearn.train.checkpoint import checkpoint_path

    limit = job.config.fault.max_restarts
    attempt = 0
    while True:
        try:
            run_once(job)
            return
        except WorkerFailed as e:
            if attempt >= limit or not e.restartable:
                raise
            attempt += 1
            cause = str(e).split(";")[0].splitlines()[0]
            path = checkpoint_path(job.out_dir, job.config.mode)
            record_restart(job.out_dir, cause, attempt, path)
            where = f"its checkpoint {path}" if path.is_file() else "the start (no checkpoint yet)"
            console.print(f"{label}: {cause}; restarting from {where} (restart {attempt} of {limit})",
                          style="yellow", markup=False)
            job.resume = True
