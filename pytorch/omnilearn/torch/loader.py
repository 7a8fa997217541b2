"""``HeteroDataLoader``: this rank's share of each global batch, from the BSP sampler.

Step ``s`` of an epoch uses positions ``[s*B, s*B + B)`` of the epoch's permutation (the same on
every rank: :class:`~omnilearn.train.sampler.GlobalBatchSampler`); rank ``r`` takes its contiguous
share, of the size the controller gives it. Shares may change at any step: every sample is still
used once per epoch, and every rank runs the same number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, default_collate

from omnilearn.errors import UserError
from omnilearn.torch import parallel
from omnilearn.train.sampler import GlobalBatchSampler


class HeteroDataLoader:
    """Iterates this rank's batches of ``dataset`` (map-style) for a global batch of ``global_batch``.

    With a :class:`~omnilearn.torch.HeteroDataParallel` in the process, the shares are its
    controller's; without one, the global batch is split equally. Each iteration is one epoch (the
    next one, or the one given to :meth:`set_epoch`).
    """

    def __init__(self, dataset: Dataset, global_batch: int, *, seed: int = 0, drop_last: bool = False,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise UserError("HeteroDataLoader: the dataset must be map-style (__getitem__ and __len__)")
        if not dist.is_initialized():
            raise UserError("HeteroDataLoader: call torch.distributed.init_process_group first")
        self.dataset = dataset
        self.global_batch = global_batch
        self.seed = seed
        self.drop_last = drop_last
        self.collate = collate_fn or default_collate
        self.epoch = 0
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._plain = GlobalBatchSampler(len(dataset), global_batch, seed, drop_last=drop_last, min_local=1)
        self.last_indices: list[int] = []
        """The dataset indices of the batch last yielded (this rank's share)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self._plain.steps_per_epoch

    def _sampler(self) -> tuple[GlobalBatchSampler, parallel.HeteroDataParallel | None]:
        model = parallel.active()
        if model is None:
            return self._plain, None
        return model.attach(len(self.dataset), self.global_batch, self.seed, self.drop_last,
                            ("", type(self.dataset).__name__)), model

    def __iter__(self) -> Iterator[Any]:
        sampler, model = self._sampler()
        epoch = self.epoch
        sampler.set_epoch(epoch)
        steps = sampler.steps_per_epoch
        equal = [self.global_batch // self.world + (1 if r < self.global_batch % self.world else 0)
                 for r in range(self.world)]
        for step in range(steps):
            shares = model.begin_step(epoch, step, steps) if model is not None else sampler.step_sizes(step, equal)
            start = step * self.global_batch + sum(shares[:self.rank])
            self.last_indices = sampler.permutation[start:start + shares[self.rank]].tolist()
            if self.last_indices:
                yield self.collate([self.dataset[i] for i in self.last_indices])
            else:  # an empty share of a partial last step: a batch of no samples, of the usual shape
                yield _empty(self.collate([self.dataset[0]]))
        if model is not None:
            model.end_epoch(epoch)
        self.epoch = epoch + 1


def _empty(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_empty(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _empty(v) for k, v in batch.items()}
    return batch
