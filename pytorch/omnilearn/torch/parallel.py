"""``HeteroDataParallel``: the BSP worker's synchronous step and batch controller, in a user's own loop.

Wrap the model after ``dist.init_process_group`` and iterate a
:class:`~omnilearn.torch.loader.HeteroDataLoader`; the loop itself stays the user's (forward, loss as
a mean over the local batch, ``backward``, ``optimizer.step``). At the end of each backward the
local gradient is weighted by ``b_i / B`` and every rank's gradients are summed with one all-reduce
of a flat buffer (:class:`~omnilearn.train.distributed.GradBuffer`): the update is the gradient of
the whole global batch, whatever the split.

The buffer's spare slots carry the step's measurements (see
:class:`~omnilearn.torch.session.StepSession`, which keeps this rank's side of the controller), so a
step has one collective.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from omnilearn.errors import UserError
from omnilearn.torch.session import StepSession
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
        self.session = StepSession(self.world, self.rank, policy=policy, control=control, out=out,
                                   library="omnilearn.torch", params=sum(p.numel() for p in self.params),
                                   device=str(self.device), model_name=type(module).__name__)
        self.grads = GradBuffer(self.params, extra=self.session.extra_slots)
        self.views = [p.grad for p in self.params]
        self._queued = False
        for p in self.params:
            p.register_hook(self._on_grad)
        _ACTIVE.append(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------------ set-up, by the loader
    def attach(self, dataset_size: int, global_batch: int, seed: int, drop_last: bool, names: tuple[str, str]
               ) -> GlobalBatchSampler:
        """Build the job, its controller and the sampler on the loader's first epoch."""
        return self.session.attach(dataset_size, global_batch, seed, drop_last, names)

    @property
    def sampler(self) -> GlobalBatchSampler | None:
        return self.session.sampler

    @property
    def epochs(self) -> int | None:
        return self.session.epochs

    @epochs.setter
    def epochs(self, value: int | None) -> None:
        self.session.epochs = value

    # ----------------------------------------------------------------------------- steps
    def begin_step(self, epoch: int, step: int, steps: int) -> list[int]:
        """Close the previous step, follow the level, and open this one; returns the step's sizes."""
        sizes = self.session.begin_step(epoch, step, steps)
        self.grads.zero()
        for p, v in zip(self.params, self.views, strict=True):
            p.grad = v
        return sizes

    def _on_grad(self, grad: torch.Tensor) -> None:
        if not self._queued and self.session.pending is not None:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _reduce(self) -> None:
        """End of backward: this rank's gradient, weighted by b_i / B, summed over ranks."""
        self._queued = False
        for p, v in zip(self.params, self.views, strict=True):
            if p.grad is None:
                v.zero_()
            elif p.grad.data_ptr() != v.data_ptr():  # zero_grad(set_to_none) let backward allocate anew
                v.copy_(p.grad)
            p.grad = v
        weight = self.session.weight
        if weight == 0.0:
            self.grads.zero()  # an empty share of a partial last step: its loss is no number
        else:
            self.grads.flat.mul_(weight)
        extra = self.grads.flat[self.grads.numel:]
        self.session.fill_slots(extra)
        self.grads.all_reduce()
        self.session.read_slots(extra)

    def finish_step(self) -> None:
        """Measure the step just done, record it, and let the controller decide (every rank alike)."""
        self.session.finish_step()

    def end_epoch(self, epoch: int) -> None:
        """After an epoch: its last step closed, an end record (the latest counts), ``summary.json``."""
        self.session.end_epoch(epoch)

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's share of the next full step."""
        return self.session.batch_sizes
