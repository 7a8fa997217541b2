"""The ASP parameter server: applies every pushed gradient exactly once, and balances the workers.

Process rank 0 of an ASP job (target ``aspworker1``); the workers (:mod:`omnilearn.train.asp`, ranks
1..N) call it through three RPCs on ``torch.distributed.rpc`` (TensorPipe; the entry points and the
server process's life are in :mod:`omnilearn.train.asp_rpc`). A worker names itself by its slot, its
rank in the whole job: when the job goes on without a worker lost for good, the survivors are
re-ranked for the RPC group but keep their slots, counters, data streams and metrics files.

- ``rpc_hello(slot)``: registration; answers once every worker has registered, so all start together.
- ``rpc_pull(slot)``: the parameters and the BatchNorm running statistics as ONE flat tensor, with
  their version (the number of gradients applied so far).
- ``rpc_push(slot, seq, version, flat, ...)``: ONE flat tensor holding the mean gradient of the worker's
  batch followed by the change its forward pass made to the running statistics, the version the
  gradient was computed on, and the compute time of the worker's step. The reply carries that worker's
  batch size for its next step, the server's epoch, level and elapsed time, and ``stop``.

Gradients travel to the server (``asp.push: gradients``). Under ``asp.push: parameters`` (the
paper's released code) a worker steps its own optimizer and pushes the parameters it reached; the
server keeps the last writer's, overwriting every update applied since that worker's pull.

**Exactly once.** A push is applied inside the RPC handler under one lock, so updates never
interleave. Every push carries ``(slot, seq)``, ``seq`` counting that worker's pushes from 1: a push
whose ``seq`` was already applied (a retry after an RPC timeout) is not applied again but answered
with the reply it got the first time; a gap in ``seq`` is an internal error. Every applied push
bumps the version by one and writes one ``update`` record to ``metrics/rank-0.jsonl`` with its
staleness: the server's version when it was applied minus the version it was computed on.

**Update rule.** ``asp.update`` (:mod:`omnilearn.train.asp_update`, ``docs/design/asp.md``):
``sample-time`` counts a push of ``b`` samples as ``κ = b / b_ref`` units of the optimizer's time
(``b_ref``: ``asp.lr_reference_batch``, by default ``global_batch / workers``) and weighs its
gradient by ``min(1, ρ / τ)``, ``τ`` its staleness in that time (the ``κ`` of the pushes applied since
its pull) and ``ρ`` ``asp.delay_tolerance``; ``scaled-gradient``, the rule kept for comparison, runs
torch's optimizer on the gradient scaled by ``(b / b_ref) ** p`` (``asp.lr_scaling``). The schedule's lr is
the base of both; every ``update`` record has the push's weight (``scale``) and both staleness counts.

**BatchNorm.** The running statistics travel like gradients: a worker pushes the *change* its forward
pass made to the statistics it pulled, and the server adds it. Each batch's statistics thus enter the
server's exponential average once, and no worker overwrites the contributions others made since its
pull (copying the latest worker's statistics would). ``num_batches_tracked`` counts applied updates.

**Controller.** Each push carries the compute time of the step. ``dynamic`` is the ASP controller
(:mod:`omnilearn.control.asp`): from every worker's compute times and cycles and the server's time
per update, the split that maximises the effective samples a second its model predicts. The
baselines (:mod:`omnilearn.control.baselines`) are given each push's time; ``paper`` decides when the
server's epoch passes an integer (its ``per_epoch``). Each worker learns its new size in its next
push reply. The sum of the batch sizes is at most ``train.global_batch`` (``dynamic`` may make the
pushes smaller, and so fresher). A batch of 0 idles a worker: ``dynamic`` takes the slowest workers'
pushes away where they add more staleness to the others' than their samples are worth; an idle worker
calls ``idle`` until it has a batch again (at least every ``IDLE_POLL_S``, so the watchdog hears from
it), and the controller gives it one small push now and then to measure it again. The server runs the
schedule, but only the policies named for the allocations (``static``, ``dynamic+prior``) are told
of a level change; the others see it in the times the workers measure.

**Memory.** Each worker reports the largest batch its memory budget takes (in ``hello`` and with
every push). The server bounds the controller by them (``uniform``, the baseline, only warns);
when the global batch cannot fit at all it stops the job with a clear error (exit status 2): before
training when that is known at registration.

**End and faults.** Training ends when the applied samples reach ``epochs * training-set size``, or
when ``train.time_budget_s`` seconds have passed since the workers started: every later pull or push is answered with ``stop`` (a gradient already computed is still applied).
A watchdog stops the job, with ``OUT/snapshots/checkpoint.pt`` saved, when a worker has not called for
``asp.worker_timeout_s``; SIGTERM (the launcher stopping the job) also saves the checkpoint.

**Checkpoints and resume.** The server also checkpoints on ``checkpoint.every`` and at the end
(:class:`~omnilearn.train.checkpoint.ASPCheckpoint`). A resumed job (``omnilearn run --resume``, or a
restart) loads it before the workers register: the version, samples, clock, level and controller go
on, and each worker's ``hello`` reply tells it how many of its pushes were applied and how many
samples they held, so it goes on from there in its own data stream (a push computed but never
applied is computed again).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from omnilearn.control.asp import AsyncController, AsyncLoop
from omnilearn.control.controller import build_controller, configured_bounds
from omnilearn.control.loop import ControlLoop
from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import MetricsWriter
from omnilearn.train.asp_update import LR_POWERS, build_rule, reference_batch, scheduled_lr
from omnilearn.train.checkpoint import ASPCheckpoint
from omnilearn.train.distributed import GradBuffer, flat_state
from omnilearn.train.evaluate import SNAPSHOT_DIR
from omnilearn.train.memory import enforce_bounds
from omnilearn.train.workload import make_optimizer

log = logging.getLogger("omnilearn.server")

IDLE_POLL_S = 0.5
"""The longest an idle worker's call waits before it is answered (its batch still 0): the worker then
follows the level and calls again."""


class WorkerTimeout(Exception):
    """A worker stopped calling the server (dead or hung)."""


def batchnorm_counters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.num_batches_tracked for m in model.modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.num_batches_tracked is not None]


class LockedWriter:
    """A MetricsWriter shared by the RPC threads and the main loop."""

    def __init__(self, path: Path) -> None:
        self._writer = MetricsWriter(path)
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self._writer.write(kind, **fields)

    def close(self) -> None:
        with self._lock:
            self._writer.close()


class ParameterServer:
    """The server's model, optimizer, version and controller; the RPC handlers are its methods."""

    def __init__(self, job: JobSpec, model: torch.nn.Module, train_size: int, metrics: LockedWriter) -> None:
        cfg = job.config
        self.slots = job.slots[1:]  # the workers' slots: how they name themselves in every call
        self.workers = len(self.slots)  # fewer than configured when the job went on without a lost one
        t = cfg.train
        self.job, self.cfg, self.metrics = job, cfg, metrics
        self.schedule = job.plan.schedule
        self.model = model.train()
        self.state, self.n_params = flat_state(model)
        params = list(model.parameters())
        self.grads = GradBuffer(params, extra=0)
        self.counters = batchnorm_counters(model)
        self.rule = build_rule(cfg, self.state[:self.n_params], lambda: make_optimizer(cfg, params), self.grads.flat)
        self.lr_power = LR_POWERS[cfg.asp.lr_scaling]
        self.b_ref = reference_batch(cfg)
        self.parameters_pushed = cfg.asp.push == "parameters"
        self.kclock = 0.0  # the optimizer's time: the step of every push applied, in units (rule.elapsed)
        self.pulled: list[tuple[int, float]] = [(0, 0.0)] * len(self.slots)  # (version, kclock) at each pull
        # the parameters each worker pulled, for asp.delay_correction (none kept without it)
        self.pulled_state: list[torch.Tensor | None] = [None] * len(self.slots)
        self.train_size = train_size
        self.target_samples = t.epochs * train_size
        self.worker_targets = [job.plan.targets[s] for s in self.slots]
        self.configured_bounds = configured_bounds(cfg.control, t.global_batch, self.workers)
        self.memory_max: list[int | None] = [None] * self.workers  # what each worker's memory takes
        self.fault: UserError | None = None  # set by a handler, raised by the main loop
        self.controller: Any = build_controller(cfg.control, t.global_batch, self.workers, asynchronous=True,
                                                delay_tolerance=cfg.asp.delay_tolerance,
                                                batch_tolerance=cfg.asp.batch_tolerance, reference_batch=self.b_ref,
                                                parameters=self.parameters_pushed)
        if isinstance(self.controller, AsyncController):  # progress a second, from cycles (control/asp.py)
            self.loop: Any = AsyncLoop(self.controller, self.metrics.write)
        else:
            self.loop = ControlLoop(self.controller, self.metrics.write)
        self.applied_at: list[float | None] = [None] * len(self.slots)  # when each worker's last push was applied
        self.level = self.schedule.level_at(0)
        if not isinstance(self.controller, AsyncController):
            self.controller.initial(self.controller.allocations(lambda: self.shares(self.level)))
        # RLock: the SIGTERM handler (main thread) may checkpoint while the main thread holds it.
        self.lock = threading.RLock()
        self.ready = threading.Condition(self.lock)
        self.version = 0
        self.samples = 0
        self.clock = 0.0  # training seconds before this start (a resumed run's clock goes on)
        self.started: float | None = None  # when the run first started training
        self.t_start: float | None = None
        self.t_done: float | None = None  # when the applied samples reached the target
        self.t_end: float | None = None  # when the last worker was told to stop
        self.stopping = False
        self.registered: set[int] = set()
        self.stopped = [False] * self.workers
        self.last_seq = [0] * self.workers
        self.updates = [0] * self.workers
        self.worker_samples = [0] * self.workers  # samples of each worker's applied pushes
        self.last_contact = [time.time()] * self.workers
        self.replies: list[dict[str, Any] | None] = [None] * self.workers
        self.decided_epoch = 0  # paper: the last whole epoch a decision was taken at
        self.duplicates = 0
        self.snapshots = 0
        self.next_snapshot = cfg.asp.eval_interval
        self.checkpoint = ASPCheckpoint(self)  # a resumed run: its metrics are cut back first
        self.checkpoint.restore()

    # ------------------------------------------------------------------ state

    def shares(self, level: str) -> list[float | None]:
        return [self.job.plan.allocation(level, t).share for t in self.worker_targets]

    @property
    def epoch(self) -> float:
        return self.samples / self.train_size

    def elapsed(self, now: float | None = None) -> float:
        """The server's training clock: seconds since training started, those of earlier attempts included."""
        return self.clock if self.t_start is None else (now or time.time()) - self.t_start

    def base_lr(self) -> float:
        return scheduled_lr(self.cfg, self.epoch)

    def _index(self, slot: int) -> int:
        """Where a worker's counters are, from the slot it names itself by (its rank in the whole job)."""
        assert slot in self.slots, f"rank {slot} is not a worker of this job"
        return self.slots.index(slot)

    def _control(self, i: int) -> dict[str, Any]:
        """What every answer tells a worker; marks it stopped when training is over."""
        if self.stopping:
            self.stopped[i] = True
        return {"batch": self.controller.batch[i], "level": self.level, "epoch": self.epoch,
                "elapsed": self.elapsed(), "version": self.version, "stop": self.stopping}

    # ------------------------------------------------------------------ RPC handlers

    def hello(self, slot: int, timeout: float, max_batch: int | None = None) -> dict[str, Any]:
        i = self._index(slot)
        with self.ready:
            self.memory_max[i] = max_batch
            self.registered.add(i)
            self.last_contact[i] = time.time()
            self.ready.notify_all()
            if not self.ready.wait_for(lambda: self.t_start is not None, timeout=timeout):
                raise RuntimeError(f"the parameter server did not start within {timeout:.0f} s")
            self.last_contact[i] = time.time()
            # Where a resumed worker goes on: its pushes applied and the samples they held.
            return {**self._control(i), "pushes": self.last_seq[i], "samples": self.worker_samples[i]}

    def pull(self, slot: int) -> tuple[torch.Tensor | None, dict[str, Any]]:
        i = self._index(slot)
        with self.lock:
            self.last_contact[i] = time.time()
            self.pulled[i] = (self.version, self.kclock)
            control = self._control(i)
            # A clone: the tensor is serialised after the handler returns, outside the lock.
            state = None if self.stopping else self.state.clone()
            if self.rule.corrects and state is not None:
                self.pulled_state[i] = state[:self.n_params]
            return state, control

    def idle(self, slot: int) -> dict[str, Any]:
        """An idle worker's call (its batch is 0: the controller found the split better without its pushes):
        returns its orders once it has a batch again, training is over, or ``IDLE_POLL_S`` passed."""
        i = self._index(slot)
        with self.ready:
            self.last_contact[i] = time.time()
            self.ready.wait_for(lambda: self.controller.batch[i] > 0 or self.stopping, timeout=IDLE_POLL_S)
            self.last_contact[i] = time.time()
            return self._control(i)

    def push(self, slot: int, seq: int, version: int, flat: torch.Tensor, batch: int, stats: dict[str, Any]
             ) -> dict[str, Any]:
        """Apply one gradient (once), feed the controller, answer with the worker's next orders.

        ``stats``: ``loss`` and ``correct`` of the batch, ``compute_s`` of this step, the worker's
        ``level`` and the largest batch its memory takes (``max_batch``).
        """
        i = self._index(slot)
        assert flat.numel() == self.state.numel(), (flat.numel(), self.state.numel())
        with self.lock:
            now = time.time()
            self.last_contact[i] = now
            if seq <= self.last_seq[i]:
                self.duplicates += 1
                self.metrics.write("duplicate", worker=slot, seq=seq, applied_seq=self.last_seq[i])
                reply = self.replies[i]
                assert reply is not None and seq == self.last_seq[i], (seq, self.last_seq[i])
                return reply
            assert seq == self.last_seq[i] + 1, f"worker {slot}: push seq {seq} after {self.last_seq[i]}"
            staleness = self.version - version
            assert 0 <= staleness, (self.version, version)
            pulled_version, pulled_clock = self.pulled[i]
            late = self.kclock - pulled_clock if pulled_version == version else float(staleness)
            kappa = batch / self.b_ref
            base = self.base_lr()
            t_apply = time.perf_counter()
            if self.parameters_pushed:  # the worker stepped its own optimizer: the last writer's parameters
                self.state[:self.n_params].copy_(flat[:self.n_params])
                weight = 1.0
            else:
                # sample-time weighs the delay in the optimizer's time; scaled-gradient's damping counts updates
                delay = staleness if self.cfg.asp.update == "scaled-gradient" else late
                weight = self.rule.weight(kappa, delay)
                pulled = self.pulled_state[i] if pulled_version == version else None
                self.rule.apply(self.state[:self.n_params], flat[:self.n_params], kappa, delay, base, pulled=pulled)
            self.state[self.n_params:].add_(flat[self.n_params:])  # running-statistics change
            for counter in self.counters:
                counter += 1
            self.version += 1
            self.kclock += kappa if self.parameters_pushed else self.rule.elapsed(kappa)
            self.samples += batch
            self.worker_samples[i] += batch
            self.updates[i] += 1
            self.last_seq[i] = seq
            apply_s = time.perf_counter() - t_apply
            self.metrics.write("update", worker=slot, seq=seq, version=self.version, grad_version=version,
                               staleness=staleness, staleness_time=round(late, 4), batch=batch, scale=weight,
                               lr=base * weight, apply_ms=round(apply_s * 1e3, 3),
                               samples=self.samples, epoch=self.epoch, elapsed_s=self.elapsed(now),
                               loss=stats["loss"] / max(batch, 1), compute_ms=round(stats["compute_s"] * 1e3, 3),
                               time=now)
            if stats.get("max_batch") is not None and stats["max_batch"] != self.memory_max[i]:
                self.memory_max[i] = int(stats["max_batch"])
                self.apply_memory_bounds()
            self._observe(i, batch, stats, now, apply_s)
            self.advance()
            self.ready.notify_all()  # an idle worker the move woke, or the end of training
            reply = {**self._control(i), "staleness": staleness, "lr": base * weight}
            self.replies[i] = reply
            return reply

    # ------------------------------------------------------------------ controller and schedule

    def _observe(self, i: int, batch: int, stats: dict[str, Any], now: float, apply_s: float) -> None:
        """Feed worker i's compute time to the controller (a policy told of level changes takes only
        times measured at the current level); maybe decide."""
        ctl = self.controller
        last, self.applied_at[i] = self.applied_at[i], now
        if isinstance(ctl, AsyncController):
            if self.stopping:
                return
            ctl.server_s = apply_s if ctl.server_s == 0 else 0.9 * ctl.server_s + 0.1 * apply_s
            self.loop.push(i, batch, stats["compute_s"], 0.0 if last is None else now - last, worker=self.slots[i],
                           version=self.version, epoch=self.epoch)
            return
        if not ctl.measures or self.stopping or (ctl.knows_allocation and stats.get("level") != self.level):
            return
        due = True
        if ctl.per_epoch:  # it decides once an epoch (the paper's), at the epoch's first push
            due = int(self.epoch) > self.decided_epoch
            if due:
                self.decided_epoch = int(self.epoch)
        self.loop.push(i, batch, stats["compute_s"], due, lambda: self.shares(self.level), self.slots[i],
                       version=self.version, epoch=self.epoch)

    def apply_memory_bounds(self) -> None:
        """Bound the controller by the workers' memory (call under the lock or before training).

        When the global batch cannot fit, sets :attr:`fault` (the main loop stops the job with it).
        """
        if all(m is None for m in self.memory_max):
            return
        try:
            change = enforce_bounds(self.controller, self.configured_bounds, self.memory_max, "ASP workers")
        except UserError as e:
            self.fault = e
            return
        if change.over:
            log.warning("uniform batching gives ASP workers (ranks) %s more than their memory bound %s: "
                        "they may be killed", [self.slots[i] for i in change.over], list(change.bounds.max_batch))
        self.metrics.write("memory_bounds", version=self.version, max_batch=list(change.bounds.max_batch),
                           enforced=change.enforced)
        if change.new is not None:
            self.metrics.write("batch_change", version=self.version, epoch=self.epoch, old=change.old,
                               batch=change.new, reason="memory")

    def advance(self) -> None:
        """Follow the schedule (by epoch or by seconds) and the end of training; call under the lock."""
        position = self.epoch if self.schedule.unit == "epoch" else self.elapsed()
        level = self.schedule.level_at(position)
        if level != self.level:
            self.level = level
            ctl = self.controller
            if ctl.knows_allocation:  # told of the change (the others see it in measured times)
                old = list(ctl.batch)
                new = ctl.reallocate(ctl.allocations(lambda: self.shares(level)))
                if new is not None:
                    self.metrics.write("batch_change", version=self.version, epoch=self.epoch, old=old,
                                       batch=new, reason="allocation")
        budget = self.cfg.train.time_budget_s
        out_of_time = budget is not None and self.t_start is not None and self.elapsed() >= budget
        if not self.stopping and (self.samples >= self.target_samples or out_of_time):
            self.stopping = True
            self.t_done = time.time()
            self.metrics.write("done", version=self.version, samples=self.samples, epoch=self.epoch,
                               elapsed_s=self.elapsed(self.t_done))

    # ------------------------------------------------------------------ snapshots and checkpoint

    def snapshot(self, final: bool = False) -> Path:
        """Save the model (flat) with its version, epoch and time, for evaluation after training. The final
        snapshot's time is the end of training (``t_end``): no push is applied after it, and the run's
        ``train_time_s`` ends there too, so a target it reaches is reached within the run."""
        with self.lock:
            at = self.t_end if final else None
            snap = {"state": self.state.clone(), "n_params": self.n_params, "version": self.version,
                    "samples": self.samples, "epoch": self.epoch, "elapsed_s": self.elapsed(at), "final": final}
            path = self.job.out_dir / SNAPSHOT_DIR / f"snapshot-{self.snapshots:03d}.pt"
            self.snapshots += 1
        path.parent.mkdir(exist_ok=True)
        _save_atomic(snap, path)
        self.metrics.write("snapshot", file=path.name, version=snap["version"], epoch=snap["epoch"],
                           samples=snap["samples"], elapsed_s=snap["elapsed_s"], final=final)
        return path

    # ------------------------------------------------------------------ main loop

    def serve(self, client: AllocationClient, poll: float = 0.05) -> None:
        """Start the workers together, then watch: level, snapshots, watchdog, end of training."""
        timeout = self.cfg.asp.worker_timeout_s
        deadline = time.time() + timeout
        with self.ready:
            while len(self.registered) < self.workers:
                if time.time() > deadline:
                    missing = sorted(set(range(self.workers)) - self.registered)
                    raise WorkerTimeout(self._describe(missing, f"did not register within {timeout:g} s"))
                self.ready.wait(poll)
            self.apply_memory_bounds()
            if self.fault is not None:
                raise self.fault  # before training: the workers wait in hello, the launcher stops them
            self.t_start = time.time() - self.clock
            self.started = self.started or self.t_start
            self.last_contact = [time.time()] * self.workers
            self.ready.notify_all()
        self.metrics.write("train_start", batch=list(self.controller.batch), level=self.level,
                           target_samples=self.target_samples, clock=self.clock, version=self.version,
                           samples=self.samples)
        interval = self.cfg.asp.eval_interval
        while True:
            with self.lock:
                self.advance()
                level, epoch, done = self.level, self.epoch, all(self.stopped)
                silent = [i for i in range(self.workers)
                          if not self.stopped[i] and time.time() - self.last_contact[i] > timeout]
            if self.fault is not None:
                raise self.fault
            if done:
                break
            if silent:
                raise WorkerTimeout(self._describe(silent, f"sent nothing for more than {timeout:g} s "
                                                           f"(asp.worker_timeout_s)"))
            if level != client.level:
                event = client.ensure(level, epoch)
                if event is not None:
                    self.metrics.write("hl_change", version=self.version, elapsed_s=self.elapsed(), **event)
            late = client.settle(epoch)  # a retried change's outcome
            if late is not None:
                self.metrics.write("hl_outcome", version=self.version, elapsed_s=self.elapsed(), **late)
            if epoch >= self.next_snapshot and not self.stopping:
                self.snapshot()
                while self.next_snapshot <= epoch:
                    self.next_snapshot += interval
            if not self.stopping and self.checkpoint.due():
                self.checkpoint.save("every")
            time.sleep(poll)
        self.t_end = time.time()
        self.snapshot(final=True)
        if self.checkpoint.schedule.enabled:
            self.checkpoint.save("end")

    def _describe(self, indices: list[int], what: str) -> str:
        names = ", ".join(f"rank {self.slots[i]} ({self.worker_targets[i]})" for i in indices)
        return f"ASP worker {names} {what}"


def _save_atomic(obj: Any, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomic(path, buffer.getvalue())
