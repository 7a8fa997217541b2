"""Calibration: the speed curve, quotas that hit the nominal ratios within the host, the file that
``emulation.calibration`` reads, and a tiny real ``omnilearn calibrate``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from omnilearn import config
from omnilearn.emulator.spec.calibration import (
    FORMAT,
    MIN_CPUS,
    SpeedCurve,
    calibrated_levels,
    fit_allreduce,
    fit_curve,
    fit_level,
    ratio,
)
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError

# Alone, 1 thread scales linearly to one CPU (100 samples/s per CPU); above it a second thread adds
# half as much: what this host measured for ResNet18, roughly.
CURVE = SpeedCurve((0.25, 0.5, 1.0, 1.3333, 2.0), (25.0, 50.0, 100.0, 116.7, 150.0))


def test_the_curve_interpolates_inverts_and_saturates() -> None:
    assert CURVE.at(0.125) == pytest.approx(12.5)  # through the origin below the first point
    assert CURVE.at(0.75) == pytest.approx(75.0) and CURVE.at(3.0) == 150.0  # flat above the last
    for cpus in (0.1, 0.3, 0.9, 1.2, 1.9):
        assert CURVE.inverse(CURVE.at(cpus)) == pytest.approx(cpus)
    assert CURVE.inverse(151) == math.inf
    assert CURVE.scaled(0.5).at(1.0) == pytest.approx(50.0)


def test_fit_keeps_a_workers_own_thread_count_and_never_falls() -> None:
    ms = [{"cpus": 0.5, "threads": 1, "samples_per_s": 50}, {"cpus": 1.5, "threads": 1, "samples_per_s": 99},
          {"cpus": 1.5, "threads": 2, "samples_per_s": 120}, {"cpus": 1.0, "threads": 1, "samples_per_s": 101},
          {"cpus": 2.0, "threads": 2, "samples_per_s": 118}]  # noise: less at 2 CPUs than at 1.5
    curve = fit_curve(ms)
    assert curve.cpus == (0.5, 1.0, 1.5, 2.0) and curve.speed == (50, 101, 120, 120)


def test_a_calibrated_level_hits_the_nominal_ratio_within_the_host() -> None:
    nominal = [0.25, 0.25, 0.1667, 1.3333]  # HL8 on 2 CPUs
    at_nominal = ratio([CURVE.at(s) for s in nominal])
    assert at_nominal < 7.1  # the second thread does not double the speed: nominal quotas give about 7:1
    fit = fit_level([CURVE] * 4, nominal, total_cpus=2)
    speeds = [CURVE.at(q) for q in fit.quotas]
    assert ratio(speeds) == pytest.approx(8.0, rel=0.01) and fit.note is None
    assert sum(fit.quotas) <= 2.0 + 1e-3
    assert [v / s for v, s in zip(speeds, nominal, strict=True)] == pytest.approx([speeds[0] / 0.25] * 4, rel=0.01)


def test_where_the_host_cannot_it_says_so() -> None:
    fit = fit_level([CURVE] * 2, [1.0, 1000.0], total_cpus=2)  # 1000:1 on two CPUs
    assert min(fit.quotas) == MIN_CPUS and "below the kernel's smallest quota" in fit.note
    # More CPU gives nothing above half a CPU: the ratio comes from shrinking the slow worker instead.
    flat = SpeedCurve((0.5, 1.0), (50.0, 50.0))
    fit = fit_level([flat, flat], [0.5, 1.0], 2)
    assert ratio([flat.at(q) for q in fit.quotas]) == pytest.approx(2.0) and fit.quotas[1] <= 0.5


def test_allreduce_lines() -> None:
    ms = [{"workers": 2, "bytes": b, "seconds": 0.001 + b / 1e9} for b in (4e3, 4e6, 4e7)]
    fit = fit_allreduce(ms + [{"workers": 4, "bytes": 4e3, "seconds": 0.01}])
    assert fit["2"]["latency_s"] == pytest.approx(0.001, abs=1e-6)
    assert fit["2"]["bandwidth_bytes_per_s"] == pytest.approx(1e9, rel=1e-3) and "4" not in fit


def _calibration(tmp_path: Path, **job) -> Path:
    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump({
        "format": FORMAT, "job": {"mode": "bsp", "workers": 4, **job},
        "levels": {"HL2": {"quotas": [0.45, 0.45, 0.3, 0.8]}, "HL8": {"quotas": [0.22, 0.22, 0.13, 1.43]}}}))
    return path


def test_emulation_calibration_replaces_the_nominal_table(tmp_path: Path) -> None:
    cal = _calibration(tmp_path)
    cfg = config.build(None, [("emulation.calibration", str(cal)), ("emulation.hl", "HL8")])
    plan = build_plan(cfg, host=[0, 1])
    assert plan.mode == "quota" and plan.allocation("HL8", "worker4") == Allocation(cpus=1.43)
    with pytest.raises(UserError, match="level 'HL4' is not in emulation.calibration"):
        build_plan(config.build(None, [("emulation.calibration", str(cal)), ("emulation.hl", "HL4")]), host=[0, 1])
    with pytest.raises(UserError, match="calibrates bsp with 3 workers; this job is bsp with 4"):
        build_plan(config.build(None, [("emulation.calibration", str(_calibration(tmp_path, workers=3)))]),
                   host=[0, 1])
    with pytest.raises(UserError, match="keep one of them"):
        build_plan(config.build(None, [("emulation.calibration", str(cal)),
                                       ("emulation.levels", {"HL8": [1, 1, 1, 1]})]), host=[0, 1])
    (tmp_path / "other.yaml").write_text("levels: {}\n")
    with pytest.raises(UserError, match="not a calibration file"):
        calibrated_levels(str(tmp_path / "other.yaml"), "bsp", 4, "x")
