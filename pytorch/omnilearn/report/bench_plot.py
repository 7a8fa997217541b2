"""The bench's figures: time reduction per level and policy, the metric over wall time, and the cores
and batch size of every worker over the epochs of a dynamic run (the paper's dynamic-HL-routine figure)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from omnilearn.metrics import read_rank  # noqa: E402
from omnilearn.records import START, STEP, of_kind
from omnilearn.report import targets  # noqa: E402

COLORS = {"uniform": "tab:grey", "static": "tab:orange", "dynamic": "tab:blue", "ddp": "tab:red",
          "dynamic+prior": "tab:cyan", "paper": "tab:green"}
DYNAMIC_FAMILY = ("dynamic", "dynamic+prior", "paper")


def _color(policy: str) -> str | None:
    return COLORS.get(policy)


def _ordered(values: list[str]) -> list[str]:
    seen: list[str] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def plot_reduction(rows: list[dict[str, Any]], path: Path) -> Path:
    """Bars of the % training-time reduction over uniform, per level and policy, ± sd over seeds."""
    modes = _ordered([r["mode"] for r in rows])
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.2), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        mine = [r for r in rows if r["mode"] == mode and r["policy"] != "uniform"]
        levels = _ordered([r["level"] for r in mine])
        policies = _ordered([r["policy"] for r in mine])
        width = 0.8 / max(len(policies), 1)
        for j, policy in enumerate(policies):
            xs, means, sds = [], [], []
            for i, level in enumerate(levels):
                vals = [r["time_reduction_pct"] for r in mine if r["level"] == level and r["policy"] == policy
                        and r["time_reduction_pct"] is not None]
                if not vals:
                    continue
                xs.append(i + (j - (len(policies) - 1) / 2) * width)
                means.append(statistics.fmean(vals))
                sds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
            bars = ax.bar(xs, means, width, yerr=sds, capsize=4, label=policy, color=_color(policy))
            ax.bar_label(bars, labels=[f"{m:.0f}%" for m in means], fontsize=8, padding=2)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(levels)), levels)
        ax.set_ylabel("training time reduction over uniform (%)")
        ax.set_title(f"{mode.upper()}: mean ± sd over seeds")
        if policies:
            ax.legend(fontsize=8)
        ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_metric_time(rows: list[dict[str, Any]], path: Path) -> Path:
    """The held-out metric over wall time, one panel per mode and level, a line per run, the target dashed."""
    groups = _ordered([(r["mode"], r["level"]) for r in rows])
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, (mode, level) in zip(axes[0], groups, strict=True):
        mine = [r for r in rows if (r["mode"], r["level"]) == (mode, level)]
        metric = mine[0]["metric"]
        labelled: set[str] = set()
        for r in mine:
            pts = targets.curve_points(r["_curve"], metric)
            if not pts:
                continue
            label = None if r["policy"] in labelled else r["policy"]
            labelled.add(r["policy"])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, linewidth=1,
                    color=_color(r["policy"]), label=label, alpha=0.8)
        if mine[0].get("target") is not None:
            ax.axhline(mine[0]["target"], color="black", linestyle="--", linewidth=0.8, label="target")
        if mine[0].get("equal_time_s"):
            ax.axvline(mine[0]["equal_time_s"], color="dimgrey", linestyle=":", linewidth=0.8, label="equal time")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel(f"held-out {metric}")
        ax.set_title(f"{mode.upper()} · {level} (a line per seed)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def worker_series(run_dir: Path, mode: str, workers: int) -> list[tuple[list[float], list[Any], list[int]]]:
    """Per worker: (epoch positions, CPUs, batch sizes) of every step."""
    out = []
    ranks = range(1, workers + 1) if mode == "asp" else range(workers)
    for rank in ranks:
        recs = read_rank(run_dir, rank)
        steps = of_kind(recs, STEP)
        if mode == "asp":
            xs = [float(r["epoch"]) for r in steps]
        else:  # the batch the controller set: a partial last step of an epoch shows only what was left
            full = max((r["global_batch"] for r in steps), default=0)
            steps = [r for r in steps if r["global_batch"] == full]
            per_epoch = next((r["steps_per_epoch"] for r in recs if r.get("kind") == START), 1)
            xs = [r["step"] / per_epoch for r in steps]
        out.append((xs, [r.get("cpus") for r in steps], [r["batch"] for r in steps]))
    return out


def plot_cores_batch(out: Path, rows: list[dict[str, Any]], mode: str, level: str, path: Path) -> Path | None:
    """Cores (top) and batch size (bottom) per worker over epochs, a column per dynamic policy (first seed)."""
    runs = {}
    for r in rows:
        if (r["mode"], r["level"]) == (mode, level) and r["policy"] in DYNAMIC_FAMILY and r["policy"] not in runs:
            runs[r["policy"]] = r
    if not runs:
        return None
    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 5.5), squeeze=False, sharex="col")
    for j, (policy, r) in enumerate(runs.items()):
        summary = json.loads((out / r["path"] / "summary.json").read_text())
        job_mode = summary["mode"]  # the group's name may be a variant's
        for i, (xs, cpus, batch) in enumerate(worker_series(out / r["path"], job_mode, summary["workers"])):
            name = f"aspworker{i + 2}" if job_mode == "asp" else f"worker{i + 1}"
            if any(c is not None for c in cpus):
                axes[0][j].step(xs, [c if c is not None else float("nan") for c in cpus], where="post", label=name)
            axes[1][j].step(xs, batch, where="post", label=name)
        axes[0][j].set_title(f"{mode.upper()} · {level} · {policy} (seed {r['seed']})")
        axes[0][j].set_ylabel("cores (CPU share)")
        axes[1][j].set_ylabel("local batch size")
        axes[1][j].set_xlabel("epoch")
        for ax in axes[:, j]:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bench(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Every figure of a bench folder; returns their paths."""
    figures = [plot_reduction(rows, out / "time_reduction.png"), plot_metric_time(rows, out / "metric_vs_time.png")]
    for mode, level in _ordered([(r["mode"], r["level"]) for r in rows]):
        fig = plot_cores_batch(out, rows, mode, level, out / f"cores_batch-{mode}-{level}.png")
        if fig is not None:
            figures.append(fig)
    return figures
