"""Per-rank straggler scores: each rank's speed against the fastest rank's, and against its own best.

A rank's speed over a window is the work it did per second of its own compute:

- a run's steps (``omnilearn run``, ``omnilearn.torch``, the framework integrations): samples per
  compute-second (the step's batch over its compute time, the all-reduce left out), over windows of
  :data:`WINDOW_STEPS` full steps (the partial last step of an epoch is left out);
- ``omnilearn emulate`` around any command, where no batch is known: CPU time its processes ran per
  busy second (ran, or runnable and waiting for a CPU: the kernel's ``schedstat``), over windows of
  :data:`WINDOW_SCANS` scans, the same wall-clock window for every rank. CPU time ran stands for the
  work done: the same instructions take the same CPU time, a throttled or crowded rank waits longer
  for it. A rank sleeping at a collective is neither, so waiting for peers does not count against it.

Per rank, from its windows (the last one: the last complete window in which it did work; the open
one when none is complete):

- ``relative``: its speed in its last window over the fastest rank's speed in theirs (0..1; 1 for the
  fastest rank);
- ``individual``: its speed in its last window over its own best window's (0..1; 1 while it is at its best).

Both are null for a rank that did no measured work.
"""

from __future__ import annotations

from typing import Any

WINDOW_STEPS = 8  # full steps per window of a run
WINDOW_SCANS = 25  # scans per window of emulate (5 s at its 0.2 s scans)


class StragglerScores:
    """Windows of (work, seconds) per rank, fed one interval at a time (a step, or a scan)."""

    def __init__(self, ranks: int, window: int) -> None:
        assert ranks >= 1 and window >= 1, (ranks, window)
        self.window = window
        self.open = [(0.0, 0.0, 0) for _ in range(ranks)]  # work, seconds, intervals of the window being filled
        self.speeds: list[list[float | None]] = [[] for _ in range(ranks)]

    def add(self, rank: int, work: float, seconds: float) -> bool:
        """One interval of ``rank``; True when it completed a window."""
        w, s, n = self.open[rank]
        w, s, n = w + work, s + seconds, n + 1
        if n < self.window:
            self.open[rank] = (w, s, n)
            return False
        self.speeds[rank].append(w / s if s > 0 else None)
        self.open[rank] = (0.0, 0.0, 0)
        return True

    def individual(self, rank: int) -> float | None:
        """``rank``'s speed in its last window over its best window's."""
        speeds = [v for v in self.speeds[rank] if v is not None]
        if not speeds:
            w, s, _ = self.open[rank]
            speeds = [w / s] if s > 0 else []
        return _ratio(speeds[-1], max(speeds)) if speeds else None

    def last(self, rank: int) -> float | None:
        """``rank``'s speed in its last window (the open one when none is complete)."""
        done = [v for v in self.speeds[rank] if v is not None]
        if done:
            return done[-1]
        w, s, _ = self.open[rank]
        return w / s if s > 0 else None

    def scores(self) -> list[dict[str, float | None]]:
        """Per rank, ``{"relative": ..., "individual": ...}`` (see the module)."""
        last = [self.last(r) for r in range(len(self.speeds))]
        fastest = max((v for v in last if v is not None), default=None)
        return [{"relative": _ratio(v, fastest), "individual": self.individual(r)} for r, v in enumerate(last)]


def _ratio(value: float | None, best: float | None) -> float | None:
    if value is None or best is None or best <= 0:
        return None
    return round(min(value / best, 1.0), 4)


def step_scores(steps: list[list[dict[str, Any]]]) -> list[dict[str, float | None]]:
    """Straggler scores of a run from each rank's step records (``batch``, ``compute_ms``): samples per
    compute-second over windows of :data:`WINDOW_STEPS` full steps."""
    scores = StragglerScores(len(steps), WINDOW_STEPS)
    full = max((r.get("global_batch", 0) for s in steps for r in s), default=0)
    for rank, records in enumerate(steps):
        for r in records:
            if r.get("global_batch", 0) == full:  # a partial last step's shares are no one's speed
                scores.add(rank, float(r["batch"]), float(r["compute_ms"]) / 1e3)
    return scores.scores()
