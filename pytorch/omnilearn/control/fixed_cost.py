"""The posterior over the workload's fixed cost ``k`` of a step (in samples), one per kind of worker.

``k`` is work a step does whatever its batch (the optimizer's update, the framework's own): on one kind
of worker it is the same for every worker, but it is not the same across kinds. A core with two threads
uses small batches less well than one thread does: the demo's ResNet18 step reads k = 3.5 samples on
one thread and 13 on two, alone on the host, and 7-10 against 27.5 in the job's steps under CPU quotas
(``results/2026-11-28_2cpu_k-by-threads.md``). A kind is what a worker reports of itself: its threads
and its kind of core (:func:`~omnilearn.train.step.core_kind`), as the start-up probe pools them.

Each kind's posterior is a log-density on one grid over ``[0, PRIORS.k_max_factor * B / n]`` (prior:
``Priors.k_prior``); evidence is a log-likelihood over the grid, added to one kind's row. A kind seen for
the first time starts from the prior.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from omnilearn.control.priors import PRIORS


def t_logpdf(e: np.ndarray) -> np.ndarray:
    """Student-t log density (up to a constant) of standardised residuals ``e``."""
    return -0.5 * (PRIORS.dof + 1) * np.log1p(e * e / PRIORS.dof)


def distinct(x: np.ndarray) -> np.ndarray:
    """The distinct values of ``x``, those within a rounding error of each other (1e-9) taken as one."""
    x = np.sort(x)
    return x[np.concatenate(([True], np.diff(x) > 1e-9 * np.maximum(np.abs(x[1:]), 1.0)))]


def kind_key(kind: Sequence[float] | None) -> tuple[float, ...]:
    """A worker's kind as a key: its threads and kind of core (``()``: not reported)."""
    return () if kind is None else tuple(float(x) for x in kind)


class FixedCost:
    """k's posterior for each kind of worker: ``log[g]`` over ``grid`` for the kind ``kinds[g]``."""

    def __init__(self, global_batch: int, workers: int) -> None:
        self.grid = PRIORS.k_max_factor * global_batch / workers * np.linspace(0.0, 1.0, PRIORS.k_points) ** 2
        # The prior: exponential with mean PRIORS.k_prior of a worker's equal share, as a mass per grid cell.
        prior = -self.grid / (PRIORS.k_prior * global_batch / workers) + np.log(np.gradient(self.grid))
        self.prior = prior - prior.max()
        self.kinds: list[tuple[float, ...]] = [()]
        self.log = self.prior[None, :].copy()
        self._memo: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def row(self, kind: Hashable) -> int:
        """The row of ``kind`` (a key of :func:`kind_key`), added with the prior when new; the first kind
        reported takes the row of the workers not reported yet, and what it learned."""
        if self.kinds == [()]:
            self.kinds = [kind]  # type: ignore[list-item]
        if kind not in self.kinds:
            self.kinds.append(kind)  # type: ignore[arg-type]
            self.log = np.vstack([self.log, self.prior])
        return self.kinds.index(kind)  # type: ignore[arg-type]

    def posterior(self) -> np.ndarray:
        """Each kind's posterior over the grid (rows sum to one)."""
        return self._moments()[0]

    def mean(self) -> np.ndarray:
        """Each kind's posterior mean of k."""
        return self._moments()[1]

    def sd(self) -> np.ndarray:
        p, mean = self._moments()[:2]
        return np.sqrt(np.maximum(p @ self.grid ** 2 - mean ** 2, 0.0))

    def _moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The posterior and its mean, computed once per ``log`` (every change assigns a new array)."""
        memo = self._memo
        if memo is None or memo[2] is not self.log:
            p = np.exp(self.log - self.log.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            memo = self._memo = (p, p @ self.grid, self.log)
        return memo

    def add(self, row: int, loglik: np.ndarray) -> None:
        """One piece of evidence on the kind ``row``: a log-likelihood over the grid."""
        log = self.log.copy()
        log[row] += loglik
        log[row] -= log[row].max()
        self.log = log

    def draws(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` draws of every kind's k: shape (count, kinds)."""
        p = self.posterior()
        return np.stack([rng.choice(self.grid, size=count, p=p[g]) for g in range(len(self.kinds))], axis=1)

    def state_dict(self) -> dict[str, Any]:
        return {"kinds": [list(k) for k in self.kinds], "log": self.log.tolist()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.kinds = [kind_key(k) for k in d["kinds"]]
        self.log = np.atleast_2d(np.asarray(d["log"], float))
