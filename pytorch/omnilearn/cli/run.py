"""``omnilearn run``, ``bench`` and ``worker``: training jobs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.cli.common import bench_overrides, flag_overrides, make_console
from omnilearn.errors import UserError


def cmd_run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from omnilearn.emulator.spec.plan import build_plan
    from omnilearn.launch.failures import WorkerFailed
    from omnilearn.launch.forked import forks, preload, warm
    from omnilearn.launch.job import check_launcher, run_job, with_policy
    from omnilearn.launch.runfolder import check_out, prepare_out

    if args.resume:
        cfg, out = resume_config(args)
    else:
        cfg = config.build(args.config, flag_overrides(args))
    policies = compare_policies(args.compare) if args.compare else [cfg.control.policy]
    plan = build_plan(cfg)  # every table, schedule and cpuset check happens here, before anything starts
    check_launcher(cfg, plan)
    if not args.resume:
        check_out(args.out, args.force)  # before the preflight: a refused folder is said at once
    if cfg.emulation.backend != "docker" and forks(plan):
        warm(preload(cfg.model.name, cfg.data.name))  # the workers' fork server imports torch while the preflight runs
    from omnilearn.train.preflight import preflight  # torch: only once the config and flags passed

    facts = preflight(cfg)  # data present (or downloaded once), model builds, batch fits the data
    if not args.resume:
        out = prepare_out(args.out, args.force)  # a new or replaceable folder, marked as a run's
    console = make_console()
    runs: dict[str, Path] = {}
    summaries: dict[str, dict[str, Any]] = {}
    console.print("[bold]omnilearn[/] " + escape(
        f"{cfg.mode.upper()} · {cfg.workers} workers · {facts['name']} "
        f"({facts['parameters'] / 1e6:.1f}M parameters, {facts['train_samples']} "
        f"training samples, {facts['steps_per_epoch']} steps/epoch) · B={cfg.train.global_batch} · "
        f"schedule {plan.schedule.name} ({' → '.join(plan.schedule.levels)}) · allocation {plan.mode} · "
        f"results in {out}"))
    for policy in policies:
        run_dir = out / policy if args.compare else out
        try:
            summaries[policy] = run_job(with_policy(cfg, policy), plan, run_dir, console, label=policy,
                                        show_progress=not args.no_progress, resume=bool(args.resume))
        except WorkerFailed as e:
            # Worker logs hold brackets rich would parse; soft wrap keeps the message's commands whole.
            console.print(str(e), style="red", markup=False, soft_wrap=True)
            return 1
        runs[policy] = run_dir
    from omnilearn.report.plot import plot_compare  # matplotlib: after the runs (launch/job.py)
    from omnilearn.report.summary import compare
    from omnilearn.report.table import print_report, targets_line

    result = None
    if args.compare:
        result = compare(out, runs, cfg.report.target, cfg.report.target_fraction)
        plot_compare(runs, summaries, out / "compare.png")
    print_report(console, summaries, result)
    if result:
        console.print(targets_line(result["targets"]), markup=False)
    files = [str(out / "compare.json")] if args.compare else []
    files += [str(d / "summary.json") for d in runs.values()] + [str(d / "run.png") for d in runs.values()]
    if cfg.report.tensorboard:
        files += [f"{d / 'tensorboard'} (tensorboard --logdir {d / 'tensorboard'})" for d in runs.values()]
    console.print("results: " + ", ".join(files), markup=False)
    return 0


def resume_config(args: argparse.Namespace) -> tuple[config.JobConfig, Path]:
    """``--resume OUT``: the run folder (a marked one, with a job file and a checkpoint) and its config
    (the job file's, or ``--config`` and the flags given); a checkpoint of another config is refused."""
    import json

    from omnilearn.launch.restart import record_restart
    from omnilearn.launch.runfolder import resume_out
    from omnilearn.train import checkpoint

    if args.compare or args.out or args.force:
        raise UserError("--resume OUT continues one run in its own folder: give no --compare, --out or --force")
    out = resume_out(args.resume)
    if args.config:
        cfg = config.build(args.config, flag_overrides(args))
    else:
        data = json.loads((out / "job.json").read_text())["config"]
        for key, value in flag_overrides(args):
            config.set_key(data, key, value)
        cfg = config.from_dict(data, f"{out / 'job.json'}" + (" (with command-line overrides)"
                                                             if flag_overrides(args) else "")).validate()
    path = checkpoint.checkpoint_path(out, cfg.mode)
    checkpoint.load(path, cfg)  # missing, unreadable or of another config: one clear message, exit 2
    record_restart(out, "resumed (--resume)", 0, path)
    return cfg, out


DEFAULT_COMPARE = "uniform,dynamic"


def compare_policies(text: str) -> list[str]:
    """``--compare`` (uniform, dynamic) or ``--compare uniform,dynamic,paper``: policies run in order."""
    known = (*config.POLICIES, *config.PEERS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    retired = [n for n in names if n in config.RETIRED]
    if retired:
        raise UserError(f"--compare: policy {retired[0]!r} is retired; its figures are in {config.RETIRED[retired[0]]}")
    unknown = [n for n in names if n not in known]
    if unknown or len(names) < 2 or len(set(names)) != len(names):
        raise UserError(f"--compare {text}: expected two or more different policies out of "
                        f"{', '.join(known)}, separated by commas")
    return names


def cmd_bench(args: argparse.Namespace) -> int:
    from omnilearn.experiments.matrix import DEFAULT_MATRIX, load_matrix

    matrix = load_matrix(Path(args.matrix) if args.matrix else DEFAULT_MATRIX, bench_overrides(args))
    from omnilearn.experiments.bench import run_bench  # torch (its preflight): only once the matrix passed

    return run_bench(matrix, Path(args.out), make_console(), show_progress=not args.no_progress)


def cmd_worker(args: argparse.Namespace) -> int:
    from omnilearn.jobfile import JobSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    job_path = Path(args.job)
    if not job_path.is_file():
        raise UserError(f"--job {job_path}: job file not found")
    job = JobSpec.load(job_path, out_dir=Path(args.out_dir) if args.out_dir else job_path.parent)
    if args.data_root:  # a container sees the host's data folder where the launcher mounted it
        job.config.data.root = args.data_root
    log = logging.getLogger("omnilearn.worker")
    log.info("job %s: rank %s of %s (%s, %s, %s), run folder %s", job.job_id, os.environ.get("RANK"),
             os.environ.get("WORLD_SIZE"), job.config.mode, job.config.control.policy, job.backend, job.out_dir)
    started = time.time()
    from omnilearn.train.lifecycle import watch_launcher
    watch_launcher()  # a worker never outlives its local launcher
    try:
        if job.config.mode == "bsp" and job.config.control.policy == "ddp":
            from omnilearn.train import ddp
            ddp.run(job)  # the peer: plain DistributedDataParallel with equal batches
        elif job.config.mode == "bsp":
            from omnilearn.train import bsp
            bsp.run(job)
        elif job.config.mode == "asp":
            from omnilearn.train import asp
            asp.run(job)  # rank 0: the parameter server; ranks 1..N: workers
        else:
            raise UserError(f"mode {job.config.mode!r} is not available in this version")
    except BaseException as e:  # noqa: BLE001 - every failure leaves the same way, below
        # A worker that fails after joining the process group must not run the interpreter's
        # normal exit: destroying a live gloo/RPC group from Python's finalizers can abort the
        # process (SIGABRT) and hide the status the launcher reports (2 for a user error).
        if isinstance(e, UserError):
            print(f"omnilearn: error: {e}", file=sys.stderr)
            status = UserError.exit_status
        elif isinstance(e, KeyboardInterrupt):
            status = 130
        elif isinstance(e, SystemExit):
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        else:
            import traceback
            traceback.print_exc()
            status = 1
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    log.info("job %s: rank %s finished after %.1f s", job.job_id, os.environ.get("RANK"), time.time() - started)
    # Everything is saved and the process group is gone: leave without the interpreter's teardown, which
    # would run at the worker's CPU allocation (seconds at a fraction of a CPU) while the launcher waits.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
