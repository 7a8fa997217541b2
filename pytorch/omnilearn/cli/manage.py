"""``omnilearn cluster``, ``toggle``, ``levels``, ``report``, ``cleanup``, ``calibrate``, ``simulate`` and ``image``: everything around a job."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.cli.common import bench_overrides, flag_overrides, make_console
from omnilearn.errors import UserError


def _job_for_cluster(args: argparse.Namespace):
    """Config, plan and saved job file for ``cluster up`` (the same checks as ``run``)."""
    from omnilearn.emulator.spec.plan import build_plan
    from omnilearn.jobfile import JobSpec, new_job_id
    from omnilearn.launch.job import check_launcher
    from omnilearn.launch.runfolder import check_out, prepare_out

    overrides = flag_overrides(args) + [("emulation.backend", "docker")]
    cfg = config.build(args.config, overrides)
    plan = build_plan(cfg)
    check_launcher(cfg, plan)
    check_out(args.out, args.force)
    from omnilearn.train.preflight import preflight  # torch: only once the config and flags passed

    preflight(cfg)
    out = prepare_out(args.out, args.force)  # a new or replaceable folder, marked as a run's
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=out.resolve(), backend="docker")
    job.save()
    return job


def cmd_cluster(args: argparse.Namespace) -> int:

    from omnilearn.jobfile import JobSpec
    from omnilearn.launch.docker import swarm

    console = make_console()
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
    from omnilearn.emulator.backends.docker import DockerBackend
    from omnilearn.emulator.protocol.toggler import Toggler
    from omnilearn.emulator.protocol.toggler_host import TogglerHost
    from omnilearn.jobfile import JobSpec
    from omnilearn.launch.docker import swarm
    from omnilearn.launch.docker.mounts import RUN_MOUNT
    from omnilearn.launch.docker.remote import RemoteRunFolders, remote_containers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = Path(args.out)
    if not (out / "job.json").is_file():
        raise UserError(f"--out {out}: not a run folder (no job.json)")
    job = JobSpec.load(out / "job.json", out_dir=out)
    default, remote = swarm.clients_for(job)
    backend = DockerBackend(job.job_id, default, clients=remote, period_us=job.config.emulation.cpu_period_us)
    sync = None  # the run folders of containers on other daemons, brought in step before each poll
    if remote:
        state = swarm.ClusterState.load(out)
        sync = RemoteRunFolders(job, remote_containers(job, state.containers, remote), RUN_MOUNT)
    console = make_console()
    links = swarm.link_applier(job, backend)
    host = TogglerHost(lambda: Toggler(job.log_dir, backend, job.plan, console=console, links=links), job.log_dir,
                       interval=args.interval, before_poll=None if sync is None else lambda final: sync.poll(metrics=final))
    try:
        with host:  # the toggler polls in its thread (restarted if it dies); this one waits for the end
            console.print(f"toggler for job {job.job_id}: watching {job.log_dir}/cpu-*.log (Ctrl-C to stop)",
                          markup=False)
            while not host.wait(args.interval):
                if args.until_done and all(r["status"] in ("exited", "dead", "absent") for r in swarm.status(out)):
                    break  # leaving ``with`` stops it after a last poll (the metrics synced too)
    except KeyboardInterrupt:
        pass  # the host was stopped on the way out, after a last poll
    finally:
        backend.close()  # a container a stall paused runs again
    return 0


def cmd_levels(args: argparse.Namespace) -> int:
    from omnilearn.config.sections import EmulationConfig
    from omnilearn.emulator.spec.levels import host_cpus, load_tables, resolve_level

    tables = load_tables()
    host = host_cpus()
    share = EmulationConfig().host_share
    out: dict[str, Any] = {}
    for mode, table in tables.items():
        rows = {}
        for level in table.levels:
            workers, server = resolve_level(table, level, table.workers, args.allocation, host, share)
            rows[level] = {"workers": [a.describe() for a in workers],
                           **({"server": server.describe()} if server else {})}
        out[mode] = rows
    print(json.dumps({"host_cpus": len(host), "host_share": share, "allocation": args.allocation, "levels": out},
                     indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:

    from omnilearn.metrics import METRICS_DIR
    from omnilearn.report.summary import summarize
    from omnilearn.report.table import emulate_table, print_report

    out = Path(args.out)
    if (out / "compare.json").is_file() and not (out / "job.json").is_file():
        return _report_compare(out)
    if not (out / "job.json").is_file():
        raise UserError(f"{out}: not a run folder (no job.json) nor a compare folder (no compare.json)")
    summary = out / "summary.json"
    if not any((out / METRICS_DIR).glob("rank-*.jsonl")) and summary.is_file():
        # omnilearn emulate around a command that records no steps: what emulate measured
        make_console().print(emulate_table(json.loads(summary.read_text())))
        return 0
    print_report(make_console(), {"run": summarize(out)}, None)
    return 0


def _report_compare(out: Path) -> int:
    """A ``--compare`` folder again: every run's summary, then ``compare.json`` (the ideal, settle) from
    the runs as they are, in the order the compare ran them."""
    from omnilearn.jobfile import JobSpec
    from omnilearn.report.summary import compare, summarize
    from omnilearn.report.table import print_report, targets_line

    try:
        order = list(json.loads((out / "compare.json").read_text())["runs"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{out / 'compare.json'}: not a compare's record ({e})") from None
    runs = {name: out / name for name in order}
    missing = [name for name, d in runs.items() if not (d / "job.json").is_file()]
    if missing:
        raise UserError(f"{out}: the compare's runs {missing} have no run folder (job.json) here")
    summaries = {name: summarize(d) for name, d in runs.items()}
    report = JobSpec.load(runs[order[0]] / "job.json", out_dir=runs[order[0]]).config.report
    result = compare(out, runs, report.target, report.target_fraction)
    console = make_console()
    print_report(console, summaries, result)
    console.print(targets_line(result["targets"]), markup=False)
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from omnilearn.emulator.backends.cgroupfs import sweep_stale
    from omnilearn.emulator.network.netns import sweep_netns
    from omnilearn.launch.cleanup import cleanup_dead

    # Jobs whose launcher is gone (their record says what they started), then leftovers of older runs.
    removed = cleanup_dead() + sweep_stale() + sweep_netns()  # cgroups, and the namespaces (veths, bridge, IFBs) of links
    print("\n".join(removed) if removed else "nothing to clean")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from omnilearn.experiments.calibrate import calibrate

    calibrate(config.build(args.config, bench_overrides(args)), Path(args.out), make_console(), args.rounds, args.seconds)
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    from omnilearn.simulate.whatif import FIGURE_FILE, WHATIF_FILE, whatif

    out = Path(args.out) if args.out else Path(args.run)
    w = whatif(Path(args.run), out)
    job = w["job"]
    print(f"{w['policy']} · {w['workers']} ranks · {w['steps']} steps · k {w['models']['k']:g} "
          f"({w['models']['k_source']})")
    for r in w["ranks"]:
        print(f"  rank {r['rank']}: work {r['work_s'] * 1e3:.1f} ms, wait {r['wait_s'] * 1e3:.1f} ms, "
              f"cost to the others {r['cost_to_others_s'] * 1e3:.1f} ms a step")
    print(f"training time: recorded {job['recorded_s']:.2f} s · no straggler {job['no_straggler_s']:.2f} s · "
          f"balanced {job['balanced_s']:.2f} s · dynamic {job['dynamic_s']:.2f} s · static {job['static_s']:.2f} s")
    print(f"results: {out / WHATIF_FILE}, {out / FIGURE_FILE}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from omnilearn.simulate import simulate

    if args.scenarios is not None:
        return cmd_scenarios(args)
    if args.asp_scenarios is not None:
        return cmd_asp_scenarios(args)
    if args.policies or args.seeds is not None or args.jobs is not None:
        raise UserError("--policies, --seeds and --jobs apply to --scenarios; --replay takes --policy and --seed")
    s = simulate(Path(args.replay), Path(args.out), args.workers, args.policy, args.epochs, args.seed, args.noise,
                 args.calibration)
    print(f"simulated {s['policy']} · {s['workers']} workers · {s['epochs_done']:g} epochs: training "
          f"{s['train_time_s']:.2f} s ({s['epoch_time_s']:.3f} s per epoch), {s['samples_per_s']:.1f} samples/s, "
          f"final batches {s['batch_sizes'] if s['workers'] <= 16 else '(see summary.json)'}, controller decision "
          f"{s['decision_ms'] if s['decision_ms'] is not None else '-'} ms mean over {s['simulated']['decisions']}; "
          f"{args.out}/summary.json")
    return 0


def _run_suite(args: argparse.Namespace, flag: str, run_suite: Any, name: str) -> dict[str, Any]:
    """``--scenarios`` or ``--asp-scenarios`` (``flag``) by ``run_suite``, its files ``name``.csv and .md
    under ``--out``, said on one line; a ``--replay`` flag beside it is refused."""
    file, command = _suite(args, flag)
    result = run_suite(Path(args.out), file, args.policies, args.seeds, jobs=args.jobs, command=command)
    print(f"{result['scenarios']} scenarios, {len(result['rows'])} runs in {result['seconds']:.1f} s: "
          f"{args.out}/{name}.csv, {args.out}/{name}.md")
    return result


def _suite(args: argparse.Namespace, flag: str) -> tuple[str | None, str]:
    """The suite file of ``flag`` (None: the default) and the command line the report names."""
    for name in ("workers", "policy", "epochs", "calibration"):
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name} applies to --replay; --{flag} takes --policies and --seeds")
    file = getattr(args, flag.replace("-", "_")) or None
    command = " ".join([f"omnilearn simulate --{flag}", *([file] if file else []), "--out", str(args.out),
                        *(["--policies", *args.policies] if args.policies else []),
                        *(["--seeds", str(args.seeds)] if args.seeds is not None else [])])
    return file, command


def cmd_asp_scenarios(args: argparse.Namespace) -> int:
    """``omnilearn simulate --asp-scenarios [FILE] --out DIR``: the ASP benchmark."""
    from omnilearn.simulate.asp_scenarios import run_suite

    result = _run_suite(args, "asp-scenarios", run_suite, "asp_scenarios")
    for line in result["lines"]:
        if line["policy"] != "uniform" and line["ratio"] is not None:
            print(f"  {line['scenario']:<22} {line['policy']:<8} time to target vs uniform {line['ratio']:.3f} "
                  f"± {line['ratio_se']:.3f}")
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    """``omnilearn simulate --scenarios [FILE] --out DIR``: the scenario benchmark."""
    from omnilearn.simulate.scenarios import run_suite

    result = _run_suite(args, "scenarios", run_suite, "scenarios")
    for line in result["lines"]:
        if line["scenario"].startswith("**"):
            print(f"  {line['policy']:<14} mean fraction of the oracle {line['mean']:.3f}, slower than uniform "
                  f"on {line['slower']:.0%} of seeds")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    """``omnilearn image build|base|status``: the Docker images the container launcher runs."""
    from omnilearn.images.base import build_base_image
    from omnilearn.images.worker import ensure_images, image_status

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
