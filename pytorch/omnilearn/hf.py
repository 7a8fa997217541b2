"""omnilearn's controller in a Hugging Face ``Trainer`` script: one Trainer subclass.

    from omnilearn.hf import HeteroTrainer
    trainer = HeteroTrainer(model=model, args=training_args, ..., policy="dynamic")  # instead of Trainer(...)

``per_device_train_batch_size`` is one integer for every rank; :class:`HeteroTrainer` keeps the
global batch (that integer times the number of processes, or ``global_batch=``) and lets the
controller split each step between the ranks. It changes three things, at the Trainer's extension
points:

- ``get_train_dataloader``: the training DataLoader draws this rank's share of each global batch
  (:class:`~omnilearn.torch.shares.ShareBatchSampler`), with the Trainer's collator and DataLoader
  settings; it does not go through Accelerate's sharding, which would split the shares again.
  Evaluation loaders are the Trainer's own.
- ``training_step``: the DistributedDataParallel model gets omnilearn's communication hook
  (:func:`~omnilearn.torch.ddp_hook.weighted_sum_hook`) before its first backward: each rank's
  gradient weighted by ``b_i / B`` and summed, the last bucket carrying the step's measurements.
  That DDP does not sync buffers at every forward (see
  :data:`~omnilearn.torch.ddp_hook.BUFFERS_STAY_LOCAL`).
- a ``TrainerCallback``: a step opens at ``on_step_begin`` (its batch in hand) and closes at
  ``on_step_end`` (after the optimizer step), before any logging, saving or evaluation. At
  ``on_train_begin`` each rank runs the start-up probe: ``compute_loss``, backward and optimizer
  step on the model itself (no collective) at two small batch sizes, timed as ``omnilearn run``'s
  workers time theirs (:meth:`~omnilearn.torch.session.StepSession.start_up`), so the first split
  is balanced; the weights, optimizer state and random state are restored after it.

The loss is the model's own mean over the rank's batch: the Trainer's token-count scaling across
devices (``num_items_in_batch``) is turned off, so for token-level losses the update is the mean of
the ranks' per-sample means, exact when every sample has the same number of tokens. One backward and
one optimizer step per batch: ``gradient_accumulation_steps`` above 1, ``compute_loss_func`` and a
``train_sampling_strategy`` other than ``random`` are refused (UserError).
"""

from __future__ import annotations

import atexit
import gc
import weakref
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.utils import is_datasets_available

from omnilearn.accelerate import check_ddp_handler
from omnilearn.errors import UserError
from omnilearn.torch.ddp_hook import BUFFERS_STAY_LOCAL, register_weighted_sum
from omnilearn.torch.session import StepSession, check_launched, leaves_no_trace, refuse_accumulation
from omnilearn.torch.shares import ShareBatchSampler, share_loader

LIBRARY = "omnilearn.hf"


class HeteroTrainer(Trainer):
    """A ``Trainer`` whose ranks each train on the controller's share of every global batch.

    ``global_batch``: samples per step over all ranks (default: ``per_device_train_batch_size``
    times the number of processes). ``policy`` and ``control`` (a dict of ``control.*`` keys) are a
    job config's ``control`` section; ``out``: the run folder (default: ``omnilearn emulate``'s, or
    ``runs/torch-<job id>``); ``per_level_threads`` and ``tensorboard`` as
    :class:`~omnilearn.torch.HeteroDataParallel`'s. The permutation's seed is ``args.data_seed`` or
    ``args.seed``. Other arguments go to ``Trainer``.
    """

    def __init__(self, *args: Any, global_batch: int | None = None, policy: str = "dynamic",
                 control: dict[str, Any] | None = None, out: str | None = None, per_level_threads: bool = False,
                 tensorboard: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _check_args(self)
        check_ddp_handler(self.accelerator, LIBRARY)
        self.model_accepts_loss_kwargs = False  # the loss is the model's mean over this rank's batch
        self.hetero = {"policy": policy, "control": control, "out": out, "per_level_threads": per_level_threads,
                       "tensorboard": tensorboard}
        self.global_batch = global_batch
        self.session: StepSession | None = None
        self.shares: ShareBatchSampler | None = None
        self._hooked: nn.Module | None = None
        self.add_callback(_Steps(self))
        if not _TRAINERS:
            atexit.register(_release_at_exit)
        _TRAINERS.add(self)

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise UserError(f"{LIBRARY}: training requires a train_dataset")
        args, dataset, collator = self.args, self.train_dataset, self.data_collator
        if is_datasets_available():
            import datasets

            if isinstance(dataset, datasets.Dataset):
                dataset = self._remove_unused_columns(dataset, description="training")
            else:
                collator = self._get_collator_with_removed_columns(collator, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        if self.session is None:
            self.session = StepSession(args.world_size, args.process_index, library=LIBRARY,
                                       params=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                                       device=str(args.device), model_name=type(self.model).__name__, **self.hetero)
        self.session.epochs = int(args.num_train_epochs) if args.max_steps <= 0 else None
        plain = DataLoader(dataset, batch_size=self._train_batch_size, collate_fn=collator,
                           num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                           persistent_workers=args.dataloader_persistent_workers,
                           prefetch_factor=args.dataloader_prefetch_factor, drop_last=args.dataloader_drop_last)
        seed = args.data_seed if args.data_seed is not None else args.seed
        loader = share_loader(plain, self.session, self.global_batch, seed, LIBRARY)
        self.shares = loader.batch_sampler  # type: ignore[assignment]
        return loader

    def start_up(self) -> None:
        """The start-up probe (once, before the first step; see the module)."""
        if self.shares is None or self.session is None:
            return
        self.shares.attach()
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # Accelerate's wrapper steps by the rules
        with leaves_no_trace(self.model, [optimizer], self.args.device):
            self.session.start_up(self._probe_batch, lambda inputs: self._probe_step(inputs, optimizer))

    def _probe_batch(self, batch_size: int) -> dict[str, Any]:
        """The first ``batch_size`` training samples, collated and on this rank's device."""
        assert self.shares is not None
        return self._prepare_inputs(self.shares.first(batch_size))

    def _probe_step(self, inputs: dict[str, Any], optimizer: Any) -> None:
        """One step of the probe on this rank alone: the loss on the model itself (not DDP's wrapper:
        no collective), its backward, the optimizer's step."""
        with self.compute_loss_context_manager():
            loss = self.compute_loss(self.model, dict(inputs))  # it may pop the labels: each round its own dict
        loss.backward()
        optimizer.step()

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        if model is not self._hooked:
            if isinstance(model, DistributedDataParallel):
                assert self.session is not None
                register_weighted_sum(model, self.session)
            elif self.args.world_size > 1:
                raise UserError(f"{LIBRARY}: the Trainer did not wrap the model in DistributedDataParallel "
                                f"({type(model).__name__}); omnilearn supports DDP only")
            self._hooked = model
        return super().training_step(model, inputs, num_items_in_batch)


class _Steps(TrainerCallback):
    """The Trainer's step events open and close the session's steps."""

    def __init__(self, trainer: HeteroTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.start_up()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.trainer.shares is not None
        self.trainer.shares.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.trainer.shares is not None
        self.trainer.shares.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer.shares is not None:
            self.trainer.shares.close()


_TRAINERS: weakref.WeakSet[HeteroTrainer] = weakref.WeakSet()
"""The process's live HeteroTrainers, for :func:`_release_at_exit` (registered with the first)."""


def _release_at_exit() -> None:
    """At the interpreter's exit, the process group a Trainer script leaves alive is destroyed, once the
    DistributedDataParallel models that hold it are gone: left to the interpreter's finalization, its
    gloo threads can abort the process (SIGABRT) after a clean run. A script that destroyed the group
    itself is left alone."""
    if not dist.is_available() or not dist.is_initialized():
        return
    for trainer in list(_TRAINERS):
        trainer.model_wrapped = trainer.model
        trainer.accelerator.free_memory()
        trainer._hooked = None
    gc.collect()
    dist.destroy_process_group()


def _check_args(trainer: HeteroTrainer) -> None:
    """One backward and one optimizer step per batch, the loss a mean, omnilearn's order: else a UserError."""
    args = trainer.args
    check_launched(LIBRARY, "Trainer", args.world_size, "TrainingArguments(use_cpu=True)")
    refuse_accumulation(LIBRARY, "gradient_accumulation_steps", args.gradient_accumulation_steps)
    if trainer.compute_loss_func is not None:
        raise UserError(f"{LIBRARY}: compute_loss_func is not supported: the loss must be the model's mean over "
                        "the rank's batch")
    if args.ddp_broadcast_buffers:
        raise UserError(f"{LIBRARY}: ddp_broadcast_buffers=True: {BUFFERS_STAY_LOCAL}")
    if args.train_sampling_strategy != "random":
        raise UserError(f"{LIBRARY}: train_sampling_strategy={args.train_sampling_strategy!r}: omnilearn's sampler "
                        "decides the order (one seeded permutation per epoch); leave it at 'random'")
