"""Batching policies: how the global batch B is split among workers.

Pure functions, no torch.distributed: every rank calls them with the same inputs and gets the same
answer, so a decision needs no broadcast.

- ``uniform``: equal batches (the data-parallel baseline).
- ``static``: batches proportional to each worker's allocated CPU share.
- ``dynamic`` (OmniLearn): ``b_i <- b_i * t_mean / t_i`` from measured compute times; its fixed point
  gives each worker a batch proportional to its measured throughput ``b_i / t_i``, which makes all
  compute times equal.

Every decision keeps ``sum(b) == B`` exactly and each ``b_i`` within ``[min_batch, max_batch_i]``;
what one worker cannot take is redistributed to the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

POLICIES = ("uniform", "static", "dynamic")


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

    def feasible(self, global_batch: int) -> bool:
        return (self.min_batch * len(self.max_batch) <= global_batch <= sum(self.max_batch)
                and all(m >= self.min_batch for m in self.max_batch))


def bounded_shares(weights: Sequence[float], total: float, lo: float, hi: Sequence[float]) -> list[float]:
    """Split ``total`` in proportion to ``weights`` with every share clamped to ``[lo, hi_i]``.

    Water-filling: workers whose proportional share falls outside their bounds are pinned at the
    bound, and the rest of the total is split again among the others, until nothing moves.
    """
    n = len(weights)
    assert n == len(hi) and n > 0
    assert lo * n <= total + 1e-9 and total <= sum(hi) + 1e-9, (lo, hi, total)
    w = [max(float(x), 0.0) for x in weights]
    if sum(w) <= 0:
        w = [1.0] * n
    pinned: dict[int, float] = {}
    while True:
        free = [i for i in range(n) if i not in pinned]
        rest = total - sum(pinned.values())
        wsum = sum(w[i] for i in free)
        shares = {i: (rest * w[i] / wsum if wsum > 0 else rest / len(free)) for i in free}
        over = [i for i in free if shares[i] > hi[i] + 1e-12]
        under = [i for i in free if shares[i] < lo - 1e-12]
        if not over and not under:
            break
        # Pin the side that violates; pinning both at once could overshoot the total.
        for i in (over if over else under):
            pinned[i] = hi[i] if over else lo
    out = [pinned.get(i, shares.get(i, 0.0)) for i in range(n)]
    return out


def round_preserving_sum(shares: Sequence[float], total: int, lo: int, hi: Sequence[int]) -> list[int]:
    """Integers within ``[lo, hi_i]`` that sum to ``total``, closest to ``shares`` (largest remainder)."""
    base = [min(max(math.floor(s + 1e-9), lo), hi[i]) for i, s in enumerate(shares)]
    left = total - sum(base)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - math.floor(shares[i] + 1e-9)), i))
    while left != 0:
        moved = False
        for i in order:
            if left > 0 and base[i] < hi[i]:
                base[i] += 1
                left -= 1
                moved = True
            elif left < 0 and base[i] > lo:
                base[i] -= 1
                left += 1
                moved = True
            if left == 0:
                break
        assert moved, "bounds cannot hold the total"
    return base


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


def dynamic(
    batch: Sequence[int],
    compute_s: Sequence[float],
    global_batch: int,
    bounds: Bounds,
    deadband: float = 0.0,
) -> list[int]:
    """OmniLearn's rule ``b_i <- b_i * t_mean / t_i``, normalised to B, bounded and rounded.

    ``compute_s[i]`` is worker i's robust compute time for its current batch ``batch[i]``.
    Returns ``batch`` unchanged when the compute times are already within ``deadband`` of each
    other (relative spread ``max/min - 1``) or when every worker would move by less than
    ``deadband`` of its batch: small, noisy corrections cost more than they gain.
    """
    assert len(batch) == len(compute_s)
    times = [max(float(t), 1e-9) for t in compute_s]
    if max(times) / min(times) - 1.0 <= deadband:
        return list(batch)
    t_mean = sum(times) / len(times)
    proposal = [b * t_mean / t for b, t in zip(batch, times, strict=True)]
    new = split(proposal, global_batch, bounds)
    if all(abs(n - b) <= max(deadband * b, 0) for n, b in zip(new, batch, strict=True)):
        return list(batch)
    return new


def imbalance(compute_s: Sequence[float]) -> float:
    """``max/min - 1`` of per-worker compute times: 0 is perfect balance."""
    return max(compute_s) / max(min(compute_s), 1e-12) - 1.0
