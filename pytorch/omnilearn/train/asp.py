"""Asynchronous training (ASP): the workers of a parameter server.

Process rank 0 is the parameter server (:mod:`omnilearn.train.parameter_server`, target
``aspworker1``); ranks 1..N are the workers (``aspworker2``...). One step of a worker, with no barrier
and no waiting for the others:

1. pull: the server's parameters and BatchNorm statistics (one flat tensor) and their version;
2. compute (timed): forward and backward of its next ``b_i`` samples;
3. push: the mean gradient followed by the change of the running statistics (one flat tensor), the
   version it was computed on and the step's compute time (under ``dynamic``, with the waits the worker's
   CPU quota put into its last push and this pull: :class:`~omnilearn.train.quota_clock.QuotaClock`).
   The reply gives the batch
   size of the next step (the controller runs at the server), the server's epoch and level, and
   whether training is over; a new level is requested from the toggler like in BSP. A batch of 0
   idles the worker: it calls the server's ``idle`` until it has a batch again, and pushes nothing.

Memory: before registering, a worker probes its peak memory per sample (:mod:`omnilearn.train.memory`)
and tells the server the largest batch its budget takes, again with every push (a level may change
its memory limit). The server never assigns more (except under ``uniform``, the baseline, which only
warns), and stops the job before training when the global batch cannot fit at all.

Data: each worker streams the whole training set, pass after pass, each pass in its own order seeded
by ``(seed, rank, pass)``; a batch that runs past the end of a pass continues into the next. An epoch
is the server's count of applied samples divided by the training-set size.

Resume: a worker of a resumed job learns from the server's ``hello`` reply how many of its pushes
the server's checkpoint holds and how many samples they took; it cuts its metrics file back to them
and goes on in its stream from there (its augmentation generator reseeded from that point).

Evaluation must not take CPU from the emulated training: the server saves snapshots of its model at
fixed epoch intervals (``asp.eval_interval``) and at the end, and :func:`~omnilearn.train.evaluate.evaluate_snapshots` scores
every one on the held-out split after the job, outside the emulated allocations
(``metrics/eval.jsonl``: accuracy over the server's wall time and epochs).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
import torch.distributed.rpc as rpc

from omnilearn.control.controller import controller_class
from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.emulator.spec.plan import SERVER_TARGET
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.train import asp_rpc, memory
from omnilearn.train.asp_update import local_rule, reference_batch, scheduled_lr
from omnilearn.train.checkpoint import cut_worker_metrics
from omnilearn.train.distributed import GradBuffer, env_int, flat_state
from omnilearn.train.models import count_parameters
from omnilearn.train.quota_clock import QuotaClock
from omnilearn.train.workload import Workload, gather, load_workload

log = logging.getLogger("omnilearn.worker")

RPC_ATTEMPTS = 3  # a pull or push that times out is sent again (a push at most once is applied)


class IndexStream:
    """One worker's endless stream of training indices: pass after pass over the whole set.

    Pass ``p`` is a permutation seeded by ``(seed, rank, p)``: workers see the data in different
    orders, and every sample once per pass of each worker, whatever batch sizes it is given.
    """

    def __init__(self, size: int, seed: int, rank: int) -> None:
        assert size > 0
        self.size, self.seed, self.rank = size, seed, rank
        self.passes = 0
        self._perm = self._permutation(0)
        self._pos = 0

    def _permutation(self, n: int) -> torch.Tensor:
        state = np.random.SeedSequence([self.seed, self.rank, n]).generate_state(2, dtype=np.uint32)
        mixed = ((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(mixed))

    def take(self, count: int) -> torch.Tensor:
        parts = []
        while count > 0:
            if self._pos == self.size:
                self.passes += 1
                self._perm, self._pos = self._permutation(self.passes), 0
            n = min(count, self.size - self._pos)
            parts.append(self._perm[self._pos:self._pos + n])
            self._pos += n
            count -= n
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def skip(self, count: int) -> None:
        """Move on ``count`` indices, as :meth:`take` would, without gathering them."""
        passes, pos = divmod(self.passes * self.size + self._pos + count, self.size)
        if pos == 0 and passes > 0:  # at the end of a pass, as take leaves it
            passes, pos = passes - 1, self.size
        if passes != self.passes:
            self._perm = self._permutation(passes)
        self.passes, self._pos = passes, pos


def _call(fn: Any, args: tuple, timeout: float) -> Any:
    """``rpc_sync`` to the server, sent again after a timeout (the server drops a repeated push)."""
    for attempt in range(1, RPC_ATTEMPTS + 1):
        try:
            return rpc.rpc_sync(SERVER_TARGET, fn, args=args, timeout=timeout)
        except RuntimeError as e:
            message = str(e).lower()
            if not ("timeout" in message or "timed out" in message) or attempt == RPC_ATTEMPTS:
                raise
            log.warning("%s to the parameter server timed out (attempt %d); sending it again", fn.__name__, attempt)
    raise AssertionError("unreachable")


def run(job: JobSpec) -> None:
    """Entry point of every ASP process: rank 0 serves, the other ranks train."""
    if env_int("RANK") == 0:
        asp_rpc.run_server(job)
    else:
        run_worker(job)


def run_worker(job: JobSpec) -> None:
    cfg = job.config
    t_cfg, c_cfg = cfg.train, cfg.control
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    assert 1 <= rank and world == len(job.slots), (rank, world, job.slots)
    slot = job.slots[rank]  # the server knows a worker by it, and its files, data stream and level follow it
    work = load_workload(cfg)
    train, test = work.train, work.test
    model = work.model().train()
    state, n_params = flat_state(model)
    grads = GradBuffer(list(model.parameters()), extra=state.numel() - n_params)  # gradient, then BN change
    target = job.plan.target(slot)
    client = AllocationClient(job.plan, job.log_dir, slot, target, cfg.emulation.ack_timeout)
    stream = IndexStream(len(train), t_cfg.seed, slot)
    augment = torch.Generator().manual_seed(t_cfg.seed * 1000 + slot)
    timeout = cfg.asp.worker_timeout_s
    follow = LevelFollower(client, probe_memory(cfg, model, work, grads) if c_cfg.memory_bounds else None)
    first = follow({"level": job.plan.schedule.level_at(0), "epoch": 0.0, "elapsed": 0.0}, 0)
    rpc.init_rpc(target, rank=rank, world_size=world, rpc_backend_options=asp_rpc.rpc_options(timeout, world - 1))
    control = rpc.rpc_sync(SERVER_TARGET, asp_rpc.rpc_hello, args=(slot, timeout, follow.max_batch),
                           timeout=2 * timeout)
    t_start = time.time()
    batch = control["batch"]
    step = seq = control["pushes"]  # a resumed worker goes on after its pushes the server's checkpoint holds
    samples = control["samples"]
    if job.resume:
        cut_worker_metrics(metrics_path(job.out_dir, slot), seq)
    if seq:
        resume_stream(stream, augment, t_cfg.seed, slot, seq, samples)
    metrics = follow.metrics = MetricsWriter(metrics_path(job.out_dir, slot))
    metrics.write("start", rank=rank, slot=slot, world=world, target=target, role="worker", params=count_parameters(model),
                  train_samples=len(train), test_samples=len(test), policy=c_cfg.policy, pushes=seq, samples=samples)
    if first is not None:
        metrics.write("hl_change", **first)
    # A controller that times quotas: the waits this worker's CPU quota put into its last push and this
    # pull count as its time
    quota, pushed = (QuotaClock() if controller_class(c_cfg.policy, asynchronous=True).times_quota else None), None
    own = local_rule(cfg, state[:n_params]) if cfg.asp.push == "parameters" else None
    while not control["stop"]:
        follow(control, step)
        control = wait_for_batch(slot, control, follow, step, timeout)
        batch = control["batch"]
        t0 = time.perf_counter()
        pulled, control = pull(slot, state, timeout)
        if pulled is None:  # training ended while this worker was busy
            break
        version, t1 = control["version"], time.perf_counter()
        held = quota.held_since(pushed) if quota is not None else 0.0
        grads.zero()
        x, y = gather(train, stream.take(batch), augment=cfg.data.augment, generator=augment)
        loss_sum, correct = local_gradient(work, model, x, y, pulled, state, n_params, grads)
        if own is not None:  # asp.push parameters: the push carries the parameters its own step reaches
            own_step(own, cfg, state[:n_params], grads.flat[:n_params], batch, control["epoch"])
        t2 = time.perf_counter()
        seq += 1
        stats = {"loss": float(loss_sum.detach()), "correct": float(correct), "compute_s": t2 - t1 + held,
                 "level": client.level, "max_batch": follow.max_batch}
        pushed = quota.read() if quota is not None else None
        control = _call(asp_rpc.rpc_push, (slot, seq, version, grads.flat, batch, stats), timeout)
        t3 = time.perf_counter()
        step += 1
        samples += batch
        metrics.write("step", step=step, seq=seq, version=version, staleness=control["staleness"], batch=batch,
                      compute_ms=round((t2 - t1) * 1e3, 3), pull_ms=round((t1 - t0) * 1e3, 3),
                      push_ms=round((t3 - t2) * 1e3, 3), sync_ms=round((t1 - t0 + t3 - t2) * 1e3, 3),
                      loss=stats["loss"] / batch, train_acc=stats["correct"] / batch, lr=control["lr"],
                      epoch=control["epoch"], level=client.level, cpus=client.allocation.share,
                      threads=client.threads)
    metrics.write("end", wall_time_s=time.time() - t_start, steps=step, pushes=seq, samples=samples,
                  batch=control["batch"], level=client.level)
    metrics.close()
    asp_rpc.shutdown_rpc()


def wait_for_batch(slot: int, control: dict[str, Any], follow: LevelFollower, step: int, timeout: float
                   ) -> dict[str, Any]:
    """The server's orders once this worker has a batch again, or training is over: while the controller
    keeps it idle (batch 0) it pulls and pushes nothing, and calls the server's ``idle`` (which answers at
    least every ``IDLE_POLL_S``), following the level meanwhile."""
    while control["batch"] == 0 and not control["stop"]:
        control = _call(asp_rpc.rpc_idle, (slot,), timeout)
        follow(control, step)
    return control


def pull(slot: int, state: torch.Tensor, timeout: float) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """The server's parameters and statistics into this worker's model (``state``, its flat view),
    and the server's orders; ``None`` for the tensor once training is over."""
    pulled, control = _call(asp_rpc.rpc_pull, (slot,), timeout)
    if pulled is not None:
        state.copy_(pulled)
    return pulled, control


def local_gradient(work: Workload, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, pulled: torch.Tensor,
                   state: torch.Tensor, n_params: int, grads: GradBuffer) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's mean gradient into ``grads`` followed by the change its forward pass made to the
    running statistics it pulled; returns the batch's summed loss and correct count."""
    loss_sum, correct = work.terms(model(x), y)
    (loss_sum / len(y)).backward()
    torch.sub(state[n_params:], pulled[n_params:], out=grads.extra)
    return loss_sum, correct


def own_step(rule: Any, cfg: Any, params: torch.Tensor, grad: torch.Tensor, batch: int, epoch: float) -> None:
    """``asp.push: parameters``: this worker's own optimizer step on the parameters it pulled, at the
    schedule's lr of the server's ``epoch``; the step's result replaces the gradient in the buffer the
    push sends."""
    rule.apply(params, grad, batch / reference_batch(cfg), 0.0, scheduled_lr(cfg, epoch))
    grad.copy_(params)


class LevelFollower:
    """Adopts the level the server's epoch (or clock) implies for this worker's own target, writes what
    changed to the metrics once they are open, and keeps the memory bound for the level in force."""

    def __init__(self, client: AllocationClient, memory_model: memory.MemoryModel | None) -> None:
        self.client, self.memory_model = client, memory_model
        self.max_batch: int | None = None
        self.metrics: MetricsWriter | None = None  # opened after the hello: a resumed worker cuts its file first

    def __call__(self, control: dict[str, Any], step: int) -> dict[str, Any] | None:
        event = self.client.ensure(control["level"], control["epoch"])
        if event is not None:
            event = {"step": step, "elapsed_s": control["elapsed"], "time": time.time(), **event}
            if self.metrics is not None:
                self.metrics.write("hl_change", **event)
        late = self.client.settle(control["epoch"])  # a retried change's outcome
        if late is not None and self.metrics is not None:
            self.metrics.write("hl_outcome", step=step, elapsed_s=control["elapsed"], **late)
        if self.memory_model is not None and (event is not None or late is not None or self.max_batch is None):
            self.max_batch = self.memory_model.max_batch_now(torch.device("cpu"))  # the level may change the limit
        return event


def resume_stream(stream: IndexStream, augment: torch.Generator, seed: int, slot: int, seq: int, samples: int) -> None:
    """A resumed worker's data position and augmentation generator, as after its ``seq`` pushes of ``samples``."""
    stream.skip(samples)
    mixed = np.random.SeedSequence([seed, slot, seq]).generate_state(1, dtype=np.uint64)[0]
    augment.manual_seed(int(mixed) & ((1 << 63) - 1))


def probe_memory(cfg: Any, model: torch.nn.Module, work: Workload, grads: GradBuffer) -> memory.MemoryModel:
    """This worker's peak memory per sample (two short forward+backward probes, before training).

    The probe's forward passes move the local BatchNorm statistics; harmless, as every step starts
    from the server's state.
    """
    def step(b: int) -> None:
        x, y = gather(work.train, torch.arange(b))
        loss_sum, _ = work.terms(model(x), y)
        (loss_sum / b).backward()
        grads.zero()

    return memory.probe(step, torch.device("cpu"), min(len(work.train), cfg.train.global_batch),
                        cfg.control.memory_margin)
