"""The one control loop: level events, the start-up probe, measurements and decisions, and the records
they leave.

The BSP trainer, ``omnilearn.torch``, the simulator (replays and the scenario benchmark) and the
parameter server drive their controller through a :class:`ControlLoop`, so each decides exactly as the
others do on the same times, by construction. The loop writes the ``batch_change`` and
``speed_change`` records (:mod:`omnilearn.records` names their fields) through the ``write`` callable
its owner gives it, and measures its own cost (``overhead_ms``: wall time spent in the controller).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnilearn.control.controller import Controller
from omnilearn.control.priors import PRIORS
from omnilearn.records import BATCH_CHANGE, MEASUREMENT

Write = Callable[..., None]
"""``write(kind, **fields)``: one record (the trainers' MetricsWriter.write, the simulator's recorder)."""
Shares = Callable[[], Sequence[float | None]]


def probe_time(times: Sequence[float], rate: float = 1.0) -> float:
    """One worker's probe time at one size from its rounds: the least of two (an interruption only adds
    time); of more, the median of each successive pair's least (an odd last round left out). Workers
    whose passes ran different numbers of rounds (``Priors.min_pass_s``) are so measured by the same
    statistic: a least of two reads lower than a median, by more the noisier the rounds, and mixing
    the two would bias the speeds.

    ``rate``: when ``times`` are CPU seconds, the CPU seconds the worker got per second of the
    start-up pass, which ran without pause: under a CPU quota a round shorter than what is left of a
    CFS period runs at a core's speed and leaves the wait to a later one, so a round's wall time may
    or may not show the quota; the pass's rate always does (a quota, a crowded core, threads)."""
    least = [min(times[i:i + 2]) for i in range(0, max(len(times) - 1, 1), 2)]
    return statistics.median(least) / max(rate, PRIORS.min_rate)


def pass_worth(small: int, large: int, t_small: float, t_large: float, round_s: float, share: float,
               steps: int | None) -> float:
    """The most a start-up pass can win, in this worker's seconds: what balancing can save over the job's
    ``steps`` (None: unknown, no bound), a step saving at most its whole time. It is the rule every move
    obeys (gain over the steps it serves against its cost) before anything is measured: the gain of a
    split no worker has timed is bounded by the step alone. A step at the equal ``share`` takes what a
    round of the pass took (``round_s``: its seconds at the ``small`` and ``large`` sizes, waits for the
    CPU quota included) scaled by the line ``c (b + k)`` through the rounds' two sizes (``t_small``,
    ``t_large``: their least times; ``k`` at least 0)."""
    if steps is None:
        return float("inf")
    c = (t_large - t_small) / (large - small)
    k = max(t_small / c - small, 0.0) if c > 0 else float("inf")
    scale = 0.5 if k == float("inf") else (share + k) / (small + large + 2 * k)
    return steps * round_s * scale


def pass_end(small: int, large: int, wall_small: Sequence[float], wall_large: Sequence[float], elapsed_s: float,
             at_least: int, quota: bool, share: float, steps: int | None) -> str | None:
    """Whether a worker's start-up pass ends before another round: ``done`` (:func:`pass_done`), ``cut``
    (after ``at_least`` rounds, where the whole pass would cost more than balancing can win over the
    job's ``steps``: :func:`pass_worth` at the equal ``share``), or None (another round).
    ``wall_small``, ``wall_large``: its rounds' seconds at each size so far; ``elapsed_s``: the pass's.
    The first round carries one-off costs: a round's seconds are the pass's since it. Under a CPU quota
    the pass lasts at least ``Priors.min_pass_s``. The trainers' passes and the simulators' models of
    them end alike."""
    rounds = min(len(wall_small), len(wall_large))
    if pass_done(rounds, elapsed_s, at_least, quota):
        return "done"
    if rounds >= max(at_least, 1):
        first = wall_small[0] + wall_large[0]
        per_round = (elapsed_s - first) / (rounds - 1) if rounds > 1 else elapsed_s
        whole = max(elapsed_s + per_round, PRIORS.min_pass_s if quota else 0.0)
        if whole > pass_worth(small, large, min(wall_small), min(wall_large), per_round, share, steps):
            return "cut"
    return None


def pass_done(rounds: int, elapsed_s: float, at_least: int, quota: bool) -> bool:
    """Whether a start-up pass of ``rounds`` at each size that has run ``elapsed_s`` seconds is over:
    ``at_least`` rounds (``control.probe_steps``) and, for a worker under a CPU quota (``quota``),
    ``Priors.min_pass_s``; or ``Priors.max_rounds``. The trainers' passes and the simulators' models of them
    end alike."""
    return rounds >= PRIORS.max_rounds or (rounds >= at_least and (not quota or elapsed_s >= PRIORS.min_pass_s))


def probe_times(readings: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Every worker's probe times at the two sizes (seconds), from every worker's reading
    (:meth:`~omnilearn.train.step.ProbeRounds.own`): those the controller takes, and each worker's own.

    A worker under a CPU quota ran the same rounds as every other, and on the same kind of core with as
    many threads they cost the same CPU seconds: what tells the workers apart is the CPU rate each got.
    Its time is so the median CPU seconds of the workers it shares both with, at its own rate. A
    worker's own CPU seconds over a pass of a second or two differ from the others' by 5-20% (what shared
    its core and caches that second), alike over its rounds and unlike in the steps that follow
    (``results/2026-11-28_2cpu_pooled-probe.md``): taken alone they would set its first split that far
    off. Wall seconds (no quota) stand alone: a slower core shows in them."""
    groups: dict[tuple[float, float], list[Sequence[float]]] = {}
    for r in readings:
        if r[3] > 0:  # CPU seconds under a quota: pooled by threads and kind of core
            groups.setdefault((r[4], r[5]), []).append(r)
    medians = {key: [statistics.median(q[j] for q in g) for j in (0, 1)] for key, g in groups.items()}
    taken = [medians[(r[4], r[5])] if r[3] > 0 else r[:2] for r in readings]

    def at_rate(seconds: float, r: Sequence[float]) -> float:
        return seconds / max(r[3], PRIORS.min_rate) if r[3] > 0 else seconds

    return ([at_rate(c[0], r) for c, r in zip(taken, readings, strict=True)],
            [at_rate(c[1], r) for c, r in zip(taken, readings, strict=True)],
            [at_rate(r[0], r) for r in readings], [at_rate(r[1], r) for r in readings])


def _ks(controller: Controller) -> dict[str, Any]:
    """A record's ``k_by_worker``, where the controller tells the workers' k apart by their kinds."""
    ks = controller.overheads
    return {} if ks is None else {"k_by_worker": ks}


def _ms(times: Sequence[float] | None) -> list[float] | None:
    return None if times is None else [round(t * 1e3, 3) for t in times]


@dataclass
class ControlLoop:
    """Drives one controller (see the module); ``where``: fields every record of this owner carries
    (BSP: the step; ASP: the server's version and epoch are given per call)."""

    controller: Controller
    write: Write
    overhead_s: float = 0.0
    """Seconds spent in the controller (observing, deciding) so far."""
    calls: int = 0
    inputs: bool = False
    """Write a ``measurement`` record of each step's inputs (every worker's time, the decision point,
    the steps left, the controller's cost): one rank does, so a run's decisions can be replayed and checked."""
    rate: Callable[[], float] = lambda: 1.0
    """The CPUs this rank's controller can run at (its owner reads its own quota: at most one)."""
    cost_s: float = 0.0
    """This rank's cost of its last step measured (observing and deciding): CPU seconds at :attr:`rate`,
    in wall seconds. Its owner shares it with the next step's times (``skips_steps`` controllers)."""
    measured: int = 0
    """Steps measured (given to the controller) so far."""
    _gap: int = 0  # steps since the last one measured, this one included
    _since_s: float = 0.0  # their times (the slowest worker's), seconds
    _due: bool = False  # a decision point among the steps left out
    _costs: list[float] = field(default_factory=list)  # the costs read after the last steps measured
    _cost_pending: bool = False  # a step was measured: the next call's cost_s is its cost

    @property
    def batch(self) -> list[int]:
        return list(self.controller.batch)

    @property
    def overhead_ms(self) -> float:
        """Mean milliseconds of controller work per step measured."""
        return 1e3 * self.overhead_s / self.calls if self.calls else 0.0

    # ------------------------------------------------------------------ start and levels
    def start(self, shares: Shares, resumed: bool, **where: Any) -> None:
        """The first level's allocation is in force: the allocation-aware policies split by it; the
        run's first ``batch_change`` record (the equal split, or the resumed one)."""
        if not resumed:
            self.controller.initial(self.controller.allocations(shares))
        self.write("batch_change", **where, batch=self.batch, reason="resumed" if resumed else "initial")

    def level(self, shares: Shares, **where: Any) -> list[int] | None:
        """A level change (the emulator's event): only a policy told of allocations moves."""
        new = self.controller.reallocate(self.controller.allocations(shares))
        if new is not None:
            self.write("batch_change", **where, batch=list(new), reason="allocation")
        return new

    def probe_sizes(self) -> tuple[int, int] | None:
        return self.controller.probe_sizes()

    def probe_readings(self, small: int, large: int, readings: Sequence[Sequence[float]], warm: bool = True,
                       **where: Any) -> list[int] | None:
        """:meth:`probe` on every worker's reading of its pass (:meth:`ProbeRounds.own`, gathered): the
        times :func:`probe_times` gives, each worker's own beside, at the slowest worker's cost."""
        t_small, t_large, own_small, own_large = probe_times(readings)
        return self.probe(small, large, t_small, t_large, max(r[2] for r in readings), warm,
                          own=(own_small, own_large), kinds=[[r[4], r[5]] for r in readings],
                          cut_short=any(r[6] > 0 for r in readings), **where)

    def probe(self, small: int, large: int, t_small: Sequence[float], t_large: Sequence[float], cost_s: float,
              warm: bool = True, own: tuple[Sequence[float], Sequence[float]] | None = None,
              kinds: Sequence[Sequence[float]] | None = None, cut_short: bool = False, **where: Any
              ) -> list[int] | None:
        """Every worker's probe times (seconds, at each size: :func:`probe_times`) and what the probe cost
        (the slowest worker's seconds): the split before step 1, recorded with reason ``probe``. ``warm``:
        the probe ran the loop's own step (the trainer's), so its first step carries no one-off costs.
        ``own``: each worker's times from its own rounds alone, recorded beside (``probe_own_ms``);
        ``kinds``: each worker's threads and kind of core (recorded); ``cut_short``: a worker's pass stopped
        after ``control.probe_steps`` rounds, where the whole pass would cost more than balancing can win
        over the job's steps: the controller is not told the times (recorded, where true)."""
        t0 = time.perf_counter()
        # a pass cut short read its CPU rate over too short a while: the controller is not told, and
        # learns the speeds from the steps as without a probe
        new = None if cut_short else self.controller.observe_probe(small, large, t_small, t_large, warm, kinds)
        self.overhead_s += time.perf_counter() - t0
        ctl = self.controller
        self.write("batch_change", **where, batch=self.batch, reason="probe", sizes=[small, large],
                   probe_ms=[_ms(t_small), _ms(t_large)], probe_times_s=[[float(t) for t in t_small],
                                                                         [float(t) for t in t_large]],
                   overhead=round(ctl.overhead, 2),
                   speeds=[round(large / t, 3) for t in t_large], probe_s=round(cost_s, 4), warm=warm,
                   **({"cut_short": True} if cut_short else {}),
                   **({} if own is None else {"probe_own_ms": [_ms(own[0]), _ms(own[1])]}),
                   **({} if kinds is None else {"kinds": [[float(x) for x in k] for k in kinds]}), **_ks(ctl))
        return new

    # ------------------------------------------------------------------ steps
    def step(self, times: Sequence[float] | None, due: bool, steps_left: int | None, shares: Shares,
             cost_s: float = 0.0, threads: Sequence[float] | None = None, **where: Any) -> list[int] | None:
        """BSP: one step done. ``times``: every worker's compute time of it (None: a partial step, not
        measured); ``due``: a decision point; ``cost_s``: the controller's cost of a step measured, the
        largest rank's (wall seconds at its CPU's rate; see ``Priors.budget``); ``threads``: every worker's
        threads in the step (its kind, with its kind of core). Returns the new split, or None."""
        if self.inputs:
            self.write("measurement", **where, times_s=None if times is None else [float(t) for t in times],
                       due=due, steps_left=steps_left, cost_s=float(cost_s),
                       **({} if threads is None else {"threads": [float(t) for t in threads]}))
        t0, c0 = time.perf_counter(), time.process_time()
        ctl = self.controller
        if threads is not None:
            ctl.set_threads(threads)
        measured = times is not None and ctl.measures
        if self._cost_pending:  # the first reading is left out: the controller's first step measured
            # (and its first decision) carry its one-off costs, lazy set-up, at every rank's quota
            if self.measured > 1:
                self._costs = [*self._costs, float(cost_s)][-PRIORS.measurement_costs_kept:]
            self._cost_pending = False
        cost_s = statistics.median(self._costs) if self._costs else 0.0  # none kept: not measured yet
        if measured and ctl.skips_steps:
            self._gap += 1
            self._since_s += max(times)
            if not ctl.wants_step and self._since_s * PRIORS.budget < cost_s and ctl.at_stake <= cost_s:  # not worth it yet
                self._due = self._due or due
                self._spent(t0)
                return None
        steps, due, self._due = max(self._gap, 1), due or self._due, False
        if measured:
            self._gap, self._since_s = 0, 0.0
        changed = ctl.observe_step(times, steps) if measured else []
        decision = self._decide(shares, steps_left) if due else None
        self._spent(t0)
        if measured:
            self.measured += 1
            if ctl.skips_steps:
                self.cost_s = (time.process_time() - c0) / max(self.rate(), PRIORS.min_rate)
                self._cost_pending = True
        if changed:
            self.write("speed_change", **where, workers=changed, regimes=ctl.regimes())
        return self._record(decision, where)

    def push(self, worker: int, batch: int, seconds: float, due: bool, shares: Shares, worker_name: Any,
             **where: Any) -> list[int] | None:
        """ASP: one worker's compute time of a step at ``batch``; ``due``: may decide now."""
        t0 = time.perf_counter()
        ctl = self.controller
        changed = ctl.observe(worker, batch, seconds)
        decision = self._decide(shares, None) if due else None
        self._spent(t0)
        if changed:
            self.write("speed_change", **where, worker=worker_name, regimes=ctl.regimes())
        return self._record(decision, where)

    def _decide(self, shares: Shares, steps_left: int | None) -> dict[str, Any] | None:
        """The controller's decision, with what it was decided from (None: the split stays)."""
        ctl = self.controller
        estimates, counts = ctl.estimates()
        old = self.batch
        new = ctl.decide(ctl.allocations(shares), steps_left=steps_left)
        if new is None:
            return None
        return {"old": old, "batch": list(new), "compute_ms": _ms(estimates), "samples": counts}

    def _spent(self, t0: float) -> None:
        self.overhead_s += time.perf_counter() - t0
        self.calls += 1

    def _record(self, decision: dict[str, Any] | None, where: dict[str, Any]) -> list[int] | None:
        """The ``batch_change`` record of a decision taken; returns the new split, or None."""
        if decision is None:
            return None
        ctl = self.controller
        self.write("batch_change", **where, old=decision["old"], batch=decision["batch"], reason="compute-time",
                   compute_ms=decision["compute_ms"], samples=decision["samples"], overhead=round(ctl.overhead, 2),
                   **_ks(ctl), **(ctl.decision or {}))
        return list(decision["batch"])

    def summary(self) -> dict[str, Any]:
        """What the end record says of the controller: its cost and the decisions it held."""
        holds = dict(self.controller.holds)
        return {"controller_overhead_ms": round(self.overhead_ms, 4), "controller_steps_measured": self.measured,
                "holds": {"count": sum(holds.values()), "reasons": holds}}


def replay(controller: Controller, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decisions a fresh ``controller`` takes on the inputs one rank recorded (its ``batch_change``
    records of reason ``probe`` and its ``measurement`` records, in order): the ``batch_change``
    records it writes, without times. Equal to the run's own when the run decided through this loop."""
    out: list[dict[str, Any]] = []
    loop = ControlLoop(controller, lambda kind, **f: out.append({"kind": kind, **f}) if kind == BATCH_CHANGE
                       else None)
    none: Shares = lambda: [None] * controller.workers  # noqa: E731 - measured policies only
    for r in records:
        if r.get("kind") == BATCH_CHANGE and r.get("reason") in ("initial", "resumed"):
            loop.start(none, r["reason"] == "resumed", step=r["step"])
        elif r.get("kind") == BATCH_CHANGE and r.get("reason") == "probe":
            small, large = r["sizes"]
            t_small, t_large = r["probe_times_s"]
            own = r.get("probe_own_ms")
            loop.probe(small, large, t_small, t_large, r["probe_s"], r.get("warm", True), step=r["step"],
                       own=None if own is None else tuple([t / 1e3 for t in ts] for ts in own), kinds=r.get("kinds"),
                       cut_short=r.get("cut_short", False))
        elif r.get("kind") == MEASUREMENT:
            loop.step(r["times_s"], r["due"], r["steps_left"], none, r.get("cost_s", 0.0), r.get("threads"),
                      step=r["step"])
    return out
