"""The BSP worker: synchronous data-parallel training with per-worker batch sizes.

One step on worker i is the synchronous step ``omnilearn.torch`` runs in a user's loop, through the
same :class:`~omnilearn.train.grad_sum.GradientSum`, timed by the same
:class:`~omnilearn.train.step.StepClock`: take its ``b_i`` samples of the step's global batch,
backward their mean loss, weight the gradient by ``b_i / B`` and sum the gradients of all workers with
one all-reduce of a flat buffer, update. The sum equals the gradient of the whole global batch,
whatever the split.
Compute time (forward, backward, and the update riding one step late) is timed apart from the
all-reduce, which also holds the wait for slower workers: the controller equalises compute times.

What the controller is given follows its policy: every worker's compute time of each step, carried
in spare slots of the same all-reduce as the gradients (:class:`~omnilearn.train.step.Slots`; the
sum gives every rank every time, so every rank's controller takes the same decisions and a step has
one collective under every policy), and the allocations only for the policies named for them.
This file keeps what the CLI job adds around the step: schedule events, memory bounds and the
out-of-memory retry, evaluation, checkpoints, survivors. A level
change is the emulator's event: it moves batches only for those policies; the others notice the
change in the times they measure. ``dynamic`` also times a few steps at two batch sizes on every
worker before step 1 (:meth:`BSPTrainer.probe`). The controller is driven by the one control loop
(:class:`~omnilearn.control.loop.ControlLoop`) that ``omnilearn.torch`` and the simulator use too.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time

import torch
import torch.distributed as dist

from omnilearn.control import policies
from omnilearn.control.controller import build_controller, configured_bounds
from omnilearn.control.loop import ControlLoop
from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.train import distributed, lifecycle, memory
from omnilearn.train.checkpoint import BSPCheckpoint
from omnilearn.train.evaluate import evaluate
from omnilearn.train.grad_sum import GradientSum
from omnilearn.train.models import count_parameters
from omnilearn.train.quota_clock import quota_seconds
from omnilearn.train.sampler import GlobalBatchSampler
from omnilearn.train.step import ProbeRounds, Slots, StepClock
from omnilearn.train.workload import Workload, gather, load_workload, make_optimizer, perplexity

log = logging.getLogger("omnilearn.worker")

LOSS, CORRECT = 0, 1  # the statistics a CLI step rides along in its slots (Slots.stat)


def share_loss(work: Workload, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
               ) -> tuple[torch.Tensor, float, float]:
    """Forward of this worker's share (at least one sample): its loss as the mean over the share, to
    backward (the gradient sum weights it by ``b_i / B``), and the share's loss and metric sums."""
    loss_sum, correct = work.terms(model(x), y)
    return loss_sum / x.shape[0], float(loss_sum.detach()), float(correct)


class BSPTrainer:
    """One rank of a BSP job: components built once, then :meth:`run` drives epochs and steps."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.stopped = False
        cfg = self.cfg = job.config
        self.slots = job.slots  # survivors of a lost worker are re-ranked; a worker's files and level follow its slot
        t, c = cfg.train, policies.effective(cfg.control, cfg.train.global_batch, len(self.slots))
        self.env = distributed.init(t.dist_backend, cfg.fault.timeout_s)
        self.rank, self.world = self.env.rank, self.env.world_size
        assert self.world == len(self.slots), (self.world, self.slots)
        self.slot = self.slots[self.rank]
        torch.manual_seed(t.seed)  # the same initial model on every rank
        self.work = load_workload(cfg)
        self.model = self.work.model().to(self.env.device)
        for p in self.model.parameters():  # belt and braces: identical start even if seeding diverged
            dist.broadcast(p.data, src=0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.layout = Slots(self.world, stats=2)  # the step's loss and metric sums ride along
        self.grads = GradientSum(params, self.layout.size, fill=self._fill, read=self._read, sync=self._sync_cuda)
        self.step_values: list[float] = []  # the all-reduced slots of the step in progress
        self.step_stats, self.step_oom, self.clock_start = (0.0, 0.0), False, 0.0
        self.optimizer = make_optimizer(cfg, params)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer, milestones=t.milestones, gamma=t.gamma)
        self.sampler = GlobalBatchSampler(len(self.work.train), t.global_batch, t.seed, drop_last=t.drop_last,
                                          min_local=c.min_batch)
        self.configured_bounds = configured_bounds(cfg.control, t.global_batch, self.world)
        self.controller = ctl = build_controller(cfg.control, t.global_batch, self.world)
        self.timer = StepClock(self.layout, self.rank, on_cpu=self.env.device.type == "cpu",
                               times_update=ctl.times_update, times_quota=ctl.times_quota)
        self.quota = self.timer.quota
        self.targets = [job.plan.targets[s] for s in self.slots]
        self.client = AllocationClient(job.plan, job.log_dir, self.slot, self.targets[self.rank],
                                       cfg.emulation.ack_timeout)
        self.augment_rng = torch.Generator().manual_seed(t.seed * 1000 + self.slot)  # per-worker, reproducible
        self.ckpt = BSPCheckpoint(self)  # a resumed run cuts its metrics back to the checkpoint first
        self.metrics = MetricsWriter(metrics_path(job.out_dir, self.slot))
        self.loop = ControlLoop(self.controller, self.metrics.write, inputs=self.rank == 0,
                                rate=lambda: self.quota.rate(self.timer.reading))
        self.memory: memory.MemoryModel | None = None
        self.oom_cap: int | None = None  # this rank's bound after an out-of-memory error (GPU)
        self.oom_seen = False  # any rank ran out of memory: bounds are enforced whatever the policy
        self.started = False  # the first level's allocation is in force and the loop has started
        self.metrics.write("start", rank=self.rank, slot=self.slot, world=self.world, target=self.targets[self.rank],
                           params=count_parameters(self.model), train_samples=len(self.work.train),
                           test_samples=len(self.work.test), steps_per_epoch=self.sampler.steps_per_epoch,
                           device=str(self.env.device), dist_backend=self.env.backend, policy=c.policy,
                           language_model=self.work.perplexity, metric=self.work.metric.name)

    # ------------------------------------------------------------------------------------ memory
    def update_bounds(self, step: int) -> None:
        """Per-worker max batch from every worker's memory budget (re-read: a level may change it).

        A collective: every rank calls it at the same step (the conditions below are the same on all).
        """
        if self.memory is None and not self.oom_seen:
            return
        own = self.cfg.train.global_batch
        if self.memory is not None:
            own = self.memory.max_batch_now(self.env.device)
        if self.oom_cap is not None:
            own = min(own, self.oom_cap)
        maxes = [int(g[0]) for g in distributed.all_gather_floats([float(own)], self.env.device)]
        change = memory.enforce_bounds(self.controller, self.configured_bounds, maxes, "workers",
                                       force=self.oom_seen)
        if change.over and self.rank == 0:
            log.warning("uniform batching gives workers %s more than their memory bound %s: they may be "
                        "killed", change.over, list(change.bounds.max_batch))
        self.metrics.write("memory_bounds", step=step, max_batch=list(change.bounds.max_batch),
                           enforced=change.enforced)
        if change.new is not None:
            self.metrics.write("batch_change", step=step, batch=list(change.new), reason="memory")

    # ------------------------------------------------------------------------------------ levels
    def shares(self, level: str) -> list[float | None]:
        return [self.job.plan.allocation(level, t).share for t in self.targets]

    def change_level(self, level: str, epoch: float, step: int) -> None:
        event = self.client.ensure(level, epoch)
        if event is None:
            late = self.client.settle(epoch)  # a retried change's outcome: this rank's threads only
            if late is not None:
                self.metrics.write("hl_outcome", step=step, **late)
            return
        self.metrics.write("hl_change", step=step, **event)
        if self.started:  # only a policy told of allocations moves (the first level: the loop's start)
            self.loop.level(lambda: self.shares(level), step=step)
        self.update_bounds(step)

    # ------------------------------------------------------------------------------------- steps
    def train_step(self, step: int, clock_start: float) -> tuple[list[int], list[float]]:
        """One synchronous step; returns (sizes, the all-reduced slots); its times are :attr:`timer`'s.

        If any rank ran out of (GPU) memory, every rank learns it from the same all-reduce, drops
        the step's gradient, and the step is tried again with lower bounds, on the same samples.
        """
        timer = self.timer
        timer.open()
        self.clock_start = clock_start
        while True:
            batch = list(self.controller.batch)
            sizes = self.sampler.step_sizes(step, batch)
            idx = self.sampler.local_indices(step, batch, self.rank)
            self.sample_sum = int(idx.sum())  # a checksum of the samples: a resumed run's data order shows
            mine = sizes[self.rank]
            self.grads.open([mine], mine / sum(sizes))
            self.step_stats, self.step_oom = (0.0, 0.0), False
            try:
                if mine:
                    x, y = gather(self.work.train, idx, augment=self.cfg.data.augment, generator=self.augment_rng)
                    loss, *stats = share_loss(self.work, self.model, x.to(self.env.device), y.to(self.env.device))
                    self.step_stats = (stats[0], stats[1])
                    loss.backward()  # its end all-reduces (GradientSum)
            except torch.OutOfMemoryError:
                self.step_oom, self.step_stats = True, (0.0, 0.0)
                torch.cuda.empty_cache()
            if not self.grads.reduced:  # no backward ran to its end here: a zero gradient joins the sum
                self.grads.reduce()
            values = self.step_values
            if values[Slots.OOM] > 0:
                self.oom_seen = True
                if self.step_oom:
                    self.oom_cap = max(self.configured_bounds.min_batch, int(mine * 0.8))
                    log.warning("rank %d: out of memory at batch %d; bound lowered to %d", self.rank, mine,
                                self.oom_cap)
                self.update_bounds(step)
                timer.retry()
                continue
            self.optimizer.step()
            self._sync_cuda()
            timer.close()
            self.grads.close()
            return sizes, values

    def _fill(self, extra: torch.Tensor) -> None:
        """The step's slots, just before its all-reduce: rank 0's clock, a stop asked, an out-of-memory
        error, this rank's time and cost, the step's loss and metric sums."""
        self.timer.fill(extra, clock=time.time() - self.clock_start, stop=lifecycle.stop_requested(),
                        cost_s=self.loop.cost_s, oom=self.step_oom, stats=self.step_stats)

    def _read(self, extra: torch.Tensor) -> None:
        self.step_values = self.timer.read(extra)

    def _sync_cuda(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize()

    def control(self, step: int, values: list[float], full: bool, end_of_epoch: bool, steps_left: int) -> None:
        """The step's compute times (every rank's, from the all-reduced buffer) to the control loop; a
        decision at the controller's decision points. A partial last step of an epoch is not measured:
        it does not describe the steady state. Every rank decides alike from the same numbers."""
        slots = self.layout
        times = slots.times(values) if full and self.controller.measures else None
        self.loop.step(times, self.controller.due(step, end_of_epoch), steps_left,
                       lambda: self.shares(self.client.level), max(slots.costs(values)), slots.kinds(values),
                       step=step)

    def start_up(self, step: int, resumed: bool) -> None:
        """The start-up pass, once the first allocation is in force and before the training clock
        starts (set-up, like building the model; ``dynamic`` reports its seconds), the same for every
        policy: steps (forward, backward and update, each worker on its own) at
        the two sizes of :func:`~omnilearn.control.policies.probe_sizes`, twice each (more with
        ``control.probe_steps``, and under a CPU quota where steps are short, until the pass has lasted
        :attr:`~omnilearn.control.priors.Priors.min_pass_s`). Their peak memory gives this worker's memory bound
        (``control.memory_bounds``); their times give ``dynamic`` its k and every speed (one gather;
        the least of each size's two runs, of more the median of each pair's least: the first also
        carries the new allocation, threads and shapes; on a CPU under a quota in CPU seconds, the median
        of the workers on the same kind of core with as many threads, at the rate this worker's whole
        pass got CPU: :func:`~omnilearn.control.loop.probe_times`), so its first split is balanced before
        step 1. The model and optimizer are restored after. The rounds' updates, timed apart, give the
        update that rides in step 1's time (every later step carries the one before it), and stand in for
        step 1's own: the first update after the restore allocates the optimizer's state again, a one-off
        that says nothing of speeds."""
        sizes = policies.probe_sizes(self.cfg.train.global_batch, self.world, self.configured_bounds)
        probe = not resumed and self.controller.probe_sizes() is not None
        if not self.cfg.control.memory_bounds and not probe:
            return
        saved = copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())
        # each round's wall time, and on a CPU under a quota its CPU time: a round shorter than what is
        # left of a CFS period runs at a core's speed and leaves the quota's wait to a later one
        rounds = ProbeRounds(quota=self.env.device.type == "cpu" and self.quota.limited(), sync=self._sync_cuda,
                             threads=torch.get_num_threads())
        available = len(self.work.train)

        reading = self.quota.read() if self.controller.times_quota else None
        cpus = self.quota.cpus(reading) if self.env.device.type == "cpu" else None  # as a step times its update
        updates: list[float] = []

        def local_step(b: int) -> None:  # no step is open: the gradient stays local
            self.grads.buffer.zero()
            x, y = gather(self.work.train, torch.arange(b) % available)
            share_loss(self.work, self.model, x.to(self.env.device), y.to(self.env.device))[0].backward()
            self._sync_cuda()
            t0, c0 = time.perf_counter(), time.process_time()
            self.optimizer.step()
            self._sync_cuda()
            updates.append(quota_seconds(time.perf_counter() - t0, time.process_time() - c0, cpus))

        def timed(b: int) -> None:
            rounds.time(local_step, b)

        if self.cfg.control.memory_bounds:
            self.memory = memory.probe(timed, self.env.device, min(available, self.cfg.train.global_batch),
                                       self.cfg.control.memory_margin, sizes=sizes)
        if probe:
            rounds.run(local_step, sizes, self.cfg.control.probe_steps, self.cfg.train.global_batch / self.world,
                       self.cfg.train.epochs * self.sampler.steps_per_epoch)
        # before the bounds' collective: a worker waiting there for a slower one gets no CPU, and its
        # rate would read lower than its rounds ran at
        own = rounds.own(*sizes) if probe else []
        if all(rounds.wall.get(b) for b in sizes):  # what tells k where the steps run one batch size
            reading = own or rounds.own(*sizes)
            self.metrics.write("start_up", sizes=list(sizes), times_ms=[round(t * 1e3, 3) for t in reading[:2]],
                               cpu=reading[3] > 0, level=self.client.level)
        if updates:  # step 1's time carries an update as every probe round's did; the first's one-off stays out
            self.timer.stand_in(statistics.median(updates[len(updates) // 2:]))
        self.model.load_state_dict(saved[0])
        self.optimizer.load_state_dict(saved[1])
        self.grads.buffer.zero()
        self.update_bounds(step)
        if probe:
            small, large = sizes
            every = distributed.all_gather_floats(own, self.env.device)
            self.loop.probe_readings(small, large, every, step=step)

    # --------------------------------------------------------------------------------------- run
    def out_of_time(self, clock: float) -> bool:
        """``train.time_budget_s`` is spent (``clock``: rank 0's seconds since the start, all-reduced)."""
        budget = self.cfg.train.time_budget_s
        return budget is not None and clock >= budget

    def run(self) -> None:
        t, schedule, metrics, ckpt = self.cfg.train, self.job.plan.schedule, self.metrics, self.ckpt
        p = ckpt.progress
        self.change_level(schedule.level_at(p.clock if schedule.unit == "seconds" else p.position), p.position,
                          p.steps)
        ckpt.restore()  # a resumed run: controller, model, optimizer, position and counters as saved
        self.loop.start(lambda: self.shares(self.client.level), ckpt.resumed, step=p.steps)
        self.started = True
        self.start_up(p.steps, ckpt.resumed)  # set-up, the same for every policy: before the clock
        dist.barrier()  # everyone starts the clock together; the first level is in force before it starts
        lifecycle.arm()  # SIGTERM from now on: stop after the current step
        t_start = time.time() - p.clock  # the training clock goes on from the checkpoint's
        p.started = p.started or t_start  # the whole run's wall time counts from its first start
        clock, steps_done, samples, eval_time, position = p.clock, p.steps, p.samples, p.eval_time, p.position
        for epoch in range(ckpt.sampler.epoch, t.epochs):
            self.sampler.set_epoch(epoch)
            steps = self.sampler.steps_per_epoch
            for step in range(ckpt.sampler.step if epoch == ckpt.sampler.epoch else 0, steps):
                # By epoch (a trace's levels change within epochs), or by rank 0's clock, shared by the
                # all-reduce: every rank takes the same decision at the same step.
                last, position = position, epoch + step / steps
                for level in self.job.plan.stalls_passed(last, position):  # a stall shorter than a step
                    self.change_level(level, position, steps_done)
                self.change_level(schedule.level_at(clock if schedule.unit == "seconds" else position), position,
                                  steps_done)
                sizes, extra = self.train_step(step, t_start)
                steps_done += 1
                samples += sum(sizes)
                clock = extra[Slots.CLOCK]
                loss, correct = extra[self.layout.stat(LOSS)], extra[self.layout.stat(CORRECT)]
                metrics.write("step", step=steps_done, epoch=epoch, sample_sum=self.sample_sum, batch=sizes[self.rank],
                              global_batch=sum(sizes), compute_ms=round(self.timer.compute_s * 1e3, 3),
                              sync_ms=round(self.timer.sync_s * 1e3, 3), held_ms=self.timer.held_ms,
                              loss=loss / sum(sizes), train_acc=correct / sum(sizes), level=self.client.level,
                              cpus=self.client.allocation.share, threads=self.client.threads,
                              lr=self.optimizer.param_groups[0]["lr"])
                self.control(steps_done, extra, sum(sizes) == t.global_batch, step == steps - 1,
                             t.epochs * steps - steps_done)
                if extra[Slots.STOP] > 0:  # a rank was asked to stop (SIGTERM): every rank stops after this step
                    self.stopped = True
                    break
                if self.out_of_time(clock):  # the same clock on every rank: all stop after this step
                    break
                if step < steps - 1 and ckpt.schedule.due_clock(clock):  # the same clock: the same step
                    ckpt.save(epoch, step + 1, steps_done, samples, clock, position, eval_time)
            if self.stopped:  # the one place a requested stop leaves the loop: save here
                metrics.write("stopped", step=steps_done, epoch=epoch, samples=samples, elapsed_s=time.time() - t_start)
                if step < steps - 1:  # from the next step (a stop after an epoch's last step keeps the last checkpoint)
                    ckpt.save(epoch, step + 1, steps_done, samples, clock, position, eval_time)
                break
            self.scheduler.step()
            last = epoch == t.epochs - 1 or self.out_of_time(clock)
            if (epoch + 1) % t.eval_every == 0 or last:
                te = time.perf_counter()
                result = evaluate(self.model, self.work, self.controller.batch, self.rank, self.env.device)
                eval_time += time.perf_counter() - te
                metrics.write("eval", epoch=epoch, step=steps_done, accuracy=result.accuracy, loss=result.loss,
                              metric=self.work.metric.name, lower_is_better=self.work.metric.lower_is_better,
                              perplexity=perplexity(result.loss) if self.work.perplexity else None,
                              samples=result.samples, elapsed_s=time.time() - t_start)
            if last or ckpt.schedule.due_epoch(epoch + 1, epoch) or ckpt.schedule.due_clock(clock):
                ckpt.save(epoch + 1, 0, steps_done, samples, clock, position, eval_time)
            if last:
                break
        wall = time.time() - p.started
        if not self.stopped:
            metrics.write("end", wall_time_s=wall, train_time_s=wall - eval_time, samples=samples, steps=steps_done,
                          batch=list(self.controller.batch), level=self.client.level,
                          epochs=steps_done / self.sampler.steps_per_epoch, out_of_time=self.out_of_time(clock),
                          **self.loop.summary())
        metrics.close()
        dist.barrier()
        dist.destroy_process_group()


def run(job: JobSpec) -> None:
    """Train one BSP worker to the end of the job (called in every worker process)."""
    trainer = BSPTrainer(job)
    trainer.run()
    if trainer.stopped:
        raise SystemExit(lifecycle.STOPPED_STATUS)
