"""``omnilearn bench``: the matrix file's checks, the results table, resuming, time budgets, TensorBoard."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.errors import UserError
from omnilearn.launch.matrix import DEFAULT_MATRIX, load_matrix
from omnilearn.report.results import build_rows, markdown, summary_rows

REQUIRED = ("mode", "policy", "level", "seed", "wall_time_s", "samples_per_s", "fraction_of_ideal", "final_metric",
            "time_to_target_s", "imbalance")
JOB = """
mode: {mode}
workers: 2
model: {{name: smallcnn}}
data: {{name: synthetic, image_size: 16, synthetic_size: 512}}
train: {{epochs: 2, global_batch: 64, lr: 0.03, momentum: 0.0}}
control: {{interval: 2, window: 3, min_samples: 2}}
emulation:
  backend: none
  levels: {{SKEW: {levels}}}
"""
MATRIX = """
modes:
  bsp: {config: bsp.yaml, policies: [uniform, dynamic, ddp]}
  asp: {config: asp.yaml, policies: [uniform]}
levels: [SKEW]
seeds: [1]
epochs: 500            # a cap the budget comes before
time_budget_s: 3
"""


def write_matrix(folder: Path, text: str = MATRIX) -> Path:
    (folder / "bsp.yaml").write_text(JOB.format(mode="bsp", levels="[0.5, 1.5]"))
    (folder / "asp.yaml").write_text(JOB.format(mode="asp", levels="[0.5, 0.5, 1.5]"))
    path = folder / "matrix.yaml"
    path.write_text(text)
    return path


def test_default_matrix_is_the_documented_one() -> None:
    m = load_matrix(DEFAULT_MATRIX)
    cells = {(c.mode, c.group, c.policy) for c in m.cells}
    assert cells == {("bsp", "HL8", p) for p in ("uniform", "static", "dynamic", "ddp")} | {
        ("asp", "HL8", p) for p in ("uniform", "dynamic")}
    assert sorted({c.seed for c in m.cells}) == [1, 2, 3] and len(m.cells) == 18
    assert m.expected_minutes and m.expected_minutes <= 25
    assert {c.config.mode for c in m.cells if c.mode == "asp"} == {"asp"}
    assert all(c.config.train.seed == c.seed and c.config.emulation.hl == "HL8" for c in m.cells)


@pytest.mark.parametrize("text, culprit", [
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\ncolour: red\n", "unknown key 'colour'"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform, fastest]}}\nlevels: [SKEW]\n", "control.policy"),
    ("modes: {asp: {config: asp.yaml, policies: [ddp]}}\nlevels: [SKEW]\n", "ddp is a BSP peer"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\n", "levels"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\nlevels: [HL3]\n", "HL3"),
    ("modes: {bsp: {config: nowhere.yaml, policies: [uniform]}}\nlevels: [SKEW]\n", "modes.bsp.config"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\nseeds: [1, one]\n", "seeds"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\ntime_budget_s: -1\n", "time_budget_s"),
    ("modes: {gpu: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\n", "unknown key 'modes.gpu'"),
    ("modes: [bsp]\nlevels: [SKEW]\n", "modes: expected a mapping"),
    ("modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\ntarget: {fraction: 2}\n",
     "target.fraction"),
])
def test_a_bad_matrix_names_the_file_and_the_key(tmp_path: Path, text: str, culprit: str) -> None:
    matrix = write_matrix(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_matrix(matrix)
    assert str(e.value).startswith(f"{matrix}: ") and culprit in str(e.value), e.value


def test_a_links_axis_compares_policies_under_network_heterogeneity(tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, "modes: {bsp: {config: bsp.yaml, policies: [uniform, dynamic]}}\nlevels: [SKEW]\n"
                                    "links: {unshaped: null, slow: {worker1: 100mbit}}\n")
    m = load_matrix(matrix)
    assert [(c.group, c.policy) for c in m.cells] == [("SKEW+unshaped", "uniform"), ("SKEW+unshaped", "dynamic"),
                                                       ("SKEW+slow", "uniform"), ("SKEW+slow", "dynamic")]
    assert m.cells[0].config.emulation.links is None and m.cells[2].config.emulation.links == {"worker1": "100mbit"}
    # backend none: links are checked, not applied
    assert m.cells[2].plan.links == {} and str(m.cells[2].path) == "bsp/SKEW+slow/uniform/seed-1"
    for bad, words in (("links: {slow: {worker9: 100mbit}}", "links slow"), ("links: {}", "names no link setting"),
                       ("links: {slow: {worker1: 100mbps}}", "bytes per second")):
        with pytest.raises(UserError, match=words):
            load_matrix(write_matrix(tmp_path, "modes: {bsp: {config: bsp.yaml, policies: [uniform]}}\n"
                                               f"levels: [SKEW]\n{bad}\n"))


def test_a_bad_matrix_stops_the_bench_with_status_2(tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, "modes: {bsp: {config: bsp.yaml, policies: [uniform, fastest]}}\nlevels: [SKEW]\n")
    r = subprocess.run([sys.executable, "-m", "omnilearn", "bench", "--out", str(tmp_path / "out"), "--matrix",
                        str(matrix)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"omnilearn: error: {matrix}: modes.bsp") and "fastest" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def _fake_cell(out: Path, path: str, mode: str, train_time: float, curve: list[tuple[float, float]],
               metric: str = "accuracy") -> dict:
    folder = out / path
    folder.mkdir(parents=True)
    final = curve[-1][1]
    (folder / "summary.json").write_text(json.dumps({
        "mode": mode, "backend": "none", "epochs": 2, "epochs_done": 2, "samples": 1000, "schedule": "pinned-HL8",
        "wall_time_s": train_time + 1, "train_time_s": train_time, "samples_per_s": 1000 / train_time,
        "final_accuracy": final if metric == "accuracy" else 0.3,
        "final_perplexity": final if metric == "perplexity" else None, "imbalance": 0.5, "batch_changes": 3,
        "accuracy_curve": [{"elapsed_s": t, metric: v, "accuracy": v if metric == "accuracy" else 0.3}
                           for t, v in curve],
        "settle": [{"from_level": None, "level": "HL1", "decisions": 0, "seconds": 0.0},
                   {"from_level": "HL1", "level": "HL8", "decisions": 2, "seconds": 3.0},
                   {"from_level": "HL8", "level": "HL1", "decisions": 4, "seconds": 5.0}]}))
    return {"mode": mode, "group": "HL8", "policy": path.split("/")[2], "seed": int(path[-1]), "path": path}


def test_rows_pair_seeds_and_the_table_gives_mean_and_spread(tmp_path: Path) -> None:
    cells = [_fake_cell(tmp_path, "asp/HL8/uniform/seed-1", "asp", 100, [(50, 0.5), (100, 0.90)]),
             _fake_cell(tmp_path, "asp/HL8/dynamic/seed-1", "asp", 50, [(25, 0.6), (50, 0.92)]),
             _fake_cell(tmp_path, "asp/HL8/uniform/seed-2", "asp", 200, [(100, 0.5), (200, 0.80)]),
             _fake_cell(tmp_path, "asp/HL8/dynamic/seed-2", "asp", 150, [(75, 0.88), (150, 0.95)])]
    rows = build_rows(tmp_path, cells, target_fraction=0.9)
    by = {r["path"]: r for r in rows}
    assert by["asp/HL8/dynamic/seed-1"]["time_reduction_pct"] == 50.0  # paired with uniform seed 1
    assert by["asp/HL8/dynamic/seed-2"]["time_reduction_pct"] == 25.0  # with uniform seed 2, not 1
    assert by["asp/HL8/uniform/seed-2"]["speedup"] == 1.0
    assert rows[0]["target"] == pytest.approx(0.855)  # 0.9 of the best final accuracy, 0.95
    assert by["asp/HL8/dynamic/seed-2"]["time_to_target_s"] == 75
    assert by["asp/HL8/uniform/seed-2"]["time_to_target_s"] is None
    assert rows[0]["equal_time_s"] == 50 and by["asp/HL8/uniform/seed-2"]["metric_at_equal_time"] is None
    assert rows[0]["settle_median"] == 3 and rows[0]["unsettled"] == 0  # over the changes, not the start
    table = {(e["policy"]): e for e in summary_rows(rows)}
    assert table["dynamic"]["time_reduction_pct"]["mean"] == pytest.approx(37.5)
    assert table["dynamic"]["time_reduction_pct"]["sd"] == pytest.approx(17.6777, abs=1e-3)
    assert table["uniform"]["train_time_s"]["mean"] == 150
    md = markdown(rows, {"matrix": "m.yaml", "cells": 4, "cells_run_this_call": 4, "this_call_s": 60,
                         "cell_seconds": 60, "target_fraction": 0.9}, [])
    assert "## ASP · HL8" in md
    assert "| `dynamic` | 2 | 100.0 ± 70.7 | 37.5% ± 17.7% |" in md
    assert "| 62.5 ± 17.7 (2/2) |" in md and "| 100.0 (1/2) |" in md  # over the runs that reached it


def test_lower_perplexity_is_the_better_target(tmp_path: Path) -> None:
    cells = [_fake_cell(tmp_path, "asp/HL8/uniform/seed-1", "asp", 100, [(50, 30.0), (100, 10.0)], "perplexity"),
             _fake_cell(tmp_path, "asp/HL8/dynamic/seed-1", "asp", 50, [(25, 12.0), (50, 9.0)], "perplexity")]
    rows = build_rows(tmp_path, cells, target_fraction=0.9)
    assert rows[0]["metric"] == "perplexity" and rows[0]["target"] == pytest.approx(10.0)
    assert [r["time_to_target_s"] for r in rows] == [100, 50]


def _bench(out: Path, matrix: Path, *extra: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "omnilearn", "bench", "--out", str(out), "--matrix", str(matrix),
                        "--no-progress", *extra], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.slow
def test_bench_runs_a_tiny_matrix_and_resumes(tmp_path: Path) -> None:
    matrix, out = write_matrix(tmp_path), tmp_path / "out"
    _bench(out, matrix, "--tensorboard")
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["policy"]) for r in rows] == [("bsp", "uniform"), ("bsp", "dynamic"), ("bsp", "ddp"),
                                                        ("asp", "uniform")]
    assert set(REQUIRED) <= set(rows[0])
    for r in rows:  # the budget, not the 500 epochs, ended every run, BSP and ASP alike
        assert 3 <= float(r["wall_time_s"]) < 60 and float(r["epochs"]) < 500, r
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


@pytest.mark.parametrize("path", sorted(DEFAULT_MATRIX.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_matrix_loads(tmp_path: Path, path: Path) -> None:
    """Configs, levels, schedules, keys and every policy of every matrix file check out."""
    import yaml

    data = yaml.safe_load(path.read_text())
    for spec in data["modes"].values():
        spec["config"] = str(DEFAULT_MATRIX.parent.parent / spec["config"])
    copy = tmp_path / path.name
    copy.write_text(yaml.safe_dump(data))
    m = load_matrix(copy)
    assert m.cells and m.expected_minutes
    assert "# Run time: " in path.read_text()  # each file says how long it takes, and whether measured
