"""The ``omnilearn`` command line.

    omnilearn run [--config FILE] [--compare] [--hl HL8] ...   train a job (the main command)
    omnilearn bench --out DIR [--matrix FILE]                 a matrix of jobs, tabulated (resumable)
    omnilearn worker --job OUT/job.json                        one rank (used by the launchers)
    omnilearn levels                                           the HL tables, as applied on this host
    omnilearn report OUT                                       re-summarize a finished run
    omnilearn cleanup                                          remove what killed runs left (cgroups, namespaces, containers)
    omnilearn calibrate --out DIR                              measure this host; a calibrated level table
    omnilearn emulate --hl HL8 -- torchrun ... train.py        any command's ranks under emulated heterogeneity
    omnilearn emulate --hl HL8 --containers c1,c2 -- CMD       containers started with docker run, rank i the i-th
    omnilearn record [--out DIR] -- torchrun ... train.py      an unmodified DDP job's step times, nothing emulated
    omnilearn simulate --replay RUN --out DIR [--workers N]    predict a BSP job from a finished run's measurements
    omnilearn simulate --scenarios [FILE] --out DIR            the controllers against the oracle on known models
    omnilearn simulate --asp-scenarios [FILE] --out DIR        ASP's policies against a delay-free reference
    omnilearn cluster up | status | down --out OUT             a job's Docker Swarm containers, step by step
    omnilearn toggle --out OUT                                 the host-side toggler of a `cluster up` job
    omnilearn image build | base | status                      the Docker images the container launcher runs

Every command and flag: docs/reference/cli.md (generated from this parser by ``make docs``).
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.cli.manage import (
    cmd_calibrate,
    cmd_cleanup,
    cmd_cluster,
    cmd_image,
    cmd_levels,
    cmd_report,
    cmd_simulate,
    cmd_toggle,
    cmd_whatif,
)
from omnilearn.cli.run import DEFAULT_COMPARE, cmd_bench, cmd_run, cmd_worker
from omnilearn.errors import UserError


def cmd_emulate(args: argparse.Namespace) -> int:
    from omnilearn.launch.emulate import container_names, emulate
    from omnilearn.launch.local import check_local_prerequisites

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be at least 1")
    containers = container_names(args.containers, args.workers) if args.containers is not None else None
    if containers is None:
        check_local_prerequisites()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("emulate-%Y%m%d-%H%M%S")
    levels = Path(args.levels) if args.levels else None
    status = emulate(command, args.hl, args.schedule, args.workers, out, containers, args.tensorboard, levels)
    if containers is None:  # the timing module runs in the command's own processes, not in containers
        from omnilearn.launch.record import steps_line

        print(steps_line(out, "emulate"), file=sys.stderr)
    return status


def cmd_record(args: argparse.Namespace) -> int:
    from omnilearn.launch.record import record, steps_line

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    out = Path(args.out) if args.out else Path("runs") / time.strftime("record-%Y%m%d-%H%M%S")
    status = record(command, out)
    print(steps_line(out, "record"), file=sys.stderr)
    return status


class Shipped(tuple):
    """A flag's choices: the shipped policies, listed; a retired one also passes argparse, for the config's
    check to refuse it with the results file that holds its figures."""

    def __contains__(self, name: object) -> bool:
        return tuple.__contains__(self, name) or name in config.RETIRED


def _add_run(sub: Any) -> None:
    from omnilearn.control.policies import POLICIES

    r = sub.add_parser("run", help="train a job under emulated heterogeneity")
    r.add_argument("--config", help="job config (YAML); defaults apply to keys it leaves out")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any config key, e.g. train.lr=0.1")
    r.add_argument("--mode", choices=["bsp", "asp"])
    r.add_argument("--workers", type=int)
    r.add_argument("--epochs", type=int)
    r.add_argument("--global-batch", type=int)
    r.add_argument("--policy", choices=Shipped((*POLICIES, *config.PEERS)),
                   help="what each knows: docs/guide/compare-policies.md (ddp: plain DistributedDataParallel, BSP)")
    r.add_argument("--hl", help="pin one heterogeneity level (HL1, HL2, HL4, HL8) for the whole run")
    r.add_argument("--schedule", help="named schedule (configs/schedules.yaml) or a YAML file")
    r.add_argument("--backend", choices=list(config.BACKENDS))
    r.add_argument("--model")
    r.add_argument("--dataset")
    r.add_argument("--compare", nargs="?", const=DEFAULT_COMPARE, metavar="POLICY,POLICY,...",
                   help="run several policies under the same schedule, one after the other (default: "
                        "uniform,dynamic); speed-ups are against uniform")
    r.add_argument("--out", help="run folder (default: a new folder under runs/)")
    r.add_argument("--force", action="store_true", help="replace an existing --out folder (only a run folder)")
    r.add_argument("--resume", metavar="OUT", help="continue the stopped run in folder OUT from its checkpoint")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--tensorboard", action="store_true",
                   help="write TensorBoard scalars to OUT/tensorboard while the job runs (report.tensorboard)")
    r.set_defaults(func=cmd_run)


def _add_bench(sub: Any) -> None:
    bn = sub.add_parser("bench", help="run a matrix of jobs (policies x levels x modes x seeds) and tabulate it")
    bn.add_argument("--out", required=True, help="results folder; a second call skips the cells already done")
    bn.add_argument("--matrix", help="matrix file (YAML; default configs/bench/default.yaml)")
    bn.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every cell")
    bn.add_argument("--tensorboard", action="store_true", help="TensorBoard scalars in every cell's folder")
    bn.add_argument("--no-progress", action="store_true", help="no per-run progress line (the matrix bar stays)")
    bn.set_defaults(func=cmd_bench)


def _add_worker(sub: Any) -> None:
    w = sub.add_parser("worker", help="run one rank of a job (started by the launchers)")
    w.add_argument("--job", required=True, help="the job file written by the launcher")
    w.add_argument("--out-dir", help="the run folder as this process sees it (default: the job file's)")
    w.add_argument("--data-root", help="the data folder as this process sees it (default: data.root)")
    w.set_defaults(func=cmd_worker)


def _add_levels(sub: Any) -> None:
    lv = sub.add_parser("levels", help="print the heterogeneity levels as allocated on this host")
    lv.add_argument("--allocation", choices=["quota", "cpuset", "none"], default="quota")
    lv.set_defaults(func=cmd_levels)


def _add_report(sub: Any) -> None:
    rp = sub.add_parser("report", help="summarize a finished run folder, or a --compare folder, again")
    rp.add_argument("out")
    rp.set_defaults(func=cmd_report)


def _add_cleanup(sub: Any) -> None:
    c = sub.add_parser("cleanup", help="remove cgroups and network namespaces left behind by killed runs")
    c.set_defaults(func=cmd_cleanup)


def _add_calibrate(sub: Any) -> None:
    ca = sub.add_parser("calibrate", help="measure this host for a job; write DIR/calibration.yaml, a calibrated "
                                          "level table (emulation.calibration)")
    ca.add_argument("--out", required=True, help="folder for calibration.yaml")
    ca.add_argument("--config", help="the job to calibrate for (default: the demo job)")
    ca.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key, e.g. workers=3")
    ca.add_argument("--rounds", type=int, default=3, help="concurrent checks per level (each corrects the last)")
    ca.add_argument("--seconds", type=float, default=3.0, help="of steps per measurement (a check takes twice)")
    ca.set_defaults(func=cmd_calibrate, tensorboard=False)


def _add_emulate(sub: Any) -> None:
    em = sub.add_parser("emulate", help="run any command (torchrun ...) with its ranks under emulated heterogeneity")
    em.add_argument("--hl", help="pin one level (HL1, HL2, HL4, HL8)")
    em.add_argument("--schedule", help="named schedule or a YAML file (in seconds; in epochs with omnilearn.torch)")
    em.add_argument("--workers", type=int, help="ranks of the command (default 4, or one per --containers name)")
    em.add_argument("--levels", metavar="FILE",
                    help="own level table (YAML: level -> one entry per rank, as emulation.levels) in place "
                         "of the paper's")
    em.add_argument("--out", help="run folder (default: a new folder under runs/)")
    em.add_argument("--containers", metavar="A,B,...",
                    help="containers you started (docker run), rank i the i-th: levels by docker update, "
                         "their own limits restored at the end")
    em.add_argument("--tensorboard", action="store_true",
                    help="write TensorBoard scalars to OUT/tensorboard while the command runs (a script's "
                         "steps, each rank's straggler scores)")
    em.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    em.set_defaults(func=cmd_emulate)


def _add_record(sub: Any) -> None:
    rc = sub.add_parser("record", help="run an unmodified DDP command (torchrun ...) with every rank's step "
                                       "times recorded, nothing emulated: for omnilearn whatif")
    rc.add_argument("--out", help="run folder (default: a new folder under runs/)")
    rc.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    rc.set_defaults(func=cmd_record)


def _add_simulate(sub: Any) -> None:
    from omnilearn.control.policies import POLICIES

    sm = sub.add_parser("simulate", help="predict a BSP job's step and epoch times and the controller's decisions "
                                         "for N workers from a finished run's measurements; or score the "
                                         "controllers against the oracle on a suite of known models (--scenarios)")
    what = sm.add_mutually_exclusive_group(required=True)
    what.add_argument("--replay", help="a finished BSP run folder: its models and schedule")
    what.add_argument("--scenarios", nargs="?", const="", metavar="FILE",
                      help="run a scenario suite (default configs/scenarios.yaml): DIR/scenarios.csv and "
                           "DIR/scenarios.md, every policy's fraction of the oracle, settling and overshoot")
    what.add_argument("--asp-scenarios", nargs="?", const="", metavar="FILE",
                      help="run the ASP suite (default configs/asp_scenarios.yaml): known problems trained through "
                           "the server's update rule and controller on simulated workers; DIR/asp_scenarios.csv and "
                           "DIR/asp_scenarios.md, each policy's time to target against a delay-free reference")
    sm.add_argument("--out", required=True, help="new folder for summary.json, run.png and the simulated metrics "
                                                 "(--scenarios, --asp-scenarios: for their CSV and Markdown)")
    sm.add_argument("--policies", nargs="+", metavar="POLICY",
                    help="--scenarios: the policies to score (default: uniform dynamic paper static; "
                         "--asp-scenarios: uniform dynamic static; best-fixed, which knows the true shares, by name)")
    sm.add_argument("--seeds", type=int, help="--scenarios, --asp-scenarios: seeds of every scenario (default: "
                                              "each scenario's)")
    sm.add_argument("--jobs", type=int, help="--scenarios, --asp-scenarios: processes (default: the CPUs, at most 2)")
    sm.add_argument("--workers", type=int, help="default: the run's; more repeat its workers' models in turn")
    sm.add_argument("--policy", choices=Shipped(POLICIES), help="default: the run's")
    sm.add_argument("--epochs", type=int, help="default: the run's")
    sm.add_argument("--seed", type=int, default=0, help="of the measured noise")
    sm.add_argument("--noise", type=float, default=1.0, help="scale of the measured noise (0: none)")
    sm.add_argument("--calibration", type=Path, help="calibration.yaml: its all-reduce latency and bandwidth")
    sm.set_defaults(func=cmd_simulate)


def _add_cluster(sub: Any) -> None:
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


def _add_toggle(sub: Any) -> None:
    tg = sub.add_parser("toggle", help="host-side toggler: apply the workers' CPU requests to their containers")
    tg.add_argument("--out", required=True, help="the job's run folder (holds job.json and logs/)")
    tg.add_argument("--interval", type=float, default=0.2)
    tg.add_argument("--until-done", action="store_true", help="stop when every container of the job has exited")
    tg.set_defaults(func=cmd_toggle)


def _add_image(sub: Any) -> None:
    from omnilearn.images.base import DEFAULT_SUITE, LOCAL_BASE_IMAGE
    from omnilearn.images.worker import DEFAULT_BASE_IMAGE, WORKER_IMAGE

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


def _add_whatif(sub: Any) -> None:
    w = sub.add_parser("whatif", help="what balancing would give a recorded BSP job: per rank its work, its wait "
                                      "and what it cost the others; the job's time as recorded, without a "
                                      "straggler, balanced, and under dynamic")
    w.add_argument("run", metavar="RUN", help="a finished BSP run folder with step records")
    w.add_argument("--out", help="folder for whatif.json and whatif.png (default: RUN)")
    w.set_defaults(func=cmd_whatif)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnilearn", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_bench, _add_worker, _add_levels, _add_report, _add_cleanup, _add_calibrate, _add_emulate, _add_record, _add_simulate, _add_whatif, _add_cluster, _add_toggle, _add_image):
        add(sub)
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


def entry() -> None:
    """The program's entry point (``omnilearn``, ``python -m omnilearn``): :func:`main`, the exit handlers,
    then out without the interpreter's teardown of its modules. Everything is saved and closed by then; the
    teardown of torch, scikit-learn and matplotlib takes most of a second of CPU, which every command
    would spend after its work is done."""
    code = main()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
