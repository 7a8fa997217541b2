"""A scenario of the benchmark (``omnilearn simulate --scenarios``) and its true model.

A :class:`Scenario` says, for every worker and every step, how long a step of ``b`` samples truly
takes. Worker i holds a CPU share ``s_i`` (cores) that changes over the run (a pinned level, a
schedule of levels by epoch, a trace, or explicit points). Its work for a step is

    w_i(b) = sample_s * (b + k) * ((b + k) / (B/n + k)) ** (p - 1)      core-seconds

(``k``: the workload's fixed cost per step in samples; ``p > 1``: time per sample grows with the
batch, the same time as the linear model at the equal split). Its time is

- ``w_i(b) / s_i`` without CFS (a share of a core is a slower core), or
- with a CFS quota (``cfs_period_ms``) as the kernel runs it: ``ceil(s_i)`` threads run at full
  speed for ``s_i / ceil(s_i)`` of each period and are throttled for the rest; the step starts at a
  random phase of the period, its worker busy since the period began (a straggler always is), so
  what is left of this period's quota is ``max(quota - phase, 0)``. Steps of a few periods jump by
  whole periods instead of growing with the batch.

Noise multiplies the work: a log-normal factor per worker and step (``noise``, the sd of its log) and
one per step shared by every worker (``host_noise``: a busy host). A trace's stalls pause one worker
for the trace's share of the run. A step lasts ``max_i t_i(b_i) + sync_ms``.

The *fluid* time ``w_i(b) / s_i`` (no noise, no quantisation) is the true model the oracle splits by
and the benchmark's settling is measured against (:mod:`.scenarios`).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omnilearn.control.loop import pass_end, probe_time, probe_times
from omnilearn.emulator.spec.levels import LevelTable, load_tables, parse_cpuset
from omnilearn.emulator.spec.schedule import load_schedule
from omnilearn.emulator.spec.trace import load_trace
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR


@dataclass
class SpeedPoint:
    """Explicit shares from step ``at`` on (one per worker; a shorter list repeats over the workers)."""

    at: int
    shares: list[float]


@dataclass
class Scenario:
    """One scenario of the suite: every field documented in ``configs/scenarios.yaml``."""

    name: str = ""
    note: str = ""
    """One line for the report: what the scenario tests."""
    workers: int = 4
    global_batch: int | None = None
    """B; default 32 per worker."""
    steps: int = 200
    steps_per_epoch: int = 50
    """Epoch length: schedules are in epochs, ``paper`` decides at epoch ends."""
    seeds: int = 100
    level: str | None = None
    """Pin one level of ``configs/levels.yaml`` (BSP table; 8, 16, 32 or any multiple of 8 workers
    take the cluster table tiled, other counts the 4-worker table tiled). With ``trace``: the level
    a trace's ``share`` is a fraction of (default HL1)."""
    schedule: str | None = None
    """A named schedule of ``configs/schedules.yaml`` (unit epoch) or a YAML file."""
    trace: str | None = None
    """A trace file (``configs/traces/``), stretched over the run's steps; its stalls pause workers."""
    speeds: list[SpeedPoint] | None = None
    """Explicit shares by step: ``[{at: 0, shares: [1, 1, 0.5, 2]}, ...]``."""
    cpus_per_worker: float = 1.0
    """The share of a worker with an HL1 allocation, in cores (0.5: four workers on two cores)."""
    sample_ms: float = 2.0
    """Milliseconds of one sample's work on one core."""
    fixed: float = 0.0
    """k: the fixed cost of a step, in samples."""
    fixed_threads: float | None = None
    """k of a worker on more than one thread (under a CFS quota a share above one core runs on
    ``ceil(share)`` threads), which uses a small batch less well; null: ``fixed`` for every worker."""
    exponent: float = 1.0
    """p: 1 is time linear in the batch; above 1 time per sample grows with the batch."""
    noise: float = 0.05
    """sd of the log of each worker's per-step noise factor."""
    host_noise: float = 0.0
    """sd of the log of each step's factor common to all workers."""
    cfs_period_ms: float | None = None
    """CFS quota period (ms) the shares are enforced with; null: a share is a slower core."""
    sync_ms: float = 5.0
    """All-reduce and synchronisation per step (ms), independent of the split."""
    min_batch: int = 2
    max_batch: int | None = None

    def check(self, where: str) -> None:
        """UserError naming the key for a value out of range or a missing speed source."""
        key = f"{where}.{self.name}"
        sources = [k for k in ("level", "schedule", "trace", "speeds") if getattr(self, k) is not None]
        if not sources:
            raise UserError(f"{key}: needs one of level, schedule, trace or speeds")
        if len(sources) > 1 and sources != ["level", "trace"]:
            raise UserError(f"{key}: {' and '.join(sources)} exclude each other (level only with trace)")
        for attr, low in (("workers", 1), ("steps", 1), ("steps_per_epoch", 1), ("seeds", 1), ("min_batch", 0)):
            if getattr(self, attr) < low:
                raise UserError(f"{key}.{attr}: must be at least {low}, not {getattr(self, attr)}")
        for attr in ("cpus_per_worker", "sample_ms"):
            if not getattr(self, attr) > 0:
                raise UserError(f"{key}.{attr}: must be positive")
        for attr in ("fixed", "fixed_threads", "noise", "host_noise", "sync_ms"):
            if (getattr(self, attr) or 0.0) < 0:
                raise UserError(f"{key}.{attr}: must be at least 0")
        if self.exponent < 1:
            raise UserError(f"{key}.exponent: must be at least 1 (time per sample that shrinks with the batch "
                            f"is not modelled), not {self.exponent}")
        if self.cfs_period_ms is not None and not self.cfs_period_ms > 0:
            raise UserError(f"{key}.cfs_period_ms: must be positive")
        if self.global_batch is None:
            self.global_batch = 32 * self.workers
        hi = self.max_batch if self.max_batch is not None else self.global_batch
        if not self.min_batch * self.workers <= self.global_batch <= hi * self.workers:
            raise UserError(f"{key}: global_batch {self.global_batch} cannot be split among {self.workers} "
                            f"workers within [{self.min_batch}, {hi}]")
        if self.speeds is not None:
            if not self.speeds or self.speeds[0].at != 0:
                raise UserError(f"{key}.speeds: the first point must be at step 0")
            for i, p in enumerate(self.speeds):
                if not p.shares or min(p.shares) <= 0:
                    raise UserError(f"{key}.speeds[{i}].shares: a non-empty list of positive shares")


# ---------------------------------------------------------------------------------------------- speeds

@functools.lru_cache(maxsize=1)
def _bsp_table() -> LevelTable:
    return load_tables()["bsp"]


def level_shares(level: str, workers: int, cpus_per_worker: float, where: str) -> np.ndarray:
    """Every worker's share (cores) at ``level``: its cores against an HL1 worker's, times
    ``cpus_per_worker``."""
    table = _bsp_table()
    if level not in table.levels:
        raise UserError(f"{where}: level {level!r} is not in the BSP table (known: {', '.join(table.levels)})")
    if table.clusters and workers % table.per_server == 0:
        one, base = table.clusters[level], table.clusters["HL1"][0]
    else:
        one = [len(parse_cpuset(s)) for s in table.levels[level]]
        base = len(parse_cpuset(table.levels["HL1"][0]))
    cores = [one[i % len(one)] for i in range(workers)]
    return np.asarray(cores, float) / base * cpus_per_worker


def _trace_path(ref: str) -> Path:
    p = Path(ref)
    return p if p.exists() or p.is_absolute() else CONFIG_DIR / p


@dataclass
class Timeline:
    """The true shares by step (piecewise constant) and the stalls (step, worker, share of the run)."""

    starts: list[int]
    shares: list[np.ndarray]
    stalls: list[tuple[int, int, float]] = field(default_factory=list)

    def regime(self, step: int) -> int:
        i = 0
        while i + 1 < len(self.starts) and self.starts[i + 1] <= step:
            i += 1
        return i


def timeline(sc: Scenario, where: str) -> Timeline:
    """The shares of ``sc``'s workers over its steps, merged where nothing changes."""
    n, key = sc.workers, f"{where}.{sc.name}"
    points: list[tuple[int, np.ndarray]] = []
    stalls: list[tuple[int, int, float]] = []
    if sc.speeds is not None:
        for p in sc.speeds:
            points.append((p.at, np.asarray([p.shares[i % len(p.shares)] for i in range(n)], float)))
    elif sc.schedule is not None:
        sched = load_schedule(sc.schedule)
        if sched.unit != "epoch":
            raise UserError(f"{key}.schedule: {sc.schedule} is in {sched.unit}; scenarios take schedules in epochs")
        for step in range(sc.steps):
            level = sched.level_at(step / sc.steps_per_epoch)
            points.append((step, level_shares(level, n, sc.cpus_per_worker, f"{key}.schedule")))
    elif sc.trace is not None:
        raw = load_trace(_trace_path(sc.trace))
        trace = raw.resample(float(sc.steps), "step")
        full = level_shares(sc.level or "HL1", n, sc.cpus_per_worker, f"{key}.level")
        for start, states in trace.segments():
            shares = full.copy()
            for i in range(n):
                st = states[i % trace.workers + 1]
                if st.share is not None:
                    shares[i] = full[i] * st.share
                elif st.cpus is not None:
                    shares[i] = st.cpus
                elif st.cpuset is not None:
                    shares[i] = float(len(parse_cpuset(st.cpuset)))
            points.append((int(start), shares))
        for s in trace.stalls():  # resampled to steps, a stall keeps the seconds of the original
            for i in range(n):
                if i % trace.workers + 1 == s.worker:
                    stalls.append((min(int(s.at), sc.steps - 1), i, s.duration / raw.span))
    else:
        assert sc.level is not None
        points.append((0, level_shares(sc.level, n, sc.cpus_per_worker, f"{key}.level")))
    starts: list[int] = []
    shares: list[np.ndarray] = []
    for at, s in sorted(points, key=lambda p: p[0]):
        if at >= sc.steps:
            break
        if shares and np.array_equal(shares[-1], s):
            continue
        if starts and starts[-1] == at:
            shares[-1] = s
        else:
            starts.append(at)
            shares.append(s)
    return Timeline(starts, shares, stalls)


# ---------------------------------------------------------------------------------------------- times

TYPICAL_DRAWS = 32
"""Draws of the noise (and CFS phase) that :meth:`World.expected` averages a step's time over."""


@dataclass
class World:
    """One seed of one scenario: the true model and every random draw (common to all policies)."""

    sc: Scenario
    line: Timeline
    seed: int

    def __post_init__(self) -> None:
        sc, n = self.sc, self.sc.workers
        rng = np.random.default_rng([self.seed, zlib.crc32(sc.name.encode())])
        self.noise = np.exp(sc.noise * rng.standard_normal((sc.steps, n)))
        self.noise *= np.exp(sc.host_noise * rng.standard_normal((sc.steps, 1)))
        self.phase = rng.random((sc.steps, n))
        self.probe_noise = np.exp(sc.noise * rng.standard_normal((64, n)))
        self.probe_phase = rng.random((64, n))
        # Draws of their own stream (the ones above stay as they were): the expected step time of a split.
        typical = np.random.default_rng([self.seed, zlib.crc32(sc.name.encode()), 1])
        self.typical_noise = np.exp(sc.noise * typical.standard_normal((TYPICAL_DRAWS, n)))
        self.typical_noise *= np.exp(sc.host_noise * typical.standard_normal((TYPICAL_DRAWS, 1)))
        self.typical_phase = typical.random((TYPICAL_DRAWS, n))
        self.sample_s = sc.sample_ms / 1e3
        self.b0 = sc.global_batch / n + sc.fixed
        self.regimes = [self.line.regime(s) for s in range(sc.steps)]
        self.stalls: dict[int, list[tuple[int, float]]] = {}
        for step, worker, share in self.line.stalls:
            self.stalls.setdefault(step, []).append((worker, share))

    def threads(self, regime: int) -> np.ndarray:
        """Each worker's threads: ``ceil(share)`` under a CFS quota, else one (a share is a slower core)."""
        shares = self.line.shares[regime]
        return np.maximum(np.ceil(shares - 1e-6), 1.0) if self.sc.cfs_period_ms is not None else np.ones(len(shares))

    def fixed(self, regime: int) -> np.ndarray:
        """Each worker's k: ``fixed``, or ``fixed_threads`` on more than one thread."""
        more = self.sc.fixed_threads if self.sc.fixed_threads is not None else self.sc.fixed
        return np.where(self.threads(regime) > 1, more, self.sc.fixed)

    def work(self, batch: np.ndarray, regime: int) -> np.ndarray:
        """Core-seconds of a step of ``batch`` samples, per worker (no noise)."""
        x = np.asarray(batch, float) + self.fixed(regime)
        w = self.sample_s * x
        return w if self.sc.exponent == 1.0 else w * (x / self.b0) ** (self.sc.exponent - 1.0)

    def fluid(self, regime: int, batch: np.ndarray) -> np.ndarray:
        """The true noise-free time of every worker (seconds): work over share."""
        return self.work(batch, regime) / self.line.shares[regime]

    def expected(self, regime: int, batch: np.ndarray) -> float:
        """The expected step time of the split ``batch`` (seconds, the slowest worker's; no stall):
        the mean over :data:`TYPICAL_DRAWS` draws of the noise and, under a CFS quota, of the phase.
        What a step at this split costs on this host, quantisation included (the fluid time is not)."""
        t = self._time(self.line.shares[regime], self.work(batch, regime) * self.typical_noise, self.typical_phase)
        return float(t.max(axis=1).mean())

    def _time(self, shares: np.ndarray, work: np.ndarray, phase: np.ndarray) -> np.ndarray:
        if self.sc.cfs_period_ms is None:
            return work / shares
        return cfs_time(work, shares, self.sc.cfs_period_ms / 1e3, phase)

    def times(self, step: int, batch: np.ndarray, fluid_step_s: float) -> np.ndarray:
        """Every worker's realised compute time of ``step`` (seconds). ``fluid_step_s``: the oracle's
        noise-free step time of this step, the scale of a stall."""
        shares = self.line.shares[self.regimes[step]]
        t = self._time(shares, self.work(batch, self.regimes[step]) * self.noise[step], self.phase[step])
        for worker, share in self.stalls.get(step, ()):
            t[worker] += share * self.sc.steps * fluid_step_s
        return t

    def probe(self, small: int, large: int, rounds: int, timed: bool) -> tuple[list[float], list[float], float, bool]:
        """The start-up pass on the first shares (BSPTrainer.start_up: ``rounds`` steps at each size and,
        where ``dynamic`` times it (``timed``), more until the worker's pass is over,
        :func:`~omnilearn.control.loop.pass_end`): every worker's time at each size as the trainers
        take it from every worker's rounds (:func:`~omnilearn.control.loop.probe_times`), its wall cost (the
        slowest worker's), and whether a worker's pass was cut short."""
        n, shares = self.sc.workers, self.line.shares[0]
        quota = self.sc.cfs_period_ms is not None  # the workers' shares are CFS quotas, not slower cores
        rows, cpu = [], []
        count, elapsed, done, cut = np.zeros(n, int), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        while not done.all():
            for b in (small, large):
                r = len(rows) % len(self.probe_noise)
                cpu.append(self.work(np.full(n, b), 0) * self.probe_noise[r])  # core-seconds: a round's CPU time
                rows.append(self._time(shares, cpu[-1], self.probe_phase[r]))
            elapsed += np.where(done, 0.0, rows[-2] + rows[-1])
            count += ~done
            walls = np.asarray(rows)
            ends = [pass_end(small, large, walls[0:2 * k:2, i].tolist(), walls[1:2 * k:2, i].tolist(), float(e),
                             rounds, quota, self.sc.global_batch / n, self.sc.steps) if timed and not done[i] else None
                    for i, (k, e) in enumerate(zip(count, elapsed, strict=True))]
            cut |= np.array([end == "cut" for end in ends])
            done = done | (np.array([end is not None for end in ends]) if timed else count >= rounds)
        t, c, threads = np.asarray(rows), np.asarray(cpu), self.threads(0)
        readings = []
        for i, m in enumerate(count):
            ti, ci = t[:2 * m, i], c[:2 * m, i]
            # under a quota CPU seconds and the rate the pass got them at (it runs without pause); else wall
            # seconds, in which a slower core shows; one kind of core, its threads
            x, rate = (ci, float(ci.sum() / ti.sum())) if quota else (ti, 0.0)
            readings.append([probe_time(x[0::2].tolist()), probe_time(x[1::2].tolist()), float(elapsed[i]), rate,
                             float(threads[i]), 0.0])
        t_small, t_large, _, _ = probe_times(readings)
        return t_small, t_large, float(elapsed.max()), bool(cut.any())


def cfs_time(work: np.ndarray, shares: np.ndarray, period: float, phase: np.ndarray) -> np.ndarray:
    """Wall seconds of ``work`` core-seconds under a CFS quota of ``shares`` cores per ``period``:
    ``ceil(share)`` threads run at full speed for ``share / ceil(share)`` of each period, then wait
    for the next; the step starts at ``phase`` (a fraction) of a period begun busy."""
    threads = np.maximum(np.ceil(shares - 1e-6), 1.0)
    run = period * shares / threads  # wall seconds of running per period
    w = work / threads  # wall seconds of running needed
    start = phase * period
    first = np.maximum(run - start, 0.0)
    rest = np.maximum(w - first, 0.0)
    whole = np.maximum(np.ceil(rest / run - 1e-12) - 1.0, 0.0)  # full periods before the last one
    late = (period - start) + whole * period + (rest - whole * run)
    return np.where(w <= first, w, late)


def describe(sc: Scenario) -> str:
    """The scenario's speed source in a few words (for the report)."""
    if sc.speeds is not None:
        return "explicit shares"
    if sc.schedule is not None:
        return f"schedule {sc.schedule}"
    if sc.trace is not None:
        return f"trace {Path(sc.trace).name}"
    return f"pinned {sc.level}"
