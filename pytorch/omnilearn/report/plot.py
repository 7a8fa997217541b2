"""Figures: a run's batch sizes and compute times per worker over steps, HL changes marked; for a
trace-driven run, each worker's CPU share and batch size over wall time, its stalls shaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from omnilearn.metrics import read_rank  # noqa: E402
from omnilearn.records import HL_CHANGE, STEP, TRAIN_START, UPDATE, of_kind


def _steps(out_dir: Path, rank: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    recs = read_rank(out_dir, rank)
    return of_kind(recs, STEP), of_kind(recs, HL_CHANGE)


def _mark_levels(ax, hl_events: list[dict[str, Any]], label: bool) -> None:
    for e in hl_events:
        ax.axvline(e["step"], color="grey", linestyle="--", linewidth=0.8)
        if label:
            ax.annotate(e["level"], xy=(e["step"], 1.0), xycoords=("data", "axes fraction"),
                        xytext=(2, -12), textcoords="offset points", fontsize=8, color="dimgrey")


def _is_asp(out_dir: Path) -> bool:
    try:
        return json.loads((Path(out_dir) / "job.json").read_text())["config"]["mode"] == "asp"
    except (OSError, KeyError, ValueError):
        return False


def _rolling(updates: list[dict[str, Any]], t0: float, k: int = 5
             ) -> tuple[list[float], list[float], list[float]]:
    """At each of a worker's updates: time, updates/s and mean staleness over its last ``k`` updates."""
    xs, rates, stale = [], [], []
    for i in range(k, len(updates)):
        span = updates[i]["time"] - updates[i - k]["time"]
        xs.append(updates[i]["time"] - t0)
        rates.append(k / span if span > 0 else float("nan"))
        stale.append(sum(u["staleness"] for u in updates[i - k + 1:i + 1]) / k)
    return xs, rates, stale


def plot_run_asp(out_dir: Path, workers: int, title: str, path: Path) -> Path:
    """ASP ``run.png``: per-worker batch size, update rate at the server, and staleness over wall time."""
    server = read_rank(out_dir, 0)
    start = next(r["time"] for r in server if r["kind"] == TRAIN_START)
    updates = of_kind(server, UPDATE)
    hl = [{**e, "step": e.get("elapsed_s", e["time"] - start)} for e in server if e["kind"] == HL_CHANGE]
    fig, (ax_b, ax_r, ax_s) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for w in range(1, workers + 1):
        steps = of_kind(read_rank(out_dir, w), STEP)
        label = f"aspworker{w + 1}"
        ax_b.step([r["time"] - start for r in steps], [r["batch"] for r in steps], where="post", label=label)
        xs, rates, stale = _rolling([u for u in updates if u["worker"] == w], start)
        ax_r.plot(xs, rates, linewidth=0.9)
        ax_s.plot(xs, stale, linewidth=0.9)
    for ax in (ax_b, ax_r, ax_s):
        _mark_levels(ax, hl, label=ax is ax_b)
    ax_r.set_ylabel("updates/s at the server\n(last 5 updates)")
    ax_s.set_ylabel("staleness\n(mean of last 5)")
    ax_s.set_xlabel("wall time (s)")
    return _finish(fig, ax_b, workers, title, path)


def _finish(fig, ax_batch, workers: int, title: str, path: Path) -> Path:
    """The batch-size panel's labels, the title, and the file."""
    ax_batch.set_ylabel("local batch size")
    ax_batch.legend(loc="upper right", fontsize=8, ncol=min(workers, 4))
    ax_batch.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(out_dir: Path, workers: int, title: str, path: Path | None = None) -> Path:
    """``run.png``: batch size (top) and compute time (bottom) of each worker over steps."""
    path = path or out_dir / "run.png"
    if _is_asp(out_dir):
        return plot_run_asp(out_dir, workers, title, path)
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
    ax_t.set_ylabel("compute time (ms)")
    ax_t.set_xlabel("step")
    return _finish(fig, ax_b, workers, title, path)


def plot_trace(out_dir: Path, workers: int, title: str, path: Path | None = None) -> Path:
    """``trace.png``: each worker's CPU share (as read back after each change) and its batch size over
    the wall time of a trace-driven run, the trace's stalls shaded in the worker's colour."""
    path = path or out_dir / "trace.png"
    first = 1 if _is_asp(out_dir) else 0  # ASP: rank 0 is the parameter server
    records = [read_rank(out_dir, r) for r in range(first, first + workers)]
    steps = [of_kind(recs, STEP) for recs in records]
    t0 = min((s[0]["time"] - (s[0]["compute_ms"] + s[0]["sync_ms"]) / 1e3 for s in steps if s), default=0.0)
    fig, (ax_c, ax_b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for i, (recs, mine) in enumerate(zip(records, steps, strict=True)):
        color = f"C{i}"
        xs = [r["time"] - t0 for r in mine]
        ax_c.step(xs, [r.get("cpus") for r in mine], where="post", color=color,
                  label=f"{'aspworker' if first else 'worker'}{i + 1 + first}")
        ax_b.step(xs, [r["batch"] for r in mine], where="post", color=color)
        for e in recs:
            if e["kind"] == HL_CHANGE and e.get("stall_s"):
                for ax in (ax_c, ax_b):
                    ax.axvspan(e["time"] - t0 - e["stall_s"], e["time"] - t0, color=color, alpha=0.2, linewidth=0)
    ax_c.set_ylabel("CPU share (CPUs)")
    ax_c.legend(loc="upper right", fontsize=8, ncol=min(workers, 4))
    ax_c.set_title(title)
    ax_b.set_ylabel("local batch size")
    ax_b.set_xlabel("wall time (s); shaded: a worker stalled")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(runs: dict[str, Path], summaries: dict[str, dict[str, Any]], path: Path) -> Path:
    """``compare.png``: samples processed over wall time, and held-out accuracy, per policy."""
    fig, (ax_s, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    for name, out_dir in runs.items():
        if _is_asp(out_dir):  # samples applied at the server
            recs = read_rank(out_dir, 0)
            updates = of_kind(recs, UPDATE)
            xs, ys = [r["elapsed_s"] for r in updates], [r["samples"] for r in updates]
        else:
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
