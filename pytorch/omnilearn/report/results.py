"""The bench's results: one row per run (``results.csv``, ``results.json``) and the table (``results.md``).

Rows are compared within a group: the runs of one mode at one level (or schedule). Each row is
paired with the ``uniform`` run of the same mode, group and seed for its speed-up and time
reduction. The ideal speed-up (BSP only) is one per level and seed: from per-worker models fitted
over all that group's BSP runs, measured on its uniform run's steps
(:func:`~omnilearn.report.ideal.group_ideal`; ``ideal_from`` names the runs, ``ideal_k`` the fixed
cost); the figure from the uniform run's measured worker speeds alone
(:func:`~omnilearn.report.ideal.ideal_speedups`) is kept as ``ideal_speedup_uniform_run``. The
target metric is the matrix's, or by default a share of the best final value among all the group's runs.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnilearn.files import write_atomic
from omnilearn.report import targets
from omnilearn.report.ideal import describe_source, group_ideal, ideal_speedups
from omnilearn.report.summary import lower_is_better, main_metric, settle_counted, settle_median

COLUMNS = ("mode", "policy", "level", "schedule", "seed", "backend", "epochs", "samples", "wall_time_s",
           "train_time_s", "samples_per_s", "speedup", "time_reduction_pct", "ideal_speedup", "fraction_of_ideal",
           "ideal_speedup_at_scatter", "fraction_of_ideal_at_scatter", "ideal_speedup_uniform_run",
           "fraction_of_ideal_uniform_run", "ideal_k", "ideal_from",
           "metric", "final_metric", "accuracy", "perplexity", "target", "time_to_target_s", "equal_time_s",
           "metric_at_equal_time", "imbalance", "batch_changes", "settle_median", "unsettled", "staleness_mean",
           "update_rate_spread", "path")


def _round(v: Any, digits: int = 4) -> Any:
    return round(v, digits) if isinstance(v, float) else v


def _settle(s: dict[str, Any]) -> tuple[float | None, int | None]:
    """Median decisions to settle after a level change, and how many changes never settled."""
    records = s.get("settle") or []
    if not records:
        return None, None
    return settle_median(records), settle_counted(records).count(None)


def build_rows(out: Path, cells: list[dict[str, Any]], target_value: float | None = None,
               target_fraction: float = 0.95) -> list[dict[str, Any]]:
    """One row per finished cell (``cells``: mode, group, policy, seed, path), in the cells' order."""
    summaries = {c["path"]: json.loads((out / c["path"] / "summary.json").read_text()) for c in cells}
    rows = []
    for c in cells:
        s = summaries[c["path"]]
        metric = main_metric(s)
        rows.append({
            "mode": c["mode"], "job_mode": s["mode"], "policy": c["policy"], "level": c["group"],
            "schedule": s.get("schedule"),
            "seed": c["seed"], "backend": s["backend"], "epochs": s.get("epochs_done", s["epochs"]),
            "samples": s["samples"], "wall_time_s": s["wall_time_s"], "train_time_s": s["train_time_s"],
            "samples_per_s": s["samples_per_s"], "metric": metric, "final_metric": s.get(f"final_{metric}"),
            "lower_is_better": lower_is_better(s),
            "accuracy": s.get("final_accuracy"), "perplexity": s.get("final_perplexity"),
            "imbalance": s.get("imbalance"), "batch_changes": s.get("batch_changes"),
            "settle_median": _settle(s)[0], "unsettled": _settle(s)[1], "staleness_mean": s.get("staleness_mean"),
            "update_rate_spread": s.get("update_rate_spread"), "path": c["path"],
            "_curve": s.get("accuracy_curve") or []})
    ideals: dict[tuple[Any, Any], dict[str, Any]] = {}
    for row in rows:
        uniform = next((r for r in rows if r["policy"] == "uniform" and r["seed"] == row["seed"]
                        and r["mode"] == row["mode"] and r["level"] == row["level"]), None)
        for key in ("speedup", "time_reduction_pct", "ideal_speedup", "fraction_of_ideal", "ideal_speedup_at_scatter",
                    "fraction_of_ideal_at_scatter", "ideal_speedup_uniform_run", "fraction_of_ideal_uniform_run",
                    "ideal_k", "ideal_from", "_ideal_from"):
            row[key] = None
        if uniform is None:
            continue
        row["speedup"] = _round(row["samples_per_s"] / uniform["samples_per_s"])
        row["time_reduction_pct"] = _round(100 * (1 - row["train_time_s"] / uniform["train_time_s"]), 2)
        if row["job_mode"] == "bsp":  # the ideal is a balanced synchronous step: no such thing in ASP
            group = (row["level"], row["seed"])
            if group not in ideals:
                ideals[group] = _group_ideal(out, rows, uniform)
            row.update(ideals[group])
            for key in ("", "_at_scatter", "_uniform_run"):
                if row[f"ideal_speedup{key}"]:
                    row[f"fraction_of_ideal{key}"] = _round(row["speedup"] / row[f"ideal_speedup{key}"])
    for group in _groups(rows, lambda r: (r["mode"], r["level"])).values():
        metric = group[0]["metric"]
        report = targets.target_report({r["path"]: r["_curve"] for r in group},
                                       {r["path"]: r["final_metric"] for r in group}, metric, target_fraction,
                                       target_value, lower=group[0]["lower_is_better"])
        for r in group:
            r["target"] = _round(report["target"])
            r["time_to_target_s"] = report["time_to_target_s"][r["path"]]
            r["equal_time_s"] = report["equal_time_s"]
            r["metric_at_equal_time"] = report["metric_at_equal_time"][r["path"]]
    return rows


def _group_ideal(out: Path, rows: list[dict[str, Any]], uniform: dict[str, Any]) -> dict[str, Any]:
    """The ideal of ``uniform``'s (level, seed) group, from all the group's BSP runs, and the old figure."""
    group = {r["policy"]: out / r["path"] for r in rows
             if r["mode"] == uniform["mode"] and r["level"] == uniform["level"] and r["seed"] == uniform["seed"]}
    new = group_ideal(group) or {}
    old = ideal_speedups(out / uniform["path"])
    source = new.get("ideal_from")
    return {"ideal_speedup": new.get("ideal_speedup"), "ideal_speedup_at_scatter": new.get("ideal_speedup_at_scatter"),
            "ideal_speedup_uniform_run": old[0] if old else None,
            "ideal_k": source["k"] if source else None,
            "ideal_from": "+".join(r["run"] for r in source["runs"]) if source else None, "_ideal_from": source}


def _groups(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def mean_sd(values: list[Any]) -> tuple[float | None, float | None, int]:
    known = [float(v) for v in values if v is not None]
    if not known:
        return None, None, 0
    return statistics.fmean(known), (statistics.stdev(known) if len(known) > 1 else None), len(known)


def _pm(values: list[Any], spec: str = ".1f", suffix: str = "") -> str:
    mean, sd, n = mean_sd(values)
    if mean is None:
        return "-"
    text = format(mean, spec) + suffix
    return text + (f" ± {format(sd, spec)}{suffix}" if sd is not None else "")


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mode, level/schedule, policy): means and spreads over seeds (``results.json``'s ``table``)."""
    out = []
    for (mode, level, policy), group in _groups(rows, lambda r: (r["mode"], r["level"], r["policy"])).items():
        entry: dict[str, Any] = {"mode": mode, "level": level, "policy": policy, "runs": len(group),
                                 "seeds": [r["seed"] for r in group], "metric": group[0]["metric"],
                                 "target": group[0].get("target")}
        for key in ("train_time_s", "wall_time_s", "samples_per_s", "time_reduction_pct", "fraction_of_ideal",
                    "final_metric", "time_to_target_s", "metric_at_equal_time", "imbalance", "settle_median",
                    "batch_changes", "staleness_mean", "update_rate_spread", "ideal_speedup",
                    "ideal_speedup_uniform_run", "fraction_of_ideal_uniform_run"):
            mean, sd, n = mean_sd([r.get(key) for r in group])
            entry[key] = {"mean": _round(mean), "sd": _round(sd), "n": n}
        out.append(entry)
    return out


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], figures: list[str]) -> str:
    """``results.md``: how the bench ran, then per mode and level one table of its policies."""
    cell_min = meta.get("cell_seconds", 0) / 60
    expected = meta.get("expected_minutes")
    lines = [f"# Benchmark results: {meta['matrix']}", ""]
    if meta.get("description"):
        lines += [meta["description"].strip(), ""]
    lines += [f"- {len(rows)} of {meta['cells']} runs finished; the cells took {cell_min:.1f} min launch to summary"
              + (f" (the matrix file expects about {expected:g} min)" if expected else "")
              + f"; the last call ran {meta['cells_run_this_call']} in {meta['this_call_s'] / 60:.1f} min.",
              f"- Written {time.strftime('%Y-%m-%d %H:%M')}; backend {', '.join(sorted({r['backend'] for r in rows}))}.",
              "- **Training time**: wall time of training without the held-out evaluations (`train_time_s`; ASP "
              "evaluates snapshots after the run, so there it is the whole run). Mean ± sd over seeds.",
              "- **Reduction**: 1 − time / time of `uniform` with the same seed, mean ± sd over those pairs. "
              "**Of ideal**: speed-up over `uniform` / the speed-up perfect balance would give (BSP only), "
              "from per-worker models `t = c_i (b + k)` fitted over all the BSP runs of the level and seed, "
              "one ideal for every policy (the runs and k are named under each table). **Of ideal (uniform "
              "run)**: the same against the ideal from the uniform run's measured worker speeds alone, "
              "which a policy can exceed in short runs.",
              "- **Time to target**: wall time (evaluations included) of the first evaluation at or past the "
              "target, over the runs that reached it (k/n). **At equal time**: each run's metric at its last "
              "evaluation before the quickest run of the group ended.",
              "- **Imbalance**: max/min − 1 of the workers' compute times at the end. For `ddp` the compute time "
              "includes DDP's all-reduce (overlapped with backward, so the wait for slower workers too): its "
              "imbalance is not comparable with the others'.", ""]
    for (mode, level), group in _groups(rows, lambda r: (r["mode"], r["level"])).items():
        metric, target = group[0]["metric"], group[0].get("target")
        rule = ("given" if meta.get("target_value") is not None else
                f"{meta.get('target_fraction', 0.95):g} of the best final {metric}"
                if targets.higher_is_better(metric, bool(group[0].get("lower_is_better"))) else f"the best final {metric} / {meta.get('target_fraction'):g}")
        lines += [f"## {mode.upper()} · {level}", "",
                  f"Target {metric}: {target if target is not None else '-'} ({rule}); equal time "
                  f"{group[0].get('equal_time_s') or 0:.1f} s.", ""]
        cols = ["policy", "runs", "training time (s)", "reduction vs uniform", "of ideal", "of ideal (uniform run)",
                f"final {metric}",
                "time to target (s)", f"{metric} at equal time", "imbalance", "decisions to settle"]
        asp = group[0]["job_mode"] == "asp"
        if asp:
            cols += ["staleness mean", "update-rate spread"]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for policy, runs in _groups(group, lambda r: r["policy"]).items():
            reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
            cells = [f"`{policy}`", str(len(runs)), _pm([r["train_time_s"] for r in runs]),
                     "-" if policy == "uniform" else _pm([r["time_reduction_pct"] for r in runs], ".1f", "%"),
                     _pm([r["fraction_of_ideal"] for r in runs], ".2f"),
                     _pm([r["fraction_of_ideal_uniform_run"] for r in runs], ".2f"),
                     _pm([r["final_metric"] for r in runs], ".3f" if metric == "accuracy" else ".2f"),
                     f"{_pm(reached)} ({len(reached)}/{len(runs)})",
                     _pm([r["metric_at_equal_time"] for r in runs], ".3f" if metric == "accuracy" else ".2f"),
                     _pm([r["imbalance"] for r in runs], ".2f"), _pm([r["settle_median"] for r in runs], ".1f")]
            if asp:
                cells += [_pm([r["staleness_mean"] for r in runs], ".2f"),
                          _pm([r["update_rate_spread"] for r in runs], ".2f")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += _ideal_lines(group)
    if figures:
        lines += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures] + [""]
    return "\n".join(lines)


def _ideal_lines(group: list[dict[str, Any]]) -> list[str]:
    """Per seed: the ideal, where it came from, and the uniform run's figure beside it."""
    lines = []
    for r in group:
        if r["policy"] != "uniform" or r["ideal_speedup_uniform_run"] is None and r["_ideal_from"] is None:
            continue
        new = (f"{r['ideal_speedup']:.2f}x from {describe_source(r['_ideal_from'])}" if r["_ideal_from"]
               else "none from per-worker models")
        old = r["ideal_speedup_uniform_run"]
        lines.append(f"- Ideal speed-up, seed {r['seed']}: {new}; from the uniform run's measured speeds alone "
                     + (f"{old:.2f}x." if old is not None else "-."))
    return lines + [""] if lines else []


def write_results(out: Path, cells: list[dict[str, Any]], meta: dict[str, Any]) -> list[Path]:
    """``results.csv``, ``results.json``, the figures and ``results.md`` in ``out``; returns their paths."""
    from omnilearn.report.bench_plot import plot_bench

    rows = build_rows(out, cells, meta.get("target_value"), meta.get("target_fraction", 0.95))
    public = [{k: r.get(k) for k in COLUMNS} for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in public)
    write_atomic(out / "results.csv", buf.getvalue())
    write_atomic(out / "results.json", json.dumps({"meta": meta, "runs": public, "table": summary_rows(rows)},
                                                  indent=2))
    figures = plot_bench(out, rows) if rows else []
    write_atomic(out / "results.md", markdown(rows, meta, [str(f) for f in figures]))
    return [out / "results.md", out / "results.csv", out / "results.json", *figures]
