"""What the ASP controller keeps of each worker's measurements, and the estimates pooled from them.

:class:`Worker` holds a worker's last times and cycle overheads, with what the controller reads of them
at every push kept up to date as they come (the times per sample at the current ``k``, sorted; the
batches the window holds), so that a push costs the same at any window; :class:`ScatterPool` keeps every
worker's scatter about its medians in one sorted list. :func:`pooled_medians` and :func:`shrunk` turn
the windows into the estimates a decision uses. Every figure is the one the plain computation gives, bit
for bit (``tests/unit/test_asp_controller.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from omnilearn.control.fixed_cost import MEDIAN_EFFICIENCY


def median_sorted(v: list[float]) -> float:
    """A sorted list's median, as :func:`statistics.median` and :func:`numpy.median` give it."""
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def padded(values: list[list[float]], width: int) -> np.ndarray:
    """``values`` (one list a worker, each at most ``width`` long) as rows of one array, NaN after each."""
    return np.asarray([[*v, *[np.nan] * (width - len(v))] for v in values], float).reshape(len(values), width)


def shrunk(x: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Each estimate ``x_i`` (sampling variance ``var_i``; infinite: no estimate) drawn toward their
    precision-weighted mean by the share of its spread its noise explains: ``m + B_i (x_i − m)``, ``B_i =
    s² / (s² + var_i)``, ``s²`` the spread between the true values (the estimates' variance less the mean
    noise, at least 0). The positive-part empirical Bayes (James-Stein) estimate: where the workers differ
    by no more than their noise (equal shares), every worker gets the same value; where they differ by far
    more (HL8), each keeps its own."""
    known = np.isfinite(var)
    if known.sum() < 2:
        return np.where(known, x, x[known].mean() if known.any() else 0.0)
    xs, vs = x[known], var[known]
    w = np.where(known, vs.min() / var, 0.0)  # the precisions, relative to the largest
    mean = float((w * np.where(known, x, 0.0)).sum() / w.sum())
    d = xs - xs.sum() / len(xs)  # numpy.var's own steps (ddof 1), without its dispatch
    between = max(float((d * d).sum() / (len(xs) - 1) - vs.mean()), 0.0)
    return np.where(known, mean + between / (between + var) * (x - mean), mean)


def pooled_medians(samples: np.ndarray, unknown: float, floor: float) -> tuple[np.ndarray, float]:
    """Each worker's median of its samples (the rows of ``samples``, workers x window, NaN where a window
    is short), :func:`shrunk` by the noise of that median; and the variance of one sample about its
    worker's median, pooled over the workers (their degrees of freedom: each window less one),
    ``unknown`` where no window has two, and at least ``floor``."""
    held = ~np.isnan(samples)
    sizes = held.sum(axis=1)
    ordered = np.sort(samples, axis=1)  # NaN last
    rows = np.arange(len(samples))
    mid = ordered[rows, np.maximum(sizes - 1, 0) // 2] + ordered[rows, sizes // 2]
    centres = np.where(sizes > 0, mid / 2, 0.0)
    dof = float(sizes.sum() - (sizes > 0).sum())
    within = max(float((np.where(held, samples - centres[:, None], 0.0) ** 2).sum()) / dof
                 if dof >= 1 else unknown, floor)
    var = np.where(sizes > 0, within * MEDIAN_EFFICIENCY / np.maximum(sizes, 1), np.inf)
    return shrunk(centres, var), within


@dataclass
class Worker:
    """One worker's recent measurements (each window ``window`` long)."""

    window: int
    times: deque[tuple[int, float]] = field(init=False)  # (batch, compute seconds)
    overheads: deque[float] = field(init=False)  # cycle seconds less compute seconds
    fresh: int = 0
    strikes: int = 0
    idle_for: int = 0
    """Decisions taken since the controller idled this worker (while its batch is 0)."""
    last_batch: int = 0
    """Its batch before it was idled: where a move that wakes it may start from."""
    woken: bool = False
    """Idle until the last move: the cycle of its first push since holds its idle time."""
    version: int = 0
    """Counts the changes to ``times``."""
    _scatter: list[float] | None = None
    _per: tuple[float, list[float]] | None = None  # (k, the times per sample at k, sorted)
    _batches: Counter[int] = field(default_factory=Counter)  # the batches of ``times``, counted

    def __post_init__(self) -> None:
        self.times, self.overheads = deque(maxlen=self.window), deque(maxlen=self.window)

    def record(self, batch: int, compute_s: float) -> None:
        if len(self.times) == self.window:  # the oldest time leaves the window
            b, t = self.times[0]
            self._batches[b] -= 1
            if not self._batches[b]:
                del self._batches[b]
            if self._per is not None:
                del self._per[1][bisect_left(self._per[1], t / (b + self._per[0]))]
        self.times.append((batch, compute_s))
        self._batches[batch] += 1
        if self._per is not None:
            insort(self._per[1], compute_s / (batch + self._per[0]))
        self._scatter = None
        self.version += 1

    def restart(self) -> None:
        """Keep only the last time: the older ones are of another speed."""
        last = self.times[-1]
        self.times.clear()
        self._batches.clear()
        self._per = self._scatter = None
        self.record(*last)

    def only_batch(self, batch: int) -> bool:
        """Whether every time of the window is at ``batch`` (none is: True)."""
        return not self._batches or (len(self._batches) == 1 and batch in self._batches)

    def per_sample(self, k: float) -> list[float]:
        """The window's seconds per sample at fixed cost ``k``, ``t / (b + k)``, sorted."""
        if self._per is None or self._per[0] != k:
            self._per = (k, sorted(t / (b + k) for b, t in self.times))
        return self._per[1]

    def scatter(self) -> list[float]:
        """Every log time's distance from the median log time of this worker's times at the same batch,
        for the batches that have three times or more."""
        if self._scatter is None:
            by: dict[int, list[float]] = {}
            for b, t in self.times:
                by.setdefault(b, []).append(math.log(t))
            self._scatter = [abs(x - median_sorted(sorted(v))) for v in by.values() if len(v) >= 3 for x in v]
        return self._scatter


class ScatterPool:
    """Every worker's :meth:`Worker.scatter` in one sorted list, brought up to date for the workers whose
    windows changed since (a decision among 64 workers would otherwise gather and sort them all at every
    push). One pool follows one list of ``workers`` workers: its owner starts a new pool with new workers."""

    def __init__(self, workers: int) -> None:
        self.values: list[float] = []
        self.held: list[list[float]] = [[] for _ in range(workers)]  # each worker's values in ``values``
        self.seen = [-1] * workers  # the :attr:`Worker.version` of each window they came from

    def median(self, workers: list[Worker]) -> float | None:
        """The median of every worker's scatter; None where fewer than three."""
        versions = [w.version for w in workers]
        for i, w in enumerate(workers):
            if versions[i] == self.seen[i]:
                continue
            for x in self.held[i]:
                del self.values[bisect_left(self.values, x)]
            self.held[i] = list(w.scatter())
            for x in self.held[i]:
                insort(self.values, x)
        self.seen = versions
        return median_sorted(self.values) if len(self.values) >= 3 else None
