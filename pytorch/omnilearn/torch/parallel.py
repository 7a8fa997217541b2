"""``HeteroDataParallel``: the BSP worker's synchronous step and batch controller, in a user's own loop.

Wrap the model after ``dist.init_process_group`` and iterate a
:class:`~omnilearn.torch.loader.HeteroDataLoader` (or :class:`~omnilearn.torch.loader.HeteroBatches`
around the loop's own ``get_batch``); the loop itself stays the user's (forward, loss as a mean over
the micro-batch divided by the number of micro-batches a step, ``backward``, ``optimizer.step``).
The step is the one ``omnilearn run``'s workers train with (:class:`~omnilearn.train.grad_sum.GradientSum`):
at the end of a step's last backward the local gradient is weighted by ``b_i / B`` and every rank's
gradients are summed with one all-reduce of a flat buffer, so the update is the gradient of the whole
global batch, whatever the split. With ``k`` micro-batches a step (gradient accumulation), the earlier
backwards only accumulate locally, each micro-batch's gradient weighted by its share of the local
batch (``k m_j / b_i``: 1 when the micro-batches are equal), so the result is the same.

The buffer's spare slots carry the step's measurements (see
:class:`~omnilearn.torch.session.StepSession`, which keeps this rank's side of the controller), so a
step has one collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from omnilearn.errors import UserError
from omnilearn.torch.session import StepSession
from omnilearn.train.grad_sum import GradientSum
from omnilearn.train.sampler import GlobalBatchSampler, micro_sizes

_ACTIVE: list[HeteroDataParallel] = []  # the wrapper a HeteroDataLoader of this process steps with


def active() -> HeteroDataParallel | None:
    return _ACTIVE[-1] if _ACTIVE else None


class HeteroDataParallel(torch.nn.Module):
    """Data parallelism with per-rank batch shares chosen by omnilearn's controller.

    ``policy`` and ``control`` (a dict of ``control.*`` keys, e.g. ``{"interval": 5}``) are the
    job config's ``control`` section; ``out``: the run folder (default: ``omnilearn emulate``'s, or
    ``runs/torch-<job id>``); ``per_level_threads``: under ``omnilearn emulate``, set torch's threads
    to each level's CPUs (by default they stay as the launcher set them); ``tensorboard``: rank 0
    writes TensorBoard scalars to the run folder while it trains. One backward per
    micro-batch; the loss must be a mean over the micro-batch, divided by the micro-batches a step.
    ``model.eval()`` closes the step in progress, so evaluation is not timed as training.

    A step's last backward all-reduces; the ones before it keep their gradients local inside
    :meth:`no_sync`, or while :attr:`require_backward_grad_sync` is false, as with DDP.
    :attr:`batch_sizes` is every rank's share of the next step (its samples over all its
    micro-batches); a loader's ``start_up`` probes whole steps of the loop's own at two shares.
    """

    def __init__(self, module: torch.nn.Module, *, policy: str = "dynamic", control: dict[str, Any] | None = None,
                 out: str | None = None, per_level_threads: bool = False, tensorboard: bool = False) -> None:
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
                                   device=str(self.device), model_name=type(module).__name__,
                                   per_level_threads=per_level_threads, tensorboard=tensorboard)
        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        self.grads = GradientSum(self.params, self.session.extra_slots, fill=self.session.fill_slots,
                                 read=self.session.read_slots, sync=sync, owner="HeteroDataParallel")
        _ACTIVE.append(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> HeteroDataParallel:
        if not mode:
            self.finish_step()  # what follows (evaluation) is not the step's
        return super().train(mode)

    @property
    def require_backward_grad_sync(self) -> bool:
        """DDP's switch, honoured as DDP honours it: while false, a backward keeps its gradient local (as
        under :meth:`no_sync`); a step's last backward runs with it true and all-reduces."""
        return not self.grads.deferred

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self.grads.deferred = not value

    def stop(self) -> None:
        """End the run here, inside a pass: the step in progress closed if its all-reduce ran, an ``end``
        record on every rank saying where it stopped (``stopped_early``) and rank 0's ``summary.json``,
        without a collective. Called for the loop when it leaves a loader's pass or the interpreter
        exits; a loop may call it itself."""
        self.grads.check_closed()
        self.session.stop()
        self.grads.close()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside keep their gradient local, as DDP's ``no_sync`` (a step's last one all-reduces)."""
        before, self.grads.deferred = self.grads.deferred, True
        try:
            yield
        finally:
            self.grads.deferred = before

    # ------------------------------------------------------------------------ set-up, by the loader
    def attach(self, dataset_size: int, global_batch: int, seed: int, drop_last: bool, names: tuple[str, str],
               accumulate: int = 1) -> GlobalBatchSampler:
        """Build the job, its controller and the sampler on the loader's first epoch."""
        return self.session.attach(dataset_size, global_batch, seed, drop_last, names, min_batch=accumulate)

    @property
    def sampler(self) -> GlobalBatchSampler | None:
        return self.session.sampler

    @property
    def epochs(self) -> int | None:
        """The epochs the loop will run, where it tells them (set this attribute): the horizon over which
        the controller weighs a new split's gain against its cost (None: unknown, at most ``1 / hazard``
        steps)."""
        return self.session.epochs

    @epochs.setter
    def epochs(self, value: int | None) -> None:
        self.session.epochs = value

    # ----------------------------------------------------------------------------- steps
    def begin_step(self, epoch: int, step: int, steps: int, accumulate: int = 1) -> list[int]:
        """Close the previous step, follow the level, and open this one of ``accumulate`` micro-batches;
        returns the step's sizes (every rank's)."""
        self.grads.check_closed()
        sizes = self.session.begin_step(epoch, step, steps)
        self.grads.open(micro_sizes(sizes[self.rank], accumulate), self.session.weight)
        return sizes

    def finish_step(self) -> None:
        """Measure the step just done, record it, and let the controller decide (every rank alike)."""
        self.grads.check_closed()
        self.session.finish_step()
        self.grads.close()

    def end_epoch(self, epoch: int) -> None:
        """After an epoch: its last step closed, an end record (the latest counts), ``summary.json``."""
        self.grads.check_closed()
        self.session.end_epoch(epoch)
        self.grads.close()

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's share of the next full step."""
        return self.session.batch_sizes
