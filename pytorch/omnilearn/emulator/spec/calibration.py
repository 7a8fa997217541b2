"""Calibration: what this host's CPU shares give a workload, and a level table whose *measured* speed
ratios are the nominal ones.

A nominal level gives worker i the CPU share ``s_i``; what it measures is a speed ``v_i`` (samples per
second of compute), and ``v_i / v_j`` is not ``s_i / s_j``: a quota above one CPU needs a second
thread, which does not double the speed; a small quota pays fixed costs per step; workers compete
for the host's caches and cores. ``omnilearn calibrate`` (:mod:`omnilearn.experiments.calibrate`)
measures ``v(share)`` per worker slot and the all-reduce's cost; this module holds the pure part:
fitting the speed curve, inverting it into quotas whose predicted speeds stand in the nominal
ratios within the host's CPUs (again with curves scaled by what a concurrent check measured), and the
file format that
``emulation.calibration: FILE`` reads (:func:`calibrated_levels`, used by :func:`.plan.build_plan`).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnilearn.errors import UserError
from omnilearn.files import load_yaml

FORMAT = "omnilearn-calibration/1"
MIN_CPUS = 0.01  # the smallest CFS quota the kernel takes (1 ms per 100 ms period)
RATIO_TOLERANCE = 0.05  # a level whose ratio is off by more than this says so


@dataclass(frozen=True)
class SpeedCurve:
    """Samples/s against CPUs (with the threads a worker uses at that share), piecewise linear through
    the measured points, through the origin below the first one and flat above the last one."""

    cpus: tuple[float, ...]
    speed: tuple[float, ...]

    def __post_init__(self) -> None:
        assert self.cpus and len(self.cpus) == len(self.speed), "a curve needs points"
        assert all(a < b for a, b in zip(self.cpus, self.cpus[1:], strict=False)), "cpus must increase"
        assert all(a <= b for a, b in zip(self.speed, self.speed[1:], strict=False)), "speed must not fall"

    def at(self, cpus: float) -> float:
        xs, ys = self.cpus, self.speed
        if cpus <= xs[0]:
            return ys[0] * cpus / xs[0]
        if cpus >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, cpus)
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (cpus - xs[i - 1]) / (xs[i] - xs[i - 1])

    def inverse(self, speed: float) -> float:
        """The smallest share that gives ``speed``; ``inf`` beyond the curve's top."""
        xs, ys = self.cpus, self.speed
        if speed <= ys[0]:
            return xs[0] * speed / ys[0]
        if speed > ys[-1]:
            return math.inf
        i = bisect.bisect_left(ys, speed)
        if ys[i] == ys[i - 1]:
            return xs[i - 1]
        return xs[i - 1] + (xs[i] - xs[i - 1]) * (speed - ys[i - 1]) / (ys[i] - ys[i - 1])

    def scaled(self, factor: float) -> SpeedCurve:
        """The curve with every speed times ``factor``: what a slot gets when others compete with it."""
        assert factor > 0, factor
        return SpeedCurve(self.cpus, tuple(y * factor for y in self.speed))

    def to_dict(self) -> dict[str, Any]:
        return {"points": [[round(x, 4), round(y, 3)] for x, y in zip(self.cpus, self.speed, strict=True)]}


def fit_curve(measurements: Sequence[dict[str, Any]]) -> SpeedCurve:
    """One slot's curve from its measurements ``{cpus, threads, samples_per_s}``: at each share, the
    median speed with the threads a worker uses there (``ceil(cpus)``), made non-decreasing."""
    by_share: dict[float, list[float]] = {}
    for m in measurements:
        if m["threads"] == max(1, math.ceil(m["cpus"] - 1e-6)):
            by_share.setdefault(float(m["cpus"]), []).append(float(m["samples_per_s"]))
    assert by_share, "no measurement at a worker's own thread count"
    xs = sorted(by_share)
    ys: list[float] = []
    for x in xs:
        ys.append(max(statistics.median(by_share[x]), ys[-1] if ys else 0.0))
    return SpeedCurve(tuple(xs), tuple(ys))


@dataclass(frozen=True)
class LevelFit:
    """Quotas for one level and what the curves predict of them."""

    quotas: list[float]
    predicted_ratio: float
    note: str | None


def ratio(values: Sequence[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else math.inf


def fit_level(curves: Sequence[SpeedCurve], nominal: Sequence[float], total_cpus: float) -> LevelFit:
    """Quotas whose predicted speeds are proportional to ``nominal``, as fast as the host allows: the
    largest speed scale ``c`` with ``speed_i = c * nominal_i`` and the quotas summing to at most
    ``total_cpus``, no quota below :data:`MIN_CPUS`. The note says where the host cannot."""
    assert len(curves) == len(nominal) and min(nominal) > 0

    def quotas(c: float) -> list[float]:
        return [curve.inverse(c * s) for curve, s in zip(curves, nominal, strict=True)]

    top = min(curve.speed[-1] / s for curve, s in zip(curves, nominal, strict=True))
    lo, hi = 0.0, top
    if sum(quotas(hi)) > total_cpus:
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(quotas(mid)) <= total_cpus else (lo, mid)
        hi = lo
    q = quotas(hi)
    note = None
    if min(q) < MIN_CPUS:
        note = (f"the slowest worker would need {min(q):.4f} CPUs, below the kernel's smallest quota "
                f"{MIN_CPUS}: raised to it")
        q = [max(MIN_CPUS, x) for x in q]
    predicted = ratio([curve.at(x) for curve, x in zip(curves, q, strict=True)])
    wanted = ratio(nominal)
    if note is None and abs(predicted / wanted - 1) > RATIO_TOLERANCE:
        note = f"the measured curves allow {predicted:.2f}:1, not {wanted:.2f}:1"
    return LevelFit([round(x, 4) for x in q], predicted, note)


def fit_allreduce(measurements: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per worker count: the least-squares line ``seconds = latency + bytes / bandwidth``."""
    out: dict[str, dict[str, float]] = {}
    for workers in sorted({m["workers"] for m in measurements}):
        pts = [(float(m["bytes"]), float(m["seconds"])) for m in measurements if m["workers"] == workers]
        if len(pts) < 2:
            continue
        mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
        var = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / var if var > 0 else 0.0
        out[str(workers)] = {"latency_s": round(max(0.0, my - slope * mx), 6),
                             "bandwidth_bytes_per_s": round(1 / slope) if slope > 0 else None}
    return out


# ---------------------------------------------------------------- the file, as build_plan reads it


def load_calibration(path: str, where: str) -> dict[str, Any]:
    """A calibration file, its shape checked (UserError naming the file and what is wrong)."""
    data = load_yaml(path, "calibration file")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{where}: {path} is not a calibration file of this version (format: {FORMAT}); "
                        f"write one with `omnilearn calibrate --out DIR`")
    job, levels = data.get("job"), data.get("levels")
    if not isinstance(job, dict) or not isinstance(levels, dict) or not levels:
        raise UserError(f"{where}: {path}: needs 'job' and 'levels' (the calibrated table)")
    for level, entry in levels.items():
        quotas = entry.get("quotas") if isinstance(entry, dict) else None
        if not isinstance(quotas, list) or not quotas or not all(
                isinstance(q, (int, float)) and not isinstance(q, bool) and q >= MIN_CPUS for q in quotas):
            raise UserError(f"{where}: {path}: levels.{level}.quotas: expected CPU quotas of at least {MIN_CPUS}")
    return data


def calibrated_levels(path: str, mode: str, workers: int, where: str) -> dict[str, list[Any]]:
    """``emulation.calibration: FILE`` as a level table (level -> one CPU quota per worker)."""
    data = load_calibration(path, where)
    job = data["job"]
    if job.get("mode") != mode or job.get("workers") != workers:
        raise UserError(f"{where}: {path} calibrates {job.get('mode')} with {job.get('workers')} workers; this "
                        f"job is {mode} with {workers}: calibrate it with the job's config")
    # ASP: the parameter server's quota first (rank order), as in emulation.levels
    return {str(level): ([entry["server"]] if entry.get("server") else []) + list(entry["quotas"])
            for level, entry in data["levels"].items()}
