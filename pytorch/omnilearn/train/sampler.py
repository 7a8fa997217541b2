"""The BSP global-batch sampler, and proportional splits of a step or of the evaluation set.

Under BSP every worker must derive the same per-epoch permutation from ``(seed, epoch)``, take its
own contiguous slice of each global step, and run the same number of steps whatever batch sizes the
controller picks, so that every sample is used exactly once per epoch and nobody waits forever at a
collective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from omnilearn.errors import UserError


def proportional_split(total: int, weights: Sequence[int | float]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, ties to lower rank).

    The parts always sum to ``total`` exactly; with integer weights the arithmetic is exact.
    """
    assert total >= 0, total
    assert len(weights) > 0 and all(w >= 0 for w in weights), weights
    weight_sum = sum(weights)
    assert weight_sum > 0, "at least one positive weight"
    if all(isinstance(w, int) for w in weights):
        floors = [total * int(w) // int(weight_sum) for w in weights]
        remainders: list[float] = [total * int(w) % int(weight_sum) for w in weights]
    else:
        quotas = [total * float(w) / float(weight_sum) for w in weights]
        floors = [math.floor(q) for q in quotas]
        remainders = [q - f for q, f in zip(quotas, floors, strict=True)]
    left = total - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-remainders[i], i))
    for i in order[:left]:
        floors[i] += 1
    assert sum(floors) == total
    return floors


def micro_sizes(local_batch: int, accumulate: int) -> list[int]:
    """A local batch cut into ``accumulate`` consecutive micro-batches, the larger ones first.

    Every size is ``local_batch // accumulate`` or one more, and they sum to ``local_batch``.
    """
    assert local_batch >= 0 and accumulate >= 1, (local_batch, accumulate)
    return [local_batch // accumulate + (1 if j < local_batch % accumulate else 0) for j in range(accumulate)]


def eval_indices(n: int, shares: Sequence[int | float], rank: int) -> range:
    """Rank ``rank``'s contiguous part of ``n`` evaluation samples, split in proportion to ``shares``.

    Every sample belongs to exactly one rank, so a sum all-reduce of per-rank correct counts gives the
    exact accuracy; proportional shares let slow workers evaluate less.
    """
    assert 0 <= rank < len(shares), (rank, len(shares))
    parts = proportional_split(n, shares)
    start = sum(parts[:rank])
    return range(start, start + parts[rank])


class GlobalBatchSampler:
    """BSP data semantics: step ``s`` uses positions ``[s*B, s*B + B)`` of the epoch's permutation.

    The permutation comes from ``(seed, epoch)`` alone, so every rank computes the same one without
    communicating. Worker ``r`` takes the contiguous slice of length ``batch_sizes[r]`` after the
    slices of ranks ``0..r-1``. Because the batch sizes of a step always sum to ``B``, they may change
    at every step and still every sample is used exactly once per epoch and every rank runs
    :attr:`steps_per_epoch` steps. A partial last step of ``R < B`` samples (``drop_last=False``) is
    split in proportion to the batch sizes; a worker left with fewer than ``min_local`` (but more than
    zero) samples hands them to the worker with the largest share, because BatchNorm cannot train on
    one sample. Workers may get zero samples in that step: they still join the collectives.
    """

    def __init__(
        self, dataset_size: int, global_batch: int, seed: int, drop_last: bool = False, min_local: int = 2
    ) -> None:
        if dataset_size < 1:
            raise UserError(f"the training set is empty (size {dataset_size})")
        if global_batch < 1:
            raise UserError(f"global batch size must be positive, got {global_batch}")
        if drop_last and global_batch > dataset_size:
            raise UserError(
                f"global batch size {global_batch} exceeds the training set size {dataset_size} "
                "with drop_last: an epoch would have no step"
            )
        assert min_local >= 1, min_local
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.seed = seed
        self.drop_last = drop_last
        self.min_local = min_local
        self.epoch = 0
        self._perm: Tensor | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the following calls use."""
        assert epoch >= 0, epoch
        if epoch != self.epoch:
            self._perm = None
        self.epoch = epoch

    @property
    def steps_per_epoch(self) -> int:
        """``ceil(N / B)``, or ``floor(N / B)`` with ``drop_last``: the same on every rank."""
        if self.drop_last:
            return self.dataset_size // self.global_batch
        return -(-self.dataset_size // self.global_batch)

    @property
    def permutation(self) -> Tensor:
        """The current epoch's permutation of ``range(N)`` (computed once per epoch)."""
        if self._perm is None:
            # SeedSequence mixes (seed, epoch) into a well-spread 63-bit seed: nearby seeds and
            # epochs give unrelated permutations, and every rank derives the same one.
            state = np.random.SeedSequence([self.seed, self.epoch]).generate_state(2, dtype=np.uint32)
            mixed = (int(state[0]) << 31) ^ int(state[1])
            generator = torch.Generator().manual_seed(mixed & ((1 << 63) - 1))
            self._perm = torch.randperm(self.dataset_size, generator=generator)
        return self._perm

    def step_size(self, step: int) -> int:
        """Number of samples step ``step`` consumes in total (``B`` except in a partial last step)."""
        assert 0 <= step < self.steps_per_epoch, (step, self.steps_per_epoch)
        return min(self.global_batch, self.dataset_size - step * self.global_batch)

    def step_sizes(self, step: int, batch_sizes: Sequence[int]) -> list[int]:
        """Per-rank sample counts actually used at ``step``; they sum to :meth:`step_size`."""
        assert len(batch_sizes) > 0 and all(int(b) == b and b >= 0 for b in batch_sizes), batch_sizes
        assert sum(batch_sizes) == self.global_batch, (
            f"batch sizes {list(batch_sizes)} sum to {sum(batch_sizes)}, not the global batch {self.global_batch}"
        )
        remaining = self.step_size(step)
        if remaining == self.global_batch:
            return [int(b) for b in batch_sizes]
        sizes = proportional_split(remaining, [int(b) for b in batch_sizes])
        receiver = max(range(len(sizes)), key=lambda i: (sizes[i], batch_sizes[i], -i))
        for i, size in enumerate(sizes):
            if i != receiver and 0 < size < self.min_local:
                sizes[receiver] += size
                sizes[i] = 0
        assert sum(sizes) == remaining
        return sizes

    def local_indices(self, step: int, batch_sizes: Sequence[int], rank: int) -> Tensor:
        """Sample indices rank ``rank`` uses at ``step`` of the current epoch (may be empty)."""
        assert 0 <= rank < len(batch_sizes), (rank, len(batch_sizes))
        sizes = self.step_sizes(step, batch_sizes)
        start = step * self.global_batch + sum(sizes[:rank])
        return self.permutation[start : start + sizes[rank]]
