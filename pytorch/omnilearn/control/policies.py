"""Batching policies: how the global batch B is split among workers.

Pure functions, no torch.distributed: every rank calls them with the same inputs and gets the same
answer, so a decision needs no broadcast.

What each policy knows (:data:`KNOWS`): a policy that reads the emulator's allocations says so in its
name; the others decide from what a real cluster gives them, measured compute times.

- ``uniform``: equal batches (the data-parallel baseline).
- ``static``: batches proportional to each worker's allocated CPU share.
- ``dynamic``: the model-based controller of :mod:`omnilearn.control.dynamic` (a start-up probe, an
  estimator of ``t_i(b) = c_i (b + k)``, one decision rule); it uses :func:`balanced` from here.
- ``dynamic+prior``: ``dynamic`` told the allocations: it starts from batches proportional to the
  allocated CPU and rescales its speeds by the new shares when the level changes.
- ``paper``: the paper's own rule (:func:`paper`, :data:`PAPER_DEADBAND`, :data:`PAPER_BOUNDS`): once per
  epoch, from each worker's mean compute time over the epoch.

The controllers that hold a split and call these are in :mod:`omnilearn.control.baselines` and
:mod:`omnilearn.control.dynamic`.

Every decision keeps ``sum(b) == B`` exactly and each ``b_i`` within ``[min_batch, max_batch_i]``;
what one worker cannot take is redistributed to the others.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The policies' names and what each knows belong to the config (one layer below): re-exported here.
from omnilearn.config.sections import KNOWS, POLICIES, ControlConfig  # noqa: F401

PAPER_DEADBAND = 0.2
"""The paper's rule applies a new split only when some worker's batch moves by 20% of its new size."""
PAPER_BOUNDS = (0.5, 3.0)
"""The paper's per-worker batch bounds as multiples of the equal share B/n ([16, 96] for 32)."""



@dataclass(frozen=True)
class Bounds:
    """Per-worker batch bounds; ``max_batch`` may differ per worker (memory-aware bounds)."""

    min_batch: int
    max_batch: tuple[int, ...]

    @staticmethod
    def make(workers: int, min_batch: int, max_batch: int | Sequence[int] | None, global_batch: int) -> Bounds:
        if max_batch is None:
            maxes = (global_batch,) * workers
        elif isinstance(max_batch, int):
            maxes = (max_batch,) * workers
        else:
            maxes = tuple(int(m) for m in max_batch)
        assert len(maxes) == workers
        return Bounds(min_batch=min_batch, max_batch=maxes)

    def admit(self, batch: Sequence[int]) -> bool:
        """Whether every worker's batch lies within its bounds."""
        return all(self.min_batch <= b <= m for b, m in zip(batch, self.max_batch, strict=True))

    def feasible(self, global_batch: int) -> bool:
        return (self.min_batch * len(self.max_batch) <= global_batch <= sum(self.max_batch)
                and all(m >= self.min_batch for m in self.max_batch))


def bounded_shares(weights: Sequence[float], total: float, lo: float | Sequence[float], hi: Sequence[float]
                   ) -> list[float]:
    """Split ``total`` in proportion to ``weights`` with every share clamped to ``[lo_i, hi_i]`` (``lo``:
    one bound for all, or one each): :func:`bounded_shares_rows` on one row."""
    n = len(weights)
    low = np.full(n, float(lo)) if isinstance(lo, int | float) else np.asarray(lo, float)
    assert n == len(hi) == len(low) and n > 0
    assert low.sum() <= total + 1e-9 and total <= sum(hi) + 1e-9, (lo, hi, total)
    return bounded_shares_rows(np.asarray([weights], float), np.asarray([total], float), low[None, :],
                               np.asarray([hi], float))[0].tolist()


def bounded_shares_rows(weights: np.ndarray, totals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Every row of ``weights`` (rows x workers) split in proportion within its own total and bounds
    (rows x workers; every row's bounds hold its total).

    Water-filling: workers whose proportional share falls outside their bounds are pinned at the
    bound (the side that violates: pinning both at once could overshoot the total), and the rest of
    the total is split again among the others, until nothing moves. Every sum runs in worker order,
    and the pinned in the order they were pinned, so a row's shares do not depend on the others'.
    """
    rows, n = weights.shape
    w = np.maximum(weights.astype(float), 0.0)
    w[np.cumsum(w, axis=1)[:, -1] <= 0] = 1.0
    top, bottom = hi + 1e-12, lo - 1e-12
    pinned = np.zeros((rows, n), bool)
    value = np.zeros((rows, n))
    pinned_sum = np.zeros(rows)
    shares = np.zeros((rows, n))
    moving = np.ones((rows, 1), bool)
    while True:
        free = ~pinned
        rest = (totals - pinned_sum)[:, None]
        wsum = np.cumsum(np.where(free, w, 0.0), axis=1)[:, -1:]
        if (wsum > 0).all():
            fresh = rest * w / wsum
        else:  # every free weight 0: the rest in equal parts
            fresh = np.where(wsum > 0, rest * w / np.where(wsum > 0, wsum, 1.0), rest / np.maximum(free.sum(axis=1, keepdims=True), 1))
        now = moving & free
        shares = np.where(now, fresh, shares)
        over = now & (shares > top)
        use_over = over.any(axis=1, keepdims=True)
        pin = np.where(use_over, over, now & (shares < bottom))
        moving = pin.any(axis=1, keepdims=True)
        if not moving.any():
            break
        val = np.where(use_over, hi, lo)
        value = np.where(pin, val, value)
        pinned |= pin
        pinned_sum = np.cumsum(np.concatenate([pinned_sum[:, None], np.where(pin, val, 0.0)], axis=1), axis=1)[:, -1]
    return np.where(pinned, value, shares)


def round_preserving_sum(shares: Sequence[float], total: int, lo: int, hi: Sequence[int]) -> list[int]:
    """Integers within ``[lo, hi_i]`` that sum to ``total``, closest to ``shares`` (largest remainder):
    :func:`round_rows` on one row."""
    return round_rows(np.asarray([shares], float), np.asarray([total]), lo, np.asarray([hi], float))[0].tolist()


def round_rows(shares: np.ndarray, totals: np.ndarray, lo: int, hi: np.ndarray) -> np.ndarray:
    """Integers within ``[lo, hi]`` closest to every row of ``shares`` (rows x workers), each summing to its
    own total (largest remainder): every share rounded down within the bounds, then the samples left over (or
    short) given one at a time to the workers in order of the largest remainders (ties: the lower
    index), pass after pass."""
    base = np.minimum(np.maximum(np.floor(shares + 1e-9), lo), hi)
    order = np.argsort(-(shares - np.floor(shares + 1e-9)), axis=1, kind="stable")
    rows = np.arange(len(shares))[:, None]
    left = totals - base.sum(axis=1)
    if not left.any():
        return base.astype(int)
    ordered, top = base[rows, order], hi[rows, order]  # in each row's order of remainders, pass after pass
    while (left != 0).any():
        up = (left > 0)[:, None] & (ordered < top)
        down = (left < 0)[:, None] & (ordered > lo)
        eligible = up | down
        rank = np.cumsum(eligible, axis=1)
        step = eligible & (rank <= np.abs(left)[:, None])
        assert step[left != 0].any(axis=1).all(), "bounds cannot hold the total"
        delta = np.where(step, np.where(up, 1.0, -1.0), 0.0)
        ordered += delta
        left = left - delta.sum(axis=1)
    base[rows, order] = ordered
    return base.astype(int)


def unique_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of ``rows`` in lexicographic order (:func:`numpy.unique` with ``axis=0``, quicker
    on the small arrays of a decision)."""
    ordered = rows[np.lexsort(rows.T[::-1])]
    return ordered[np.concatenate(([True], (ordered[1:] != ordered[:-1]).any(axis=1)))]


def from_fastest(speeds: np.ndarray, fastest: Sequence[float], powers: Sequence[float]) -> np.ndarray:
    """Splits scaled from the fastest worker's batch, unrounded: ``b_i = f (s_i / max s)^p`` for every
    ``f`` of ``fastest`` (samples) and, within it, every ``p`` of ``powers`` (rows x workers)."""
    rel = np.asarray(speeds, float) / float(np.max(speeds))
    return (np.asarray(fastest, float)[:, None, None] * rel[None, None, :]
            ** np.asarray(powers, float)[None, :, None]).reshape(-1, len(rel))


def split(weights: Sequence[float], global_batch: int, bounds: Bounds) -> list[int]:
    """Integer batches proportional to ``weights``, within bounds, summing to ``global_batch``."""
    shares = bounded_shares(weights, global_batch, bounds.min_batch, bounds.max_batch)
    return round_preserving_sum(shares, global_batch, bounds.min_batch, bounds.max_batch)


def uniform(workers: int, global_batch: int, bounds: Bounds) -> list[int]:
    return split([1.0] * workers, global_batch, bounds)


def static(cpu_shares: Sequence[float | None], global_batch: int, bounds: Bounds) -> list[int]:
    """Batch proportional to allocated CPU; unknown shares count as the mean of the known ones."""
    known = [s for s in cpu_shares if s]
    fill = sum(known) / len(known) if known else 1.0
    return split([s if s else fill for s in cpu_shares], global_batch, bounds)


def balanced(batch: Sequence[int], compute_s: Sequence[float], overhead: float | Sequence[float], global_batch: int,
             bounds: Bounds) -> list[int]:
    """Batches that make ``t_i(b) = c_i (b + k)`` equal for all workers, bounded, summing to B.

    ``c_i = t_i / (b_i + k)`` from each worker's time at its current batch; equal times need
    ``b_i + k`` proportional to ``1 / c_i`` with ``sum(b_i) = B``: the water-filling of
    :func:`bounded_shares` on ``b_i + k`` (total ``B + n k``, bounds shifted by ``k``). With ``k = 0``
    it is the proportional rule ``b_i * t_mean / t_i`` normalised to B. Rounding to integers then
    moves single samples from the slowest predicted worker to the fastest while that shortens the
    slowest: a worker with 20 samples is 5% off with one sample too many. ``overhead``: k, one for all
    or one per worker (workers of different kinds).
    """
    n = len(batch)
    ks = [float(overhead)] * n if isinstance(overhead, int | float) else [float(x) for x in overhead]
    assert len(compute_s) == len(ks) == n and min(ks) >= 0
    extra = n * ks[0] if len(set(ks)) == 1 else sum(ks)  # one k: n k exactly, as a sum would not round
    cost = [max(float(t), 1e-9) / (b + k) for b, t, k in zip(batch, compute_s, ks, strict=True)]  # c_i
    shares = bounded_shares([1 / c for c in cost], global_batch + extra, [bounds.min_batch + k for k in ks],
                            [h + k for h, k in zip(bounds.max_batch, ks, strict=True)])
    new = round_preserving_sum([x - k for x, k in zip(shares, ks, strict=True)], global_batch, bounds.min_batch,
                               bounds.max_batch)
    # Two heaps (the slowest first; the cheapest to give one more sample first, among workers below
    # their bound), stale entries skipped: a move costs O(log n), so a thousand workers decide in ms.
    t = [c * (b + k) for c, b, k in zip(cost, new, ks, strict=True)]
    hi = bounds.max_batch
    slow_heap = [(-x, i) for i, x in enumerate(t)]  # the largest time, then the lowest index
    fast_heap = [(t[i] + cost[i], i) for i in range(n) if new[i] < hi[i]]
    heapq.heapify(slow_heap)
    heapq.heapify(fast_heap)
    for _ in range(global_batch):
        while -slow_heap[0][0] != t[slow_heap[0][1]]:
            heapq.heappop(slow_heap)
        slow = slow_heap[0][1]
        while fast_heap and (new[fast_heap[0][1]] >= hi[fast_heap[0][1]]
                             or fast_heap[0][0] != t[fast_heap[0][1]] + cost[fast_heap[0][1]]):
            heapq.heappop(fast_heap)
        fast = fast_heap[0][1] if fast_heap else slow
        if fast == slow or new[slow] <= bounds.min_batch or t[fast] + cost[fast] >= t[slow]:
            break
        new[slow] -= 1
        new[fast] += 1
        for i in (slow, fast):
            t[i] = cost[i] * (new[i] + ks[i])
            heapq.heappush(slow_heap, (-t[i], i))
            if new[i] < hi[i]:
                heapq.heappush(fast_heap, (t[i] + cost[i], i))
    return new


def paper(batch: Sequence[int], compute_s: Sequence[float], global_batch: int, bounds: Bounds,
          deadband: float = PAPER_DEADBAND) -> list[int]:
    """The paper's rule: ``b_i <- b_i * t_mean / t_i``, adopted when some worker's batch would move by
    at least ``deadband`` of its new size (``|b_new - b| / b_new``).

    The paper applies the test worker by worker; one test for the whole split keeps ``sum(b) == B``.
    """
    new = balanced(batch, compute_s, 0.0, global_batch, bounds)
    if all(abs(n - b) < deadband * n for n, b in zip(new, batch, strict=True)):
        return list(batch)
    return new


def probe_sizes(global_batch: int, workers: int, bounds: Bounds) -> tuple[int, int]:
    """The two batch sizes of a job's start-up pass (the memory probe every policy runs, and the timing
    ``dynamic`` takes from it): an eighth and a quarter of the equal share, within the bounds."""
    share = global_batch / workers
    small = max(bounds.min_batch, 1, round(share / 8))
    large = min(max(small + 1, round(share / 4)), min(bounds.max_batch))
    return (small, large) if large > small else (max(1, large - 1), large)


def effective(control: ControlConfig, global_batch: int, workers: int) -> ControlConfig:
    """The settings ``control``'s policy runs with: ``paper`` replaces the batch bounds by the paper's
    ([B/n / 2, 3 B/n]) and decides at epoch ends (``interval`` 0)."""
    if control.policy != "paper":
        return control
    lo, hi = paper_bounds(workers, global_batch)
    return dataclasses.replace(control, interval=0, min_batch=lo, max_batch=hi)


def paper_bounds(workers: int, global_batch: int) -> tuple[int, int]:
    """The paper's per-worker bounds for this job: [B/n / 2, 3 B/n] (its [16, 96] at B/n = 32)."""
    share = global_batch / workers
    return max(1, math.ceil(share * PAPER_BOUNDS[0])), math.floor(share * PAPER_BOUNDS[1])


def imbalance(compute_s: Sequence[float]) -> float:
    """``max/min - 1`` of per-worker compute times: 0 is perfect balance."""
    return max(compute_s) / max(min(compute_s), 1e-12) - 1.0
