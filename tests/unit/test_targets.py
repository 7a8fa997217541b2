"""Time to a target metric and the metric at equal wall time, on synthetic evaluation records."""

from __future__ import annotations

import pytest

from omnilearn.report.targets import default_target, equal_time, metric_at, target_report, time_to_target


def curve(*points: tuple[float, float], metric: str = "accuracy") -> list[dict[str, float]]:
    return [{"elapsed_s": t, metric: v, "epoch": i} for i, (t, v) in enumerate(points)]


FAST = curve((10, 0.50), (20, 0.80), (30, 0.90))
SLOW = curve((25, 0.60), (50, 0.85), (75, 0.95))


def test_time_to_target_is_the_first_evaluation_at_or_past_it() -> None:
    assert time_to_target(FAST, "accuracy", 0.80) == 20  # reached exactly counts
    assert time_to_target(FAST, "accuracy", 0.81) == 30
    assert time_to_target(SLOW, "accuracy", 0.81) == 50
    assert time_to_target(FAST, "accuracy", 0.91) is None  # never reached
    assert time_to_target([], "accuracy", 0.5) is None


def test_records_out_of_order_or_without_the_metric_are_handled() -> None:
    shuffled = [FAST[2], {"elapsed_s": 5.0, "accuracy": None}, FAST[0], FAST[1]]
    assert time_to_target(shuffled, "accuracy", 0.8) == 20


def test_perplexity_is_better_lower() -> None:
    ppl = curve((10, 40.0), (20, 12.0), (30, 9.0), metric="perplexity")
    assert time_to_target(ppl, "perplexity", 12.5) == 20
    assert time_to_target(ppl, "perplexity", 8.0) is None
    assert default_target([9.0, 10.0, None], "perplexity", 0.9) == pytest.approx(10.0)  # best / fraction
    assert default_target([0.90, 0.95, None], "accuracy", 0.9) == pytest.approx(0.855)  # best x fraction
    assert default_target([None], "accuracy", 0.9) is None


def test_metric_at_takes_the_last_evaluation_at_or_before() -> None:
    assert metric_at(SLOW, "accuracy", 24.9) is None
    assert metric_at(SLOW, "accuracy", 25) == 0.60
    assert metric_at(SLOW, "accuracy", 49) == 0.60
    assert metric_at(SLOW, "accuracy", 1000) == 0.95


def test_equal_time_is_the_shortest_runs_end() -> None:
    at, values = equal_time({"fast": FAST, "slow": SLOW}, "accuracy")
    assert at == 30
    assert values == {"fast": 0.90, "slow": 0.60}  # the slow run had only its first evaluation by then
    assert equal_time({"none": []}, "accuracy") == (None, {"none": None})


def test_target_report_default_and_given() -> None:
    r = target_report({"fast": FAST, "slow": SLOW}, {"fast": 0.90, "slow": 0.95}, "accuracy", 0.9)
    assert r["target"] == pytest.approx(0.855)
    assert r["time_to_target_s"] == {"fast": 30, "slow": 75}
    assert r["equal_time_s"] == 30 and r["metric_at_equal_time"]["slow"] == 0.60
    given = target_report({"fast": FAST, "slow": SLOW}, {"fast": 0.90, "slow": 0.95}, "accuracy", 0.9, value=0.8)
    assert given["target"] == 0.8 and given["time_to_target_s"] == {"fast": 20, "slow": 50}
    assert given["target_rule"] == "given"


def test_compare_json_holds_time_to_target_and_equal_time(tmp_path) -> None:
    import json

    from omnilearn.report.summary import compare

    runs = {}
    for name, points, rate in (("uniform", SLOW, 100.0), ("dynamic", FAST, 150.0)):
        d = tmp_path / name
        d.mkdir()
        d.joinpath("summary.json").write_text(json.dumps({
            "mode": "asp", "samples_per_s": rate, "final_accuracy": points[-1]["accuracy"],
            "final_perplexity": None, "accuracy_curve": points}))
        runs[name] = d
    result = compare(tmp_path, runs, target=None, target_fraction=0.9)
    t = json.loads((tmp_path / "compare.json").read_text())["targets"]
    assert t == result["targets"]
    assert t["target"] == pytest.approx(0.855) and t["time_to_target_s"] == {"uniform": 75, "dynamic": 30}
    assert t["equal_time_s"] == 30 and t["metric_at_equal_time"] == {"uniform": 0.60, "dynamic": 0.90}
