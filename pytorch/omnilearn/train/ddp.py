"""The peer a user would otherwise run: plain ``DistributedDataParallel`` with equal batches.

``control.policy: ddp`` (BSP only) trains the same model on the same data under the same emulation
as our BSP worker, with everything a benchmark needs held equal: the global-batch sampler (each
worker takes ``B / n`` samples of the same per-epoch permutation, so the data is identical to
``uniform``), the optimizer and its schedule, the evaluation, the metrics records. What differs is
the step: each worker's loss is the standard mean over its own batch, and DDP averages the
gradients with its bucketed all-reduce, overlapped with the backward pass. With equal batches the
update equals ours (``sum(loss) / B`` summed over workers); the test checks it.

Because DDP's all-reduce runs inside ``backward()``, the wait for slower workers cannot be told
apart from computing: a DDP step's ``compute_ms`` is forward + backward + optimizer step *including*
the all-reduce, and its ``sync_ms`` only the small all-reduce of the step's statistics (loss,
accuracy, rank 0's clock) that every BSP step shares.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from omnilearn.jobfile import JobSpec
from omnilearn.train import lifecycle
from omnilearn.train.bsp import BSPTrainer
from omnilearn.train.workload import Workload, gather


def ddp_backward(work: Workload, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Forward and backward of this worker's batch with the mean loss; returns (loss sum, correct).

    ``model`` is the DDP wrapper: its backward averages the gradients over the workers. A worker
    left with no sample (a partial last step) still runs both, contributing a zero gradient, so
    that every rank joins DDP's all-reduce.
    """
    out = model(x)
    loss_sum, correct = work.terms(out, y)
    mean = loss_sum / x.shape[0] if x.shape[0] > 0 else out.sum() * 0.0
    mean.backward()
    return float(loss_sum.detach()), float(correct)


class DDPTrainer(BSPTrainer):
    """The BSP worker's loop with DDP's step: equal batches, no controller decisions, no memory probe."""

    def __init__(self, job: JobSpec) -> None:
        cfg = job.config
        assert cfg.mode == "bsp", cfg.mode
        # Equal batches are the uniform policy's; plain DDP knows nothing of memory bounds.
        equal = dataclasses.replace(cfg.control, policy="uniform", memory_bounds=False)
        super().__init__(dataclasses.replace(job, config=dataclasses.replace(cfg, control=equal)))
        # Each parameter's .grad is already a view into the gradient sum's buffer: DDP copies its averaged
        # buckets there, so zeroing stays one fill_ and the optimizer is the one the BSP worker has.
        device_ids = [self.env.device.index] if self.env.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)

    def train_step(self, step: int, clock_start: float) -> tuple[list[int], list[float]]:
        batch = list(self.controller.batch)
        sizes = self.sampler.step_sizes(step, batch)
        idx = self.sampler.local_indices(step, batch, self.rank)
        self.sample_sum = int(idx.sum())  # the step record's checksum of the samples, as BSP's
        timer = self.timer
        timer.open()
        self.grads.buffer.zero()
        x, y = gather(self.work.train, idx, augment=self.cfg.data.augment, generator=self.augment_rng)
        loss_sum, correct = ddp_backward(self.work, self.ddp, x.to(self.env.device), y.to(self.env.device))
        self.optimizer.step()
        self._sync_cuda()
        # DDP's backward holds its all-reduce: what follows is the small one of the step's statistics
        timer.fill(self.grads.extra, clock=time.time() - clock_start, stop=lifecycle.stop_requested(), cost_s=0.0,
                   stats=(loss_sum, correct))
        dist.all_reduce(self.grads.extra)
        self._sync_cuda()
        values = timer.read(self.grads.extra)
        timer.close()
        return sizes, values


def run(job: JobSpec) -> None:
    """Train one DDP worker to the end of the job (called in every worker process)."""
    trainer = DDPTrainer(job)
    trainer.run()
    if trainer.stopped:
        raise SystemExit(lifecycle.STOPPED_STATUS)
