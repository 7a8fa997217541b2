"""Time to a target metric and the metric at equal wall time: pure functions over evaluation records.

A curve is a run's held-out evaluations in order, each ``{"elapsed_s": seconds since training
started, <metric>: value}`` (BSP: the ``eval`` records of rank 0; ASP: the scored snapshots of
``metrics/eval.jsonl``; both appear in ``summary.json`` as ``accuracy_curve``). Accuracy is better
higher, perplexity lower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LOWER_IS_BETTER = ("perplexity", "loss")


def higher_is_better(metric: str, lower: bool = False) -> bool:
    """``lower``: the run's metric says it improves downwards (a workload's own metric may)."""
    return not lower and metric not in LOWER_IS_BETTER


def reaches(value: float, target: float, metric: str, lower: bool = False) -> bool:
    return value >= target if higher_is_better(metric, lower) else value <= target


def best(values: Sequence[float], metric: str, lower: bool = False) -> float:
    return max(values) if higher_is_better(metric, lower) else min(values)


def default_target(finals: Sequence[float | None], metric: str, fraction: float, lower: bool = False
                   ) -> float | None:
    """``fraction`` of the best final value among the compared runs (lower is better: the best / ``fraction``)."""
    known = [v for v in finals if v is not None]
    if not known:
        return None
    top = best(known, metric, lower)
    return top * fraction if higher_is_better(metric, lower) else top / fraction


def curve_points(curve: Sequence[Mapping[str, Any]], metric: str) -> list[tuple[float, float]]:
    """(elapsed_s, value) of every evaluation that has the metric, in time order."""
    pts = [(float(r["elapsed_s"]), float(r[metric])) for r in curve
           if r.get(metric) is not None and r.get("elapsed_s") is not None]
    return sorted(pts)


def time_to_target(curve: Sequence[Mapping[str, Any]], metric: str, target: float, lower: bool = False
                   ) -> float | None:
    """Wall time of the first evaluation that reaches ``target``; None when none does.

    Only evaluations are known, so this is when the run was *seen* at the target: a run evaluated
    once per epoch may have got there up to an epoch earlier.
    """
    for t, v in curve_points(curve, metric):
        if reaches(v, target, metric, lower):
            return t
    return None


def metric_at(curve: Sequence[Mapping[str, Any]], metric: str, at_s: float) -> float | None:
    """The metric of the last evaluation at or before ``at_s`` (what the run had by then); None if none."""
    value = None
    for t, v in curve_points(curve, metric):
        if t > at_s + 1e-9:
            break
        value = v
    return value


def equal_time(curves: Mapping[str, Sequence[Mapping[str, Any]]], metric: str
               ) -> tuple[float | None, dict[str, float | None]]:
    """The shortest run's end (its last evaluation) and every run's metric by then.

    Compares the runs at the same wall time: what each had reached when the quickest one finished.
    """
    ends = [pts[-1][0] for pts in (curve_points(c, metric) for c in curves.values()) if pts]
    if not ends:
        return None, {name: None for name in curves}
    at = min(ends)
    return at, {name: metric_at(c, metric, at) for name, c in curves.items()}


def target_report(curves: Mapping[str, Sequence[Mapping[str, Any]]], finals: Mapping[str, float | None],
                  metric: str, fraction: float, value: float | None = None, lower: bool = False) -> dict[str, Any]:
    """Time to target and metric at equal time for compared runs (``compare.json``, the bench's groups)."""
    target = value if value is not None else default_target(list(finals.values()), metric, fraction, lower)
    at, at_equal = equal_time(curves, metric)
    return {
        "metric": metric,
        "target": target,
        "target_rule": "given" if value is not None else f"{fraction:g} of the best final value"
        if higher_is_better(metric, lower) else f"the best final value / {fraction:g}",
        "lower_is_better": not higher_is_better(metric, lower),
        "time_to_target_s": {name: None if target is None else time_to_target(c, metric, target, lower)
                             for name, c in curves.items()},
        "equal_time_s": at,
        "metric_at_equal_time": at_equal,
    }
