"""omnilearn bench as a command: a bad matrix stops it with status 2; a tiny matrix runs and resumes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import yaml
from test_bench import write_matrix

REQUIRED = ("mode", "policy", "level", "seed", "wall_time_s", "samples_per_s", "fraction_of_ideal", "final_metric",
            "time_to_target_s", "imbalance")


def test_a_bad_matrix_stops_the_bench_with_status_2(tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, "modes: {bsp: {config: bsp.yaml, policies: [uniform, fastest]}}\nlevels: [SKEW]\n")
    r = subprocess.run([sys.executable, "-m", "omnilearn", "bench", "--out", str(tmp_path / "out"), "--matrix",
                        str(matrix)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"omnilearn: error: {matrix}: modes.bsp") and "fastest" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def _bench(out: Path, matrix: Path, *extra: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "omnilearn", "bench", "--out", str(out), "--matrix", str(matrix),
                        "--no-progress", *extra], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_bench_runs_a_tiny_matrix_and_resumes(tmp_path: Path) -> None:
    matrix, out = write_matrix(tmp_path), tmp_path / "out"
    _bench(out, matrix, "--tensorboard")
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["policy"]) for r in rows] == [("bsp", "uniform"), ("bsp", "dynamic"), ("bsp", "ddp"),
                                                        ("asp", "uniform")]
    assert set(REQUIRED) <= set(rows[0])
    budget = yaml.safe_load(matrix.read_text())["time_budget_s"]
    for r in rows:  # the budget, not the 500 epochs, ended every run, BSP and ASP alike
        assert budget <= float(r["wall_time_s"]) < 60 and float(r["epochs"]) < 500, r
        assert r["final_metric"] and r["level"] == "SKEW" and r["seed"] == "1"
    for mode in ("bsp", "asp"):  # the target is 95% of the best final metric: the best run reached it
        best = max((r for r in rows if r["mode"] == mode), key=lambda r: float(r["final_metric"]))
        assert float(best["time_to_target_s"]) <= float(best["wall_time_s"]), best
    assert rows[0]["fraction_of_ideal"] and not rows[3]["fraction_of_ideal"]  # no ideal balance for ASP
    md = (out / "results.md").read_text()
    assert "## BSP · SKEW" in md and "| `ddp` | 1 |" in md and "## ASP · SKEW" in md
    for name in ("time_reduction.png", "metric_vs_time.png", "cores_batch-bsp-SKEW.png"):
        assert (out / name).stat().st_size > 10_000, name
    assert json.loads((out / "results.json").read_text())["runs"][2]["policy"] == "ddp"
    # TensorBoard: the launcher wrote every worker's batch sizes and the held-out metric
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ddp = out / "bsp/SKEW/ddp/seed-1/tensorboard"
    main_events = EventAccumulator(str(ddp)).Reload()
    assert {"train/loss", "eval/accuracy"} <= set(main_events.Tags()["scalars"])
    batch = EventAccumulator(str(ddp / "batch_worker2")).Reload().Scalars("batch")
    values = [e.value for e in batch]  # equal batches, B / 2, but in an epoch's partial last step
    assert len(values) > 3 and max(values) == 32.0 and values.count(32.0) > 0.8 * len(values), values
    assert (out / "asp/SKEW/uniform/seed-1/tensorboard/staleness_aspworker3").is_dir()

    log = out / "bench-log.jsonl"
    assert len(log.read_text().splitlines()) == 4
    done = out / "bsp/SKEW/uniform/seed-1/summary.json"
    before = done.stat().st_mtime_ns
    half = out / "bsp/SKEW/dynamic/seed-1"  # as if the bench was stopped in the middle of this cell
    (half / "summary.json").unlink()
    (half / "leftover").write_text("from the interrupted run")
    r = _bench(out, matrix)
    assert "3 already done, 1 to run" in r.stdout
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 5 and runs[-1]["path"] == "bsp/SKEW/dynamic/seed-1" and runs[-1]["status"] == "done"
    assert not (half / "leftover").exists() and (half / "summary.json").is_file()
    assert done.stat().st_mtime_ns == before
    r = _bench(out, matrix)  # everything done: nothing runs, the table is written again
    assert "4 already done, 0 to run" in r.stdout and len(log.read_text().splitlines()) == 5
