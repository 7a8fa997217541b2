"""The ``omnilearn`` command line.

    omnilearn run [--config FILE] [--compare] [--hl HL8] ...   train a job (the main command)
    omnilearn bench --out DIR [--matrix FILE]                 a matrix of jobs, tabulated (resumable)
    omnilearn worker --job OUT/job.json                        one rank (used by the launchers)
    omnilearn levels                                           the HL tables, as applied on this host
    omnilearn report OUT                                       re-summarize a finished run
    omnilearn cleanup                                          remove cgroups and namespaces left by killed runs
    omnilearn calibrate --out DIR                              measure this host; a calibrated level table
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.errors import UserError


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 130)  # logs and CI get whole tables


def _overrides(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """Named flags are shorthands for config keys; ``--set`` reaches any key."""
    out = [config.parse_assignment(s) for s in args.set or []]
    named = {
        "mode": args.mode, "workers": args.workers, "train.epochs": args.epochs,
        "train.global_batch": args.global_batch, "control.policy": args.policy,
        "emulation.backend": args.backend, "emulation.hl": args.hl, "emulation.schedule": args.schedule,
        "model.name": args.model, "data.name": args.dataset,
    }
    out += [(k, v) for k, v in named.items() if v is not None]
    if getattr(args, "tensorboard", False):
        out.append(("report.tensorboard", True))
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from omnilearn.emulator.plan import build_plan
    from omnilearn.launch.failures import WorkerFailed
    from omnilearn.launch.job import check_launcher, run_job, with_policy
    from omnilearn.launch.runfolder import prepare_out
    from omnilearn.report.plot import plot_compare
    from omnilearn.report.summary import compare
    from omnilearn.report.table import print_report, targets_line
    from omnilearn.train.preflight import preflight

    cfg = config.build(args.config, _overrides(args))
    plan = build_plan(cfg)  # every table, schedule and cpuset check happens here, before anything starts
    check_launcher(cfg, plan)
    facts = preflight(cfg)  # data present (or downloaded once), model builds, batch fits the data
    out = prepare_out(args.out, args.force)  # a new or replaceable folder, marked as a run's
    console = _console()
    policies = ["uniform", "dynamic"] if args.compare else [cfg.control.policy]
    runs: dict[str, Path] = {}
    summaries: dict[str, dict[str, Any]] = {}
    console.print("[bold]omnilearn[/] " + escape(
        f"{cfg.mode.upper()} · {cfg.workers} workers · {cfg.model.name} "
        f"({facts['parameters'] / 1e6:.1f}M parameters) on {cfg.data.name} ({facts['train_samples']} "
        f"training samples, {facts['steps_per_epoch']} steps/epoch) · B={cfg.train.global_batch} · "
        f"schedule {plan.schedule.name} ({' → '.join(plan.schedule.levels)}) · allocation {plan.mode} · "
        f"results in {out}"))
    for policy in policies:
        run_dir = out / policy if args.compare else out
        try:
            summaries[policy] = run_job(with_policy(cfg, policy), plan, run_dir, console, label=policy,
                                        show_progress=not args.no_progress)
        except WorkerFailed as e:
            console.print(str(e), style="red", markup=False)  # worker logs hold brackets rich would parse
            return 1
        runs[policy] = run_dir
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


def cmd_bench(args: argparse.Namespace) -> int:
    from omnilearn.launch.bench import run_bench
    from omnilearn.launch.matrix import DEFAULT_MATRIX, load_matrix

    matrix = load_matrix(Path(args.matrix) if args.matrix else DEFAULT_MATRIX, _overrides_for_bench(args))
    return run_bench(matrix, Path(args.out), _console(), show_progress=not args.no_progress)


def _overrides_for_bench(args: argparse.Namespace) -> list[tuple[str, Any]]:
    out = [config.parse_assignment(s) for s in args.set or []]
    return out + ([("report.tensorboard", True)] if args.tensorboard else [])


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
    return 0


def _job_for_cluster(args: argparse.Namespace):
    """Config, plan and saved job file for ``cluster up`` (the same checks as ``run``)."""
    from omnilearn.emulator.plan import build_plan
    from omnilearn.jobfile import JobSpec, new_job_id
    from omnilearn.launch.job import check_launcher
    from omnilearn.launch.runfolder import prepare_out
    from omnilearn.train.preflight import preflight

    overrides = _overrides(args) + [("emulation.backend", "docker")]
    cfg = config.build(args.config, overrides)
    plan = build_plan(cfg)
    check_launcher(cfg, plan)
    preflight(cfg)
    out = prepare_out(args.out, args.force)  # a new or replaceable folder, marked as a run's
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=out.resolve(), backend="docker")
    job.save()
    return job


def cmd_cluster(args: argparse.Namespace) -> int:

    from omnilearn.jobfile import JobSpec
    from omnilearn.launch.docker import swarm

    console = _console()
    if args.cluster_command == "up":
        job = _job_for_cluster(args)
        swarm.up(job, console)
        console.print(f"job {job.job_id} running in {job.out_dir}; apply HL changes with "
                      f"`omnilearn toggle --out {job.out_dir}` (scripts/exec_HL.sh)", markup=False)
        return 0
    if args.cluster_command == "status":
        out = Path(args.out)
        for row in swarm.status(out):
            console.print(row, markup=False)
        return 0
    # down: by run folder, or by job id after the folder is gone
    if args.job:
        job_id, hosts = args.job, {}
    else:
        if not args.out or not (Path(args.out) / "job.json").is_file():
            raise UserError("cluster down needs --out RUN_DIR (with its job.json) or --job JOB_ID")
        job = JobSpec.load(Path(args.out) / "job.json", out_dir=Path(args.out))
        job_id, hosts = job.job_id, job.config.docker.hosts
    removed = swarm.down(job_id, hosts, leave_swarm=args.leave_swarm)
    console.print("removed: " + (", ".join(removed) if removed else "nothing (already gone)"), markup=False)
    return 0


def cmd_toggle(args: argparse.Namespace) -> int:
    """The host-side toggler for a job whose containers were started by ``cluster up``."""
    import threading

    from omnilearn.emulator.backends.docker import DockerBackend
    from omnilearn.emulator.toggler import Toggler, toggler_lock
    from omnilearn.jobfile import JobSpec
    from omnilearn.launch.docker import swarm

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = Path(args.out)
    if not (out / "job.json").is_file():
        raise UserError(f"--out {out}: not a run folder (no job.json)")
    job = JobSpec.load(out / "job.json", out_dir=out)
    default, remote = swarm.clients_for(job)
    backend = DockerBackend(job.job_id, default, clients=remote)
    console = _console()
    stop = threading.Event()
    with toggler_lock(job.log_dir):
        toggler = Toggler(job.log_dir, backend, job.plan, console=console, links=swarm.link_applier(job, backend))
        console.print(f"toggler for job {job.job_id}: watching {job.log_dir}/cpu-*.log (Ctrl-C to stop)",
                      markup=False)
        try:
            while not stop.is_set():
                toggler.poll_once()
                if args.until_done and all(r["status"] in ("exited", "dead", "absent")
                                           for r in swarm.status(out)):
                    toggler.poll_once()
                    break
                stop.wait(args.interval)
        except KeyboardInterrupt:
            toggler.poll_once()
        finally:
            backend.close()  # a container a stall paused runs again
    return 0


def cmd_levels(args: argparse.Namespace) -> int:
    from omnilearn.emulator.levels import host_cpus, load_tables, resolve_level

    tables = load_tables()
    host = host_cpus()
    out: dict[str, Any] = {}
    for mode, table in tables.items():
        rows = {}
        for level in table.levels:
            workers, server = resolve_level(table, level, table.workers, args.allocation, host)
            rows[level] = {"workers": [a.describe() for a in workers],
                           **({"server": server.describe()} if server else {})}
        out[mode] = rows
    print(json.dumps({"host_cpus": len(host), "allocation": args.allocation, "levels": out}, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:

    from omnilearn.report.summary import summarize
    from omnilearn.report.table import print_report

    out = Path(args.out)
    if not (out / "job.json").is_file():
        raise UserError(f"{out}: not a run folder (no job.json)")
    print_report(_console(), {"run": summarize(out)}, None)
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from omnilearn.emulator.backends.cgroupfs import sweep_stale
    from omnilearn.emulator.netns import sweep_netns

    removed = sweep_stale() + sweep_netns()  # cgroups, and the namespaces (veths, bridge, IFBs) of links
    print("\n".join(removed) if removed else "nothing to clean")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from omnilearn.launch.calibrate import calibrate

    calibrate(config.build(args.config, _overrides_for_bench(args)), Path(args.out), _console(), args.rounds, args.seconds)
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    """``omnilearn image build|base|status``: the Docker images the container launcher runs."""
    from omnilearn.launch.docker.base_image import build_base_image
    from omnilearn.launch.docker.images import ensure_images, image_status

    def say(line: str) -> None:
        print(line, flush=True)

    if args.image_command == "build":
        ca: Path | str = args.ca_bundle if args.ca_bundle is not None else "auto"
        result = ensure_images(args.tag, base_image=args.base, ca_bundle=ca, force=args.force, on_log=say)
        if result.worker_build is None:
            print(f"{result.worker_image}: up to date (base {result.base_image})")
        else:
            b = result.worker_build
            print(f"{b.tag}: built in {b.seconds:.0f} s, {b.size_bytes / 1e9:.2f} GB (base {result.base_image}; "
                  f"{result.reason})")
    elif args.image_command == "base":
        build_base_image(args.tag, suite=args.suite, mirror=args.mirror, force=args.force, on_log=say)
    else:
        for line in image_status(args.tag):
            print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnilearn", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train a job under emulated heterogeneity")
    r.add_argument("--config", help="job config (YAML); defaults apply to keys it leaves out")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any config key, e.g. train.lr=0.1")
    r.add_argument("--mode", choices=["bsp", "asp"])
    r.add_argument("--workers", type=int)
    r.add_argument("--epochs", type=int)
    r.add_argument("--global-batch", type=int)
    r.add_argument("--policy", help="uniform | static | dynamic | ddp (plain DistributedDataParallel, BSP)")
    r.add_argument("--hl", help="pin one heterogeneity level (HL1, HL2, HL4, HL8) for the whole run")
    r.add_argument("--schedule", help="named schedule (configs/schedules.yaml) or a YAML file")
    r.add_argument("--backend", choices=list(config.BACKENDS))
    r.add_argument("--model")
    r.add_argument("--dataset")
    r.add_argument("--compare", action="store_true", help="run uniform then dynamic under the same schedule")
    r.add_argument("--out", help="run folder (default: a new folder under runs/)")
    r.add_argument("--force", action="store_true", help="replace an existing --out folder (only a run folder)")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--tensorboard", action="store_true",
                   help="write TensorBoard scalars to OUT/tensorboard while the job runs (report.tensorboard)")
    r.set_defaults(func=cmd_run)

    bn = sub.add_parser("bench", help="run a matrix of jobs (policies x levels x modes x seeds) and tabulate it")
    bn.add_argument("--out", required=True, help="results folder; a second call skips the cells already done")
    bn.add_argument("--matrix", help="matrix file (YAML; default configs/bench/default.yaml)")
    bn.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every cell")
    bn.add_argument("--tensorboard", action="store_true", help="TensorBoard scalars in every cell's folder")
    bn.add_argument("--no-progress", action="store_true", help="no per-run progress line (the matrix bar stays)")
    bn.set_defaults(func=cmd_bench)

    w = sub.add_parser("worker", help="run one rank of a job (started by the launchers)")
    w.add_argument("--job", required=True, help="the job file written by the launcher")
    w.add_argument("--out-dir", help="the run folder as this process sees it (default: the job file's)")
    w.add_argument("--data-root", help="the data folder as this process sees it (default: data.root)")
    w.set_defaults(func=cmd_worker)

    lv = sub.add_parser("levels", help="print the heterogeneity levels as allocated on this host")
    lv.add_argument("--allocation", choices=["quota", "cpuset", "none"], default="quota")
    lv.set_defaults(func=cmd_levels)

    rp = sub.add_parser("report", help="summarize a finished run folder again")
    rp.add_argument("out")
    rp.set_defaults(func=cmd_report)

    c = sub.add_parser("cleanup", help="remove cgroups and network namespaces left behind by killed runs")
    c.set_defaults(func=cmd_cleanup)

    ca = sub.add_parser("calibrate", help="measure this host for a job; write DIR/calibration.yaml, a calibrated "
                                          "level table (emulation.calibration)")
    ca.add_argument("--out", required=True, help="folder for calibration.yaml")
    ca.add_argument("--config", help="the job to calibrate for (default: the demo job)")
    ca.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. workers=3")
    ca.add_argument("--rounds", type=int, default=3, help="concurrent checks per level (each corrects the last)")
    ca.add_argument("--seconds", type=float, default=3.0, help="of steps per measurement (a check takes twice)")
    ca.set_defaults(func=cmd_calibrate, tensorboard=False)

    cl = sub.add_parser("cluster", help="Docker Swarm containers for a job: up | status | down")
    cl_sub = cl.add_subparsers(dest="cluster_command", required=True)
    cu = cl_sub.add_parser("up", help="start one container per rank with the first level's allocation")
    for flag in ("--config", "--mode", "--hl", "--schedule", "--policy", "--model", "--dataset", "--out"):
        cu.add_argument(flag)
    cu.add_argument("--set", action="append", metavar="KEY=VALUE")
    cu.add_argument("--workers", type=int)
    cu.add_argument("--epochs", type=int)
    cu.add_argument("--global-batch", type=int)
    cu.add_argument("--force", action="store_true")
    cu.set_defaults(func=cmd_cluster, backend=None)
    cs = cl_sub.add_parser("status", help="the job's containers and their CPU limits")
    cs.add_argument("--out", required=True)
    cs.set_defaults(func=cmd_cluster)
    cd = cl_sub.add_parser("down", help="remove the job's containers and network (also after a crash)")
    cd.add_argument("--out")
    cd.add_argument("--job", help="job id (label omnilearn.job), when the run folder is gone")
    cd.add_argument("--leave-swarm", action="store_true", help="also leave the swarm if no job network remains")
    cd.set_defaults(func=cmd_cluster)

    tg = sub.add_parser("toggle", help="host-side toggler: apply the workers' CPU requests to their containers")
    tg.add_argument("--out", required=True, help="the job's run folder (holds job.json and logs/)")
    tg.add_argument("--interval", type=float, default=0.2)
    tg.add_argument("--until-done", action="store_true", help="stop when every container of the job has exited")
    tg.set_defaults(func=cmd_toggle)

    from omnilearn.launch.docker.base_image import DEFAULT_SUITE, LOCAL_BASE_IMAGE
    from omnilearn.launch.docker.images import DEFAULT_BASE_IMAGE, WORKER_IMAGE

    im = sub.add_parser("image", help="build the Docker images the container launcher runs")
    im_sub = im.add_subparsers(dest="image_command", required=True)
    b = im_sub.add_parser("build", help="build the worker image if missing or stale (and a base if none can be "
                                        "pulled)")
    b.add_argument("--base", help=f"base image (default: {DEFAULT_BASE_IMAGE} if it can be had, else "
                                  f"{LOCAL_BASE_IMAGE} made with debootstrap)")
    b.add_argument("--ca-bundle", type=Path,
                   help="PEM file of extra CAs the image must trust, for a TLS-inspecting proxy (default: the "
                        "bundle named by OMNILEARN_CA_BUNDLE or PIP_CERT, if any)")
    b.add_argument("--tag", default=WORKER_IMAGE, help=f"worker image tag (default {WORKER_IMAGE})")
    b.add_argument("--force", action="store_true", help="rebuild even when the labels say it is up to date")
    s = im_sub.add_parser("base", help=f"make the Debian base image with debootstrap (default tag {LOCAL_BASE_IMAGE})")
    s.add_argument("--tag", default=LOCAL_BASE_IMAGE)
    s.add_argument("--suite", default=DEFAULT_SUITE, help=f"Debian/Ubuntu suite (default {DEFAULT_SUITE})")
    s.add_argument("--mirror", help="package mirror (default: debootstrap's)")
    s.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    st = im_sub.add_parser("status", help="show the images and whether the worker image matches this checkout")
    st.add_argument("--tag", default=WORKER_IMAGE)
    im.set_defaults(func=cmd_image)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack: for a job that seems stuck
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        return args.func(args)
    except UserError as e:
        print(f"omnilearn: error: {e}", file=sys.stderr)
        return UserError.exit_status
    except KeyboardInterrupt:
        print("omnilearn: interrupted; workers stopped and cgroups removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
