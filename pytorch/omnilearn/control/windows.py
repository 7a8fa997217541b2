"""Measurement windows: recent compute times, robust estimates, noticed speed changes, noise.

:class:`ComputeWindow` holds one worker's times (ASP, and the paper's per-epoch means);
:class:`StepWindow` every worker's time of each synchronous step, compared relative to the step (BSP).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

NOISE_STEPS = 16  # recent step-to-step changes behind the noise estimate


def _departs(value: float, ref: float, change: float) -> int:
    """+1 / -1 when ``value`` departs from ``ref`` by more than ``change`` (relative), else 0."""
    d = value / ref - 1
    return 0 if abs(d) <= change else (1 if d > 0 else -1)


@dataclass
class ComputeWindow:
    """Recent compute times of one worker at its current batch size (ASP: one per worker, at the server).

    The first ``skip`` steps after a batch change are dropped: they carry new tensor shapes, cache
    refill and the like, not the steady state. With ``change`` > 0 the window notices a new regime
    from the times alone: a step that departs from the window's median by more than ``change``
    (relative) is held back; if the next one departs the same way the worker's speed has changed
    (its allocation, a neighbour's job): the old times are dropped, the two new ones kept, and
    ``regime`` counts up. One departing step followed by a usual one is an outlier, dropped.
    ``mean``: the estimate is the mean of every time since the last reset (the paper's epoch mean)
    rather than the median of the last ``size``.
    """

    size: int
    skip: int = 1
    change: float = 0.0
    mean: bool = False
    times: list[float] = field(default_factory=list)
    regime: int = 0
    _to_skip: int = 0
    _suspect: float | None = None

    def __post_init__(self) -> None:
        self._to_skip = self.skip

    def reset(self, skip: int | None = None) -> None:
        """Drop every time; the next ``skip`` steps (default: ``self.skip``) will not be measured."""
        self.times.clear()
        self._to_skip = self.skip if skip is None else skip
        self._suspect = None

    def add(self, seconds: float) -> bool:
        """Take one step's compute time; True when it confirmed a new regime."""
        if self._to_skip > 0:
            self._to_skip -= 1
            return False
        if self.change > 0 and self.times:
            ref = statistics.median(self.times)
            now = _departs(seconds, ref, self.change)
            if now:
                if self._suspect is not None and _departs(self._suspect, ref, self.change) == now:
                    self.times, self._suspect = [self._suspect, seconds], None
                    self.regime += 1
                    return True
                self._suspect = seconds
                return False
            self._suspect = None
        self.times.append(seconds)
        if not self.mean:
            del self.times[: -self.size]
        return False

    @property
    def count(self) -> int:
        """Measurements behind the estimate; 0 while a departing step awaits confirmation."""
        return 0 if self._suspect is not None else len(self.times)

    def estimate(self) -> float | None:
        """Median of the window (robust to the odd slow step), or the mean for ``mean``."""
        if not self.times:
            return None
        return statistics.fmean(self.times) if self.mean else statistics.median(self.times)


def _normalised(row: Sequence[float]) -> list[float]:
    g = math.exp(statistics.fmean(math.log(max(t, 1e-9)) for t in row))
    return [t / g for t in row]


@dataclass
class StepWindow:
    """BSP: every worker's compute time of the last ``size`` synchronous steps at the current split.

    A slow host slows every worker of a step alike, so each step is divided by its geometric mean
    over the workers before anything is compared: what remains is the workers' relative speed, with
    about half the noise of raw times. A worker whose time departs from its median by more than
    ``change`` beyond what the step did to the median worker, two steps in a row and the same way,
    has changed speed: the window restarts from those two steps (everyone's relative times moved
    with it) and the worker's regime counts up. Any batch change restarts the window too, after
    ``skip`` steps.

    The window also measures its own noise: how much a worker's relative time changes from one step
    to the next at an unchanged split (robustly, over the last steps, across restarts). A departure
    must exceed three times that noise as well (with steps of a few CFS periods, times jump by
    factors, and that is no change of speed), and none is looked for before the noise is known.
    """

    workers: int
    size: int
    skip: int = 1
    change: float = 0.0
    rows: list[list[float]] = field(default_factory=list)
    regimes: list[int] = field(default_factory=list)
    changes: list[list[float]] = field(default_factory=list)
    _to_skip: int = 0
    _suspect: list[float] | None = None
    _previous: list[float] | None = None

    def __post_init__(self) -> None:
        self.regimes = [0] * self.workers
        self._to_skip = self.skip

    def reset(self, skip: int | None = None) -> None:
        """Drop every step; the next ``skip`` steps (default: ``self.skip``) will not be measured."""
        self.rows.clear()
        self._to_skip = self.skip if skip is None else skip
        self._suspect = self._previous = None

    def noise(self) -> float | None:
        """Step-to-step noise of one worker's relative time (a standard deviation, in log), or None
        before a few steps tell: from the absolute changes between consecutive steps, the larger of
        what their median and their 80th percentile say under normal noise. Steps shorter than a
        CFS period jump by whole periods now and then; the median alone does not see the jumps, and
        a controller trusting it chases them."""
        if len(self.changes) < 3:
            return None
        flat = [abs(d) for c in self.changes for d in c]
        # |d| for d ~ N(0, 2 sigma^2): median 0.6745 sqrt(2) sigma, 80th percentile 1.2816 sqrt(2) sigma.
        tail = statistics.quantiles(flat, n=5, method="inclusive")[3] / 1.2816
        return max(1.4826 * statistics.median(flat), tail) / math.sqrt(2)

    def add(self, row: Sequence[float]) -> list[int]:
        """Take one step's compute times (one per worker); returns the workers found to change speed."""
        assert len(row) == self.workers
        row = [float(t) for t in row]
        if self._to_skip > 0:
            self._to_skip -= 1
            return []
        logs = [math.log(x) for x in _normalised(row)]
        if self._previous is not None:
            self.changes = [*self.changes, [a - b for a, b in zip(logs, self._previous, strict=True)]][-NOISE_STEPS:]
        self._previous = logs
        noise = self.noise() if self.change > 0 and self.rows else None  # once a step: it sorts every change
        if noise is not None:
            ref, threshold = self._medians(), max(self.change, math.expm1(3 * noise))
            now = self._departures(row, ref, threshold)
            if any(now):
                if self._suspect is not None:
                    before = self._departures(self._suspect, ref, threshold)
                    changed = [i for i in range(self.workers) if now[i] and now[i] == before[i]]
                    if changed:
                        self.rows, self._suspect = [self._suspect, row], None
                        for i in changed:
                            self.regimes[i] += 1
                        return changed
                self._suspect = row
                return []
            self._suspect = None
        self.rows.append(row)
        del self.rows[: -self.size]
        return []

    @staticmethod
    def _departures(row: list[float], ref: list[float], threshold: float) -> list[int]:
        """Which workers' times depart by more than ``threshold`` from their relative medians ``ref``:
        each time against its median, divided by the median of those ratios (what the step did to all
        workers alike), so that one worker's change does not look like a change of the others."""
        ratios = [t / r for t, r in zip(row, ref, strict=True)]
        common = statistics.median(ratios)
        return [_departs(q, common, threshold) for q in ratios]

    def _medians(self) -> list[float]:
        norm = [_normalised(r) for r in self.rows]
        return [statistics.median(n[i] for n in norm) for i in range(self.workers)]

    @property
    def count(self) -> int:
        return 0 if self._suspect is not None else len(self.rows)

    def estimates(self) -> list[float] | None:
        """Each worker's median relative time, in seconds of the window's typical step."""
        if not self.rows:
            return None
        scale = statistics.median(math.exp(statistics.fmean(math.log(max(t, 1e-9)) for t in r)) for r in self.rows)
        return [m * scale for m in self._medians()]
