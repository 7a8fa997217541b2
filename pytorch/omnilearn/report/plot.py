"""Figures: a run's batch sizes and compute times per worker over steps, HL changes marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from omnilearn.train.metrics import metrics_path, read_jsonl  # noqa: E402


def _steps(out_dir: Path, rank: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    recs = read_jsonl(metrics_path(out_dir, rank))
    return [r for r in recs if r["kind"] == "step"], [r for r in recs if r["kind"] == "hl_change"]


def _mark_levels(ax, hl_events: list[dict[str, Any]], label: bool) -> None:
    for e in hl_events:
        ax.axvline(e["step"], color="grey", linestyle="--", linewidth=0.8)
        if label:
            ax.annotate(e["level"], xy=(e["step"], 1.0), xycoords=("data", "axes fraction"),
                        xytext=(2, -12), textcoords="offset points", fontsize=8, color="dimgrey")


def plot_run(out_dir: Path, workers: int, title: str, path: Path | None = None) -> Path:
    """``run.png``: batch size (top) and compute time (bottom) of each worker over steps."""
    path = path or out_dir / "run.png"
    fig, (ax_b, ax_t) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    hl_events: list[dict[str, Any]] = []
    for rank in range(workers):
        steps, hl = _steps(out_dir, rank)
        if rank == 0:
            hl_events = hl
        xs = [r["step"] for r in steps]
        ax_b.step(xs, [r["batch"] for r in steps], where="post", label=f"worker{rank + 1}")
        ax_t.plot(xs, [r["compute_ms"] for r in steps], marker=".", markersize=3, linewidth=0.8)
    _mark_levels(ax_b, hl_events, label=True)
    _mark_levels(ax_t, hl_events, label=False)
    ax_b.set_ylabel("local batch size")
    ax_t.set_ylabel("compute time (ms)")
    ax_t.set_xlabel("step")
    ax_b.legend(loc="upper right", fontsize=8, ncol=min(workers, 4))
    ax_b.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(runs: dict[str, Path], summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """``compare.png``: samples processed over wall time, and held-out accuracy, per policy."""
    fig, (ax_s, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    for name, out_dir in runs.items():
        steps, _ = _steps(out_dir, 0)
        if not steps:
            continue
        t0 = steps[0]["time"] - (steps[0]["compute_ms"] + steps[0]["sync_ms"]) / 1e3
        total, xs, ys = 0, [], []
        for r in steps:
            total += r["global_batch"]
            xs.append(r["time"] - t0)
            ys.append(total)
        s = summaries[name]
        ax_s.plot(xs, ys, label=f"{name} ({s['samples_per_s']:.0f} samples/s)")
        curve = s.get("accuracy_curve") or []
        ax_a.plot([c["elapsed_s"] for c in curve], [c["accuracy"] for c in curve], marker="o", label=name)
    ax_s.set_xlabel("wall time (s)")
    ax_s.set_ylabel("training samples processed")
    ax_s.legend()
    ax_a.set_xlabel("wall time (s)")
    ax_a.set_ylabel("held-out accuracy")
    ax_a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
