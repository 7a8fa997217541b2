"""Step times of an unmodified DDP script: the timing module ``omnilearn record`` and ``omnilearn emulate`` load.

Loaded into every rank through the environment (:mod:`omnilearn.torch.autoload`, ``OMNILEARN_HOOK``),
with no change to the script, it wraps ``DistributedDataParallel``: the first model a rank wraps is
timed. A DDP communication hook is called for each bucket of gradients as the backward produces it,
the last bucket once the backward has produced every gradient; so per step (one reduced backward):

- the rank's **own work** runs from the end of the last step's all-reduce (the script drawing its next
  batch, the forwards and backwards, the optimizer's update after that all-reduce) to its last bucket
  (``compute_ms``), with the wait for its CPU under a quota beyond that (``held_ms``), timed by the
  one step clock every BSP path uses (:class:`~omnilearn.train.step.StepClock`);
- its **wait** runs from its last bucket to the end of that bucket's all-reduce (``sync_ms``): the
  all-reduce's own time, and the wait for the slowest rank.

Backwards inside ``no_sync`` (gradient accumulation) reduce nothing: their work is part of the step
that reduces, which is counted once; its ``batch`` is the samples of every training forward since the
last all-reduce (the first tensor argument's first dimension). Forwards in eval mode or without
gradients (evaluation) are not a step's: the work of the step after them starts at its first training
forward, and the time between is left out of ``train_time_s``. AMP changes nothing here (its scaler
runs inside the work). A script's own communication hook is kept and wrapped, whenever it is
registered; a built-in C++ hook (``_register_builtin_comm_hook``) runs no Python and cannot be: that
rank then records no steps and says why. A model wrapped with omnilearn's own weighting hook (the framework integrations)
is recorded by :mod:`omnilearn.torch` instead.

Records go to ``OUT/metrics/rank-<r>.jsonl`` (``OUT``: ``OMNILEARN_OUT``): a ``start`` record, a ``step``
record per step with the fields :mod:`omnilearn.torch` writes and ``source: "hook"``, and at the
process's exit an ``end`` record. A DDP job's ranks take equal shares (``DistributedSampler``):
``global_batch`` is the rank's batch times the world size. The ranks' levels are emulate's schedule's,
by seconds since it began (a schedule in epochs stays at its first level: the script asks for no other).
At its exit rank 0 writes into the job file what the script ran: its ranks, the global batch of its
full steps, one epoch of its steps, ``uniform`` (DDP's equal split) as its policy.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from omnilearn import config
from omnilearn.emulator.spec.plan import build_plan, worker_target
from omnilearn.errors import UserError
from omnilearn.jobfile import JOB_FILE, OUT_ENV, T0_ENV, JobSpec
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.records import STEP
from omnilearn.train.step import Slots, StepClock

log = logging.getLogger("omnilearn.hook")

SOURCE = "hook"
BY_OMNILEARN = "its model is wrapped with omnilearn's own hook"
"""Why a rank whose steps :mod:`omnilearn.torch` records itself records none here (said nowhere)."""


def first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The samples of a forward: the first dimension of its first tensor argument (0 if none)."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
        if isinstance(value, dict | list | tuple):  # a batch as (inputs, targets), or a dict of tensors
            inner = first_batch_size((), value) if isinstance(value, dict) else first_batch_size(tuple(value), {})
            if inner:
                return inner
    return 0


class StepTimes:
    """One rank's steps as a DDP hook sees them (see the module): forwards, the last bucket, the reduce.

    ``write(kind, **fields)``: where records go; ``level()``: the level in force now (a label);
    ``cpus(level)``: this rank's allocated CPUs at a level (None: nothing emulated).
    """

    def __init__(self, rank: int, world: int, write: Callable[..., None], level: Callable[[], str],
                 on_cpu: bool = True, cpus: Callable[[str], float | None] = lambda level: None) -> None:
        self.rank, self.world, self.write, self.level, self.cpus = rank, world, write, level, cpus
        self.clock = StepClock(Slots(world), rank, on_cpu=on_cpu, times_update=True, times_quota=True)
        self.samples = 0  # the open step's training samples
        self.open = False  # a training forward opened a step
        self.waiting = False  # its last bucket is in the all-reduce
        self.started_at: float | None = None  # the first training forward (perf_counter)
        self.reduced_at: float | None = None  # the end of the last step's all-reduce
        self.between_s = 0.0  # time in evaluation, between steps: not training time
        self.eval_since: float | None = None
        self.steps = self.total_samples = 0
        self.batches: collections.Counter[int] = collections.Counter()

    def forward(self, samples: int, training: bool) -> None:
        """A forward of the model: a training one opens or grows the step; an evaluation one pauses it."""
        now = time.perf_counter()
        if not training:
            if self.eval_since is None and not self.open:
                self.eval_since = now
            return
        if self.started_at is None:
            self.started_at = now
        if not self.open:
            if self.eval_since is not None:  # the step's work starts here, not at the last all-reduce
                self.between_s += now - self.eval_since
                self.eval_since = None
                self.clock.open()
            elif self.reduced_at is None:
                self.clock.open()  # the first step: from its first forward
            self.open = True
        self.samples += samples

    def last_bucket(self) -> None:
        """The backward produced every gradient: the rank's work is done, its wait begins."""
        if not self.open:  # a backward with no training forward of the model's (a forward hook left out)
            self.forward(0, True)
        self.clock.work_done()
        self.waiting = True

    def reduced(self) -> None:
        """The last bucket's all-reduce ended: the step is done; the next one's work starts now."""
        if not self.waiting:
            return
        clock = self.clock
        clock.reduced()
        clock.close()
        work_ms, wait_ms, held_ms = round(clock.compute_wall * 1e3, 3), round(clock.sync_s * 1e3, 3), clock.held_ms
        self.reduced_at = time.perf_counter()
        clock.open()  # the next step's work runs from here (what the script does after the all-reduce)
        self.waiting, self.open = False, False
        self.steps += 1
        b, self.samples = self.samples, 0
        self.total_samples += b * self.world
        self.batches[b] += 1
        level = self.level()
        self.write(STEP, step=self.steps, epoch=0, batch=b, global_batch=b * self.world, compute_ms=work_ms,
                   sync_ms=wait_ms, held_ms=held_ms, loss=None, train_acc=None, level=level, cpus=self.cpus(level),
                   threads=torch.get_num_threads(), source=SOURCE)

    def usual_batch(self) -> int:
        """The batch of most of the steps (a full step's)."""
        return self.batches.most_common(1)[0][0] if self.batches else 0

    def train_time_s(self) -> float:
        """From the first training forward to the last all-reduce, less the evaluation between steps."""
        if self.started_at is None or self.reduced_at is None:
            return 0.0
        return self.reduced_at - self.started_at - self.between_s


@dataclasses.dataclass
class Recording:
    """One rank's recording: its run folder, job, records, and the timed model's size and device.

    It keeps no reference to the model: the script's model (and through DDP's reducer, its process
    group) is freed when the script drops it, not at the interpreter's teardown, where gloo's threads
    would still be running.
    """

    out: Path
    rank: int
    world: int
    job: JobSpec
    t0: float
    params: int  # the timed model's trainable parameters
    device: str  # where its parameters are
    off: str | None = None  # why this rank records no steps
    metrics: MetricsWriter | None = None  # opened at the model's first forward
    times: StepTimes = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        on_cpu = torch.device(self.device).type == "cpu"
        self.times = StepTimes(self.rank, self.world, self._write, self.level, on_cpu=on_cpu, cpus=self.cpus)

    def _write(self, kind: str, **fields: Any) -> None:  # noqa: ANN401
        assert self.metrics is not None, "a record before the first forward"
        self.metrics.write(kind, **fields)

    def level(self) -> str:
        schedule = self.job.plan.schedule
        if schedule.unit == "seconds":
            return str(schedule.level_at(time.time() - self.t0))
        return str(schedule.levels[0])

    def cpus(self, level: str) -> float | None:
        """This rank's allocated CPUs at ``level`` under ``omnilearn emulate`` (None under ``record``)."""
        if self.job.backend in ("", "none") or self.rank >= len(self.job.plan.targets):
            return None
        return self.job.plan.allocation(level, self.job.plan.targets[self.rank]).share

    def begin(self) -> None:
        """At the model's first forward (its hook decided): the records opened, the start record."""
        if self.metrics is not None or self.off is not None:
            return
        self.metrics = MetricsWriter(metrics_path(self.out, self.rank))
        self.metrics.write("start", rank=self.rank, world=self.world, target=worker_target("bsp", self.rank),
                           params=self.params, train_samples=0, policy="uniform", device=self.device,
                           dist_backend=dist.get_backend(), library=SOURCE)

    def close(self) -> None:
        """At the process's exit: the end record; rank 0 writes what the script ran into the job file."""
        t = self.times
        if self.off is not None and t.steps == 0 and not self.off.startswith(BY_OMNILEARN):
            log.warning("omnilearn: rank %d recorded no steps: %s", self.rank, self.off)
        if self.metrics is None:
            return
        wall = time.perf_counter() - t.started_at if t.started_at is not None else 0.0
        self.metrics.write("end", wall_time_s=round(wall, 4), train_time_s=round(t.train_time_s(), 4),
                           samples=t.total_samples, steps=t.steps, batch=[t.usual_batch()] * self.world,
                           level=self.level(), epochs=1.0, out_of_time=False)
        self.metrics.close()
        if self.rank == 0 and t.steps:
            try:
                ran_as(self.job, self.world, t.usual_batch() * self.world).save()
            except UserError as e:
                log.warning("omnilearn: the job file keeps the command's defaults: %s", e)


def ran_as(job: JobSpec, world: int, global_batch: int) -> JobSpec:
    """The job file of what a DDP script ran: its ranks, its global batch, one epoch, DDP's equal split."""
    data = job.config.to_dict()
    for key, value in (("workers", world), ("train.global_batch", max(global_batch, world)), ("train.epochs", 1),
                       ("control.min_batch", 1),
                       ("control.policy", "uniform"), ("model.name", "ddp-script"), ("data.name", "ddp-script")):
        config.set_key(data, key, value)
    cfg = config.from_dict(data, "the DDP script's job").validate()
    plan = job.plan if len(job.plan.targets) == world else build_plan(cfg)
    return dataclasses.replace(job, config=cfg, plan=plan)


_RECORDING: list[Recording] = []


def recording(model: torch.nn.Module) -> Recording | None:
    """This rank's recording, begun by the first DDP model it wraps (None: a later model, no run folder,
    or a run folder of another number of ranks, said once)."""
    if _RECORDING:
        return None
    folder = os.environ.get(OUT_ENV)
    if not folder or not (Path(folder) / JOB_FILE).is_file() or not dist.is_initialized():
        return None
    out, rank, world = Path(folder), dist.get_rank(), dist.get_world_size()
    try:
        job = JobSpec.load(out / JOB_FILE, out_dir=out)
    except UserError as e:
        log.warning("omnilearn: no step records: %s", e)
        return None
    if len(job.plan.targets) != world and job.backend not in ("", "none"):
        log.warning("omnilearn: no step records: omnilearn emulate was given %d workers (--workers), the script "
                    "runs %d ranks: give emulate --workers %d", len(job.plan.targets), world, world)
        return None
    rec = Recording(out=out, rank=rank, world=world, job=job, t0=float(os.environ.get(T0_ENV) or time.time()),
                    params=sum(p.numel() for p in model.parameters() if p.requires_grad),
                    device=str(next(model.parameters()).device))
    _RECORDING.append(rec)
    atexit.register(rec.close)
    return rec
