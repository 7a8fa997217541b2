"""The baselines every result is judged against: ``uniform``, ``static``, ``paper`` and ``dynamic+prior``.

- :class:`Uniform`: equal batches, never changed (the data-parallel baseline).
- :class:`Static`: batches proportional to the allocated CPU shares, re-split at every level change
  (it knows the emulator's allocations, as its name says; it measures nothing).
- :class:`Paper`: the OmniLearn paper's rule: at each epoch's end, from every worker's mean forward
  and backward time over the epoch, ``b_i <- b_i * t_mean / t_i`` normalised to B, adopted when some
  worker's batch moves by :data:`~omnilearn.control.policies.PAPER_DEADBAND` of its new size, within
  the paper's bounds (:func:`~omnilearn.control.policies.effective`).
- :class:`Prior`: ``dynamic`` told the allocations: it starts from the split the allocated shares give,
  and at a level change it expects each worker's speed to scale with its share, re-splits at once on
  that prior, and goes on measuring as ``dynamic`` does.

Each holds its batches and takes the calls of :class:`~omnilearn.control.controller.Controller`; its
capabilities are class attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.dynamic import DynamicController
from omnilearn.control.policies import Bounds
from omnilearn.control.priors import PRIORS

Shares = Sequence[float | None]


@dataclass
class Baseline:
    """What the three plain baselines share: the current split within its bounds, and no estimator."""

    config: ControlConfig
    global_batch: int
    bounds: Bounds
    synchronous: bool = True
    batch: list[int] = field(default_factory=list)

    knows_allocation = False
    measures = False
    times_update = True
    times_quota = False
    skips_steps = False
    wants_step = False
    bounded_by_memory = True
    per_epoch = False
    at_stake = 0.0
    overhead = 0.0
    overheads = None
    decision = None

    def __post_init__(self) -> None:
        if not self.batch:
            self.batch = policies.uniform(len(self.bounds.max_batch), self.global_batch, self.bounds)

    @property
    def policy(self) -> str:
        return self.config.policy

    @property
    def workers(self) -> int:
        return len(self.batch)

    @property
    def holds(self) -> dict[str, int]:
        return {}

    def allocations(self, read: Callable[[], Shares]) -> Shares | None:
        """The allocated CPU shares, read only for a policy whose name says it uses them."""
        return read() if self.knows_allocation else None

    def initial(self, cpu_shares: Shares | None) -> list[int]:
        return list(self.batch)

    def reallocate(self, cpu_shares: Shares | None) -> list[int] | None:
        return None

    def probe_sizes(self) -> tuple[int, int] | None:
        return None  # no start-up timing: the pass every policy runs is the memory probe alone

    def observe_probe(self, small: int, large: int, t_small: Sequence[float], t_large: Sequence[float],
                      warm: bool = True, kinds: Sequence[Sequence[float]] | None = None) -> list[int] | None:
        return None

    def set_threads(self, threads: Sequence[float]) -> None:
        return None

    def observe_step(self, seconds: Sequence[float], steps: int = 1) -> list[int]:
        return []

    def observe(self, worker: int, batch: int, seconds: float) -> bool:
        return False

    def estimates(self) -> tuple[list[float] | None, list[int]]:
        return None, [0] * self.workers

    def regimes(self) -> list[int]:
        return [0] * self.workers

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        return False

    def decide(self, cpu_shares: Shares | None = None, steps_left: int | None = None) -> list[int] | None:
        return None

    def set_bounds(self, bounds: Bounds) -> list[int] | None:
        """Adopt new bounds (memory-aware limits); re-split if the current batch breaks them."""
        self.bounds = bounds
        return None if bounds.admit(self.batch) else self._adopt(policies.split(self.batch, self.global_batch, bounds))

    def _adopt(self, new: list[int]) -> list[int] | None:
        if new == self.batch:
            return None
        self.batch = list(new)
        return list(new)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "batch": list(self.batch),
                "bounds": {"min_batch": self.bounds.min_batch, "max_batch": list(self.bounds.max_batch)},
                **self._extra_state()}

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        """Load ``d``; with ``keep`` (the saved workers that still run, in rank order) only theirs: their
        batches scaled up to the global batch (their ratios are what the policy had set), their bounds."""
        maxes = list(d["bounds"]["max_batch"])
        if keep is None or keep == list(range(len(d["batch"]))):
            assert len(d["batch"]) == self.workers, (d["batch"], self.workers)
            self.bounds = Bounds(d["bounds"]["min_batch"], tuple(maxes))
            self.batch = list(d["batch"])
            self._load_extra(d, None)
            return
        assert len(keep) == self.workers, (keep, self.workers)
        self.bounds = Bounds(d["bounds"]["min_batch"], tuple(maxes[i] for i in keep))
        self.batch = policies.split([float(d["batch"][i]) for i in keep], self.global_batch, self.bounds)
        self._load_extra(d, keep)

    def _load_extra(self, d: dict[str, Any], keep: list[int] | None) -> None:
        return None


class Uniform(Baseline):
    """Equal batches, never changed; the memory bounds bind it only once a worker ran out of memory."""

    bounded_by_memory = False


class Static(Baseline):
    """Batches proportional to the allocated CPU shares (unknown shares count as the known ones' mean)."""

    knows_allocation = True

    def initial(self, cpu_shares: Shares | None) -> list[int]:
        assert cpu_shares is not None
        self.batch = policies.static(cpu_shares, self.global_batch, self.bounds)
        return list(self.batch)

    def reallocate(self, cpu_shares: Shares | None) -> list[int] | None:
        assert cpu_shares is not None
        return self._adopt(policies.static(cpu_shares, self.global_batch, self.bounds))


class Paper(Baseline):
    """The paper's controller (see the module): it times forward and backward only (``times_update``
    false), raw seconds, one mean per worker over each epoch; in ASP the parameter server decides at
    the first push of each epoch (``per_epoch``)."""

    measures = True
    times_update = False
    per_epoch = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sums = [0.0] * self.workers
        self.counts = [0] * self.workers

    def observe_step(self, seconds: Sequence[float], steps: int = 1) -> list[int]:
        for i, t in enumerate(seconds):
            self.sums[i] += float(t)
            self.counts[i] += 1
        return []

    def observe(self, worker: int, batch: int, seconds: float) -> bool:
        if batch == self.batch[worker]:
            self.sums[worker] += float(seconds)
            self.counts[worker] += 1
        return False

    def estimates(self) -> tuple[list[float] | None, list[int]]:
        """Every worker's mean compute time since the last decision (None until each has one)."""
        if min(self.counts) == 0:
            return None, list(self.counts)
        return [s / c for s, c in zip(self.sums, self.counts, strict=True)], list(self.counts)

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool:
        return end_of_epoch

    def decide(self, cpu_shares: Shares | None = None, steps_left: int | None = None) -> list[int] | None:
        times, _ = self.estimates()
        if times is None:
            return None
        new = policies.paper(self.batch, times, self.global_batch, self.bounds)
        self.sums, self.counts = [0.0] * self.workers, [0] * self.workers  # each epoch is its own mean
        return self._adopt(new)

    def _adopt(self, new: list[int]) -> list[int] | None:
        moved = super()._adopt(new)
        if moved is not None:  # a worker's times at its old batch say nothing of its new one
            for i in range(self.workers):
                self.sums[i], self.counts[i] = 0.0, 0
        return moved

    def _extra_state(self) -> dict[str, Any]:
        return {"sums": list(self.sums), "counts": list(self.counts)}

    def _load_extra(self, d: dict[str, Any], keep: list[int] | None) -> None:
        if keep is None:
            self.sums = [float(s) for s in d.get("sums", [0.0] * self.workers)]
            self.counts = [int(c) for c in d.get("counts", [0] * self.workers)]
        else:
            self.sums, self.counts = [0.0] * self.workers, [0] * self.workers


@dataclass
class Prior(DynamicController):
    """``dynamic`` told the allocations (see the module)."""

    shares: list[float | None] | None = None
    """The allocated CPU shares in force (the last level's)."""

    knows_allocation = True
    policy = property(lambda self: "dynamic+prior")

    def allocations(self, read: Callable[[], Shares]) -> Shares | None:  # type: ignore[override]
        return read()

    def initial(self, cpu_shares: object) -> list[int]:
        """The split the allocated shares give (when every share is known): the start before any timing."""
        shares = list(cpu_shares)  # type: ignore[call-overload]
        self.shares = shares
        if all(shares):
            self.batch = policies.static(shares, self.global_batch, self.bounds)
        return list(self.batch)

    def reallocate(self, cpu_shares: object) -> list[int] | None:
        """A level change: each worker's speed scaled by its new share over its old (its estimate's
        variance grown by a jump's), and the balanced split on that prior, adopted without waiting
        for a measurement. None where a share is unknown (the measurements will tell)."""
        old, new = self.shares, list(cpu_shares)  # type: ignore[call-overload]
        self.shares = new
        if old is None or not all(old) or not all(new):
            return None
        m = self.model
        ratio = np.asarray([float(o) / float(s) for o, s in zip(old, new, strict=True)])
        moved = np.abs(np.log(ratio)) > 1e-9
        if not moved.any():
            return None
        m.u = m.u + np.log(ratio)  # u: log seconds a sample; a larger share is a faster worker
        var = m.var.copy()
        var[moved] += PRIORS.jump ** 2 / 4  # the prior is a share's ratio, not a measurement
        m.var = var
        m.regimes = [r + int(x) for r, x in zip(m.regimes, moved, strict=True)]
        if m.relative:
            shift = float(m.u.mean())
            m.u = m.u - shift
            m.scale = (m.scale or 0.0) + shift
        if not m.measured:
            return self._adopt(policies.static(new, self.global_batch, self.bounds))
        return self._adopt(self._balanced())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "policy": "dynamic+prior", "shares": self.shares}

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        super().load_state_dict(d, keep)
        shares = d.get("shares")
        if shares is not None and keep is not None:
            shares = [shares[i] for i in keep]
        self.shares = shares
