"""Each worker's measurement noise, learned from its steps: the noise half of
:class:`~omnilearn.control.model.SpeedModel` (the filter's other halves: the speeds, and the tests of
a change, :mod:`~.changes`).

Each worker's measurement noise from how its innovation (``nu``, scaled back to one worker's,
        before this step's update) changes from step to step at one batch: a bias of the estimate (a
        speed that moved a little, a k slightly off) is the same in each and drops out, the noise does
        not. A step's sample is taken a step late, as the lesser of its changes to the step before and
        the step after: an odd step differs from both and reads as one outlier (not two, the change into
        it and the change out of it), a change of speed differs from one side only and reads as none,
        so the step that brings a level change never widens the noise the next step's test of it
        needs. Where the model takes a change of speed on a step (``changed``: a jump at it, or a
        shift over the last few), the change lies before it: the step before gives no sample (its
        change to this one crosses it), nor does the step itself while the change holds: a level
        change taken at once and followed by a move (the step after it at another batch) would
        otherwise be judged by its one side, the change itself. An odd step taken for a change is
        taken back at the next step, and that return is its one sample, full-size (a worker that
        seems to jump step after step is noisy, and then no longer chased). A step's innovations
        kept for later samples have every update since taken out (``moved``: how far each estimate
        moved on this step, scaled alike): a jump taken in full leaves the next step's innovation near
        zero. A worker's first two steps at a batch give one sample (the change between them, as a
        lesser of two), every step after one more; a step followed by a move is judged by the step
        before it alone. The median of the last ``Priors.noise_memory`` samples, as a normal sd
        (``Priors.pair_scale``: robust to the heavy tails it is the scale of), shrunk towards the pool of
        every worker's (a worker with few steps borrows the others' scale; ``Priors.noise_weight`` steps of
        ``Priors.noise`` before any).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from omnilearn.control.priors import PRIORS


class NoiseScale:
    """Each worker's noise (``noise2``, a log-time variance) and the samples it rests on (see the module)."""

    def __init__(self, workers: int) -> None:
        n = self.workers = workers
        self.noise2 = np.full(n, PRIORS.noise ** 2)
        self.abs = np.zeros((PRIORS.noise_memory, n))  # each worker's recent samples (oldest first)
        self.count = np.zeros(n, int)
        self.last_nu = np.full(n, np.nan)  # each worker's innovation at its last steady step
        self.last_b = np.zeros(n)  # and the batch it was at
        self.prev_nu = np.full(n, np.nan)  # and at the one before
        self.prev_b = np.zeros(n)
        self.last_changed = np.zeros(n, bool)  # the model took a change of speed at the last step

    def dof(self) -> np.ndarray:
        """The Student-t degrees of freedom of each worker's innovations: the noise's (``Priors.dof``),
        fewer while its scale rests on few samples."""
        return np.minimum(PRIORS.dof, self.count + PRIORS.noise_dof)

    def learn(self, nu: np.ndarray, moved: np.ndarray, live: np.ndarray, batch: np.ndarray,
              changed: np.ndarray) -> None:
        """One step's innovations (``nu``, scaled back to one worker's, before the step's update; ``moved``:
        how far each estimate moved on it; ``changed``: the workers whose speed the model took as changed
        at it): a sample each where the module says, and ``noise2`` again."""
        b = np.asarray(batch, float)
        kept = live & ~np.isnan(self.last_nu)
        returned = kept & self.last_changed & changed  # a change taken and taken back: an odd step
        has_after = kept & (b == self.last_b) | returned  # the last step has this one after it at its batch
        has_before = kept & ~np.isnan(self.prev_nu) & (self.prev_b == self.last_b) & ~returned  # and one before
        pair = (has_after | has_before) & ~changed & ~self.last_changed | returned
        after = np.abs(self.last_nu - np.where(has_after, nu, 0.0))
        before = np.abs(self.last_nu - np.where(has_before, self.prev_nu, 0.0))
        one = np.where(has_after, after, before) * 1.4826 / PRIORS.pair_scale
        sample = np.where(has_after & has_before, np.minimum(after, before), one) / math.sqrt(2)
        self.abs[:-1, pair] = self.abs[1:, pair]
        self.abs[-1, pair] = sample[pair]
        self.count[pair] = np.minimum(self.count[pair] + 1, PRIORS.noise_memory)
        self.prev_nu = np.where(live, self.last_nu - moved, self.prev_nu)
        self.prev_b = np.where(live, self.last_b, self.prev_b)
        self.last_nu = np.where(live, nu - moved, self.last_nu)
        self.last_b = np.where(live, b, self.last_b)
        self.last_changed = np.where(live, changed, self.last_changed)
        n = self.count
        own = np.full(self.workers, PRIORS.noise ** 2)
        some = n > 0
        if some.any():  # each worker's median over its own last n changes, all at once
            c = n[some]
            recent = np.arange(PRIORS.noise_memory)[:, None] >= PRIORS.noise_memory - c[None, :]
            ordered = np.sort(np.where(recent, self.abs[:, some], np.inf), axis=0)  # the unused last
            cols = np.arange(c.size)
            med = 0.5 * (ordered[(c - 1) // 2, cols] + ordered[c // 2, cols])
            own[some] = np.maximum((PRIORS.pair_scale * med) ** 2, PRIORS.noise_floor ** 2)
        pool_n = float(n.sum())
        pool = float(np.median(own[n > 0])) if pool_n else PRIORS.noise ** 2
        pool = (pool * pool_n + PRIORS.noise ** 2 * PRIORS.noise_weight) / (pool_n + PRIORS.noise_weight)
        self.noise2 = np.maximum((own * n + pool * PRIORS.noise_weight) / (n + PRIORS.noise_weight),
                                 PRIORS.noise_floor ** 2)

    def keep(self, idx: Sequence[int]) -> None:
        """Only the workers ``idx`` remain, in this order."""
        for name in ("noise2", "count", "last_nu", "last_b", "prev_nu", "prev_b", "last_changed"):
            setattr(self, name, getattr(self, name)[idx])
        self.abs = self.abs[:, idx]
        self.workers = len(idx)

    def state_dict(self) -> dict[str, Any]:
        return {"noise2": self.noise2.tolist(), "noise_abs": self.abs.tolist(), "noise_count": self.count.tolist(),
                "last_nu": [None if math.isnan(x) else x for x in self.last_nu], "last_b": self.last_b.tolist(),
                "prev_nu": [None if math.isnan(x) else x for x in self.prev_nu], "prev_b": self.prev_b.tolist(),
                "last_changed": [bool(x) for x in self.last_changed]}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.noise2, self.abs = np.asarray(d["noise2"], float), np.asarray(d["noise_abs"], float)
        self.count = np.asarray(d["noise_count"], int)
        self.last_nu = np.asarray([np.nan if x is None else x for x in d["last_nu"]], float)
        self.last_b = np.asarray(d["last_b"], float)
        n = self.workers = len(self.last_b)  # a state without the innovations before the last: none kept
        self.prev_nu = np.asarray([np.nan if x is None else x for x in d.get("prev_nu", [None] * n)], float)
        self.prev_b = np.asarray(d.get("prev_b", [0.0] * n), float)
        self.last_changed = np.asarray(d.get("last_changed", [False] * n), bool)
