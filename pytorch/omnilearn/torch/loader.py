"""This rank's share of each global batch: from a dataset (``HeteroDataLoader``) or the loop's own
``get_batch`` (``HeteroBatches``).

Step ``s`` of an epoch uses positions ``[s*B, s*B + B)`` of the epoch's permutation (the same on
every rank: :class:`~omnilearn.train.sampler.GlobalBatchSampler`); rank ``r`` takes its contiguous
share, of the size the controller gives it, cut into ``accumulate`` micro-batches (one per backward
of gradient accumulation). Shares may change at any step: every sample is still used once per
epoch, and every rank runs the same number of steps.

The unit is the script's own: a per-device ``batch_size`` (the global batch is then
``batch_size x world size x accumulate``, and the controller moves shares around it), or the global
batch itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, default_collate

from omnilearn.errors import UserError
from omnilearn.torch import parallel
from omnilearn.torch.session import leaves_no_trace
from omnilearn.train.sampler import GlobalBatchSampler, eval_indices, micro_sizes, proportional_split


def global_batch_of(global_batch: int | None, batch_size: int | None, world: int, accumulate: int,
                    what: str) -> int:
    """The samples of one optimizer step over all ranks, from whichever of the two the script gives."""
    if accumulate < 1:
        raise UserError(f"{what}: accumulate must be at least 1, not {accumulate}")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"{what}: batch_size (per device) must be at least 1, not {batch_size}")
    if batch_size is None:
        if global_batch is None:
            raise UserError(f"{what}: give batch_size= (per device, per micro-batch) or global_batch=")
        return global_batch
    implied = batch_size * world * accumulate
    if global_batch is not None and global_batch != implied:
        raise UserError(f"{what}: global_batch={global_batch} is not batch_size={batch_size} x {world} ranks x "
                        f"accumulate={accumulate} = {implied}: give one of the two")
    return implied


class _Steps(ABC):
    """What the two iterables share: the global batch, the session's steps, the micro-batches."""

    def __init__(self, global_batch: int | None, batch_size: int | None, accumulate: int, what: str) -> None:
        if not dist.is_initialized():
            raise UserError(f"{what}: call torch.distributed.init_process_group first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.what = what
        self.accumulate = accumulate
        self.batch_size = batch_size
        self.global_batch = global_batch_of(global_batch, batch_size, self.world, accumulate, what)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (each iteration otherwise runs the one after the last)."""
        self.epoch = epoch

    def start_up(self, step: Callable[[Any], Any], *optimizers: torch.optim.Optimizer) -> None:
        """The start-up probe (optional; once, before the first iteration): ``step(batch)``, the loop's own
        step on one batch (forward, loss, backward, optimizer step), run on this rank alone (no step is
        open, so no all-reduce) at the controller's two probe sizes and timed as ``omnilearn run``'s
        workers time theirs: the first split is balanced before step 1. Under gradient accumulation a
        probe step is one ``step`` call on a batch of the whole share. ``optimizers``: those ``step`` steps; their state, the model's weights
        and buffers, the random state and the gradients are put back after it. Without a
        :class:`~omnilearn.torch.HeteroDataParallel` in the process, or on one rank, nothing runs."""
        model = parallel.active()
        if model is None or self.world == 1:
            return
        self._attach(model)
        with leaves_no_trace(model.module, list(optimizers), model.device):
            model.session.start_up(self._probe_batch, step)

    @abstractmethod
    def _attach(self, model: parallel.HeteroDataParallel) -> GlobalBatchSampler:
        """The session's sampler for this loader's samples (built on the first call)."""

    @abstractmethod
    def _probe_batch(self, size: int) -> Any:
        """A batch of ``size`` samples for the start-up probe."""

    def _steps(self, sampler: GlobalBatchSampler, model: parallel.HeteroDataParallel | None
               ) -> Iterator[tuple[int, int]]:
        """(start, size) of each of this rank's micro-batches in the epoch; the session's steps around them."""
        epoch = self.epoch
        sampler.set_epoch(epoch)
        steps = sampler.steps_per_epoch
        equal = proportional_split(self.global_batch, [1] * self.world)
        try:
            for step in range(steps):
                shares = (model.begin_step(epoch, step, steps, self.accumulate) if model is not None
                          else sampler.step_sizes(step, equal))
                start = step * self.global_batch + sum(shares[:self.rank])
                for size in micro_sizes(shares[self.rank], self.accumulate):
                    yield start, size
                    start += size
        except GeneratorExit:  # the loop left the pass (a break): its records close where it stopped
            if model is not None:  # a step in progress may be left whole or in part: no check
                model.session.stop()
                model.grads.close()
            raise
        if model is not None:
            model.end_epoch(epoch)
        self.epoch = epoch + 1


class HeteroDataLoader(_Steps):
    """Iterates this rank's batches of ``dataset`` (map-style).

    Give the per-device ``batch_size`` (as to a ``DataLoader``; the global batch is
    ``batch_size x world size x accumulate``) or the ``global_batch`` of one optimizer step. Each
    step yields ``accumulate`` micro-batches of this rank's share (one backward each). With a
    :class:`~omnilearn.torch.HeteroDataParallel` in the process, the shares are its controller's;
    without one, the global batch is split equally. Each iteration is one epoch (the next one, or
    the one given to :meth:`set_epoch`).

    ``train=False`` (evaluation): every rank takes an equal contiguous part of the dataset, once, in
    batches of ``batch_size`` (else ``global_batch`` / world size); nothing is recorded as a step,
    and a training step in progress is closed first.
    """

    def __init__(self, dataset: Dataset, global_batch: int | None = None, *, batch_size: int | None = None,
                 accumulate: int = 1, train: bool = True, seed: int = 0, drop_last: bool = False,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise UserError("HeteroDataLoader: the dataset must be map-style (__getitem__ and __len__)")
        super().__init__(global_batch, batch_size, accumulate, "HeteroDataLoader")
        self.dataset = dataset
        self.train = train
        self.seed = seed
        self.drop_last = drop_last
        self.collate = collate_fn or default_collate
        self._plain = GlobalBatchSampler(len(dataset), self.global_batch, seed, drop_last=drop_last, min_local=1)
        self.last_indices: list[int] = []
        """The dataset indices of the batch last yielded (this rank's share)."""

    def __len__(self) -> int:
        if not self.train:
            return -(-len(self._eval_indices()) // self._eval_batch())
        return self._plain.steps_per_epoch * self.accumulate

    def __iter__(self) -> Iterator[Any]:
        if not self.train:
            yield from self._evaluation()
            return
        model = parallel.active()
        sampler = self._plain if model is None else self._attach(model)
        for start, size in self._steps(sampler, model):
            self.last_indices = sampler.permutation[start:start + size].tolist()
            yield self._batch(self.last_indices)

    def _attach(self, model: parallel.HeteroDataParallel) -> GlobalBatchSampler:
        return model.attach(len(self.dataset), self.global_batch, self.seed, self.drop_last,
                            ("", type(self.dataset).__name__), self.accumulate)

    def _probe_batch(self, size: int) -> Any:
        return self._batch([i % len(self.dataset) for i in range(size)])  # the first samples

    def _batch(self, indices: list[int]) -> Any:
        if indices:
            return self.collate([self.dataset[i] for i in indices])
        return _empty(self.collate([self.dataset[0]]))  # an empty share: a batch of no samples, the usual shape

    def _eval_batch(self) -> int:
        return self.batch_size or max(1, self.global_batch // self.world)

    def _eval_indices(self) -> range:
        return eval_indices(len(self.dataset), [1] * self.world, self.rank)

    def _evaluation(self) -> Iterator[Any]:
        model = parallel.active()
        if model is not None:
            model.finish_step()  # the evaluation is not the training step's time
        mine, size = self._eval_indices(), self._eval_batch()
        for start in range(0, len(mine), size):
            self.last_indices = list(mine[start:start + size])
            yield self._batch(self.last_indices)


class HeteroBatches(_Steps):
    """This rank's batches from the loop's own ``get_batch(size)``, for a loop without a DataLoader.

    Each step asks ``get_batch`` for ``accumulate`` micro-batches of this rank's share (``size`` is
    its part; the function draws it, e.g. random windows of a token stream, with the loop's own
    random state: nothing here seeds it), so the controller moves shares as it does with a loader.
    The global batch is ``batch_size x world size x accumulate``, or ``global_batch`` itself.

    One pass over it is ``steps`` optimizer steps, ``steps x accumulate`` batches (an epoch of the
    run folder's records: an ``end`` record and ``summary.json`` after it). A loop of iterations
    ``0..max_iters`` runs ``max_iters + 1`` steps. Taking the first micro-batch of a step opens that
    step and closes the one before: take the next batch after the current one's ``backward``, not
    before it. A loop may stop inside the pass (a ``break``, an iteration count): its records close
    where it stopped (an ``end`` record with ``stopped_early``, and ``summary.json``) when the
    iteration is left or the interpreter exits.
    """

    def __init__(self, get_batch: Callable[[int], Any], global_batch: int | None = None, *,
                 batch_size: int | None = None, accumulate: int = 1, steps: int) -> None:
        super().__init__(global_batch, batch_size, accumulate, "HeteroBatches")
        if steps < 1:
            raise UserError(f"HeteroBatches: steps must be at least 1, not {steps}")
        if self.global_batch < self.world * accumulate:
            raise UserError(f"HeteroBatches: a global batch of {self.global_batch} leaves a rank an empty "
                            f"micro-batch ({self.world} ranks x accumulate={accumulate})")
        self.get_batch = get_batch
        self.steps = steps
        self._plain = GlobalBatchSampler(steps * self.global_batch, self.global_batch, 0, drop_last=True, min_local=1)

    def __len__(self) -> int:
        return self.steps * self.accumulate

    def __iter__(self) -> Iterator[Any]:
        model = parallel.active()
        sampler = self._plain if model is None else self._attach(model)
        for _, size in self._steps(sampler, model):
            yield self.get_batch(size)

    def _attach(self, model: parallel.HeteroDataParallel) -> GlobalBatchSampler:
        name = getattr(self.get_batch, "__name__", "get_batch")
        return model.attach(self._plain.dataset_size, self.global_batch, 0, True, ("", name), self.accumulate)

    def _probe_batch(self, size: int) -> Any:
        return self.get_batch(size)


def _empty(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_empty(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _empty(v) for k, v in batch.items()}
    return batch
