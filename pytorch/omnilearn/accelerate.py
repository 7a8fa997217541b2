"""omnilearn's controller in an Accelerate loop: an ``Accelerator`` that also gives each rank its share.

    from omnilearn.accelerate import HeteroAccelerator
    accelerator = HeteroAccelerator(policy="dynamic")           # instead of Accelerator()
    train_dataloader = accelerator.share_batches(train_dataloader)  # before accelerator.prepare
    ...                                                             # accelerator.prepare(...)
    accelerator.start_up(lambda batch: accelerator.backward(model(**batch).loss))  # optional: the probe

:class:`HeteroAccelerator` is Accelerate's ``Accelerator`` with two additions:

- :meth:`HeteroAccelerator.share_batches` turns the training DataLoader into a :class:`ShareLoader`:
  each rank draws its share of every global batch from the controller
  (:class:`~omnilearn.torch.shares.ShareBatchSampler`), batches land on ``accelerator.device``, and
  each iteration of the loop is one step (it opens when its batch is yielded and closes when the
  loop asks for the next one, after the optimizer step). ``prepare`` passes it through unchanged:
  Accelerate's own sharding (``BatchSamplerShard``, ``even_batches``) would split the shares again.
- :meth:`HeteroAccelerator.start_up` (optional, once, after ``prepare`` and before the loop) runs
  the start-up probe on the loop's own step: ``forward_backward(batch)`` (the loop's loss on
  ``batch`` and ``accelerator.backward``), then every prepared optimizer's step, at two small batch
  sizes on this rank alone (DDP's ``no_sync``: no collective), timed as ``omnilearn run``'s workers
  time theirs (:meth:`~omnilearn.torch.session.StepSession.start_up`), so the first split is
  balanced before step 1. The weights, optimizer and scheduler state, random state and gradients
  are put back after it. Without it the controller starts from the equal split and learns from
  the steps.
- ``prepare`` gives the DistributedDataParallel model it builds omnilearn's communication hook
  (:func:`~omnilearn.torch.ddp_hook.weighted_sum_hook`): each rank's gradient weighted by
  ``b_i / B`` and summed, the last bucket carrying the step's measurements; and no buffer sync at
  every forward (see :data:`~omnilearn.torch.ddp_hook.BUFFERS_STAY_LOCAL`).

One backward and one optimizer step per batch: ``gradient_accumulation_steps`` above 1 is refused
(UserError). The loss is a mean over the rank's batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, send_to_device
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from omnilearn.errors import UserError
from omnilearn.torch.ddp_hook import register_weighted_sum
from omnilearn.torch.session import StepSession, check_launched, leaves_no_trace, refuse_accumulation
from omnilearn.torch.shares import ShareBatchSampler, share_loader

LIBRARY = "omnilearn.accelerate"


class ShareLoader:
    """This rank's share of each global batch, on the accelerator's device; each iteration one step."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader, self.device = loader, device
        assert isinstance(loader.batch_sampler, ShareBatchSampler)
        self.shares: ShareBatchSampler = loader.batch_sampler

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.shares.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.shares.begin_step()
            yield send_to_device(batch, self.device)
            self.shares.end_step()  # the loop is back for the next batch: its step (and optimizer step) is done


def check_ddp_handler(accelerator: Accelerator, library: str) -> None:
    """The DDP that ``accelerator`` builds gets no communication hook of Accelerate's, nor a buffer sync."""
    handler = accelerator.ddp_handler
    if handler is not None and handler.comm_hook != DDPCommunicationHookType.NO:
        raise UserError(f"{library}: DistributedDataParallelKwargs(comm_hook={handler.comm_hook}): omnilearn's "
                        "communication hook does the reduction")


class HeteroAccelerator(Accelerator):
    """An ``Accelerator`` whose training loader gives each rank the controller's share of each global batch.

    ``global_batch``: samples per step over all ranks (default: the training DataLoader's
    ``batch_size`` times the number of processes). ``policy`` and ``control`` (a dict of
    ``control.*`` keys) are a job config's ``control`` section; ``out``: the run folder (default:
    ``omnilearn emulate``'s, or ``runs/torch-<job id>``); ``per_level_threads`` and ``tensorboard`` as
    :class:`~omnilearn.torch.HeteroDataParallel`'s; ``seed``: the permutation's; ``epochs``: the
    loop's epochs, if known (the controller's horizon). Other arguments go to ``Accelerator``.
    """

    def __init__(self, *args: Any, global_batch: int | None = None, policy: str = "dynamic",
                 control: dict[str, Any] | None = None, out: str | None = None, seed: int = 0,
                 epochs: int | None = None, per_level_threads: bool = False, tensorboard: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_launched(LIBRARY, "Accelerator", self.num_processes, "Accelerator(cpu=True)")
        refuse_accumulation(LIBRARY, "gradient_accumulation_steps", self.gradient_accumulation_steps)
        check_ddp_handler(self, LIBRARY)
        self.session = StepSession(self.num_processes, self.process_index, policy=policy, control=control, out=out,
                                   library=LIBRARY, device=str(self.device), per_level_threads=per_level_threads,
                                   tensorboard=tensorboard)
        self.session.epochs = epochs
        self.global_batch, self.seed = global_batch, seed
        self.shares: ShareLoader | None = None
        self.trained: DistributedDataParallel | None = None

    def share_batches(self, dataloader: DataLoader) -> ShareLoader:
        """The training loader: ``dataloader``'s dataset and settings, each rank drawing its share of each step."""
        if not isinstance(dataloader, DataLoader):
            raise UserError(f"{LIBRARY}: share_batches takes the training DataLoader, before accelerator.prepare; "
                            f"got {type(dataloader).__name__}")
        self.shares = ShareLoader(share_loader(dataloader, self.session, self.global_batch, self.seed, LIBRARY),
                                  self.device)
        return self.shares

    def start_up(self, forward_backward: Callable[[Any], Any]) -> None:
        """The start-up probe (see the module): once, after ``prepare``, before the loop's first step."""
        if self.num_processes == 1:
            return  # one worker: nothing to split
        if self.shares is None or self.trained is None:
            raise UserError(f"{LIBRARY}: start_up comes after share_batches and prepare (of the model and the "
                            "training loader), before the loop's first step")
        model, shares = self.trained, self.shares.shares
        optimizers = [getattr(o, "optimizer", o) for o in self._optimizers]  # Accelerate's wrapper steps by its rules
        schedulers = [copy.deepcopy(s.state_dict()) for s in self._schedulers]

        def step(batch: Any) -> None:
            with model.no_sync():  # this rank alone: no all-reduce in the backward
                forward_backward(batch)
            for optimizer in optimizers:
                optimizer.step()

        shares.attach()
        with leaves_no_trace(model.module, optimizers, self.device):
            self.session.start_up(lambda size: send_to_device(shares.first(size), self.device), step)
        for scheduler, state in zip(self._schedulers, schedulers, strict=True):
            scheduler.load_state_dict(state)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        prepared = super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        if evaluation_mode:
            return prepared
        if self.session.params:
            raise UserError(f"{LIBRARY}: one trained model per HeteroAccelerator (its steps have one backward)")
        if isinstance(prepared, DistributedDataParallel):
            self.session.params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            self.session.model_name = type(model).__name__
            register_weighted_sum(prepared, self.session)
            self.trained = prepared
        elif self.num_processes > 1:
            raise UserError(f"{LIBRARY}: Accelerate did not wrap the model in DistributedDataParallel "
                            f"({self.distributed_type}); omnilearn supports DDP only")
        return prepared
