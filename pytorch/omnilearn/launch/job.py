"""One run of a job, from a checked config to ``summary.json`` and ``run.png``.

The same path for ``omnilearn run`` (once, or once per policy with ``--compare``) and for every cell
of ``omnilearn bench``: a cell is an ordinary run folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console

from omnilearn.config import JobConfig
from omnilearn.emulator.plan import EmulationPlan
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.report.plot import plot_run
from omnilearn.report.summary import summarize


def with_policy(cfg: JobConfig, policy: str) -> JobConfig:
    return dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, policy=policy))


def check_launcher(cfg: JobConfig) -> None:
    """The launcher the config names can start workers here (else one clear UserError)."""
    if cfg.emulation.backend == "docker":
        from omnilearn.launch.docker.daemon import daemon_client
        daemon_client()  # no daemon: one clear message before anything is made
    else:
        from omnilearn.launch.local import check_local_prerequisites
        check_local_prerequisites()


def run_job(cfg: JobConfig, plan: EmulationPlan, run_dir: Path, console: Console, label: str,
            show_progress: bool = True) -> dict[str, Any]:
    """Train the job in ``run_dir`` (which must be new or empty) and summarize it; returns the summary.

    Raises WorkerFailed (a worker died) or UserError (a worker found a user error).
    """
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=run_dir.resolve(), backend="")
    live = contextlib.nullcontext()
    if cfg.report.tensorboard:
        from omnilearn.launch.tensorboard import LiveTensorBoard
        live = LiveTensorBoard(job)
    with live as board:
        if cfg.emulation.backend == "docker":
            from omnilearn.launch.docker.swarm import run_docker
            run_docker(job, console, label=label, show_progress=show_progress)
        else:
            from omnilearn.launch.local import run_local
            run_local(job, console, label=label, show_progress=show_progress)
        if cfg.mode == "asp":  # after the emulation ends: scoring takes no worker's CPU
            console.print(f"{label}: scoring the server's snapshots on the held-out split", markup=False)
        summary = summarize(run_dir)
        if board is not None:
            board.update()  # ASP's held-out scores exist only now
    plot_run(run_dir, cfg.workers, f"{label} · {cfg.model.name}/{cfg.data.name} · schedule "
             f"{plan.schedule.name} · backend {job.backend}")
    return summary
