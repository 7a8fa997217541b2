"""Printed tables of run summaries."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from omnilearn.report.fidelity import link_note
from omnilearn.report.ideal import describe_source
from omnilearn.report.stragglers import WINDOW_SCANS
from omnilearn.report.summary import SETTLED, settle_counted, settle_median
from omnilearn.report.worker_models import threads_name


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _name(s: dict[str, Any], i: int) -> str:
    return f"aspworker{i + 2}" if s["mode"] == "asp" else f"worker{i + 1}"


STRAGGLER_COLUMNS = ("relative", "individual")
STRAGGLER_NOTE = ("relative: speed over the fastest rank's, individual: speed in its last window over its best window's "
                  "(straggler scores, 0..1)")


def straggler_cells(s: dict[str, Any], i: int) -> list[str]:
    """Rank ``i``'s straggler scores (:mod:`omnilearn.report.stragglers`), as two cells."""
    scores = s.get("straggler_scores") or []
    mine = scores[i] if i < len(scores) else {}
    return [_fmt(mine.get(k), ".2f") for k in STRAGGLER_COLUMNS]


def asp_worker_table(s: dict[str, Any]) -> Table:
    t = Table(title=f"{s['policy']} · ASP · backend {s['backend']} · per worker (server: "
                    f"{_fmt(s.get('server_allocation'), '.3g')} CPU)")
    for col in ("worker", "CPU share", "threads", "batch", "compute ms", "pull+push ms", "updates",
                "updates/s", "staleness", *STRAGGLER_COLUMNS):
        t.add_column(col, justify="right")
    for i in range(s["workers"]):
        t.add_row(_name(s, i), _fmt(s["allocations"][i], ".3g"), _fmt(s["threads"][i]), str(s["batch_sizes"][i]),
                  _fmt(s["compute_ms"][i], ".0f"), _fmt(s["sync_ms"][i], ".0f"), _fmt(s["updates"][i]),
                  _fmt(s["update_rates"][i], ".2f"), _fmt(s["staleness_by_worker"][i], ".1f"), *straggler_cells(s, i))
    t.caption = (f"updates/s over {s['update_rate_window_s'][0]:.0f}-{s['update_rate_window_s'][1]:.0f} s "
                 f"(the last half of the time to the target samples); {STRAGGLER_NOTE}")
    return t


def asp_job_table(summaries: dict[str, dict[str, Any]]) -> Table:
    t = Table(title="job (ASP)")
    t.add_column("policy")
    language = any(s.get("final_perplexity") is not None for s in summaries.values())
    for col in ("wall s", "samples/s", "update-rate spread", "staleness mean", "staleness p95",
                "token accuracy" if language else "accuracy", *(["perplexity"] if language else []), "batch changes"):
        t.add_column(col, justify="right")
    for name, s in summaries.items():
        t.add_row(name, _fmt(s["wall_time_s"], ".1f"), _fmt(s["samples_per_s"], ".1f"),
                  _fmt(s["update_rate_spread"], ".2f"), _fmt(s["staleness_mean"], ".2f"),
                  _fmt(s["staleness_p95"], ".1f"), _fmt(s["final_accuracy"], ".3f"),
                  *([_fmt(s.get("final_perplexity"), ".2f")] if language else []), _fmt(s["batch_changes"]))
    return t


def worker_table(s: dict[str, Any]) -> Table:
    if s["mode"] == "asp":
        return asp_worker_table(s)
    t = Table(title=f"{s['policy']} · {s['mode'].upper()} · backend {s['backend']} · final state per worker")
    for col in ("worker", "CPU share", "threads", "batch", "compute ms", "sync ms", "samples/s", *STRAGGLER_COLUMNS):
        t.add_column(col, justify="right")
    t.caption = STRAGGLER_NOTE
    if s.get("measured_steps"):
        t.caption = f"measured over steps {s['measured_steps'][0]}-{s['measured_steps'][1]}; {STRAGGLER_NOTE}"
    measured = s.get("measured_batch_sizes") or s["batch_sizes"]
    for i in range(s["workers"]):
        b, c, final = measured[i], s["compute_ms"][i], s["batch_sizes"][i]
        t.add_row(f"worker{i + 1}", _fmt(s["allocations"][i], ".3g"), _fmt(s["threads"][i]),
                  str(b) if b == final else f"{b} (then {final})",
                  _fmt(c, ".0f"), _fmt(s["sync_ms"][i], ".0f"), _fmt(b / c * 1e3 if c else None, ".1f"),
                  *straggler_cells(s, i))
    return t


def emulate_table(s: dict[str, Any]) -> Table:
    """``omnilearn emulate`` around a command that recorded no steps: per rank, its CPU and busy time
    and its straggler scores from them."""
    t = Table(title=f"omnilearn emulate · backend {s['backend']} · schedule {s['schedule']} · per rank")
    for col in ("rank", "target", "CPU share", "CPU s", "busy s", *STRAGGLER_COLUMNS):
        t.add_column(col, justify="right")
    busy = s.get("busy_seconds") or [None] * len(s["targets"])
    for i, target in enumerate(s["targets"]):
        last = (s["allocations"][i] or [{}])[-1].get("cpus")
        t.add_row(str(i), target, _fmt(last, ".3g"), _fmt(s["cpu_seconds"][i], ".1f"), _fmt(busy[i], ".1f"),
                  *straggler_cells(s, i))
    t.caption = f"{STRAGGLER_NOTE}; speed: CPU time ran per busy second, over windows of {WINDOW_SCANS} scans"
    return t


def job_table(summaries: dict[str, dict[str, Any]], compare: dict[str, Any] | None) -> Table:
    t = Table(title="job")
    t.add_column("policy")
    language = any(s.get("final_perplexity") is not None for s in summaries.values())
    for col in ("wall s", "train s", "samples/s", "ideal samples/s", "imbalance",
                "token accuracy" if language else "accuracy", *(["perplexity"] if language else []),
                "batch changes"):
        t.add_column(col, justify="right")
    for name, s in summaries.items():
        t.add_row(name, _fmt(s["wall_time_s"], ".1f"), _fmt(s["train_time_s"], ".1f"),
                  _fmt(s["samples_per_s"], ".1f"), _fmt(s["ideal_samples_per_s"], ".1f"),
                  _fmt(s["imbalance"], ".3f"), _fmt(s["final_accuracy"], ".3f"),
                  *([_fmt(s.get("final_perplexity"), ".2f")] if language else []), _fmt(s["batch_changes"]))
    if compare and compare.get("policies"):
        t.caption = "\n".join(ideal_lines(compare))
    return t


def ideal_lines(compare: dict[str, Any]) -> list[str]:
    """Each policy's speed-up and share of the ideal, then where the ideal came from, the uniform run's
    figure beside it."""
    def share(e: dict[str, Any], key: str) -> str | None:
        return f"{e[key]:.0%}" if e.get(key) else None

    lines = []
    for name, e in compare["policies"].items():
        shares = [f"{v} of the ideal" for v in [share(e, "fraction_of_ideal")] if v]
        shares += [f"{v} of the ideal at the workers' scatter" for v in [share(e, "fraction_of_ideal_at_scatter")] if v]
        shares += [f"{v} of the uniform run's" for v in [share(e, "fraction_of_ideal_uniform_run")] if v]
        lines.append(f"speed-up of {name} over uniform: {e['speedup']:.2f}x"
                     + (f" ({'; '.join(shares)})" if shares else ""))
    if compare.get("ideal_from"):
        lines.append(f"ideal from {describe_source(compare['ideal_from'])}: "
                     f"{_fmt(compare.get('ideal_speedup'), '.2f')}x; compute alone would allow "
                     f"{_fmt(compare.get('ideal_compute_speedup'), '.2f')}x; at the workers' own step-to-step "
                     f"scatter (each step waits for the slowest draw) {_fmt(compare.get('ideal_speedup_at_scatter'), '.2f')}x")
    if compare.get("ideal_speedup_uniform_run") is not None:
        lines.append(f"ideal from the uniform run's measured worker speeds alone: "
                     f"{_fmt(compare.get('ideal_speedup_uniform_run'), '.2f')}x; compute alone "
                     f"{_fmt(compare.get('ideal_compute_speedup_uniform_run'), '.2f')}x")
    return lines


def _settled(r: dict[str, Any]) -> str:
    if r["decisions"] is not None:
        return f"{r['decisions']} ({r['seconds']:.1f} s)"
    return "never" if r.get("imbalance") is None else f"never ({r['imbalance']:.2f} at best)"


def settle_line(s: dict[str, Any]) -> str | None:
    """``dynamic settled: start→HL1 0 decisions (0.0 s) · HL1→HL2 1 (7.9 s) · HL2→HL4 never (0.13 at
    best) · ...``: a change that never settled shows the least imbalance it reached."""
    if not s.get("settle"):
        return None
    parts = [f"{r['from_level'] or 'start'}→{r['level']} " + _settled(r) for r in s["settle"]]
    counted, median = settle_counted(s["settle"]), settle_median(s["settle"])
    over = "level changes" if any(r["from_level"] is not None for r in s["settle"]) else "the start"
    tail = f" · median over {over}: " + ("never" if median is None else f"{median:g}")
    if None in counted:
        tail += f" ({counted.count(None)} of {len(counted)} never settled)"
    k = s.get("settle_k") or {}
    model = (f" under t = c (b + k), k = {k['k']:.3g} samples (fitted over {', '.join(k['runs'])}: "
             f"{k['fitted']:.3g} ± {k['k_se']:.2g}, less two standard errors)" if k.get("k") else "")
    return (f"{s['policy']} settled (compute-time decisions until the slowest worker's busy time is within "
            f"{SETTLED:.0%} of the balanced step{model}, time): "
            + " · ".join(parts) + tail)


def level_table(s: dict[str, Any], modelled: dict[str, dict[str, Any]] | None = None) -> Table:
    """Per level: the workers' speeds and the fidelity ratios of the run ``s``; ``modelled``: speeds and
    measured ratios from models fitted over a compare's runs (its ``level_speeds``), in place of the run's own."""
    t = Table(title="measured worker speeds per level (samples/s) and fidelity: nominal vs measured heterogeneity")
    t.add_column("level")
    for i in range(s["workers"]):
        t.add_column(_name(s, i), justify="right")
    for col in ("nominal", "read back", "measured", "measured raw", "as asked", "apply ms"):
        t.add_column(col, justify="right")
    rows = {level: {**row, **(modelled or {}).get(level, {})} for level, row in s["level_speeds"].items()}
    for level, row in rows.items():
        speeds = row.get("samples_per_s") or [None] * s["workers"]
        t.add_row(level, *[_fmt(v, ".1f") for v in speeds], _fmt(row.get("nominal_ratio"), ".2f"),
                  _fmt(row.get("effective_ratio"), ".2f"), _fmt(row["measured_ratio"], ".2f"),
                  _fmt(row.get("measured_ratio_raw"), ".2f"),
                  _fmt(row.get("applied_as_asked"), ".0%"), _fmt(row.get("apply_ms"), ".0f"))
    some = next(iter(rows.values()), {})
    at = (f" at {some['speed_batch']:g} samples per worker, {_k_caption(some)}"
          if some.get("speed_batch") is not None else "")
    t.caption = ("fast/slow ratios: nominal (the plan), read back (the kernel's or Docker's values), measured "
                 f"(samples per second of compute, from per-worker models t = c (b + k) fitted on "
                 f"{'the runs compared' if modelled else 'the run'}{at}), "
                 "measured raw (median b / t of the steps); as asked: changes read back as requested; apply ms: "
                 "request to applied, median")
    return t


def _k_caption(speeds: dict[str, Any]) -> str:
    """``k = 3.1 (fitted)``, or with one k per kind of worker ``k per kind: 1 thread 3.1, 2 threads 12 (fitted)``."""
    kinds = speeds.get("k_by_kind")
    if not kinds:
        return f"k = {speeds['k']:g} ({speeds['k_status']})"
    each = ", ".join(f"{threads_name(g['threads'])} {g['k']:.3g}" for g in kinds)
    return f"k per kind of worker: {each} ({speeds['k_status']})"


def print_report(console: Console, summaries: dict[str, dict[str, Any]], compare: dict[str, Any] | None) -> None:
    for s in summaries.values():
        console.print(worker_table(s))
        if (note := link_note(s)) is not None:
            console.print(f"{s['policy']}: {note}", markup=False)
    last = list(summaries.values())[-1]
    console.print(level_table(last, (compare or {}).get("level_speeds")))
    console.print(asp_job_table(summaries) if last["mode"] == "asp" else job_table(summaries, compare))
    for s in summaries.values():
        if s.get("policy_knows"):
            console.print(f"{s['policy']} knows: {s['policy_knows']}", markup=False)
    for s in (compare or {}).get("runs", summaries).values():  # a compare's: balanced under the group's k
        line = settle_line(s)
        if line and s["policy"] != "uniform":
            console.print(line, markup=False)


def targets_line(t: dict[str, Any]) -> str:
    """Time to the target metric and the metric at equal wall time, per run, in one line."""
    if t.get("target") is None:
        return f"no {t['metric']} recorded: no time to target"
    times = ", ".join(f"{n} {_fmt(v, '.1f')} s" if v is not None else f"{n} not reached"
                      for n, v in t["time_to_target_s"].items())
    equal = ", ".join(f"{n} {_fmt(v, '.4g')}" for n, v in t["metric_at_equal_time"].items())
    return (f"time to {t['metric']} {t['target']:.4g} ({t['target_rule']}): {times}; {t['metric']} at equal "
            f"wall time ({_fmt(t['equal_time_s'], '.1f')} s, the shortest run's last evaluation): {equal}")
