"""``HeteroDataParallel``: the BSP worker's synchronous step and batch controller, in a user's own loop.

Wrap the model after ``dist.init_process_group`` and iterate a
:class:`~omnilearn.torch.loader.HeteroDataLoader`; the loop itself stays the user's (forward, loss as
a mean over the local batch, ``backward``, ``optimizer.step``). At the end of each backward the
local gradient is weighted by ``b_i / B`` and every rank's gradients are summed with one all-reduce
of a flat buffer (:class:`~omnilearn.train.distributed.GradBuffer`): the update is the gradient of
the whole global batch, whatever the split.

Between two steps (when the loader is asked for the next batch) the step just done is measured:
its compute time is the time since its batch was asked for, less the all-reduce (which holds the
wait for the other ranks). Every rank's time is gathered, so every rank's
:class:`~omnilearn.control.controller.BatchController` (the one ``omnilearn run`` uses, built from
the same ``control`` settings) takes the same measurements and the same decisions, and the next
step's shares always sum to the global batch. Records go to ``metrics/rank-<r>.jsonl`` as a run's
do; after each epoch rank 0 writes ``summary.json``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from omnilearn.control.controller import BatchController
from omnilearn.control.policies import Bounds
from omnilearn.errors import UserError
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.report.summary import summarize
from omnilearn.torch.session import Levels, make_job
from omnilearn.train import distributed
from omnilearn.train.distributed import GradBuffer
from omnilearn.train.sampler import GlobalBatchSampler

_ACTIVE: list[HeteroDataParallel] = []  # the wrapper a HeteroDataLoader of this process steps with


def active() -> HeteroDataParallel | None:
    return _ACTIVE[-1] if _ACTIVE else None


class HeteroDataParallel(torch.nn.Module):
    """Data parallelism with per-rank batch shares chosen by omnilearn's controller.

    ``policy`` and ``control`` (a dict of ``control.*`` keys, e.g. ``{"interval": 5}``) are the
    job config's ``control`` section; ``out``: the run folder (default: ``omnilearn emulate``'s, or
    ``runs/torch-<job id>``). One backward per step; the loss must be a mean over the local batch.
    """

    def __init__(self, module: torch.nn.Module, *, policy: str = "dynamic", control: dict[str, Any] | None = None,
                 out: str | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise UserError("HeteroDataParallel: call torch.distributed.init_process_group first")
        self.module = module
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = next(module.parameters()).device
        for t in [*module.parameters(), *module.buffers()]:  # the same start on every rank
            dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.grads = GradBuffer(self.params)
        self.views = [p.grad for p in self.params]
        self.settings = {"control.policy": policy, **{f"control.{k}": v for k, v in (control or {}).items()}}
        self.out = out
        self._queued = False
        for p in self.params:
            p.register_hook(self._on_grad)
        self.sampler: GlobalBatchSampler | None = None
        self.sizes: list[int] = []
        self.pending: dict[str, Any] | None = None
        self.steps_done = self.samples = 0
        self.sync_s = self.clock = 0.0
        _ACTIVE.append(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------------ set-up, by the loader
    def attach(self, dataset_size: int, global_batch: int, seed: int, drop_last: bool, names: tuple[str, str]
               ) -> GlobalBatchSampler:
        """Build the job, its controller and the sampler on the loader's first epoch."""
        if self.sampler is not None:
            if self.sampler.global_batch != global_batch or self.sampler.dataset_size != dataset_size:
                raise UserError("HeteroDataParallel: one HeteroDataLoader per wrapped model")
            return self.sampler
        self.settings.update({"train.seed": seed, "train.drop_last": drop_last})
        self.job, emulated = make_job(self.world, self.rank, global_batch, self.settings,
                                      (type(self.module).__name__, names[1]), self.out)
        cfg = self.job.config
        c = cfg.control.effective(global_batch, self.world)
        if c.policy not in ("uniform", "static", "dynamic", "dynamic+prior", "paper"):
            raise UserError(f"HeteroDataParallel: policy {c.policy!r} is not a batch controller's")
        self.controller = BatchController(c, global_batch, Bounds.make(self.world, c.min_batch, c.max_batch,
                                                                       global_batch))
        self.levels = Levels(self.job, self.rank, emulated)
        self.sampler = GlobalBatchSampler(dataset_size, global_batch, seed, drop_last=drop_last,
                                          min_local=c.min_batch)
        self.metrics = MetricsWriter(metrics_path(self.job.out_dir, self.rank))
        self.metrics.write("start", rank=self.rank, world=self.world, target=self.levels.target,
                           params=sum(p.numel() for p in self.params), train_samples=dataset_size,
                           steps_per_epoch=self.sampler.steps_per_epoch, device=str(self.device),
                           dist_backend=dist.get_backend(), policy=c.policy, library="omnilearn.torch")
        dist.barrier()
        self.t_start = time.time()
        self.metrics.write("batch_change", step=0, batch=list(self.controller.batch), reason="initial")
        return self.sampler

    # ----------------------------------------------------------------------------- steps
    def begin_step(self, epoch: int, step: int, steps: int) -> list[int]:
        """Close the previous step, follow the level, and open this one; returns the step's sizes."""
        self.finish_step()
        position = epoch + step / steps
        event = self.levels.at(position, self.clock)
        if event is not None:
            self.metrics.write("hl_change", step=self.steps_done, **event)
            ctl = self.controller
            shares = ctl.allocations(self.levels.shares)
            if self.steps_done == 0:
                ctl.initial(shares)
            elif ctl.reallocate(shares) is not None:
                self.metrics.write("batch_change", step=self.steps_done, batch=list(ctl.batch), reason="allocation")
        late = self.levels.outcome(position)  # a retried change's outcome: this rank's threads only
        if late is not None:
            self.metrics.write("hl_outcome", step=self.steps_done, **late)
        assert self.sampler is not None
        self.sizes = self.sampler.step_sizes(step, self.controller.batch)
        self.grads.zero()
        for p, v in zip(self.params, self.views, strict=True):
            p.grad = v
        self.sync_s = 0.0
        self.pending = {"epoch": epoch, "step": step, "last": step == steps - 1, "t0": time.perf_counter()}
        return self.sizes

    def _on_grad(self, grad: torch.Tensor) -> None:
        if not self._queued and self.pending is not None:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _reduce(self) -> None:
        """End of backward: this rank's gradient, weighted by b_i / B, summed over ranks."""
        self._queued = False
        t1 = time.perf_counter()
        for i, (p, v) in enumerate(zip(self.params, self.views, strict=True)):
            if p.grad is None:
                v.zero_()
            elif p.grad.data_ptr() != v.data_ptr():  # zero_grad(set_to_none) let backward allocate anew
                v.copy_(p.grad)
            self.params[i].grad = v
        mine, total = self.sizes[self.rank], sum(self.sizes)
        if mine == 0:
            self.grads.zero()  # an empty share of a partial last step: its loss is no number
        else:
            self.grads.flat.mul_(mine / total)
        self.grads.all_reduce()
        self.sync_s += time.perf_counter() - t1

    def finish_step(self) -> None:
        """Measure the step just done, record it, and let the controller decide (every rank alike)."""
        if self.pending is None:
            return
        p, self.pending = self.pending, None
        compute_s = max(time.perf_counter() - p["t0"] - self.sync_s, 0.0)
        clock = self.levels.clock() if self.rank == 0 else 0.0
        gathered = distributed.all_gather_floats([compute_s, clock], self.device)
        self.clock = gathered[0][1]  # rank 0's: every rank labels and decides at the same step
        self.steps_done += 1
        self.samples += sum(self.sizes)
        ctl, t = self.controller, self.sampler
        assert t is not None
        full = sum(self.sizes) == t.global_batch
        if ctl.measures and full:
            changed = ctl.observe_step([g[0] for g in gathered])
            if changed:
                self.metrics.write("speed_change", step=self.steps_done, workers=changed, regimes=ctl.regimes())
        self.metrics.write("step", step=self.steps_done, epoch=p["epoch"], batch=self.sizes[self.rank],
                           global_batch=sum(self.sizes), compute_ms=round(compute_s * 1e3, 3),
                           sync_ms=round(self.sync_s * 1e3, 3), loss=None, train_acc=None, level=self.levels.level,
                           cpus=self.levels.cpus, threads=self.levels.threads or torch.get_num_threads())
        if ctl.due(self.steps_done, p["last"]):
            times, counts = ctl.estimates()
            old = list(ctl.batch)
            new = ctl.decide(ctl.allocations(self.levels.shares))
            if new is not None:
                self.metrics.write("batch_change", step=self.steps_done, old=old, batch=new, reason="compute-time",
                                   compute_ms=None if times is None else [round(x * 1e3, 3) for x in times],
                                   samples=counts, overhead=round(ctl.overhead, 2))

    def end_epoch(self, epoch: int) -> None:
        """After an epoch: its last step closed, an end record (the latest counts), ``summary.json``."""
        self.finish_step()
        assert self.sampler is not None
        wall = time.time() - self.t_start
        self.metrics.write("end", wall_time_s=wall, train_time_s=wall, samples=self.samples, steps=self.steps_done,
                           batch=list(self.controller.batch), level=self.levels.level,
                           epochs=self.steps_done / self.sampler.steps_per_epoch, out_of_time=False)
        dist.barrier()  # every rank's end record is written before rank 0 reads them
        if self.rank == 0:
            summarize(self.job.out_dir)

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's share of the next full step."""
        return list(self.controller.batch) if self.sampler is not None else []
