"""Summaries of finished runs, from the per-rank metrics files and the toggler's audit."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from omnilearn.config.sections import ControlConfig
from omnilearn.control.controller import STEP_DRIVEN, controller_class
from omnilearn.control.policies import KNOWS, effective
from omnilearn.emulator.spec.plan import SERVER_TARGET
from omnilearn.errors import UserError
from omnilearn.files import read_records, write_atomic
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import eval_path, read_rank, restarts_path
from omnilearn.records import BATCH_CHANGE, END, EVAL, HL_CHANGE, HL_OUTCOME, START, STEP, UPDATE, of_kind
from omnilearn.report.fidelity import allreduce_ms, change_outcomes, level_fidelity, level_speeds
from omnilearn.report.ideal import balanced_time, group_ideal, ideal_speedups
from omnilearn.report.stragglers import step_scores
from omnilearn.report.targets import target_report
from omnilearn.report.worker_models import fit_worker_models

FINAL_WINDOW = 8  # steps per worker behind the "final" compute time (at the final batch size)
SETTLED = 0.10  # a level change is settled once its slowest worker loses at most this against balance
# What ``summary.json``'s ``control`` says the policy ran with: every field of the control section but the
# policy's name (its own key) and the memory keys (the same whatever the policy). Derived, so a new field shows.
CONTROL_KEYS = tuple(f.name for f in dataclasses.fields(ControlConfig)
                     if f.name not in ("policy", "memory_bounds", "memory_margin"))


def _final_compute_s(steps: list[dict[str, Any]], batch: int) -> float | None:
    """One worker's median compute time over its last steps at ``batch`` (ASP: workers step alone)."""
    tail: list[float] = []
    for r in reversed(steps):
        if r["batch"] != batch:
            if tail:
                break
            continue
        tail.append(r["compute_ms"] / 1e3)
        if len(tail) == FINAL_WINDOW:
            break
    if len(tail) > 2:  # the first step at a new size carries the change itself
        tail = tail[:-1]
    return statistics.median(tail) if tail else None


def eval_curve(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The held-out metric at each evaluation, with its wall time since training started."""
    return [{"epoch": round(e["epoch"], 4), "elapsed_s": round(e["elapsed_s"], 3), "accuracy": e["accuracy"],
             **({"perplexity": e["perplexity"]} if e.get("perplexity") is not None else {})} for e in evals]


def main_metric(summary: dict[str, Any]) -> str:
    """The held-out metric a run is judged by: perplexity for a language model, else the workload's
    score (kept under ``accuracy``, whatever the workload names it: ``metric_name``)."""
    return "perplexity" if summary.get("final_perplexity") is not None else "accuracy"


def metric_of(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The workload's metric, as its evaluations name it: ``metric_name`` and ``metric_lower_is_better``."""
    last = evals[-1] if evals else {}
    return {"metric_name": last.get("metric", "accuracy"), "metric_lower_is_better": bool(last.get("lower_is_better"))}


def lower_is_better(summary: dict[str, Any]) -> bool:
    """Whether the workload says its metric improves downwards (perplexity is known to by name:
    :func:`~omnilearn.report.targets.higher_is_better`)."""
    return bool(summary.get("metric_lower_is_better"))


def describe(job: JobSpec) -> dict[str, Any]:
    """What ran: the keys every summary starts with."""
    cfg = job.config
    workers = len(job.slots) - (1 if cfg.mode == "asp" else 0)
    control = effective(cfg.control, cfg.train.global_batch, workers)
    described = {"mode": cfg.mode, "policy": cfg.control.policy, "policy_knows": KNOWS[cfg.control.policy],
                 "control": {k: getattr(control, k) for k in CONTROL_KEYS}, "backend": job.backend,
                 "allocation_mode": job.plan.mode, "workers": workers, "model": cfg.model.name,
                 "dataset": cfg.data.name, "epochs": cfg.train.epochs}
    if job.members is not None:  # it went on without a worker lost for good: the per-worker lists are the survivors'
        described.update(workers_configured=cfg.workers,
                         worker_targets=[job.plan.targets[s] for s in job.slots if job.plan.targets[s] != SERVER_TARGET])
    return described


def final_segment(steps: list[list[dict[str, Any]]]) -> list[int]:
    """Step positions of the last stretch in which every worker kept the same batch size.

    The run's final state is measured there, on the same steps for every worker: the first step
    of the stretch (it carries the change itself) and partial last steps of epochs are left out,
    and at most FINAL_WINDOW steps are kept. A decision at the very end leaves an empty stretch;
    then the one before it is used.
    """
    n = min(len(s) for s in steps)
    rows = [tuple(s[k]["batch"] for s in steps) for k in range(n)]
    full = [k for k in range(n) if sum(rows[k]) == steps[0][k]["global_batch"] and
            steps[0][k]["global_batch"] == max(r["global_batch"] for r in steps[0])]
    segments: list[list[int]] = []
    for k in full:
        if segments and rows[segments[-1][-1]] == rows[k]:
            segments[-1].append(k)
        else:
            segments.append([k])
    for seg in reversed(segments):
        if len(seg) >= 2:
            return seg[1:][-FINAL_WINDOW:]
    return segments[-1][-FINAL_WINDOW:] if segments else []


def busy_ms(step: dict[str, Any], quota: bool = True) -> float:
    """A worker's busy time in a BSP step: its compute and, where the policy times the quota (``quota``),
    the wait for its CPU beyond that (``held_ms``; null or absent, or a policy that does not time it:
    compute alone, what that policy balances)."""
    return step["compute_ms"] + ((step.get("held_ms") or 0.0) if quota else 0.0)


def stretch_loads(busy: list[list[float]]) -> list[float]:
    """Each worker's load over a stretch of BSP steps (``busy[k][i]``: worker i's busy time in step k):
    the median over the steps of its busy time over that step's median (see :func:`settle`)."""
    shares = [[b / max(statistics.median(row), 1e-9) for b in row] for row in busy]
    return [statistics.median(col) for col in zip(*shares, strict=True)]


def settle(steps: list[list[dict[str, Any]]], hl_events: list[dict[str, Any]],
           batch_changes: list[dict[str, Any]], fixed_cost: float = 0.0,
           batch_bounds: tuple[float, float | None] = (0.0, None), quota: bool = True) -> list[dict[str, Any]]:
    """Per level change (the start counts as the first, ``from_level`` null): how many compute-time
    decisions the controller took until its split came within :data:`SETTLED` of the balanced step
    time, and how long (the measure the scenario benchmark settles by, on measured times).

    A worker's busy time in a step is its compute and the wait for its CPU beyond that under a CPU
    quota (``held_ms``: a worker under a quota computes at a core's speed until its quota runs out,
    and the wait for the next CFS period lands in the all-reduce, so its compute time alone does not
    show the quota: ``held_ms`` is its compute's CPU at the quota's rate less its wall time; ``dynamic``
    balances the same sum, and records the wait). The steps from one change to the next are cut at
    every compute-time decision into stretches. A stretch's workers' loads are each worker's median,
    over the stretch's full steps (its first step, which carries the change, is left out when it has
    more), of its busy time over its step's median busy time. A BSP step's workers share its moment: a
    host busier at one step slows them all, and is no imbalance; each step's own median takes it out,
    where medians of raw times over a few steps would keep it (each worker's median may fall on a
    different step). The stretch's ``imbalance`` is the time its slowest worker loses against the same
    workers balanced under ``t_i = c_i (b_i + k)`` within ``batch_bounds`` (:func:`balance_loss`; ``k`` is
    ``fixed_cost``, the workload's, in samples, from models fitted on runs' steps: :func:`run_settle`);
    ``spread``, ``max/min - 1`` of the loads, says how far apart they are (a small worker left a little
    fast is a large spread and little time). The change is settled at the first stretch whose imbalance
    is at most SETTLED: ``decisions`` is the number of decisions before it, ``seconds`` the time from
    the change to the start of that stretch. Both are null when no stretch settles before the next
    change or the end of the run. ``imbalance`` and
    ``spread`` are those of the least imbalanced stretch up to the one that settled, which is that one
    (or how near it came, when none did; null when no stretch had a full step). (Decisions taken by other
    reasons, allocation or memory, are not counted; ``static`` settles with 0 or never.)
    """
    n = min(len(s) for s in steps)
    if n == 0:
        return []
    full = max(r["global_batch"] for r in steps[0][:n])
    decided = sorted({c["step"] for c in batch_changes if c.get("reason") == "compute-time"})
    out = []
    for j, ev in enumerate(hl_events):
        start = ev["step"]
        end = min(hl_events[j + 1]["step"] if j + 1 < len(hl_events) else n, n)
        cuts = [d for d in decided if start < d < end]
        bounds = [start, *cuts, end]
        record: dict[str, Any] = {"level": ev["level"], "from_level": ev.get("from_level"), "step": start,
                                  "decisions": None, "seconds": None, "imbalance": None, "spread": None}
        for m in range(len(bounds) - 1):
            ks = [k for k in range(bounds[m], bounds[m + 1]) if steps[0][k]["global_batch"] == full]
            if len(ks) > 1:
                ks = ks[1:]
            if not ks:
                continue
            loads = stretch_loads([[busy_ms(s[k], quota) for s in steps] for k in ks])
            batch = [statistics.median(s[k]["batch"] for k in ks) for s in steps]
            imbalance = round(balance_loss(batch, loads, fixed_cost, batch_bounds), 4)
            if record["imbalance"] is None or imbalance < record["imbalance"]:
                record.update(imbalance=imbalance, spread=round(max(loads) / max(min(loads), 1e-9) - 1, 4))
            if imbalance <= SETTLED:
                began = ev["time"] if m == 0 else steps[0][bounds[m] - 1]["time"]
                record.update(decisions=m, seconds=round(max(began - ev["time"], 0.0), 3))
                break
        out.append(record)
    return out


def balance_loss(batch: list[float], loads: list[float], k: float = 0.0,
                 bounds: tuple[float, float | None] = (0.0, None)) -> float:
    """The slowest worker's load over the load of the same workers balanced, less one: with worker i
    doing ``batch[i]`` samples in ``loads[i]``, its cost per sample is ``c_i = loads[i] / (batch[i] + k)``,
    and balanced, the same global batch is split so that every ``c_i (b_i + k)`` is equal, each ``b_i``
    within ``bounds`` (:func:`~omnilearn.report.ideal.balanced_time`; with ``k`` 0 and no bound binding,
    the split in proportion to the speeds ``batch[i] / loads[i]``)."""
    total = sum(batch)
    if total <= 0 or min(loads) <= 0:
        return 0.0
    c = [t / (b + k) for b, t in zip(batch, loads, strict=True)]
    balanced = balanced_time(c, k, total, bounds[0], bounds[1] or total)
    return max(loads) / balanced - 1 if balanced > 0 else 0.0


def run_settle(steps: list[list[dict[str, Any]]], r0: list[dict[str, Any]], job: JobSpec,
               k_from: dict[str, Any] | None = None) -> dict[str, Any]:
    """A BSP run's ``settle`` (:func:`settle`, within the job's batch bounds) and ``settle_k``: the fixed
    cost it balanced under and where that came from, ``k_from`` (the ``ideal_from`` of
    :func:`~omnilearn.report.ideal.group_ideal`, models fitted over a compare's runs) or else models
    fitted on this run's steps alone (:func:`settle_fixed_cost`)."""
    source = k_from or fit_worker_models([steps], ["this run"]).provenance()
    k = settle_fixed_cost(source)
    control = job.config.control
    bounds = (float(control.min_batch), float(control.max_batch or job.config.train.global_batch))
    records = settle(steps, of_kind(r0, HL_CHANGE), of_kind(r0, BATCH_CHANGE), k, bounds, times_quota(control.policy))
    return {"settle": records, "settle_k": {"k": round(k, 3), "fitted": source["k"], "k_se": source.get("k_se"),
                                            "k_status": source["k_status"],
                                            "runs": [r["run"] for r in source["runs"]]}}


def times_quota(policy: str) -> bool:
    """Whether ``policy``'s controller counts a worker's waits for its CPU quota as its time (the peer
    ``ddp`` has none)."""
    return policy in STEP_DRIVEN and controller_class(policy).times_quota


def settle_fixed_cost(source: dict[str, Any]) -> float:
    """The k a run's settle balances under, from a fit's provenance (``k``, ``k_se``, ``k_status``): the
    fit's k less two standard errors, at least 0. A larger k leaves balance less to gain, so an uncertain
    k does not call a split settled that the data cannot; 0 where the fit gives no k within its range
    (every worker at one batch size, or k at a bound: a few noisy steps can read as time that does not
    grow with the batch)."""
    if source["k_status"] != "fitted" or source.get("k_se") is None:
        return 0.0
    return max(source["k"] - 2 * source["k_se"], 0.0)


def settle_counted(records: list[dict[str, Any]]) -> list[int | None]:
    """The settle records a median is taken over: the level changes, or the start when the level
    never changed (a pinned level: how many decisions from equal batches)."""
    changes = [r for r in records if r.get("from_level") is not None]
    return [r["decisions"] for r in (changes or records[:1])]


def settle_median(records: list[dict[str, Any]]) -> float | None:
    """Median decisions to settle over :func:`settle_counted`, a change that never settled ranking
    above any number: None when the median falls on one (or there is nothing to count)."""
    counted = sorted(settle_counted(records), key=lambda d: (d is None, d or 0))
    if not counted:
        return None
    mid = counted[(len(counted) - 1) // 2], counted[len(counted) // 2]
    return None if mid[0] is None or mid[1] is None else (mid[0] + mid[1]) / 2


def controller_cost(end: dict[str, Any], batch_changes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the controller cost and held: ``controller_overhead_ms`` (its measured milliseconds per
    step, observing and deciding), ``controller_steps_measured`` (the steps it measured: fewer than
    the run's when measuring each would cost more than its budget), ``holds`` (decisions considered that kept the split: count and
    reasons), and ``probe`` (dynamic's start-up probe: its seconds, sizes, the k it measured, and
    ``cut_short``: whether a worker's pass stopped early, where the whole pass would have cost more than
    balancing can win over the job's steps; its times were then not the controller's)."""
    probe = next((b for b in batch_changes if b.get("reason") == "probe"), None)
    return {"controller_overhead_ms": end.get("controller_overhead_ms"),
            "controller_steps_measured": end.get("controller_steps_measured"),
            "holds": end.get("holds"),
            "probe": None if probe is None else {"seconds": probe.get("probe_s"), "sizes": probe.get("sizes"),
                                                 "k": probe.get("overhead"), "batch": probe.get("batch"),
                                                 "cut_short": bool(probe.get("cut_short", False))}}


def summarize(out_dir: Path) -> dict[str, Any]:
    """Build ``summary.json`` for one finished run folder and write it (atomically)."""
    job = JobSpec.load(out_dir / "job.json", out_dir=out_dir)
    cfg = job.config
    if cfg.mode == "asp":
        summary = {**summarize_asp(out_dir, job), "restarts": read_records(restarts_path(out_dir))}
        write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
        return summary
    ranks = [read_rank(out_dir, r) for r in job.slots]  # the workers that finished it (survivors, if any was lost)
    steps = [of_kind(recs, STEP) for recs in ranks]
    ends = [(of_kind(recs, END) or [None])[-1] for recs in ranks]
    if any(e is None for e in ends):
        missing = [r for r, e in enumerate(ends) if e is None]
        raise UserError(f"{out_dir}: the run did not finish: no end record for rank(s) "
                        f"{', '.join(map(str, missing))} (stopped or still running)")
    r0 = ranks[0]
    end0 = ends[0]
    train_time = end0["train_time_s"]
    batches = end0["batch"]
    seg = final_segment(steps)
    measured_batches = [s[seg[0]]["batch"] for s in steps] if seg else batches
    compute = [statistics.median(s[k]["compute_ms"] / 1e3 for k in seg) if seg else None for s in steps]
    sync = [statistics.median(s[k]["sync_ms"] for k in seg) if seg else None for s in steps]
    allocations = [s[-1].get("cpus") if s else None for s in steps]
    evals = of_kind(r0, EVAL)
    hl_events = of_kind(r0, HL_CHANGE)
    run_start = end0["time"] - end0["wall_time_s"]
    known = [c for c in compute if c]
    ideal = (sum(b / c for b, c in zip(measured_batches, compute, strict=True))
             if known and len(known) == len(compute) else None)
    summary: dict[str, Any] = {
        **describe(job),
        "global_batch": cfg.train.global_batch,
        "steps": end0["steps"],
        "samples": end0["samples"],
        "wall_time_s": round(end0["wall_time_s"], 3),
        "train_time_s": round(train_time, 3),
        "samples_per_s": round(end0["samples"] / train_time, 3),
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "final_loss": evals[-1]["loss"] if evals else None,
        "final_perplexity": evals[-1].get("perplexity") if evals else None,
        **metric_of(evals),
        "accuracy_curve": eval_curve(evals),
        "epochs_done": round(end0.get("epochs", cfg.train.epochs), 4),
        "stopped_early": bool(end0.get("stopped_early", False)),
        "time_budget_s": cfg.train.time_budget_s,
        "batch_sizes": batches,
        "measured_batch_sizes": measured_batches,
        "measured_steps": [seg[0] + 1, seg[-1] + 1] if seg else None,
        "allocations": allocations,
        "threads": [s[-1].get("threads") if s else None for s in steps],
        "compute_ms": [round(c * 1e3, 2) if c else None for c in compute],
        "sync_ms": [round(s, 2) if s is not None else None for s in sync],
        "imbalance": round(max(known) / min(known) - 1, 4) if known else None,
        "straggler_scores": step_scores(steps),
        "ideal_samples_per_s": round(ideal, 3) if ideal else None,
        "hl_changes": [{"time": round(e["time"] - run_start, 3), "epoch": e["epoch"], "level": e["level"]}
                       for e in hl_events],
        "batch_changes": sum(1 for e in of_kind(r0, BATCH_CHANGE) if e.get("reason") != "initial"),
        **run_settle(steps, r0, job),
        **controller_cost(end0, of_kind(r0, BATCH_CHANGE)),
        "level_speeds": level_fidelity(level_speeds(steps), out_dir, job.plan, [job.plan.targets[s] for s in job.slots]),
        "allocation_changes": change_outcomes(out_dir / "logs"),
        "schedule": job.plan.schedule.name,
        "allreduce_ms": allreduce_ms(steps),
        "links": links_at(job, end0.get("level")),
        "restarts": read_records(restarts_path(out_dir)),
    }
    if summary["probe"] is not None:  # what the run knew: its times at two sizes before step 1 too
        summary["policy_knows"] += (f"; a start-up probe at batch sizes {summary['probe']['sizes']} before step 1"
                                    + (" (cut short: the whole pass would have cost more than balancing can win over "
                                       "the job's steps; its times were not used)" if summary["probe"]["cut_short"]
                                       else ""))
    summary = {**summary, **emulated(out_dir)}
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


EMULATE_KEYS = ("command", "targets", "cpu_seconds", "processes", "busy_seconds", "busy_ratio", "containers")
"""What ``omnilearn emulate`` adds to a run folder's ``summary.json`` that a summary of steps has not
(its ``allocations`` over time are the steps' final ones here; its straggler scores, from busy time,
only stand where the script recorded no steps)."""


def emulated(out_dir: Path) -> dict[str, Any]:
    """What ``omnilearn emulate`` measured around a script that summarizes its own run (omnilearn.torch),
    kept when the summary is rewritten."""
    path = out_dir / "summary.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    return {k: old[k] for k in EMULATE_KEYS if k in old} if old.get("command") == "emulate" else {}


def links_at(job: JobSpec, level: str | None) -> dict[str, str]:
    """The shaped links of the run's last level, per target (none: {})."""
    return {t: k.describe() for t, k in job.plan.links.get(level, {}).items()} if level else {}


RATE_WINDOW = 0.5  # update rates are measured over the last half of the time to the target samples


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), without numpy."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def update_rates(updates: list[dict[str, Any]], workers: list[int], t_from: float, t_to: float) -> list[float]:
    """Updates per second each of ``workers`` (their slots: 1..N unless one was lost) got applied at the server between two times of the server's
    training clock (``elapsed_s``: a resumed run's clock goes on from its checkpoint's, pauses excluded).

    Measured between a worker's first and last update inside the window (``(n - 1) / span``), so a
    window edge falling mid-step does not count a fraction of a step as a whole one.
    """
    times: dict[int, list[float]] = {w: [] for w in workers}
    for u in updates:
        if t_from <= u["elapsed_s"] <= t_to and u["worker"] in times:
            times[u["worker"]].append(u["elapsed_s"])
    return [(len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) >= 2 and ts[-1] > ts[0] else 0.0 for ts in times.values()]


def _mean_of(records: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the records that have it (None if none does)."""
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return round(statistics.fmean(values), 4) if values else None


def summarize_asp(out_dir: Path, job: JobSpec) -> dict[str, Any]:
    """The ASP summary: the keys BSP has, plus update rates and staleness, from the server's records.

    ``update_rates``: updates/s of each worker applied at the server over the last half of the time
    until the target samples were reached (``update_rate_window_s``; the first half holds the
    controller's convergence); ``update_rates_run``: the same over the whole run.
    """
    cfg = job.config
    server = read_rank(out_dir, 0)
    slots = job.slots[1:]  # the workers that finished it (survivors, if one was lost for good)
    workers = [read_rank(out_dir, r) for r in slots]
    end = (of_kind(server, END) or [None])[-1]
    missing = [r for r, recs in zip(slots, workers, strict=True) if not of_kind(recs, END)]
    if end is None or missing:
        ranks = ([0] if end is None else []) + missing
        raise UserError(f"{out_dir}: the run did not finish: no end record for rank(s) "
                        f"{', '.join(map(str, ranks))} (stopped or still running)")
    updates = of_kind(server, UPDATE)
    steps = [of_kind(recs, STEP) for recs in workers]
    evals = read_records(eval_path(out_dir))  # the job scored the server's snapshots after training
    batches = end["batch"]
    # At the batch size of each worker's last steps: a change decided at the very end has no steps yet.
    last = [s[-1]["batch"] if s else 0 for s in steps]
    compute = [_final_compute_s(s, b) for s, b in zip(steps, last, strict=True)]
    comm = [statistics.median([r["sync_ms"] for r in s[-FINAL_WINDOW:]]) if s else None for s in steps]
    known = [c for c in compute if c]
    ideal = (sum(b / c for b, c in zip(last, compute, strict=True))
             if known and len(known) == len(compute) else None)
    t_done = end["done_time_s"]  # on the server's training clock, like train_time_s
    t_from = t_done - RATE_WINDOW * t_done
    rates = update_rates(updates, slots, t_from, t_done)
    rates_run = update_rates(updates, slots, 0.0, end["train_time_s"])
    staleness = [float(u["staleness"]) for u in updates]
    per_worker = [[float(u["staleness"]) for u in updates if u["worker"] == w] for w in slots]
    wall = end["wall_time_s"]
    return {
        **describe(job),
        "global_batch": sum(batches),
        "steps": len(updates),
        "samples": end["samples"],
        "wall_time_s": round(wall, 3),
        "train_time_s": round(end["train_time_s"], 3),
        "samples_per_s": round(end["samples"] / end["train_time_s"], 3),
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "final_loss": evals[-1]["loss"] if evals else None,
        "final_perplexity": evals[-1].get("perplexity") if evals else None,
        **metric_of(evals),
        "accuracy_curve": eval_curve(evals),
        "epochs_done": round(end["epoch"], 4),
        "time_budget_s": cfg.train.time_budget_s,
        "batch_sizes": batches,
        "allocations": [s[-1].get("cpus") if s else None for s in steps],
        "server_allocation": next((e["effective"].get("cpus") for e in reversed(server)
                                   if e.get("kind") in (HL_CHANGE, HL_OUTCOME)), None),
        "threads": [s[-1].get("threads") if s else None for s in steps],
        "compute_ms": [round(c * 1e3, 2) if c else None for c in compute],
        "sync_ms": [round(c, 2) if c is not None else None for c in comm],
        "imbalance": round(max(known) / min(known) - 1, 4) if known else None,
        "straggler_scores": step_scores(steps),
        "ideal_samples_per_s": round(ideal, 3) if ideal else None,
        "hl_changes": [{"time": round(e["elapsed_s"], 3), "epoch": e["epoch"], "level": e["level"]}
                       for e in of_kind(server, HL_CHANGE)],
        "batch_changes": sum(1 for e in of_kind(server, BATCH_CHANGE) if e.get("reason") != "initial"),
        "settle": None,  # BSP only: ASP workers step alone, there is no common step to measure balance on
        **controller_cost(end, of_kind(server, BATCH_CHANGE)),
        "level_speeds": level_fidelity(level_speeds(steps), out_dir, job.plan, [job.plan.targets[s] for s in job.slots]),
        "allocation_changes": change_outcomes(out_dir / "logs"),
        "schedule": job.plan.schedule.name,
        "links": links_at(job, end.get("level")),
        "updates": [sum(1 for u in updates if u["worker"] == w) for w in slots],
        "update_rates": [round(r, 4) for r in rates],
        "update_rate_spread": round(max(rates) / min(rates), 4) if min(rates) > 0 else None,
        "update_rate_window_s": [round(t_from, 3), round(t_done, 3)],
        "update_rates_run": [round(r, 4) for r in rates_run],
        "staleness_mean": round(statistics.fmean(staleness), 4) if staleness else None,
        "staleness_p95": _percentile(staleness, 95),
        "staleness_max": max(staleness) if staleness else None,
        "staleness_by_worker": [round(statistics.fmean(v), 4) if v else None for v in per_worker],
        "staleness_time_mean": _mean_of(updates, "staleness_time"),
        "update": cfg.asp.update, "push": cfg.asp.push, "delay_tolerance": cfg.asp.delay_tolerance,
        "second_moment": cfg.asp.second_moment,
        "lr_reference_batch": of_kind(server, START)[-1].get("lr_reference_batch"),
        "staleness_damping": cfg.asp.staleness_damping,
        "duplicates": end.get("duplicates", 0),
    }


def compare(out_dir: Path, runs: dict[str, Path], target: float | None = None, target_fraction: float = 0.95
            ) -> dict[str, Any]:
    """``compare.json``: every summary, each policy against uniform (measured and ideal speed-up), time
    to a target metric (``target``, default ``target_fraction`` of the best final value) and the metric
    at equal wall time.

    BSP: ``ideal_speedup`` and ``ideal_compute_speedup`` (with and without the all-reduce) come from
    per-worker models fitted over all the BSP runs compared, one ideal for every policy, and
    ``ideal_from`` says which runs and steps, and ``k`` (:func:`~omnilearn.report.ideal.group_ideal`);
    ``ideal_speedup_uniform_run`` and ``ideal_compute_speedup_uniform_run`` are the figures from the
    uniform run's raw speeds alone (:func:`~omnilearn.report.ideal.ideal_speedups`). ``level_speeds``:
    the workers' speeds per level from the same models (a summary's are from its own run alone).

    ``ideal_speedup_at_scatter``: the model-based ideal with every worker's own step-to-step scatter in
    both times (what balance can reach when each step waits for the slowest draw).

    ``policies`` holds, for every policy other than uniform, its ``speedup`` (samples/s over
    uniform's), ``fraction_of_ideal`` (of the model-based ideal), ``fraction_of_ideal_at_scatter``,
    ``fraction_of_ideal_uniform_run``
    and ``accuracy_delta``; the reactive ``dynamic``'s are also at the top level (``speedup``,
    ``fraction_of_ideal``, ``accuracy_delta``), as before.
    """
    summaries = {name: json.loads((d / "summary.json").read_text()) for name, d in runs.items()}
    result: dict[str, Any] = {"runs": summaries}
    first = next(iter(summaries.values()))
    metric = main_metric(first)
    result["targets"] = target_report({n: s["accuracy_curve"] for n, s in summaries.items()},
                                      {n: s.get(f"final_{metric}") for n, s in summaries.items()},
                                      metric, target_fraction, target, lower=lower_is_better(first))
    if any(s.get("links") for s in summaries.values()):  # what a slow link cost each policy, per step
        result["allreduce_ms"] = {n: s.get("allreduce_ms") for n, s in summaries.items()}
    if "uniform" not in summaries:
        write_atomic(out_dir / "compare.json", json.dumps(result, indent=2))
        return result
    u = summaries["uniform"]
    if u["mode"] == "asp":  # no synchronous steps to rebalance: compare update rates and staleness
        for key in ("update_rate_spread", "staleness_mean", "staleness_p95", "final_accuracy"):
            result[key] = {name: s.get(key) for name, s in summaries.items()}
    else:
        result.update(group_ideal(runs) or {})
        for name in (result.get("ideal_from") or {}).get("runs", []):  # settled against the group's k too
            folder = Path(runs[name["run"]])
            job = JobSpec.load(folder / "job.json", out_dir=folder)
            ranks = [read_rank(folder, r) for r in job.slots]
            summaries[name["run"]].update(run_settle([of_kind(r, STEP) for r in ranks], ranks[0], job,
                                                     result["ideal_from"]))
        old = ideal_speedups(runs["uniform"])
        if old:
            result["ideal_speedup_uniform_run"], result["ideal_compute_speedup_uniform_run"] = old
    per: dict[str, dict[str, Any]] = {}
    for name, d in summaries.items():
        if name == "uniform":
            continue
        entry: dict[str, Any] = {"speedup": round(d["samples_per_s"] / u["samples_per_s"], 4)}
        for key in ("", "_at_scatter", "_uniform_run"):
            if result.get(f"ideal_speedup{key}"):
                entry[f"fraction_of_ideal{key}"] = round(entry["speedup"] / result[f"ideal_speedup{key}"], 4)
        if u.get("final_accuracy") is not None and d.get("final_accuracy") is not None:
            entry["accuracy_delta"] = round(d["final_accuracy"] - u["final_accuracy"], 4)
        per[name] = entry
    result["policies"] = per
    result.update(per.get("dynamic", {}))
    write_atomic(out_dir / "compare.json", json.dumps(result, indent=2))
    return result
