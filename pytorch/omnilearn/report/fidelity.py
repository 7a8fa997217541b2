"""Fidelity: how closely a run's emulation did what its plan asked, level by level, and what a link cost.

Per level (``summary.json``'s ``level_speeds.<level>``, beside the measured speeds):

- ``nominal_ratio``: the plan's fastest worker share over its slowest;
- ``effective_ratio``: the same of the shares read back from the kernel or Docker after each change
  (the affinity backend's is the duty cycle it achieved);
- ``samples_per_s`` and ``measured_ratio``: each worker's measured speed and the fastest's over the
  slowest's, what the workers actually got, from per-worker models fitted on the run's steps
  (:func:`level_speeds`); ``samples_per_s_raw`` and ``measured_ratio_raw``: the same as the median
  of ``b / t`` over the level's steps, without a model;
- ``applied_as_asked``: the share of the level's changes that the toggler applied and read back as
  requested (a quota within 2%, the same cpuset and memory limit, the link within tc's rounding);
- ``apply_ms`` and ``apply_ms_max``: from the worker's request (its line's ``time``) to the toggler's
  ``applied`` record, median and worst, over the level's changes.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from omnilearn.bounded_json import loads_bounded
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.requests import MAX_JSON_DEPTH, MAX_LINE_BYTES, request_log
from omnilearn.emulator.spec.levels import Allocation, parse_cpuset
from omnilearn.emulator.spec.links import Link
from omnilearn.emulator.spec.plan import SERVER_TARGET, EmulationPlan
from omnilearn.files import read_lines
from omnilearn.report.worker_models import WorkerModels, fit_worker_models

QUOTA_TOLERANCE = 0.02


def _ratio(shares: list[float | None]) -> float | None:
    known = [s for s in shares if s]
    return round(max(known) / min(known), 3) if known and len(known) == len(shares) else None


def as_asked(record: dict[str, Any]) -> bool:
    """An outcome applied and read back as requested (an unset cpuset or memory asks for nothing)."""
    if record.get("status") != "applied":
        return False
    req, eff = Allocation.from_dict(record.get("requested") or {}), Allocation.from_dict(record.get("effective") or {})
    if (req.cpus is None) != (eff.cpus is None) or (
            req.cpus is not None and not math.isclose(req.cpus, eff.cpus, rel_tol=QUOTA_TOLERANCE, abs_tol=1e-3)):
        return False
    if req.cpuset is not None and (eff.cpuset is None or parse_cpuset(req.cpuset) != parse_cpuset(eff.cpuset)):
        return False
    if req.memory is not None and req.memory != eff.memory:
        return False
    if "link" in record:
        want, got = record["link"], record.get("effective_link")
        return (want is None and got is None) or (want is not None and Link.from_dict(want).matches(
            Link.from_dict(got) if got else None))
    return True


def request_times(log_dir: Path, ranks: int) -> dict[tuple[str, int], float]:
    """``(log name, offset_end) -> time`` of every request line the workers wrote (bounded reads)."""
    times: dict[tuple[str, int], float] = {}
    for rank in range(ranks):
        path = request_log(log_dir, rank)
        lines, _ = read_lines(path)
        for raw, end in lines:
            obj = loads_bounded(raw, MAX_LINE_BYTES, MAX_JSON_DEPTH)
            if isinstance(obj, dict) and isinstance(obj.get("time"), (int, float)):
                times[(path.name, end)] = float(obj["time"])
    return times


def level_speeds(per_rank_steps: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Measured samples/s of each worker at each level, from per-worker models fitted on these steps.

    Nominal levels say what the allocation asked for; these say what the workers actually got. The
    models are ``t = c_i (b + k)`` (:mod:`~omnilearn.report.worker_models`: one ``k`` for the run, or one
    per kind of worker);
    a worker's speed is read at ONE batch for all workers, the job's mean local batch ``b``:
    ``b / (c_i (b + k))``, the samples per second it would give there. At a common batch the ratio of
    two workers is ``c_j / c_i`` whatever their batches were, so a job whose time does not grow with
    its batch (a pure fixed cost, ``k`` at its upper bound) reads as equal workers when their steps
    take equal times, while ``b / t`` at their own batches would read the ratio of the batches a
    controller gave them (39:1 for batches of 78 and 2). The speed at ``b`` rather than ``1 / c`` (the
    speed at an infinite batch) keeps the numbers at what the job can reach: ``1 / c`` grows without
    bound as ``k`` does. ``samples_per_s_raw`` / ``measured_ratio_raw``: the median of ``b / t`` over
    the level's steps, the figure without a model. ``speed_batch``, ``k``, ``k_status`` and ``k_model``
    (``k_by_kind`` with one ``k`` per kind): the batch the speeds are read at and the run's ``k``.
    """
    modelled = model_speeds(fit_worker_models([per_rank_steps], ["this run"]), len(per_rank_steps))
    out: dict[str, dict[str, Any]] = {}
    levels = {r.get("level") for steps in per_rank_steps for r in steps} - {None}
    for level in sorted(levels):
        raw = []
        for steps in per_rank_steps:
            vals = [r["batch"] / (r["compute_ms"] / 1e3) for r in steps
                    if r.get("level") == level and r["compute_ms"] > 0 and r["batch"] > 0]
            raw.append(statistics.median(vals) if vals else None)
        out[level] = {**modelled.get(level, {"samples_per_s": [None] * len(raw), "measured_ratio": None}),
                      "samples_per_s_raw": [round(s, 2) if s else None for s in raw], "measured_ratio_raw": _spread(raw)}
    return out


def model_speeds(models: WorkerModels, workers: int) -> dict[str, dict[str, Any]]:
    """Per level of ``models``: each worker's ``samples_per_s`` at the models' mean local batch, the
    ``measured_ratio`` of the fastest to the slowest, the batch read at (``speed_batch``), ``k``, ``k_status``,
    ``k_model`` and, with one ``k`` per kind of worker, ``k_by_kind``."""
    at = models.mean_batch
    out = {}
    for level in sorted({lv for _, lv in models.c}):
        speeds = [models.speed(i, level, at) if (i, level) in models.c else None for i in range(workers)]
        out[level] = {"samples_per_s": [round(s, 2) if s else None for s in speeds], "measured_ratio": _spread(speeds),
                      "speed_batch": round(at, 2), "k": round(models.k, 3), "k_status": models.k_status,
                      "k_model": models.k_model,
                      **({"k_by_kind": [dict(g) for g in models.k_by_kind]} if models.k_by_kind else {})}
    return out


def _spread(speeds: list[float | None]) -> float | None:
    known = [s for s in speeds if s]
    return round(max(known) / min(known), 3) if known else None


def level_fidelity(speeds: dict[str, dict[str, Any]], out_dir: Path, plan: EmulationPlan,
                   targets: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``speeds`` (level -> measured speeds and ratio) with the fidelity of each level added; ``targets``:
    the workers measured (default: every worker of the plan)."""
    log_dir = Path(out_dir) / "logs"
    outcomes = [r for r in read_audit(log_dir, status=None) if r.get("status") in ("applied", "rejected")]
    asked = request_times(log_dir, len(plan.targets))
    workers = [t for t in (targets or plan.targets) if t != SERVER_TARGET]
    out: dict[str, dict[str, Any]] = {}
    for level in dict.fromkeys([*plan.levels, *speeds]):
        mine = [r for r in outcomes if r.get("level") == level]
        effective: dict[str, float | None] = {}
        for r in mine:
            if r.get("status") == "applied" and r.get("target") in workers:
                effective[r["target"]] = Allocation.from_dict(r.get("effective") or {}).share
        delays = [1e3 * (r["time"] - asked[(r["file"], r["offset_end"])]) for r in mine
                  if r.get("status") == "applied" and (r.get("file"), r.get("offset_end")) in asked]
        nominal = [plan.allocation(level, t).share for t in workers] if level in plan.levels else []
        out[level] = {
            **speeds.get(level, {"samples_per_s": None, "measured_ratio": None, "samples_per_s_raw": None,
                                 "measured_ratio_raw": None}),
            "nominal_ratio": _ratio(nominal) if nominal else None,
            "effective_ratio": _ratio([effective.get(t) for t in workers]) if effective else None,
            "changes": len(mine),
            "applied_as_asked": round(sum(map(as_asked, mine)) / len(mine), 4) if mine else None,
            "apply_ms": round(statistics.median(delays), 1) if delays else None,
            "apply_ms_max": round(max(delays), 1) if delays else None,
        }
    return out


MAX_LISTED_CHANGES = 64  # changes listed one by one in summary.json (the counts cover them all)


def change_outcomes(log_dir: Path) -> dict[str, Any]:
    """How the run's allocation changes ended, from the toggler's audit (``summary.json``'s
    ``allocation_changes``): ``changes`` begun, ``retried`` (the backend failed at least once),
    ``never_held`` (the nominal allocation never took: rejected, superseded by the next request, or
    still being retried when the run ended), and ``listed``, the first MAX_LISTED_CHANGES of those
    retried or never held, each with its ``nominal`` allocation (the plan's), the one ``in_force``
    (read back by the toggler from the kernel or Docker at its last record), its ``retries`` and its
    last ``status`` (applied, rejected, retrying; applying: never tried, the toggler stopped first).
    """
    last: dict[tuple[Any, int], dict[str, Any]] = {}
    for r in read_audit(log_dir, status=None):
        if r.get("status") in ("applying", "retrying", "applied", "rejected") and type(r.get("offset_end")) is int:
            last[(r.get("file"), r["offset_end"])] = r
    entries = []
    for r in last.values():
        attempts = r.get("attempts") if type(r.get("attempts")) is int else 0
        entries.append({"target": r.get("target"), "level": r.get("level"), "epoch": r.get("epoch"),
                        "seq": r.get("seq"), "status": r.get("status"), "reason": r.get("reason"),
                        "held": r.get("status") == "applied", "retries": max(attempts - 1, 0),
                        "nominal": r.get("requested"), "in_force": r.get("effective")})
    notable = [e for e in entries if e["retries"] or not e["held"]]
    return {"changes": len(entries), "retried": sum(1 for e in entries if e["retries"]),
            "never_held": sum(1 for e in entries if not e["held"]), "listed": notable[:MAX_LISTED_CHANGES]}


def allreduce_ms(steps: list[list[dict[str, Any]]]) -> float | None:
    """The all-reduce's own cost per step (BSP): the sync time of the rank that waited least (the last
    to arrive), median over steps. A slow link shows here; balancing compute cannot remove it."""
    n = min((len(s) for s in steps), default=0)
    per_step = [min(s[k]["sync_ms"] for s in steps) for k in range(n)]
    return round(statistics.median(per_step), 2) if per_step else None


def link_note(summary: dict[str, Any]) -> str | None:
    """What the run's links cost, from its measurements (BSP with links only)."""
    links, cost = summary.get("links"), summary.get("allreduce_ms")
    if not links or cost is None or summary.get("mode") != "bsp":
        return None
    step = [c + s for c, s in zip(summary["compute_ms"], summary["sync_ms"], strict=True)
            if c is not None and s is not None]
    share = f" ({cost / max(step):.0%} of a step)" if step else ""
    shaped = ", ".join(f"{t} {v}" for t, v in links.items())
    return (f"links {shaped}: the all-reduce itself takes {cost:.0f} ms per step{share}, on every rank; "
            f"resizing batches balances compute and cannot remove it")
