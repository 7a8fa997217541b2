"""``omnilearn emulate -- COMMAND``: any command's ranks under emulated heterogeneity.

The command runs as given (``torchrun ... train.py``, an unmodified script). Every few tenths of a
second its descendants are scanned; a process whose environment holds ``RANK`` joins that rank's
target (cgroup as root, else CPU affinity and throttling: the backends ``omnilearn run`` uses), its
threads with it and its later children inheriting it. Levels go through the same request logs,
toggler and audit as a run's: the first level before the command starts, the next ones at their
seconds. A schedule in epochs moves on only when the command's script uses :mod:`omnilearn.torch`,
which asks for its levels itself (``OMNILEARN_OUT`` and ``OMNILEARN_EMULATE_T0`` tell it the run
folder and the schedule's start). The command's exit status is emulate's; cgroups are removed
however it ends.

With ``--containers A,B,...`` the targets are containers the user started (``docker run``), rank i
the i-th name: each level is a ``docker update`` of theirs through the Docker backend
(:class:`~omnilearn.emulator.backends.docker_user.UserContainers`), read back and audited the same
way, and their own limits are given back when the command ends or is interrupted. Their CPU time is
their cgroups' (or ``docker stats``), over the command's run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.emulator.backends import Backend, select_backend
from omnilearn.emulator.backends.docker_user import UserContainers
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.protocol.toggler_host import TogglerHost
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan, build_plan
from omnilearn.errors import UserError
from omnilearn.files import load_yaml, write_atomic
from omnilearn.jobfile import HOOK_ENV, OUT_ENV, T0_ENV, JobSpec, new_job_id
from omnilearn.launch.interrupts import Interrupts
from omnilearn.report.stragglers import WINDOW_SCANS, WINDOW_STEPS, StragglerScores

log = logging.getLogger("omnilearn.emulate")

SCAN_S = 0.2
TICK = os.sysconf("SC_CLK_TCK")
BOOTSTRAP = Path(__file__).resolve().parents[1] / "torch" / "bootstrap"
"""The folder whose ``sitecustomize`` loads the timing module into a command's ranks (:mod:`omnilearn.torch.bootstrap`)."""


def command_env(job: JobSpec, t0: float) -> dict[str, str]:
    """The command's environment: the run folder, the schedule's start, and the timing module loaded
    into every rank of an unmodified DDP script (its step records: :mod:`omnilearn.torch.hook_timing`;
    ``OMNILEARN_HOOK=0`` in emulate's own environment leaves it out)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, OUT_ENV: str(job.out_dir), T0_ENV: repr(t0), HOOK_ENV: os.environ.get(HOOK_ENV, "1"),
            "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), *([path] if path else [])])}


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(root: int) -> list[int]:
    tree, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += tree.get(pid, [])
    return out


def rank_of(pid: int) -> int | None:
    """The RANK in the process's environment (None: none, or not readable)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            try:
                return int(item[5:])
            except ValueError:
                return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of the process (its threads included), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def schedstat_seconds(pid: int) -> tuple[float, float] | None:
    """Seconds the process's threads ran, and ran or waited for a CPU (CFS throttling included), not slept.

    From ``/proc/<pid>/task/*/schedstat`` (time on a CPU, time runnable on a run queue). A rank of a
    synchronous job sleeps while it waits for its peers: its busy time is its own compute under its
    allocation, which step times (equal on every rank) cannot show.
    """
    ran = waited = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            on_cpu, queued = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        ran, waited = ran + int(on_cpu), waited + int(queued)
    return ran / 1e9, (ran + waited) / 1e9


def container_names(text: str, workers: int | None) -> list[str]:
    """``--containers A,B,...`` as a list, checked against ``--workers`` (when given)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UserError(f"--containers {text!r}: an empty name (give names separated by commas, e.g. c1,c2)")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise UserError(f"--containers: {dup!r} is named twice (one container per rank)")
    if workers is not None and workers != len(names):
        raise UserError(f"--containers names {len(names)} containers but --workers is {workers}: "
                        f"one container per rank")
    return names


def container_backend(job_id: str, targets: list[str], names: list[str]) -> UserContainers:
    """The user's containers as the job's targets, through the local Docker daemon."""
    from omnilearn.emulator.backends.dockerd import daemon_client

    if len(names) != len(targets):  # ASP: the parameter server is a rank too
        raise UserError(f"--containers names {len(names)} containers, the job has {len(targets)} ranks")
    try:
        client = daemon_client(timeout=30)
    except UserError as e:
        raise UserError(f"--containers: {e}") from None
    return UserContainers.adopt(job_id, client, targets, names)


def emulate(argv: list[str], hl: str | None, schedule: str | None, workers: int | None, out: Path,
            containers: list[str] | None = None, tensorboard: bool = False, levels: Path | None = None) -> int:
    """Run ``argv`` under the levels; returns its exit status. ``containers``: the user's, one per rank
    (``workers`` defaults to their count, else to 4). ``tensorboard``: scalars in ``OUT/tensorboard/``
    while it runs (a script's steps, and each rank's straggler scores from busy time). ``levels``: a
    YAML file of the job's own level table (``emulation.levels``' format) in place of the paper's."""
    job = emulation_job(argv, hl, schedule, workers, out, containers, levels)
    plan, cfg = job.plan, job.config
    backend: Backend = (container_backend(job.job_id, list(plan.targets), containers) if containers
                        else select_backend("auto", job.job_id, list(plan.targets), period_us=cfg.emulation.cpu_period_us))
    job.backend = backend.name
    job.save()
    toggler = TogglerHost(lambda: Toggler(job.log_dir, backend, plan), job.log_dir)
    writers = [RequestWriter(job.log_dir, r) for r in range(len(plan.targets))]
    live = live_board(job) if tensorboard else contextlib.nullcontext()
    ranks = RankWatch(backend, plan.targets)
    proc: subprocess.Popen | None = None
    t0 = time.time()

    def apply(level: str, at: float | None) -> None:
        apply_level(writers, plan, level, at, cfg.emulation.ack_timeout)

    # Ctrl-C and SIGTERM are noted and acted on at the loop's pace: a second one cannot cut the
    # teardown short, where the user's containers get their own limits back.
    with Interrupts() as interrupts, live as board:
        ranks.board = board
        try:
            toggler.start()
            sched = plan.schedule
            apply(sched.levels[0], 0.0)
            interrupts.check()
            pending = list(zip(sched.starts[1:], sched.levels[1:], strict=True)) if sched.unit == "seconds" else []
            t0 = time.time()
            env = command_env(job, t0)
            try:
                proc = subprocess.Popen(argv, env=env)
            except OSError as e:
                raise UserError(f"omnilearn emulate: cannot start {argv[0]!r}: {e.strerror}") from None
            while proc.poll() is None:
                if not containers:
                    ranks.scan(proc.pid)
                while pending and time.time() - t0 >= pending[0][0]:
                    apply(pending.pop(0)[1], None)
                interrupts.wait(SCAN_S)
            status = proc.returncode
        except KeyboardInterrupt:
            status = 130
        finally:
            end_process(proc)
            toggler.stop()
            backend.close()  # the user's containers get their own limits back here
            seconds, busy_s = ranks.totals()
            if isinstance(backend, UserContainers):
                seconds = [backend.cpu_seconds(t) or 0.0 for t in plan.targets]
            write_summary(job, t0, seconds, None if containers else busy_s, len(ranks.placed), containers,
                          None if containers else ranks.stragglers.scores())
    return status


def live_board(job: JobSpec) -> Any:  # noqa: ANN401 - observe.tensorboard.LiveTensorBoard
    """TensorBoard scalars of the command's run: a script's steps (omnilearn.torch), with their straggler
    scores, and (:meth:`RankWatch.scan`) each rank's straggler scores from busy time."""
    from omnilearn.observe.tensorboard import LiveTensorBoard

    return LiveTensorBoard(job, stragglers=StragglerScores(len(job.plan.targets), WINDOW_STEPS))


def emulation_job(argv: list[str], hl: str | None, schedule: str | None, workers: int | None, out: Path,
                  containers: list[str] | None, levels: Path | None = None) -> JobSpec:
    """The job ``emulate`` runs the command as: its config, plan and run folder, checked before anything starts."""
    if not argv:
        raise UserError("omnilearn emulate: give a command after --, e.g. -- torchrun --nproc-per-node 4 train.py")
    if hl and schedule:
        raise UserError("omnilearn emulate: --hl and --schedule exclude each other")
    if workers is None:
        workers = len(containers) if containers else 4
    overrides: list[tuple[str, Any]] = [("workers", workers), ("emulation.backend", "auto")]
    overrides += [("emulation.hl", hl)] if hl else [("emulation.schedule", schedule or "demo")]
    if levels is not None:
        table = load_yaml(levels, "--levels file")
        if not isinstance(table, dict) or not table:
            raise UserError(f"--levels {levels}: expected a mapping of levels to one entry per rank, "
                            f"e.g. HL8: [{{cpuset: '0', cpus: 0.125}}, {{cpuset: '1', cpus: 1}}]")
        overrides.append(("emulation.levels", table))
    try:
        cfg = config.build(None, overrides)
        plan = build_plan(cfg)
    except UserError as e:
        if levels is None:
            raise
        raise UserError(f"--levels {levels}: {e}") from None
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: exists and is not empty")
    return JobSpec(job_id=new_job_id(), config=cfg, plan=plan, out_dir=out.resolve(), backend="")


def apply_level(writers: list[RequestWriter], plan: EmulationPlan, level: str, at: float | None,
                timeout: float) -> None:
    """Ask the toggler for ``level`` on every rank, as a worker would, and wait for its answers."""
    reqs = [w.submit(t, level, plan.allocation(level, t), at) for w, t in zip(writers, plan.targets, strict=True)]
    for w, r, t in zip(writers, reqs, plan.targets, strict=True):
        decision = w.wait_applied(r, timeout=timeout)
        if decision is None or decision.get("status") != "applied":
            log.warning("%s: level %s not applied (%s)", t, level,
                        decision.get("detail") if decision else "no answer from the toggler")


class RankWatch:
    """The command's processes that carry a ``RANK``: each put under its rank's target once, the CPU and
    busy time each used, as last seen, and each rank's straggler scores over the scans (CPU time ran
    per busy second: :mod:`omnilearn.report.stragglers`)."""

    def __init__(self, backend: Backend, targets: tuple[str, ...]) -> None:
        self.backend, self.targets = backend, targets
        self.placed: dict[int, int] = {}  # pid -> rank
        self.used: dict[int, float] = {}  # pid -> CPU seconds last seen
        self.busy: dict[int, float] = {}  # pid -> busy seconds last seen
        self.ran: dict[int, float] = {}  # pid -> seconds its threads ran on a CPU, last seen
        self.stragglers = StragglerScores(len(targets), WINDOW_SCANS)
        self._seen = [(0.0, 0.0)] * len(targets)  # per rank: ran and busy seconds at the last scan
        self.board: Any = None  # a LiveTensorBoard, shown each window's scores
        self.t0 = time.time()

    def scan(self, root: int) -> None:
        for pid in descendants(root):
            if pid not in self.placed:
                rank = rank_of(pid)
                if rank is None or not 0 <= rank < len(self.targets):
                    continue
                try:
                    self.backend.add_process(self.targets[rank], pid)
                except (OSError, ValueError):
                    continue  # exited meanwhile
                self.placed[pid] = rank
            self.used[pid] = cpu_seconds(pid) or self.used.get(pid, 0.0)
            times = schedstat_seconds(pid)
            if times is not None and times[1] > 0:
                self.ran[pid], self.busy[pid] = times
        self._score()

    def _score(self) -> None:
        """This scan's interval, per rank: what its processes ran and were busy since the last scan."""
        ran, busy = [0.0] * len(self.targets), [0.0] * len(self.targets)
        for pid, rank in self.placed.items():
            ran[rank] += self.ran.get(pid, 0.0)
            busy[rank] += self.busy.get(pid, 0.0)
        closed = False
        for rank, (r, b) in enumerate(zip(ran, busy, strict=True)):
            r0, b0 = self._seen[rank]
            closed |= self.stragglers.add(rank, max(r - r0, 0.0), max(b - b0, 0.0))
        self._seen = list(zip(ran, busy, strict=True))
        if closed and self.board is not None:
            self.board.busy_scores(self.stragglers.scores(), time.time() - self.t0)

    def totals(self) -> tuple[list[float], list[float]]:
        """CPU and busy seconds per rank."""
        seconds, busy = [0.0] * len(self.targets), [0.0] * len(self.targets)
        for pid, rank in self.placed.items():
            seconds[rank] += self.used.get(pid, 0.0)
            busy[rank] += self.busy.get(pid, 0.0)
        return seconds, busy


def end_process(proc: subprocess.Popen | None) -> None:
    """Terminate the command if it still runs (killed when it will not go within 10 s)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def write_summary(job: JobSpec, t0: float, seconds: list[float], busy: list[float] | None, processes: int,
                  containers: list[str] | None, scores: list[dict[str, float | None]] | None = None) -> None:
    """``summary.json``: each rank's applied allocations over time, the CPU time its processes used, and
    its straggler scores from busy time. A script using omnilearn.torch has written the run's summary
    there: these keys join it (its straggler scores, from its steps, stay)."""
    n = len(job.plan.targets)
    allocations: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in read_audit(job.log_dir, status="applied"):
        if r.get("target") in job.plan.targets:
            share = Allocation.from_dict(r.get("effective") or {}).share
            allocations[job.plan.targets.index(r["target"])].append(
                {"t": round(max(r["time"] - t0, 0.0), 3), "cpus": share, "level": r.get("level")})
    summary = {"command": "emulate", "backend": job.backend, "schedule": job.plan.schedule.name,
               "targets": list(job.plan.targets), "allocations": allocations,
               "cpu_seconds": [round(s, 3) for s in seconds], "processes": processes}
    if busy is not None:  # the ranks' own processes (not containers): their busy time
        summary["busy_seconds"] = [round(s, 3) for s in busy]
        if scores is not None:
            summary["straggler_scores"] = scores
        levels = job.plan.schedule.levels
        shares = [job.plan.allocation(levels[0], t).share for t in job.plan.targets]
        if len(set(levels)) == 1 and min(busy) > 0 and all(shares):  # one level: nominal beside measured
            summary["busy_ratio"] = {"measured": round(max(busy) / min(busy), 3),
                                     "nominal": round(max(shares) / min(shares), 3), "level": levels[0]}
    if containers:
        summary["containers"] = containers
    path = job.out_dir / "summary.json"
    script = json.loads(path.read_text()) if path.is_file() else None
    if script is not None:  # the script's own summary (omnilearn.torch): emulate's measurements join it
        if "straggler_scores" in script:  # from its steps: samples per compute-second, not busy time
            summary.pop("straggler_scores", None)
        summary = {**script, **summary}
    write_atomic(path, json.dumps(summary, indent=2))
    if script is not None:  # and its steps get the figure a run's get
        from omnilearn.report.plot import plot_run

        plot_run(job.out_dir, n, f"emulate · {script.get('model')} · schedule {job.plan.schedule.name} · "
                                 f"backend {job.backend} · {script.get('policy')}")
