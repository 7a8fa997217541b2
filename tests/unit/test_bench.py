"""``omnilearn bench``: the matrix file's checks, the results table, resuming, time budgets, TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnilearn.errors import UserError
from omnilearn.experiments.matrix import DEFAULT_MATRIX, load_matrix
from omnilearn.report.results import build_rows, markdown, summary_rows

JOB = """
mode: {mode}
workers: 2
model: {{name: smallcnn}}
data: {{name: synthetic, image_size: 16, synthetic_size: 512}}
train: {{epochs: 2, global_batch: 64, lr: 0.03, momentum: 0.0}}
control: {{interval: 2}}
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
time_budget_s: 1.5
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
    ("modes: {gpu: {config: bsp.yaml, policies: [uniform]}}\nlevels: [SKEW]\n", "modes.gpu.mode: must be one of bsp, asp"),
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
