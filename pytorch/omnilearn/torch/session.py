"""One rank's side of the controller in a user's loop: its run folder, its steps, and the levels around it.

:class:`StepSession` is the bookkeeping every way of training in a user's own script shares
(:class:`~omnilearn.torch.HeteroDataParallel`, and the framework integrations): it builds the job,
the controller and the sampler, opens and closes steps, times them, fills and reads the spare slots
of the step's one collective, records the steps and writes ``summary.json``. Whatever does the
all-reduce calls :meth:`StepSession.fill_slots` just before it and :meth:`StepSession.read_slots`
just after.

A script that adopts :mod:`omnilearn.torch` gets an ordinary run folder (``job.json``,
``metrics/rank-<r>.jsonl``, ``summary.json``), so ``omnilearn report`` and the figures read it as
they read a run's. Under ``omnilearn emulate`` the folder is emulate's (``OMNILEARN_OUT``): the job
file keeps emulate's plan and gets the script's batch and control settings. Levels then come from
emulate's schedule: one in seconds is applied by emulate, and the script only labels its steps with
it (by rank 0's clock, so every rank changes label at the same step); one in epochs is applied by
the script itself, through the same request log and toggler as a run's workers.
"""

from __future__ import annotations

import atexit
import copy
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from omnilearn import config
from omnilearn.control.controller import build_controller
from omnilearn.control.loop import ControlLoop
from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.emulator.spec.plan import build_plan, worker_target
from omnilearn.errors import UserError
from omnilearn.jobfile import JOB_FILE, OUT_ENV, T0_ENV, JobSpec, new_job_id
from omnilearn.metrics import MetricsWriter, metrics_path, read_rank
from omnilearn.observe.tensorboard import LiveTensorBoard
from omnilearn.records import END, of_kind
from omnilearn.report.stragglers import WINDOW_STEPS, StragglerScores
from omnilearn.report.summary import summarize
from omnilearn.train.distributed import all_gather_floats
from omnilearn.train.quota_clock import QuotaClock
from omnilearn.train.sampler import GlobalBatchSampler
from omnilearn.train.step import ProbeRounds, Slots, StepClock

STOP_WAIT_S = 30.0
"""How long rank 0 waits for the other ranks' ``end`` records when a loop stops inside a pass."""


def _shared_text(value: str) -> str:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def make_job(world: int, rank: int, global_batch: int, settings: dict[str, Any], names: tuple[str, str],
             out: str | Path | None) -> tuple[JobSpec, bool]:
    """The job of this script (rank 0 writes its job file); returns it and whether emulate runs it.

    ``settings``: dotted config keys (``control.policy``, ``train.seed``, ...) checked as a job
    config's are. A mistake is a UserError naming the key.
    """
    emulated = out is None and bool(os.environ.get(OUT_ENV))
    folder = Path(os.environ[OUT_ENV]) if emulated else Path(out) if out is not None else None
    base: dict[str, Any] = {"emulation": {"backend": "none", "hl": "HL1"}}
    plan, job_id, backend = None, "", "none"
    if emulated:
        assert folder is not None
        if not (folder / JOB_FILE).is_file():
            raise UserError(f"{OUT_ENV}={folder}: no {JOB_FILE} there (set by omnilearn emulate)")
        outer = JobSpec.load(folder / JOB_FILE, out_dir=folder)
        base, plan, job_id, backend = outer.config.to_dict(), outer.plan, outer.job_id, outer.backend
        if len(plan.targets) != world:
            raise UserError(f"omnilearn emulate was given {len(plan.targets)} workers (--workers), the "
                            f"script runs {world} ranks: give emulate --workers {world}")
    else:
        job_id = _shared_text(new_job_id() if rank == 0 else "")
        if folder is None:
            folder = Path("runs") / f"torch-{job_id}"
    data = copy.deepcopy(base)
    keys = {"mode": "bsp", "workers": world, "train.global_batch": global_batch, "train.epochs": 1,
            "model.name": f"torch:{names[0]}", "data.name": f"torch:{names[1]}", **settings}
    for key, value in keys.items():
        config.set_key(data, key, value)
    cfg = config.from_dict(data, "omnilearn.torch settings").validate()
    if plan is None:
        plan = build_plan(cfg)
    job = JobSpec(job_id=job_id, config=cfg, plan=plan, out_dir=folder.resolve(), backend=backend)
    if rank == 0:
        job.save()
    dist.barrier()
    return job, emulated



def refuse_accumulation(library: str, setting: str, value: int) -> None:
    """A framework's gradient accumulation (``setting=value``, above 1): a UserError. The controller
    sizes each step's batch, so one backward and one optimizer step make a step."""
    if value != 1:
        raise UserError(f"{library}: {setting}={value} is not supported: the controller sizes each step's batch; "
                        "raise the global batch instead")


def check_launched(library: str, what: str, runs: int, remedy: str) -> None:
    """The framework (``what``) runs ``runs`` processes where the launcher started WORLD_SIZE: else a
    UserError with ``remedy`` (a framework that sees no GPU would run each rank as a world of one)."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if runs != launched:
        raise UserError(f"{library}: WORLD_SIZE={launched} processes were launched but the {what} runs {runs}: "
                        f"without GPUs, give {remedy}")

@contextmanager
def leaves_no_trace(module: torch.nn.Module, optimizers: list[torch.optim.Optimizer], device: torch.device
                    ) -> Iterator[None]:
    """Within it, steps that leave no trace (a start-up probe's): the module's weights and buffers,
    the optimizers' state, the random state and the gradients are put back after it."""
    weights = copy.deepcopy(module.state_dict())
    states = [copy.deepcopy(o.state_dict()) for o in optimizers]
    try:
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            yield
    finally:
        module.load_state_dict(weights)
        for optimizer, state in zip(optimizers, states, strict=True):
            optimizer.load_state_dict(state)
        for p in module.parameters():
            p.grad = None


@dataclass
class Levels:
    """The level in force at each step, and this rank's allocation, under ``omnilearn emulate``.

    ``set_threads``: match torch's threads to each level's allocation; without it they stay as the
    launcher set them (``OMP_NUM_THREADS``), and :attr:`threads` stays None.
    """

    job: JobSpec
    rank: int
    emulated: bool
    set_threads: bool = False
    level: str | None = None
    cpus: float | None = None
    threads: int | None = None
    t0: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.target = worker_target("bsp", self.rank)
        self.targets = [worker_target("bsp", r) for r in range(self.job.config.workers)]
        self.client: AllocationClient | None = None
        if self.emulated:
            self.t0 = float(os.environ.get(T0_ENV) or time.time())
            if self.schedule.unit != "seconds":  # levels follow the script's epochs: the script asks for them
                self.client = AllocationClient(self.job.plan, self.job.log_dir, self.rank, self.target,
                                               self.job.config.emulation.ack_timeout,
                                               set_threads=self.set_threads)

    @property
    def schedule(self):  # noqa: ANN201 - emulator.schedule.Schedule
        return self.job.plan.schedule

    def clock(self) -> float:
        """Seconds since emulate's schedule began (rank 0's is shared with every step's gather)."""
        return time.time() - self.t0

    def at(self, epoch_position: float, clock: float) -> dict[str, Any] | None:
        """Move to the level the schedule holds now; returns the change event, or None."""
        if not self.emulated:
            return None
        if self.client is not None:
            event = self.client.ensure(self.schedule.level_at(epoch_position), epoch_position)
            if event is not None:
                self.level, self.cpus = self.client.level, self.client.allocation.share
                self.threads = self.client.threads if self.set_threads else None
            return event
        level = self.schedule.level_at(clock)
        if level == self.level:
            return None
        previous, self.level = self.level, level
        allocation = self.job.plan.allocation(level, self.target)
        self.cpus = allocation.share
        if self.set_threads:
            self.threads = allocation.threads()
            torch.set_num_threads(self.threads)
        return {"from_level": previous, "level": level, "epoch": epoch_position, "target": self.target,
                "status": "applied by omnilearn emulate", "clock_s": round(clock, 3)}

    def outcome(self, epoch_position: float) -> dict[str, Any] | None:
        """The outcome of a change the toggler was still retrying, once it has one (else None)."""
        late = self.client.settle(epoch_position) if self.client is not None else None
        if late is not None and self.client is not None:
            self.cpus = self.client.allocation.share
            self.threads = self.client.threads if self.set_threads else None
        return late

    def shares(self) -> list[float | None]:
        """Every rank's allocated CPUs at the level in force (for the policies named for them)."""
        if self.level is None:
            raise UserError("policies static and dynamic+prior need the allocations of omnilearn emulate: "
                            "run the script under `omnilearn emulate`, or use dynamic")
        return [self.job.plan.allocation(self.level, t).share for t in self.targets]


class StepSession:
    """One rank's side of the controller in a user's loop, whatever does the all-reduce.

    Per step: :meth:`begin_step` (the sizes of the step; it closes the previous one), the caller's
    backward, :meth:`fill_slots` at its end (this rank's compute time and rank 0's clock go in the
    ``extra_slots`` floats of the step's one sum all-reduce: :class:`~omnilearn.train.step.Slots`),
    the all-reduce, :meth:`read_slots`. The step is timed as ``omnilearn run``'s workers time theirs,
    by the same :class:`~omnilearn.train.step.StepClock`.
    The sum gives every rank every rank's time, so every rank's controller (the one ``omnilearn run``
    uses, from the same ``control`` settings, driven by the same
    :class:`~omnilearn.control.loop.ControlLoop`) takes the same decisions: the next step's shares
    always sum to the global batch. A step's compute time runs from :meth:`begin_step` to
    :meth:`fill_slots`, plus what the previous step spent after its all-reduce (the optimizer step
    and the loop's own work, one step late, where the controller times the update). Records go to ``metrics/rank-<r>.jsonl``; after each
    epoch rank 0 writes ``summary.json``.

    A step counts only once its all-reduce ran (:meth:`read_slots`): a batch drawn and never trained
    on (a peek at the loader) is neither recorded nor timed nor shown to the controller.
    ``per_level_threads``: set torch's threads to each level's allocation under ``omnilearn emulate``;
    by default they stay as the launcher set them (``OMP_NUM_THREADS``). ``tensorboard``: rank 0
    writes TensorBoard scalars to ``OUT/tensorboard/`` from a thread (under ``omnilearn emulate``,
    its ``--tensorboard`` writes them from outside the script instead).
    """

    def __init__(self, world: int, rank: int, *, policy: str = "dynamic", control: dict[str, Any] | None = None,
                 out: str | None = None, library: str = "omnilearn.torch", params: int = 0,
                 device: str = "cpu", model_name: str = "", per_level_threads: bool = False,
                 tensorboard: bool = False) -> None:
        self.world, self.rank = world, rank
        self.per_level_threads, self.tensorboard = per_level_threads, tensorboard
        self.board: LiveTensorBoard | None = None
        self.settings = {"control.policy": policy, **{f"control.{k}": v for k, v in (control or {}).items()}}
        self.out, self.library, self.params, self.device, self.model_name = out, library, params, device, model_name
        self.slots = Slots(world)
        self.extra_slots = self.slots.size
        self.timer: StepClock | None = None  # built with the controller, whose capabilities it follows
        self.quota = QuotaClock()  # the timer's
        self.asks_stop: Callable[[], bool] = lambda: False
        """Whether this rank asks every rank to stop (the loop's own signal, e.g. a SIGTERM it caught),
        read at the end of each backward: the answer rides that step's all-reduce."""
        self.stop_seen = False
        """Some rank asked to stop, as of the last all-reduce: the same on every rank, at the same step."""
        self.sampler: GlobalBatchSampler | None = None
        self.sizes: list[int] = []
        self.pending: dict[str, Any] | None = None
        self.steps_done = self.samples = 0
        self.epochs: int | None = None  # the loop's epochs, when it knows them (the horizon of a split)
        self.clock = 0.0  # rank 0's clock as of the last step
        self.filled = False  # the open step's slots are written
        self.values: list[float] | None = None
        self.between_s = 0.0  # time between an epoch's end and the next step (evaluation): not training time
        self.epoch_ended_at: float | None = None
        self.closed_at: float | None = None  # when the last step closed (perf_counter), within an epoch
        self.closed_cpu_s = 0.0  # and the process's CPU seconds then

    # ------------------------------------------------------------------------ set-up
    def attach(self, dataset_size: int, global_batch: int, seed: int, drop_last: bool, names: tuple[str, str],
               *, min_batch: int = 1) -> GlobalBatchSampler:
        """Build the job, its controller and the sampler (once; later calls return the sampler).

        ``names``: (model, data) names for the job file; the session's ``model_name`` wins if given.
        ``min_batch``: a floor under ``control.min_batch`` (``k`` micro-batches a step need ``k`` samples).
        """
        if self.sampler is not None:
            if self.sampler.global_batch != global_batch or self.sampler.dataset_size != dataset_size:
                raise UserError(f"{self.library}: one training loader per model (a second one has "
                                f"{dataset_size} samples in global batches of {global_batch})")
            return self.sampler
        self.settings.update({"train.seed": seed, "train.drop_last": drop_last})
        self.job, emulated = make_job(self.world, self.rank, global_batch, self.settings,
                                      (self.model_name or names[0], names[1]), self.out)
        if min_batch * self.world > global_batch:
            raise UserError(f"{self.library}: a global batch of {global_batch} over {self.world} ranks leaves "
                            f"a rank fewer than {min_batch} samples, one per micro-batch: give a larger batch")
        try:
            self.controller = build_controller(self.job.config.control, global_batch, self.world, min_batch=min_batch)
        except UserError as e:
            raise UserError(f"{self.library}: {e}") from None
        c, ctl = self.controller.bounds, self.controller
        self.timer = StepClock(self.slots, self.rank, on_cpu=torch.device(self.device).type == "cpu",
                               times_update=ctl.times_update, times_quota=ctl.times_quota, quota=self.quota)
        self.levels = Levels(self.job, self.rank, emulated, set_threads=self.per_level_threads)
        self.sampler = GlobalBatchSampler(dataset_size, global_batch, seed, drop_last=drop_last,
                                          min_local=c.min_batch)
        self.metrics = MetricsWriter(metrics_path(self.job.out_dir, self.rank))
        timer = self.timer
        self.loop = ControlLoop(self.controller, self.metrics.write, inputs=self.rank == 0,
                                rate=lambda: timer.quota.rate(timer.reading))
        if self.tensorboard and self.rank == 0 and not emulated:
            self.board = LiveTensorBoard(self.job, stragglers=StragglerScores(self.world, WINDOW_STEPS)).__enter__()
        self.metrics.write("start", rank=self.rank, world=self.world, target=self.levels.target,
                           params=self.params, train_samples=dataset_size,
                           steps_per_epoch=self.sampler.steps_per_epoch, device=self.device,
                           dist_backend=dist.get_backend(), policy=self.controller.policy, library=self.library)
        dist.barrier()
        self.t_start = time.time()
        self.started = False  # the loop starts at the first step, once its level is in force
        atexit.register(self.stop)  # a loop that ends before its pass does still closes its records
        return self.sampler

    def _follow(self, position: float) -> None:
        """Move to the level the schedule holds at ``position``; the loop starts at the first level."""
        event = self.levels.at(position, self.clock)
        if event is not None:
            self.metrics.write("hl_change", step=self.steps_done, **event)
            if self.started:
                self.loop.level(self.levels.shares, step=self.steps_done)
        if not self.started:
            self.loop.start(self.levels.shares, False, step=0)
            self.started = True

    def start_up(self, batch: Callable[[int], Any], local_step: Callable[[Any], None]) -> None:
        """The start-up probe, once, before the first step (after :meth:`attach`), where the loop can
        run a step of its own: the first level put in force, then ``local_step(batch(b))`` (forward,
        backward and optimizer step on ``b`` samples of this rank's, with no collective) timed at the
        two sizes of the controller's probe, ``control.probe_steps`` times each (more under a CPU quota
        where steps are short, see :attr:`~omnilearn.control.priors.Priors.min_pass_s`), as ``omnilearn run``'s workers do
        (:class:`~omnilearn.train.step.ProbeRounds`); one gather gives every rank every
        time and the controller its first split. ``batch(b)`` (the samples collated and on the device)
        runs before the clock, once a size: a step's time starts with its batch in hand. The caller
        restores what the steps changed (weights, optimizer state, random state). A policy without a
        probe runs nothing. Like ``omnilearn run``'s, the pass is set-up: its seconds are recorded
        (``probe_s``) and left out of ``train_time_s``."""
        if self.started or self.sampler is None:
            return
        began = time.time()
        self._follow(0.0)
        sizes = self.controller.probe_sizes()
        if sizes is None:
            return
        data = {b: batch(b) for b in sizes}
        device = torch.device(self.device)
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        assert self.timer is not None
        rounds = ProbeRounds(quota=device.type == "cpu" and self.timer.quota.limited(), sync=sync,
                             threads=torch.get_num_threads())
        steps = self.epochs * self.sampler.steps_per_epoch if self.epochs else None
        rounds.run(lambda size: local_step(data[size]), sizes, self.job.config.control.probe_steps,
                   self.sampler.global_batch / self.world, steps)
        every = all_gather_floats(rounds.own(*sizes), device)
        # the loop's first step still carries its one-off costs (a framework's hooks, DDP's first pass)
        self.loop.probe_readings(*sizes, every, warm=False, step=0)
        self.between_s += time.time() - began

    # ----------------------------------------------------------------------------- steps
    def begin_step(self, epoch: int, step: int, steps: int, sizes: list[int] | None = None) -> list[int]:
        """Close the previous step, follow the level, and open this one; returns the step's sizes.

        ``sizes``: every rank's share of this step, when a loader drew its samples ahead of the step
        (from :attr:`batch_sizes` at that time, the same on every rank); by default the controller's now.
        """
        self.finish_step()
        assert self.timer is not None
        if self.epoch_ended_at is not None:
            self.between_s += time.time() - self.epoch_ended_at
            self.epoch_ended_at = None
        elif self.closed_at is not None:
            # What the loop did between closing the last step and opening this one (a framework's
            # bookkeeping after its step-end hook, drawing and collating this batch) is this rank's work
            # as much as its forward: it rides with this step's time, as the update after the all-reduce does.
            self.timer.carry(time.perf_counter() - self.closed_at, time.process_time() - self.closed_cpu_s)
        self.closed_at = None
        position = epoch + step / steps
        self._follow(position)
        late = self.levels.outcome(position)  # a retried change's outcome: this rank's threads only
        if late is not None:
            self.metrics.write("hl_outcome", step=self.steps_done, **late)
        assert self.sampler is not None
        self.sizes = list(sizes) if sizes is not None else self.sampler.step_sizes(step, self.controller.batch)
        assert sum(self.sizes) == self.sampler.step_size(step) and len(self.sizes) == self.world, self.sizes
        self.pending = {"epoch": epoch, "step": step, "last": step == steps - 1}
        self.timer.open()
        return self.sizes

    @property
    def weight(self) -> float:
        """``b_i / B`` of the open step: this rank's gradient weight in the sum (0.0 for an empty share)."""
        mine = self.sizes[self.rank] if self.sizes else 0
        return mine / sum(self.sizes) if mine else 0.0

    def fill_slots(self, extra: torch.Tensor) -> None:
        """At the end of the step's backward, just before its all-reduce: rank 0's clock, this rank's time
        (:meth:`~omnilearn.train.step.StepClock.fill`: its compute, and the update after the last
        all-reduce one step late, as in ``omnilearn run``'s workers), its controller's cost, its threads,
        whether it asks every rank to stop."""
        assert self.pending is not None and self.timer is not None, "fill_slots outside a step"
        self.timer.fill(extra, clock=self.levels.clock(), stop=self.asks_stop(), cost_s=self.loop.cost_s)
        self.filled = True

    def read_slots(self, extra: torch.Tensor) -> None:
        """Just after the all-reduce (a sum over ranks): every rank's time, and the time spent in it."""
        assert self.filled and self.timer is not None, "read_slots before fill_slots"
        self.values = self.timer.read(extra)
        self.stop_seen = self.values[Slots.STOP] > 0

    def finish_step(self) -> None:
        """Measure the step just done, record it, and let the controller decide (every rank alike)."""
        if self.pending is None:
            return
        p, self.pending = self.pending, None
        if self.values is None:  # no all-reduce: the batch was drawn, never trained on
            self.filled = False
            return
        timer = self.timer
        assert timer is not None
        timer.close()  # what the step did after its all-reduce rides in the next one's time
        values, self.values, self.filled = self.values, None, False
        self.clock = values[Slots.CLOCK]  # rank 0's: every rank labels and decides at the same step
        self.steps_done += 1
        self.samples += sum(self.sizes)
        ctl, t = self.controller, self.sampler
        assert t is not None
        self.metrics.write("step", step=self.steps_done, epoch=p["epoch"], batch=self.sizes[self.rank],
                           global_batch=sum(self.sizes), compute_ms=round(timer.compute_s * 1e3, 3),
                           sync_ms=round(timer.sync_s * 1e3, 3), held_ms=timer.held_ms, loss=None,
                           train_acc=None, level=self.levels.level,
                           cpus=self.levels.cpus, threads=self.levels.threads or torch.get_num_threads())
        # the run's first step's update (the optimizer's state allocated, hooks set up: one-off costs)
        # rides with no step's time: the clock's first close is a stand-in of nothing
        full, slots = sum(self.sizes) == t.global_batch, self.slots
        times = slots.times(values) if full and ctl.measures else None
        steps_left = t.steps_per_epoch * self.epochs - self.steps_done if self.epochs else None
        self.loop.step(times, ctl.due(self.steps_done, p["last"]), steps_left, self.levels.shares,
                       max(slots.costs(values)), slots.kinds(values), step=self.steps_done)
        self.closed_at = time.perf_counter() if self.steps_done > 1 else None  # the first's gap: one-off too
        self.closed_cpu_s = time.process_time()

    def end_epoch(self, epoch: int) -> None:
        """After an epoch: its last step closed, an end record (the latest counts), ``summary.json``.

        ``train_time_s`` leaves out the time between an epoch's end and the next step (the loop's
        evaluation), as a run's does.
        """
        self.finish_step()
        ended = self._write_end(stopped=False)
        dist.barrier()  # every rank's end record is written before rank 0 reads them
        if self.rank == 0:
            summarize(self.job.out_dir)
        if self.board is not None:
            self.board.update()
        self.epoch_ended_at = ended

    def _write_end(self, stopped: bool) -> float:
        """This rank's ``end`` record of the steps so far (``stopped``: the loop ended inside a pass)."""
        assert self.sampler is not None
        ended = time.time()
        wall = ended - self.t_start
        self.metrics.write("end", wall_time_s=wall, train_time_s=wall - self.between_s, samples=self.samples,
                           steps=self.steps_done,
                           batch=list(self.controller.batch), level=self.levels.level,
                           epochs=self.steps_done / self.sampler.steps_per_epoch, out_of_time=False,
                           **({"stopped_early": True} if stopped else {}), **self.loop.summary())
        self.ended_steps = self.steps_done
        return ended

    ended_steps = 0
    """The steps the last ``end`` record covers."""

    def stop(self) -> None:
        """The loop ended inside a pass (a ``break``, an iteration count, the interpreter's exit): the step
        in progress closed if its all-reduce ran, an ``end`` record saying where it stopped
        (``stopped_early``), and rank 0's ``summary.json`` once every rank's end record is written (read
        from the files, for how long :data:`STOP_WAIT_S` allows: no collective, the process group may
        be gone). Nothing when every step is in an end record already."""
        if self.sampler is None or (self.steps_done == self.ended_steps and self.pending is None):
            return
        self.finish_step()
        if self.steps_done == self.ended_steps:
            return
        self._write_end(stopped=True)
        if self.rank == 0 and self._ends_written(self.steps_done):
            summarize(self.job.out_dir)
        if self.board is not None:
            self.board.update()

    def _ends_written(self, steps: int) -> bool:
        """Whether every rank's last ``end`` record covers ``steps`` steps (waiting for them)."""
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            last = [(of_kind(read_rank(self.job.out_dir, r), END) or [{}])[-1] for r in range(self.world)]
            if all(e.get("steps") == steps for e in last):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's share of the next full step."""
        return list(self.controller.batch) if self.sampler is not None else []
