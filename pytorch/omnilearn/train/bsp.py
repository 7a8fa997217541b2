"""The BSP worker: synchronous data-parallel training with per-worker batch sizes.

One step on worker i: take its ``b_i`` samples of the step's global batch, compute
``sum(loss) / B`` and its gradient (so the gradient is already weighted by ``b_i / B``), sum the
gradients of all workers with one all-reduce of a flat buffer, update. The sum equals the gradient
of the whole global batch, whatever the split. Compute time (forward, backward, update) is timed
apart from the all-reduce, which also holds the wait for slower workers: the controller equalises
compute times.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from omnilearn.control.controller import BatchController
from omnilearn.control.policies import Bounds
from omnilearn.emulator.client import AllocationClient
from omnilearn.emulator.plan import worker_target
from omnilearn.launch.job import JobSpec
from omnilearn.train import distributed
from omnilearn.train.data import GlobalBatchSampler, eval_indices, load_dataset
from omnilearn.train.metrics import MetricsWriter, metrics_path
from omnilearn.train.models import build_model, count_parameters

log = logging.getLogger("omnilearn.worker")

# Slots after the gradients in the all-reduced buffer: statistics that ride along for free.
LOSS, CORRECT, CLOCK, EXTRA = 0, 1, 2, 3


class GradBuffer:
    """One flat tensor holding every parameter's gradient (``.grad`` are views into it).

    Backward accumulates straight into the buffer, so the all-reduce is a single call with no
    packing or unpacking copies, and zeroing is one ``fill_``.
    """

    def __init__(self, params: list[torch.nn.Parameter], extra: int = EXTRA) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel + extra, device=params[0].device)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = self.flat[offset:offset + n].view_as(p)
            offset += n
        self.extra = self.flat[self.numel:]

    def zero(self) -> None:
        self.flat.zero_()

    def all_reduce(self) -> None:
        dist.all_reduce(self.flat)


def local_backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, global_size: int
                   ) -> tuple[float, int]:
    """Forward and backward of this worker's share; returns (loss sum, correct predictions).

    Dividing the summed loss by the step's global size weights the local gradient by b_i / B.
    """
    if x.shape[0] == 0:
        return 0.0, 0
    out = model(x)
    loss_sum = F.cross_entropy(out, y, reduction="sum")
    (loss_sum / global_size).backward()
    return float(loss_sum.detach()), int((out.detach().argmax(1) == y).sum())


@dataclass
class EvalResult:
    accuracy: float
    loss: float
    samples: int


@torch.no_grad()
def recalibrate_batchnorm(model: torch.nn.Module, train, shares: list[int], rank: int, device: torch.device,
                          samples: int = 512, chunk: int = 128) -> None:
    """Re-estimate BatchNorm statistics with the current weights before evaluating ("precise BN").

    The running averages mix statistics of many past weights (after a short run, mostly of the
    initial ones) and each replica saw only its own batches. Here every rank runs forward passes on
    its share of one fixed set of training samples, and the ranks pool their averages weighted by
    samples, so every replica evaluates with the same statistics of the model as it is now.
    """
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
           and m.track_running_stats]
    if not bns:
        return
    n = min(samples, len(train))
    subset = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:n]
    idx = eval_indices(n, shares, rank)
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batches
    was_training = model.training
    model.train()
    seen = 0
    for start in range(idx.start, idx.stop, chunk):
        sel = subset[start:min(start + chunk, idx.stop)]
        if len(sel) < 2:  # BatchNorm cannot normalise a single sample
            continue
        x, _ = train.batch(sel)
        model(x.to(device))
        seen += len(sel)
    stats = torch.cat([torch.cat([m.running_mean, m.running_var]) for m in bns]).double() * seen
    stats = torch.cat([stats, torch.tensor([float(seen)], dtype=torch.float64, device=stats.device)])
    dist.all_reduce(stats)
    pooled = stats[:-1] / stats[-1].clamp(min=1)
    offset = 0
    for m, momentum in zip(bns, momenta, strict=True):
        c = m.running_mean.numel()
        m.running_mean.copy_(pooled[offset:offset + c])
        m.running_var.copy_(pooled[offset + c:offset + 2 * c])
        offset += 2 * c
        m.momentum = momentum
    model.train(was_training)


@torch.no_grad()
def evaluate(model: torch.nn.Module, test, shares: list[int], rank: int, device: torch.device,
             chunk: int = 256, train=None) -> EvalResult:
    """Held-out accuracy, the test set split among ranks in proportion to ``shares``.

    With ``train``, BatchNorm statistics are first re-estimated on training samples (see
    :func:`recalibrate_batchnorm`); otherwise the replicas' running statistics are averaged.
    """
    if train is not None:
        recalibrate_batchnorm(model, train, shares, rank, device)
    else:
        distributed.average_buffers(model)
    model.eval()
    idx = eval_indices(len(test), shares, rank)
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for start in range(idx.start, idx.stop, chunk):
        sel = torch.arange(start, min(start + chunk, idx.stop))
        x, y = test.batch(sel)
        x, y = x.to(device), y.to(device)
        out = model(x)
        stats[0] += F.cross_entropy(out, y, reduction="sum").double()
        stats[1] += (out.argmax(1) == y).sum().double()
        stats[2] += len(sel)
    dist.all_reduce(stats)
    model.train()
    n = int(stats[2].item())
    return EvalResult(accuracy=float(stats[1] / n), loss=float(stats[0] / n), samples=n)


def run(job: JobSpec) -> None:
    """Train one BSP worker to the end of the job (called in every worker process)."""
    cfg = job.config
    t_cfg, c_cfg = cfg.train, cfg.control
    env = distributed.init(t_cfg.dist_backend)
    rank, world = env.rank, env.world_size
    assert world == cfg.workers, (world, cfg.workers)
    torch.manual_seed(t_cfg.seed)  # the same initial model on every rank

    train, test, classes = load_dataset(cfg.data.name, cfg.data.root, cfg.data.image_size,
                                        cfg.data.download, cfg.data.test_fraction, t_cfg.seed,
                                        synthetic_size=cfg.data.synthetic_size)
    model = build_model(cfg.model.name, classes, cfg.data.image_size, stem=cfg.model.stem).to(env.device)
    for p in model.parameters():  # belt and braces: identical start even if seeding diverged
        dist.broadcast(p.data, src=0)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = GradBuffer(params)
    optimizer = torch.optim.SGD(params, lr=t_cfg.lr, momentum=t_cfg.momentum, weight_decay=t_cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=t_cfg.milestones, gamma=t_cfg.gamma)
    sampler = GlobalBatchSampler(len(train), t_cfg.global_batch, t_cfg.seed, drop_last=t_cfg.drop_last,
                                 min_local=c_cfg.min_batch)
    bounds = Bounds.make(world, c_cfg.min_batch, c_cfg.max_batch, t_cfg.global_batch)
    controller = BatchController(policy=c_cfg.policy, global_batch=t_cfg.global_batch, bounds=bounds,
                                 interval=c_cfg.interval, window=c_cfg.window, min_samples=c_cfg.min_samples,
                                 deadband=c_cfg.deadband, skip=c_cfg.skip_after_change)
    plan, schedule = job.plan, job.plan.schedule
    targets = [worker_target(cfg.mode, r) for r in range(world)]
    client = AllocationClient(plan, job.log_dir, rank, targets[rank], cfg.emulation.ack_timeout)
    metrics = MetricsWriter(metrics_path(job.out_dir, rank))
    metrics.write("start", rank=rank, world=world, target=targets[rank], params=count_parameters(model),
                  train_samples=len(train), test_samples=len(test), steps_per_epoch=sampler.steps_per_epoch,
                  device=str(env.device), dist_backend=env.backend, policy=c_cfg.policy)

    def shares(level: str) -> list[float | None]:
        return [plan.allocation(level, t).share for t in targets]

    def change_level(level: str, epoch: float, step: int) -> None:
        event = client.ensure(level, epoch)
        if event is None:
            return
        metrics.write("hl_change", step=step, **event)
        controller.own.reset()  # a new allocation: old measurements no longer describe this worker
        new = (controller.initial(shares(level)) if step == 0 else
               controller.decide([None] * world, [0] * world, shares(level)))
        if new is not None and c_cfg.policy == "static" and step > 0:
            metrics.write("batch_change", step=step, batch=list(controller.batch), reason="allocation")

    # Everyone starts the clock together; the first level is requested before it starts.
    dist.barrier()
    change_level(schedule.level_at(0), 0.0, 0)
    metrics.write("batch_change", step=0, batch=list(controller.batch), reason="initial")
    dist.barrier()
    t_start = time.time()
    clock = 0.0  # rank 0's seconds since t_start, as of the last step (shared through the buffer)
    step_in_run, samples_done, eval_time = 0, 0, 0.0
    sync_cuda = env.device.type == "cuda"

    for epoch in range(t_cfg.epochs):
        if schedule.unit == "epoch":
            change_level(schedule.level_at(epoch), float(epoch), step_in_run)
        sampler.set_epoch(epoch)
        steps = sampler.steps_per_epoch
        for step in range(steps):
            if schedule.unit == "seconds":
                change_level(schedule.level_at(clock), epoch + step / steps, step_in_run)
            batch = list(controller.batch)
            sizes = sampler.step_sizes(step, batch)
            global_size = sum(sizes)
            idx = sampler.local_indices(step, batch, rank)

            t0 = time.perf_counter()
            grads.zero()
            x, y = train.batch(idx)
            x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
            loss_sum, correct = local_backward(model, x, y, global_size)
            grads.extra[LOSS] = loss_sum
            grads.extra[CORRECT] = correct
            grads.extra[CLOCK] = time.time() - t_start if rank == 0 else 0.0
            if sync_cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            grads.all_reduce()
            if sync_cuda:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            optimizer.step()
            if sync_cuda:
                torch.cuda.synchronize()
            t3 = time.perf_counter()

            compute_s = (t1 - t0) + (t3 - t2)
            step_in_run += 1
            samples_done += global_size
            extra = grads.extra.tolist()
            clock = extra[CLOCK]
            if sizes[rank] == batch[rank]:  # a partial last step does not describe the steady state
                controller.own.add(compute_s)
            metrics.write("step", step=step_in_run, epoch=epoch, batch=sizes[rank], global_batch=global_size,
                          compute_ms=round(compute_s * 1e3, 3), fwd_bwd_ms=round((t1 - t0) * 1e3, 3),
                          sync_ms=round((t2 - t1) * 1e3, 3), update_ms=round((t3 - t2) * 1e3, 3),
                          loss=extra[LOSS] / global_size, train_acc=extra[CORRECT] / global_size,
                          level=client.level, cpus=client.allocation.share, threads=client.threads,
                          lr=optimizer.param_groups[0]["lr"])

            end_of_epoch = step == steps - 1
            if controller.due(step_in_run, end_of_epoch):
                estimate = controller.own.estimate()
                gathered = distributed.all_gather_floats(
                    [estimate if estimate is not None else math.nan, float(controller.own.count)], env.device)
                estimates = [None if math.isnan(g[0]) else g[0] for g in gathered]
                counts = [int(g[1]) for g in gathered]
                old = list(controller.batch)
                new = controller.decide(estimates, counts, shares(client.level))
                if new is not None:
                    controller.own.reset()
                    metrics.write("batch_change", step=step_in_run, old=old, batch=new,
                                  compute_ms=[None if e is None else round(e * 1e3, 3) for e in estimates],
                                  reason="compute-time")
        scheduler.step()
        if (epoch + 1) % t_cfg.eval_every == 0 or epoch == t_cfg.epochs - 1:
            te = time.perf_counter()
            result = evaluate(model, test, controller.batch, rank, env.device, train=train)
            eval_time += time.perf_counter() - te
            metrics.write("eval", epoch=epoch, step=step_in_run, accuracy=result.accuracy, loss=result.loss,
                          samples=result.samples, elapsed_s=time.time() - t_start)

    wall = time.time() - t_start
    metrics.write("end", wall_time_s=wall, train_time_s=wall - eval_time, samples=samples_done,
                  steps=step_in_run, batch=list(controller.batch), level=client.level)
    metrics.close()
    dist.barrier()
    dist.destroy_process_group()
