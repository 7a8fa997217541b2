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
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.trace import TRACE_PREFIX
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec, new_job_id


def with_policy(cfg: JobConfig, policy: str) -> JobConfig:
    return dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, policy=policy))


def check_launcher(cfg: JobConfig, plan: EmulationPlan | None = None) -> None:
    """The launcher the config names can start workers here, with the plan's links (else one clear
    UserError: no daemon, links without root, a delay on a kernel without sch_netem, ...)."""
    if cfg.emulation.backend == "docker":
        from omnilearn.emulator.backends.dockerd import daemon_client
        daemon_client()  # no daemon: one clear message before anything is made
    else:
        from omnilearn.launch.local import check_local_prerequisites
        check_local_prerequisites()
    if plan is not None and plan.links:
        from omnilearn.emulator.network.shaping import LinkShaper
        LinkShaper().check_all(plan.links)  # root, tc, and every link this kernel can shape
        remote = sorted({t for per in plan.links.values() for t in per} & set(cfg.docker.hosts))
        if cfg.emulation.backend == "docker" and remote:
            raise UserError(f"{cfg.source}: emulation.links: {', '.join(remote)} run on another daemon "
                            f"(docker.hosts): a link is shaped on this host's end of a container's veth; "
                            f"give links only to targets on this host")


def resumed_members(run_dir: Path, cfg: JobConfig) -> list[int] | None:
    """The ranks a stopped run went on with (its checkpoint's slots), when it had lost a worker for good."""
    from omnilearn.train.checkpoint import checkpoint_path, load, saved_slots

    path = checkpoint_path(run_dir, cfg.mode)
    if not path.is_file():
        return None
    slots = saved_slots(load(path, cfg))
    return slots if slots != list(range(cfg.workers + (1 if cfg.mode == "asp" else 0))) else None


def run_job(cfg: JobConfig, plan: EmulationPlan, run_dir: Path, console: Console, label: str,
            show_progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Train the job in ``run_dir`` (new or empty; with ``resume``, the folder of a stopped run) and
    summarize it; returns the summary. A lost worker restarts the job up to ``fault.max_restarts`` times.

    Raises WorkerFailed (a worker died) or UserError (a worker found a user error).
    """
    # Here, not at the top: scipy (the controllers) and matplotlib take a second of CPU that a launcher
    # spends while its fork server imports torch, not before it starts one (cli/run.py).
    from omnilearn.launch.restart import run_with_restarts
    from omnilearn.report.plot import plot_run, plot_trace
    from omnilearn.report.summary import summarize

    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=run_dir.resolve(), backend="", resume=resume,
                  members=resumed_members(run_dir, cfg) if resume else None)
    live = contextlib.nullcontext()
    if cfg.report.tensorboard:
        from omnilearn.observe.tensorboard import LiveTensorBoard
        from omnilearn.report.stragglers import WINDOW_STEPS, StragglerScores
        workers = len(plan.targets) - (1 if cfg.mode == "asp" else 0)
        live = LiveTensorBoard(job, stragglers=StragglerScores(workers, WINDOW_STEPS))
    with live as board:
        unreachable = None
        if cfg.emulation.backend == "docker":
            from omnilearn.launch.docker.daemon import unanswering as unreachable
            from omnilearn.launch.docker.swarm import run_docker as launch
        else:
            from omnilearn.launch.local import run_local as launch
        run_with_restarts(job, lambda j: launch(j, console, label=label, show_progress=show_progress),
                          console, label, unreachable)
        if cfg.mode == "asp":  # after the emulation ends: scoring takes no worker's CPU
            from omnilearn.train.evaluate import evaluate_snapshots
            console.print(f"{label}: scoring the server's snapshots on the held-out split", markup=False)
            evaluate_snapshots(job)  # the eval records the report reads
        summary = summarize(run_dir)
        if board is not None:
            board.update()  # ASP's held-out scores exist only now
    from omnilearn.train.workload import workload_name
    title = f"{label} · {workload_name(cfg)} · schedule {plan.schedule.name} · backend {job.backend}"
    plot_run(run_dir, cfg.workers, title)
    if plan.schedule.name.startswith(TRACE_PREFIX):
        plot_trace(run_dir, cfg.workers, title)
    return summary
