"""``HeteroDataParallel``: the BSP worker's synchronous step and batch controller, in a user's own loop.

Wrap the model after ``dist.init_process_group`` and iterate a
:class:`~omnilearn.torch.loader.HeteroDataLoader`; the loop itself stays the user's (forward, loss as
a mean over the local batch, ``backward``, ``optimizer.step``). At the end of each backward the
local gradient is weighted by ``b_i / B`` and every rank's gradients are summed with one all-reduce
of a flat buffer (:class:`~omnilearn.train.distributed.GradBuffer`): the update is the gradient of
the whole global batch, whatever the split.

Each rank's compute time rides in spare slots of the same all-reduce: the time from asking for its
batch to the end of its backward, plus what the previous step spent after its all-reduce (the
optimizer step and the loop's own work, one step late). The sum gives every rank every time, so
every rank's controller (the one ``omnilearn run`` uses, built from the same ``control`` settings,
driven by the same :class:`~omnilearn.control.loop.ControlLoop`) takes the same measurements and
the same decisions, the next step's shares always sum to the global batch, and a step has one
collective. Records go to ``metrics/rank-<r>.jsonl`` as a run's
do; after each epoch rank 0 writes ``summary.json``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from omnilearn.control.controller import make_controller
from omnilearn.control.loop import ControlLoop
from omnilearn.control.policies import POLICIES, Bounds, effective
from omnilearn.errors import UserError
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.report.summary import summarize
from omnilearn.torch.session import Levels, make_job
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
        self.grads = GradBuffer(self.params, extra=1 + self.world)  # rank 0's clock, every rank's time
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
        self.epochs: int | None = None  # the loader's epochs, when it knows them (the horizon of a split)
        self.sync_s = self.clock = self.after_s = 0.0
        self.reduced_at: float | None = None
        self.values: list[float] | None = None
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
        c = effective(cfg.control, global_batch, self.world)
        if c.policy not in POLICIES:
            raise UserError(f"HeteroDataParallel: policy {c.policy!r} is not a batch controller's")
        self.controller = make_controller(c, global_batch, Bounds.make(self.world, c.min_batch, c.max_batch,
                                                                      global_batch))
        self.levels = Levels(self.job, self.rank, emulated)
        self.sampler = GlobalBatchSampler(dataset_size, global_batch, seed, drop_last=drop_last,
                                          min_local=c.min_batch)
        self.metrics = MetricsWriter(metrics_path(self.job.out_dir, self.rank))
        self.loop = ControlLoop(self.controller, self.metrics.write, inputs=self.rank == 0)
        self.metrics.write("start", rank=self.rank, world=self.world, target=self.levels.target,
                           params=sum(p.numel() for p in self.params), train_samples=dataset_size,
                           steps_per_epoch=self.sampler.steps_per_epoch, device=str(self.device),
                           dist_backend=dist.get_backend(), policy=c.policy, library="omnilearn.torch")
        dist.barrier()
        self.t_start = time.time()
        self.started = False  # the loop starts at the first step, once its level is in force
        return self.sampler

    # ----------------------------------------------------------------------------- steps
    def begin_step(self, epoch: int, step: int, steps: int) -> list[int]:
        """Close the previous step, follow the level, and open this one; returns the step's sizes."""
        self.finish_step()
        position = epoch + step / steps
        event = self.levels.at(position, self.clock)
        if event is not None:
            self.metrics.write("hl_change", step=self.steps_done, **event)
            if self.started:
                self.loop.level(self.levels.shares, step=self.steps_done)
        if not self.started:
            self.loop.start(self.levels.shares, False, step=0)
            self.started = True
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
        extra = self.grads.flat[self.grads.numel:]
        extra.zero_()
        extra[0] = self.levels.clock() if self.rank == 0 else 0.0
        assert self.pending is not None
        extra[1 + self.rank] = (t1 - self.pending["t0"]) + self.after_s  # forward+backward, the update one step late
        self.grads.all_reduce()
        self.values = extra.tolist()
        self.reduced_at = time.perf_counter()
        self.sync_s += self.reduced_at - t1

    def finish_step(self) -> None:
        """Measure the step just done, record it, and let the controller decide (every rank alike)."""
        if self.pending is None:
            return
        p, self.pending = self.pending, None
        now = time.perf_counter()
        compute_s = max(now - p["t0"] - self.sync_s, 0.0)
        self.after_s = now - self.reduced_at if self.reduced_at is not None else 0.0
        values, self.values, self.reduced_at = self.values, None, None
        if values is not None:
            self.clock = values[0]  # rank 0's: every rank labels and decides at the same step
        self.steps_done += 1
        self.samples += sum(self.sizes)
        ctl, t = self.controller, self.sampler
        assert t is not None
        self.metrics.write("step", step=self.steps_done, epoch=p["epoch"], batch=self.sizes[self.rank],
                           global_batch=sum(self.sizes), compute_ms=round(compute_s * 1e3, 3),
                           sync_ms=round(self.sync_s * 1e3, 3), loss=None, train_acc=None, level=self.levels.level,
                           cpus=self.levels.cpus, threads=self.levels.threads or torch.get_num_threads())
        full = sum(self.sizes) == t.global_batch and values is not None
        times = values[1:1 + self.world] if full and ctl.measures else None
        steps_left = t.steps_per_epoch * self.epochs - self.steps_done if self.epochs else None
        self.loop.step(times, ctl.due(self.steps_done, p["last"]), steps_left, self.levels.shares,
                       step=self.steps_done)

    def end_epoch(self, epoch: int) -> None:
        """After an epoch: its last step closed, an end record (the latest counts), ``summary.json``."""
        self.finish_step()
        assert self.sampler is not None
        wall = time.time() - self.t_start
        self.metrics.write("end", wall_time_s=wall, train_time_s=wall, samples=self.samples, steps=self.steps_done,
                           batch=list(self.controller.batch), level=self.levels.level,
                           epochs=self.steps_done / self.sampler.steps_per_epoch, out_of_time=False,
                           **self.loop.summary())
        dist.barrier()  # every rank's end record is written before rank 0 reads them
        if self.rank == 0:
            summarize(self.job.out_dir)

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's share of the next full step."""
        return list(self.controller.batch) if self.sampler is not None else []
