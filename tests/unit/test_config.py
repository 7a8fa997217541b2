"""Config loading and validation: every mistake is one clear message, exit status 2, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.spec.levels import load_tables, resolve_level
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.emulator.spec.schedule import load_schedule
from omnilearn.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_defaults_and_file_load(tmp_path: Path) -> None:
    cfg = config.build(write(tmp_path, "workers: 3\ntrain:\n  lr: 1\n  milestones: [2, 4]\n"), [])
    assert cfg.workers == 3 and cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.train.milestones == [2, 4]
    assert cfg.model.name == "resnet18"


def test_overrides_win_over_file(tmp_path: Path) -> None:
    p = write(tmp_path, "train:\n  epochs: 5\n")
    cfg = config.build(p, [config.parse_assignment("train.epochs=2"), ("control.policy", "uniform")])
    assert cfg.train.epochs == 2 and cfg.control.policy == "uniform"


@pytest.mark.parametrize("text, key", [
    ("trian:\n  lr: 1\n", "trian"),
    ("train:\n  lrr: 1\n", "train.lrr"),
    ("train:\n  global_batch: big\n", "train.global_batch"),
    ("train:\n  global_batch: -4\n", "train.global_batch"),
    ("train:\n  epochs: 1.5\n", "train.epochs"),
    ("workers: true\n", "workers"),
    ("control:\n  policy: magic\n", "control.policy"),
    ("control:\n  min_batch: 0\n", "control.min_batch"),
    ("control:\n  prior: allocation\n", "policy dynamic+prior"),  # the oracle start has its own name now
    ("control:\n  change_threshold: 0.1\n", "control.change_threshold: no longer a key"),
    ("control:\n  policy: dynamic-v1\n", "retired; its figures are in results/2026-11-29_2cpu_fresh-clone-bounds.md"),
    ("emulation:\n  backend: kvm\n", "emulation.backend"),
    ("data:\n  download: yes please\n", "data.download"),
    ("train:\n  milestones: [5, 2]\n", "train.milestones"),
    ("train:\n  time_budget_s: 0\n", "train.time_budget_s"),
    ("train:\n  time_budget_s: soon\n", "train.time_budget_s"),
    ("report:\n  tensorboard: 1\n", "report.tensorboard"),
    ("report:\n  target_fraction: 1.5\n", "report.target_fraction"),
    ("report:\n  target: -0.5\n", "report.target"),
    ("mode: asp\ncontrol:\n  policy: ddp\n", "control.policy"),
])
def test_bad_values_name_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        config.build(p, [])
    msg = str(err.value)
    assert str(p) in msg and key in msg, msg


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not valid YAML"):
        config.build(write(tmp_path, "train: [unclosed\n"), [])
    with pytest.raises(UserError, match="not found"):
        config.build(tmp_path / "nope.yaml", [])


def test_hl_missing_from_table() -> None:
    cfg = config.build(None, [("emulation.hl", "HL3")])
    with pytest.raises(UserError, match="HL3.*not in the BSP table"):
        build_plan(cfg, host=[0, 1])


def test_schedule_with_unknown_level(tmp_path: Path) -> None:
    sched = tmp_path / "s.yaml"
    sched.write_text("unit: epoch\npoints:\n  - {at: 0, level: HL1}\n  - {at: 2, level: HL16}\n")
    cfg = config.build(None, [("emulation.schedule", str(sched))])
    with pytest.raises(UserError, match="HL16"):
        build_plan(cfg, host=[0, 1])
    with pytest.raises(UserError, match="unknown schedule"):
        build_plan(config.build(None, [("emulation.schedule", "no-such")]), host=[0, 1])


def test_cpuset_naming_cpus_the_host_lacks(tmp_path: Path) -> None:
    p = write(tmp_path, "workers: 2\nemulation:\n  allocation: cpuset\n  levels:\n    HL1: ['0', '7']\n"
                        "  hl: HL1\n")
    with pytest.raises(UserError) as err:
        build_plan(config.build(p, []), host=[0, 1])
    assert "emulation.levels.HL1" in str(err.value) and "lacks: 7" in str(err.value)


def test_paper_cpusets_on_a_small_host_are_refused() -> None:
    cfg = config.build(None, [("emulation.allocation", "cpuset"), ("emulation.hl", "HL8")])
    with pytest.raises(UserError, match="emulation.allocation.*lacks"):
        build_plan(cfg, host=[0, 1])


def test_two_workers_sharing_a_cpuset(tmp_path: Path) -> None:
    p = write(tmp_path, "workers: 2\nemulation:\n  allocation: cpuset\n  hl: HL1\n"
                        "  levels:\n    HL1: ['0', '0-1']\n")
    with pytest.raises(UserError, match="share CPU 0"):
        build_plan(config.build(p, []), host=[0, 1])


def test_a_quota_on_a_cpuset(tmp_path: Path) -> None:
    p = write(tmp_path, "workers: 2\nemulation:\n  hl: HL8\n  levels:\n"
                        "    HL8: [{cpuset: '0', cpus: 0.125}, {cpuset: '1', cpus: 1, memory: 1G}]\n")
    plan = build_plan(config.build(p, []), host=[0, 1])
    slow, fast = (plan.allocation("HL8", f"worker{i}") for i in (1, 2))
    assert (slow.cpuset, slow.cpus, slow.memory) == ("0", 0.125, None)
    assert (fast.cpuset, fast.cpus, fast.memory) == ("1", 1.0, 2**30)
    assert fast.share / slow.share == pytest.approx(8)


@pytest.mark.parametrize(("entry", "message"), [
    ("{cpuset: '0', cpus: 1.5}", "asks for 1.5 CPUs on cpuset 0, which has 1"),
    ("{cpuset: '0', cpus: 0}", "quota must be positive"),
    ("{cpuset: '7', cpus: 0.5}", "lacks: 7"),
    ("{cpuset: 3, cpus: 0.5}", "cpuset: expected a cpuset string"),
])
def test_a_bad_quota_on_a_cpuset(tmp_path: Path, entry: str, message: str) -> None:
    p = write(tmp_path, f"workers: 2\nemulation:\n  hl: HL8\n  levels:\n    HL8: [{entry}, 1.0]\n")
    with pytest.raises(UserError, match=message) as err:
        build_plan(config.build(p, []), host=[0, 1])
    assert "emulation.levels.HL8" in str(err.value)


def test_quota_scaling_keeps_ratios() -> None:
    table = load_tables()["bsp"]
    workers, server = resolve_level(table, "HL8", 4, "quota", host=[0, 1])
    shares = [a.cpus for a in workers]
    assert shares == pytest.approx([0.25, 0.25, 1 / 6, 4 / 3], abs=1e-3)
    assert max(shares) / min(shares) == pytest.approx(8, rel=1e-2)
    assert sum(shares) == pytest.approx(2, abs=1e-3)
    assert server is None
    asp_workers, asp_server = resolve_level(load_tables()["asp"], "HL8", 4, "quota", host=[0, 1])
    assert asp_server.cpus == pytest.approx(8 / 48 * 2, abs=1e-3)
    assert sum(a.cpus for a in asp_workers) + asp_server.cpus == pytest.approx(2, abs=1e-3)


def test_cpuset_mode_on_a_48_core_host_uses_the_paper_sets() -> None:
    cfg = config.build(None, [("emulation.hl", "HL4")])
    plan = build_plan(cfg, host=list(range(48)))
    assert plan.mode == "cpuset"
    assert [plan.allocation("HL4", f"worker{i}").cpuset for i in (1, 2, 3, 4)] == ["0-8", "9-17", "18-23", "24-47"]


def test_named_schedules() -> None:
    paper = load_schedule("paper")
    assert paper.levels == ("HL1", "HL2", "HL4", "HL8", "HL8", "HL4", "HL2", "HL1")
    assert paper.level_at(0) == "HL1" and paper.level_at(7) == "HL2" and paper.level_at(39) == "HL1"
    assert load_schedule("demo").changes() >= 2


def test_shipped_configs_are_valid() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name in ("levels.yaml", "schedules.yaml", "scenarios.yaml", "asp_scenarios.yaml"):
            continue
        build_plan(config.build(path, []), host=[0, 1])
