"""omnilearn's controller in a Lightning script: one strategy.

    from omnilearn.lightning import HeteroDDPStrategy
    trainer = L.Trainer(strategy=HeteroDDPStrategy(policy="dynamic"), ...)

:class:`HeteroDDPStrategy` is Lightning's :class:`~lightning.pytorch.strategies.DDPStrategy` with
three changes, each at one of Lightning's extension points:

- the data (``process_dataloader``): the training DataLoader gets a
  :class:`~omnilearn.torch.shares.ShareBatchSampler` in place of its sampler (Lightning's
  ``DistributedSampler`` included), so each rank draws its share of every global batch from the
  controller; its other settings (dataset, collate function, workers) stay. Validation and test
  loaders are Lightning's, sharded as before.
- the gradients (DDP's communication hook): :func:`~omnilearn.torch.ddp_hook.weighted_sum_hook`
  weights each rank's gradient by ``b_i / B`` instead of DDP's average, and its last bucket carries
  the step's measurements; Lightning registers hooks on GPUs only, this strategy on every device.
  DDP does not sync buffers at every forward (see :data:`~omnilearn.torch.ddp_hook.BUFFERS_STAY_LOCAL`).
- the steps (``on_train_batch_start``, ``optimizer_step``): a step opens when its batch is in hand
  and closes after its optimizer step; then the controller decides the shares of the steps drawn
  next. Validation between steps is not counted as any rank's compute.
- the start-up probe (``on_train_start``): once the first level is in force, each rank times its
  training step (``training_step``, backward, optimizer step, on no collective) at two small batch
  sizes (the first training samples, collated before the clock), as ``omnilearn run``'s workers do
  before step 1
  (:meth:`~omnilearn.torch.session.StepSession.start_up`), so the first split is balanced; the
  weights, optimizer state and random state are restored after it, and what ``training_step`` logs
  in it is dropped.
- the stop signal (``on_train_start``): Lightning broadcasts rank 0's SIGTERM flag at the start of
  every training step, a second collective a step that makes every rank wait for the slowest there
  (under a CPU quota, for its next CFS period). Here the flag rides the step's gradient all-reduce
  instead, any rank's: a rank that caught SIGTERM before the end of its backward stops after that
  step (Lightning's own check), and every other rank at the start of the next one, as Lightning's
  broadcast would have it. This replaces the training loop's ``_broadcast_sigterm_tensor``.

One backward and one optimizer step per batch: ``accumulate_grad_batches`` above 1, manual
optimization and epochs cut short by ``limit_train_batches`` or ``overfit_batches`` are refused
(UserError). The loss of ``training_step`` is a mean over the rank's batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from omnilearn.errors import UserError
from omnilearn.torch.ddp_hook import BUFFERS_STAY_LOCAL, register_weighted_sum
from omnilearn.torch.session import StepSession, leaves_no_trace, refuse_accumulation
from omnilearn.torch.shares import ShareBatchSampler, share_loader

LIBRARY = "omnilearn.lightning"


class HeteroDDPStrategy(DDPStrategy):
    """DDP with per-rank shares of each global batch, chosen by omnilearn's controller.

    ``global_batch``: samples per step over all ranks (default: the training DataLoader's
    ``batch_size`` times the number of ranks). ``policy`` and ``control`` (a dict of ``control.*``
    keys, e.g. ``{"interval": 5}``) are a job config's ``control`` section; ``out``: the run folder
    (default: ``omnilearn emulate``'s, or ``runs/torch-<job id>``); ``per_level_threads`` and
    ``tensorboard`` as :class:`~omnilearn.torch.HeteroDataParallel`'s. ``seed``: the permutation's
    (default: ``seed_everything``'s, else 0). Other keyword arguments go to ``DDPStrategy``.
    """

    strategy_name = "omnilearn_ddp"

    def __init__(self, *, global_batch: int | None = None, policy: str = "dynamic",
                 control: dict[str, Any] | None = None, out: str | None = None, seed: int | None = None,
                 per_level_threads: bool = False, tensorboard: bool = False, **ddp_kwargs: Any) -> None:
        for key in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period"):
            if key in ddp_kwargs:
                raise UserError(f"HeteroDDPStrategy({key}=...): omnilearn's communication hook does the reduction")
        for key in ("broadcast_buffers", "forward_sync_buffers"):
            if ddp_kwargs.get(key):
                raise UserError(f"HeteroDDPStrategy({key}=True): {BUFFERS_STAY_LOCAL}")
        super().__init__(**ddp_kwargs)
        self.hetero = {"policy": policy, "control": control, "out": out, "per_level_threads": per_level_threads,
                       "tensorboard": tensorboard}
        self.global_batch, self.seed = global_batch, seed
        self.session: StepSession | None = None
        self.shares: ShareBatchSampler | None = None

    def setup(self, trainer: Trainer) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            _check_trainer(trainer)
            module = self.lightning_module
            assert module is not None
            self.session = StepSession(self.world_size, self.global_rank, library=LIBRARY,
                                       params=sum(p.numel() for p in module.parameters() if p.requires_grad),
                                       device=str(self.root_device), model_name=type(module).__name__,
                                       **self.hetero)
            self.session.epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        super().setup(trainer)

    def _register_ddp_hooks(self) -> None:
        assert isinstance(self.model, DistributedDataParallel) and self.session is not None
        register_weighted_sum(self.model, self.session)

    def process_dataloader(self, dataloader: object) -> object:
        module = self.lightning_module
        if module is None or not module.trainer.training or not isinstance(dataloader, DataLoader):
            return super().process_dataloader(dataloader)
        assert self.session is not None
        seed = self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
        loader = share_loader(dataloader, self.session, self.global_batch, seed, LIBRARY)
        self.shares = loader.batch_sampler  # type: ignore[assignment]
        return super().process_dataloader(loader)

    def on_train_start(self) -> None:
        super().on_train_start()
        module = self.lightning_module
        assert module is not None and self.session is not None
        trainer = module.trainer
        self.session.asks_stop = lambda: bool(trainer.received_sigterm)
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = self._stop_if_asked  # type: ignore[method-assign]
        if self.shares is not None:
            self.shares.attach()
            with leaves_no_trace(module, self.optimizers, self.root_device), _silenced(module):
                self.session.start_up(self._probe_batch, self._probe_step)

    def _probe_batch(self, batch_size: int) -> Any:
        """The first ``batch_size`` samples of the training set, collated and on this rank's device."""
        assert self.shares is not None
        return self.batch_to_device(self.shares.first(batch_size))

    def _probe_step(self, batch: Any) -> None:
        """One step of the start-up probe on this rank alone: ``training_step``, its backward and every
        optimizer's step."""
        module = self.lightning_module
        assert module is not None
        with self.precision_plugin.train_step_context():
            out = module.training_step(batch, 0)  # the module itself, not DDP's wrapper: no collective
        loss = out["loss"] if isinstance(out, Mapping) else out
        if loss is None:
            return
        loss.backward()
        for optimizer in self.optimizers:
            optimizer.step()

    def _stop_if_asked(self) -> None:
        """In place of Lightning's per-step broadcast: stop where the last all-reduce said a rank asked to."""
        if self.session is not None and self.session.stop_seen:
            raise SIGTERMException()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.shares is None:
            raise UserError(f"{LIBRARY}: the training loader is no DataLoader, so omnilearn cannot give it shares")
        self.shares.begin_step()

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        result = super().optimizer_step(*args, **kwargs)
        if self.shares is not None:
            self.shares.end_step()
        return result

    def on_train_end(self) -> None:
        super().on_train_end()
        if self.shares is not None:
            self.shares.close()


@contextmanager
def _silenced(module: LightningModule) -> Iterator[None]:
    """Within it, what the module logs (``self.log``, ``self.log_dict``) is dropped."""
    module.log = module.log_dict = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log, module.log_dict


def _check_trainer(trainer: Trainer) -> None:
    """One backward and one optimizer step per batch, every batch of every epoch: else a UserError."""
    refuse_accumulation(LIBRARY, "Trainer accumulate_grad_batches", trainer.accumulate_grad_batches)
    module = trainer.lightning_module
    if module is not None and not module.automatic_optimization:
        raise UserError(f"{LIBRARY}: manual optimization is not supported (one backward and one optimizer step "
                        "per batch)")
    limit = trainer.limit_train_batches
    if not (limit is None or (isinstance(limit, float) and limit == 1.0)) or trainer.overfit_batches:
        raise UserError(f"{LIBRARY}: Trainer(limit_train_batches={limit}, overfit_batches={trainer.overfit_batches})"
                        " cuts epochs short; omnilearn's sampler uses every sample once per epoch")
