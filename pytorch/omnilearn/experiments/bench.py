"""``omnilearn bench``: every cell of a matrix as an ordinary run folder, then one table and its figures.

Cells run one after another, each through the same path as ``omnilearn run``
(:func:`~omnilearn.launch.job.run_job`) into ``OUT/<mode>/<level-or-schedule>/<policy>/seed-<s>/``;
within a level the policies of one seed run back to back, so paired runs see the same host. A cell
is done when its ``summary.json`` exists: a second call skips it, and clears and reruns a cell
folder left half-finished. ``OUT/bench-log.jsonl`` records each cell's time, launch to summary.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from omnilearn.errors import UserError
from omnilearn.experiments.matrix import Cell, Matrix
from omnilearn.files import read_records, write_atomic
from omnilearn.launch.failures import WorkerFailed
from omnilearn.launch.job import check_launcher, run_job
from omnilearn.launch.runfolder import prepare_out
from omnilearn.report.results import write_results
from omnilearn.train.preflight import preflight

LOG = "bench-log.jsonl"


def cell_done(out: Path, cell: Cell) -> bool:
    return (out / cell.path / "summary.json").is_file()


def _log(out: Path, record: dict) -> None:
    with (out / LOG).open("a") as f:
        f.write(json.dumps(record) + "\n")


def run_bench(matrix: Matrix, out: Path, console: Console, show_progress: bool = True) -> int:
    """Run the cells not done yet, then write ``results.*`` and the figures; returns the exit status."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: not a folder")
    todo = [c for c in matrix.cells if not cell_done(out, c)]
    for mode in {c.mode for c in todo}:  # before anything starts: data present, model builds, launcher ready
        first = next(c for c in todo if c.mode == mode)
        check_launcher(first.config)
        preflight(first.config)
    for plan in {id(c.plan): c.plan for c in todo if c.plan.links}.values():
        check_launcher(next(c.config for c in todo if c.plan is plan), plan)  # links: root, tc, the kernel
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "matrix.yaml", f"# {matrix.source}\n{matrix.text}")
    expected = f", about {matrix.expected_minutes:g} min for the whole matrix when measured" \
        if matrix.expected_minutes else ""
    console.print(escape(f"bench {matrix.source}: {len(matrix.cells)} cells, {len(matrix.cells) - len(todo)} "
                         f"already done, {len(todo)} to run{expected} · results in {out}"))
    failures: list[str] = []
    started = time.time()
    bar = Progress(TextColumn("[bold]matrix"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), console=console)
    with bar:
        task = bar.add_task("", total=len(matrix.cells), completed=len(matrix.cells) - len(todo))
        for cell in todo:
            bar.update(task, description=cell.label)
            folder = out / cell.path
            # A cell interrupted earlier starts again from nothing: replaced only if it carries the run marker.
            prepare_out(str(folder), force=True)
            t0 = time.time()
            try:
                summary = run_job(cell.config, cell.plan, folder, console, label=cell.label,
                                  show_progress=show_progress)
            except (WorkerFailed, UserError) as e:
                failures.append(f"{cell.label}: {e}")
                console.print(f"{cell.label}: failed: {e}", style="red", markup=False)
                _log(out, {**cell.describe(), "status": "failed", "seconds": round(time.time() - t0, 1),
                           "time": time.time()})
                bar.advance(task)
                continue
            _log(out, {**cell.describe(), "status": "done", "seconds": round(time.time() - t0, 1),
                       "wall_time_s": summary["wall_time_s"], "time": time.time()})
            console.print(escape(f"{cell.label}: {summary['wall_time_s']:.1f} s, {summary['samples_per_s']:.1f} "
                                 f"samples/s, accuracy {summary.get('final_accuracy') or 0:.3f}"))
            bar.advance(task)
    this_call = time.time() - started
    files = write_results(out, [c.describe() for c in matrix.cells if cell_done(out, c)], {
        "matrix": str(matrix.source), "description": matrix.description,
        "expected_minutes": matrix.expected_minutes, "target_value": matrix.target_value,
        "target_fraction": matrix.target_fraction, "cells": len(matrix.cells),
        "this_call_s": round(this_call, 1), "cells_run_this_call": len(todo),
        "cell_seconds": _cell_seconds(out, matrix)})
    console.print(escape(f"bench: {len(todo)} cells run in {this_call / 60:.1f} min; results: "
                         + ", ".join(str(f) for f in files)))
    if failures:
        console.print(f"{len(failures)} cell(s) failed (run the same command again to retry them):\n"
                      + "\n".join(failures), style="red", markup=False)
        return 1
    return 0


def _cell_seconds(out: Path, matrix: Matrix) -> float:
    """Launch-to-summary time of the matrix's cells, summed over the calls that ran them."""
    paths = {str(c.path) for c in matrix.cells if cell_done(out, c)}
    last: dict[str, float] = {}
    for rec in read_records(out / LOG):
        if rec.get("status") == "done" and rec.get("path") in paths:
            last[rec["path"]] = float(rec["seconds"])
    return round(sum(last.values()), 1)
