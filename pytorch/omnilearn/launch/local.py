"""The embedded launcher: workers as local processes, emulation by cgroups or CPU affinity.

It starts the toggler (a thread here, reading the same CPU-request logs a host-side toggler reads
for containers), one process per rank with torchrun's environment variables, and tears everything
down, cgroups included, however the run ends. A job with links runs each worker in a network
namespace of its own (:mod:`omnilearn.emulator.network.netns`); others talk over loopback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from omnilearn.emulator.backends import select_backend
from omnilearn.emulator.backends.cgroupfs import sweep_stale
from omnilearn.emulator.network.netns import JobNetwork, sweep_netns
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.protocol.toggler_host import TogglerHost
from omnilearn.errors import UserError
from omnilearn.files import create_in
from omnilearn.jobfile import JobSpec
from omnilearn.launch.failures import WorkerFailed, last_error, tail
from omnilearn.launch.forked import ForkedWorker, forks, preload, warm
from omnilearn.launch.interrupts import Interrupts
from omnilearn.launch.pidfile import JobRecord
from omnilearn.launch.supervise import States, supervise
from omnilearn.launch.watch import HangWatch, describe_status
from omnilearn.observe.progress import progress_for
from omnilearn.train.lifecycle import LAUNCHER_PID_ENV, die_with_parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Idle OpenMP threads must sleep, not spin: under a CPU quota a spinning thread burns the
    # worker's own budget (measured: the fast HL8 worker ran 1.5x faster with passive waiting).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("OMP_NUM_THREADS", "1")  # raised by the worker once its allocation is known
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # the worker's watchdog: it never outlives the launcher
    return env


def stop_processes(procs: list[subprocess.Popen | ForkedWorker], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
                p.send_signal(signal.SIGCONT)  # a stopped worker (SIGSTOP, a duty cycle) must see it
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_local(job: JobSpec, console: Console, label: str, show_progress: bool = True) -> None:
    """Run the job to the end; raises WorkerFailed (with the failing rank's log) or UserError."""
    cfg = job.config
    sweep_stale()
    sweep_netns()
    limits_memory = any(a.memory is not None for allocs in job.plan.levels.values() for a in allocs.values())
    backend = select_backend(cfg.emulation.backend, job.job_id, list(job.plan.targets), memory=limits_memory,
                             period_us=cfg.emulation.cpu_period_us)
    job.backend = backend.name
    job_file = job.save()
    net: JobNetwork | None = None
    procs: list[subprocess.Popen | ForkedWorker] = []
    logs: list[Path] = []
    slots = job.slots  # one process per target that runs: BSP workers; ASP server (rank 0) + workers
    world = len(slots)
    port = free_port()
    record = JobRecord(job.job_id, job.out_dir, backend.name)  # what `omnilearn cleanup` finds if we are killed
    toggler: TogglerHost | None = None
    try:
        if job.plan.links:  # each worker in a network namespace of its own, its link shaped on its veth
            net = JobNetwork(job.job_id, job.plan.targets).up()
        toggler = TogglerHost(lambda: Toggler(job.log_dir, backend, job.plan, links=net), job.log_dir)
        with Interrupts() as interrupts:
            toggler.start()
            fork = forks(job.plan)
            if fork:
                warm(preload(job.config.model.name, job.config.data.name))
            # Everything but the rendezvous knows a worker by its slot (its target's index in the plan):
            # the same files and allocations after survivors are re-ranked.
            for rank, slot in enumerate(slots):
                log_path = job.log_dir / f"worker-{slot}.out"
                logs.append(log_path)
                proc = start_worker(job_file, log_path, worker_env(rank, world, port), fork,
                                    None if net is None else (net, slot))
                procs.append(proc)
                record.add(slot, proc.pid)
                backend.add_process(job.plan.targets[slot], proc.pid)
                interrupts.check()
            with progress_for(job, label, console) if show_progress else contextlib.nullcontext() as progress:
                if progress:
                    progress.set_epochs(cfg.train.epochs)
                watched = {s: p.pid for s, p in zip(slots, procs, strict=True) if not (cfg.mode == "asp" and s == 0)}
                hangs = HangWatch(job.out_dir, watched, cfg.fault.timeout_s)  # the ASP server watches its workers

                def states() -> States:
                    codes = {s: p.poll() for s, p in zip(slots, procs, strict=True)}
                    hung = hangs.check(lambda r: who_is(job, r))
                    if hung is None and any(c not in (None, 0) for c in codes.values()):
                        hung = hangs.check_stopped(lambda r: who_is(job, r))  # its peers' timeouts came first
                    if hung is not None:
                        console.print(f"{label}: {hung}; stopping the job", markup=False)  # before the teardown
                        raise WorkerFailed(hung, slot=hangs.culprit)
                    now = time.monotonic()
                    return {s: (c, now) for s, c in codes.items()}

                supervise(states, lambda s, code: process_failure(job, s, code, logs[slots.index(s)]), interrupts,
                          progress, interval=0.25)
    finally:
        stop_processes(procs)
        if toggler is not None:
            toggler.stop()
        backend.close()
        if net is not None:
            net.close()
        record.close()


def start_worker(job_file: Path, log_path: Path, env: dict[str, str], fork: bool,
                 netns: tuple[JobNetwork, int] | None) -> subprocess.Popen | ForkedWorker:
    """One worker process writing to ``log_path``: forked from the fork server, or a new interpreter (in
    its network namespace when the job has links)."""
    args = ["worker", "--job", str(job_file)]
    with os.fdopen(create_in(log_path.parent, log_path.name), "w") as out:
        if fork:
            return ForkedWorker(args, env, log_path)
        argv = [sys.executable, "-m", "omnilearn", *args]
        if netns is not None:
            net, slot = netns
            argv, env = net.command(slot, argv), {**env, **net.env(slot)}
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,  # Ctrl-C reaches the launcher only
                                preexec_fn=die_with_parent)  # they die with it, even by SIGKILL


def process_failure(job: JobSpec, slot: int, code: int, log_path: Path) -> Exception:
    """What a worker process's failure is told as: a user error it found is passed on (exit status 2)."""
    who = who_is(job, slot)
    if code == UserError.exit_status:
        return UserError(f"{who}: {last_error(log_path)}")
    return WorkerFailed(f"{who} {describe_status(code)}; end of {log_path}:\n{tail(log_path)}", slot=slot)


def who_is(job: JobSpec, slot: int) -> str:
    """How messages name the worker in ``slot`` (its rank in the whole job, whatever survivors run)."""
    if job.config.mode == "asp":
        role = "parameter server" if slot == 0 else "ASP worker"
        return f"{role} rank {slot} ({job.plan.target(slot)})"
    return f"worker rank {slot}"


def check_local_prerequisites() -> None:
    if sys.platform != "linux":
        raise UserError("the local launcher needs Linux (cgroups or sched_setaffinity)")
