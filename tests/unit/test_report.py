"""Reports computed from metrics records: how fast a controller settles after each level change."""

from __future__ import annotations

from typing import Any

import pytest

from omnilearn.report.summary import settle, settle_fixed_cost


def run_records(times: list[list[float]], batch_steps: list[int], levels: list[tuple[int, str]], B: int = 64,
                batch: list[int] | None = None
                ) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Step records of the workers of ``times[k]`` (their compute ms at step k+1, one second per step;
    ``batch``: their batches, default B split equally), level changes ``(steps done, level)`` and
    compute-time decisions after ``batch_steps``."""
    n = len(times[0])
    batch = batch or [B // n] * n
    steps = [[{"step": k + 1, "batch": batch[w], "global_batch": sum(batch), "compute_ms": row[w],
               "time": 100.0 + k + 1} for k, row in enumerate(times)] for w in range(n)]
    hl, previous = [], None
    for at, level in levels:
        hl.append({"step": at, "level": level, "from_level": previous, "time": 100.0 + at})
        previous = level
    changes = [{"step": 0, "reason": "initial"}] + [{"step": s, "reason": "compute-time"} for s in batch_steps]
    return steps, hl, changes


def test_settle_counts_decisions_until_balanced_per_level_change() -> None:
    times = ([[100, 100]] * 4  # HL1: balanced from the start
             + [[100, 300], [100, 300], [100, 130], [100, 130], [100, 104], [100, 104]]  # HL8: 2 decisions
             + [[200, 100], [200, 100], [100, 300], [100, 300]])  # HL2: one decision that overshoots, never
    steps, hl, changes = run_records(times, [6, 8, 12], [(0, "HL1"), (4, "HL8"), (10, "HL2")])
    got = settle(steps, hl, changes)
    assert [(r["from_level"], r["level"]) for r in got] == [(None, "HL1"), ("HL1", "HL8"), ("HL8", "HL2")]
    assert got[0]["decisions"] == 0 and got[0]["seconds"] == 0
    # HL8 at step 4; decisions after steps 6 and 8; the stretch from step 9 on is balanced: it began
    # when step 8 ended, 4 s after the change.
    assert got[1]["decisions"] == 2 and got[1]["seconds"] == pytest.approx(4.0)
    assert got[2]["decisions"] is None and got[2]["seconds"] is None
    # the imbalance of the stretch that settled; of one that never did, the least it reached: 2:1 at
    # first (loads 4/3 and 2/3 of the step's median; balanced, 8/9: a third of the slow load is lost),
    # 3:1 after the overshoot (loads 3/2 and 1/2, balanced 3/4: half lost)
    assert [r["imbalance"] for r in got] == pytest.approx([0.0, 0.02, 0.5], abs=1e-4)
    assert [r["spread"] for r in got] == pytest.approx([0.0, 0.04, 1.0])  # max/min - 1 of the same stretch


def test_settle_judges_the_time_lost_not_the_spread() -> None:
    # A small worker left fast (10 samples in half the others' time) is a spread of 1 but costs the step
    # little: the same speeds (40, 40, 40 and 20 samples a step) balanced do 130 samples in 130/140 of
    # it. A worker as much slower is the step's time: a load of 1.5 against 130/126.7.
    fast = settle(*run_records([[100, 100, 100, 50]] * 3, [], [(0, "HL8")], batch=[40, 40, 40, 10]))[0]
    assert fast["decisions"] == 0 and fast["spread"] == pytest.approx(1.0)
    assert fast["imbalance"] == pytest.approx(140 / 130 - 1, abs=1e-4)
    slow = settle(*run_records([[100, 100, 100, 150]] * 3, [], [(0, "HL8")], batch=[40, 40, 40, 10]))[0]
    assert slow["decisions"] is None and slow["imbalance"] == pytest.approx(1.5 * (120 + 10 / 1.5) / 130 - 1,
                                                                             abs=1e-4)


def test_settle_leaves_out_partial_steps_and_the_first_step_of_a_stretch() -> None:
    times = [[100, 300], [100, 300], [500, 100], [100, 105], [100, 103]]
    steps, hl, changes = run_records(times, [2], [(0, "HL8")])
    steps[0][4]["global_batch"] = steps[1][4]["global_batch"] = 40  # the partial last step of an epoch
    steps[1][4]["compute_ms"] = 900
    got = settle(steps, hl, changes)
    assert got[0]["decisions"] == 1  # step 3 carries the change; step 5 is partial: step 4 decides


def test_settle_counts_the_quota_hold_as_busy_time() -> None:
    """A worker under a CPU quota computes at a core's speed and waits in the all-reduce (``held_ms``):
    balanced compute with one worker held 50 ms a step is not settled, and compute that looks
    imbalanced only by the hold the other worker waited is."""
    steps, hl, changes = run_records([[100, 100]] * 4, [], [(0, "HL8")])
    for r in steps[1]:
        r["held_ms"] = 50.0
    assert settle(steps, hl, changes)[0]["decisions"] is None
    steps, hl, changes = run_records([[150, 100]] * 4, [], [(0, "HL8")])
    for r in steps[1]:
        r["held_ms"] = 48.0
    assert settle(steps, hl, changes)[0]["decisions"] == 0


def test_settle_judges_each_worker_against_its_own_steps_not_the_hosts_busier_moments() -> None:
    """A host busier at one step slows every worker of it alike: a worker's load is its busy time over
    its step's median, so the busier step weighs no more than the others. Worker 3 is 25% under the
    others at step 2 and 25% over at step 3, when the host ran three times slower: its load is even
    (raw medians, weighted by the slow step, would read it 12.5% over). A worker over the others on
    every step still reads over, whatever each step's speed."""
    from omnilearn.report.summary import stretch_loads

    def four(rows: list[list[float]]) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
        steps = [[{"step": k + 1, "batch": 16, "global_batch": 64, "compute_ms": row[w], "time": 101.0 + k}
                  for k, row in enumerate(rows)] for w in range(4)]
        return steps, [{"step": 0, "level": "HL8", "from_level": None, "time": 100.0}]

    steps, hl = four([[500, 100, 100, 100], [100, 100, 100, 75], [300, 300, 300, 375]])
    assert settle(steps, hl, [])[0]["decisions"] == 0
    assert stretch_loads([[100, 100, 100, 75], [300, 300, 300, 375]]) == pytest.approx([1, 1, 1, 1])
    steps, hl = four([[500, 100, 100, 100], [100, 100, 100, 115], [300, 300, 300, 345]])
    assert settle(steps, hl, [])[0]["decisions"] is None
    assert stretch_loads([[100, 100, 100, 115], [300, 300, 300, 345]])[3] == pytest.approx(1.15)


def test_settle_line_names_the_policy_and_the_median_over_level_changes() -> None:
    from omnilearn.report.table import settle_line

    records = [{"from_level": None, "level": "HL1", "decisions": 0, "seconds": 0.0},
               {"from_level": "HL1", "level": "HL8", "decisions": 2, "seconds": 5.0},
               {"from_level": "HL8", "level": "HL2", "decisions": None, "seconds": None},
               {"from_level": "HL2", "level": "HL1", "decisions": 1, "seconds": 2.0}]
    line = settle_line({"policy": "dynamic", "settle": records})
    assert line is not None and line.startswith("dynamic settled")
    assert "HL8→HL2 never" in line  # the start is left out of the median: 1, 2, never
    assert line.endswith("median over level changes: 2 (1 of 3 never settled)")


def test_settle_median_ranks_never_above_any_number_and_falls_back_to_the_start() -> None:
    from omnilearn.report.summary import settle_median

    def rec(frm: str | None, d: int | None) -> dict[str, Any]:
        return {"from_level": frm, "level": "HL8", "decisions": d, "seconds": None if d is None else 1.0}

    assert settle_median([rec(None, 0), rec("HL1", 1), rec("HL8", None), rec("HL4", 3)]) == 3
    assert settle_median([rec(None, 0), rec("HL1", 1), rec("HL8", None), rec("HL4", None)]) is None
    assert settle_median([rec(None, 0), rec("HL1", 1), rec("HL8", 2)]) == 1.5
    assert settle_median([rec(None, 2)]) == 2  # a pinned level: the start is all there is
    assert settle_median([]) is None


def test_settle_balances_under_the_fixed_cost() -> None:
    # t = c (b + k) with k = 100 samples: worker 2 costs three times worker 1 per sample. At 60 and 4
    # samples (160 and 312 time units) the split is as good as the bounds allow: balanced, worker 2 at
    # the least batch (1) takes 3 x 101 = 303 and worker 1 the other 63 (163). Judged as if time were in
    # proportion to batch (k = 0) the same step is 89% slower than balanced.
    times = [[160, 312]] * 3
    with_k = settle(*run_records(times, [], [(0, "HL8")], batch=[60, 4]), fixed_cost=100, batch_bounds=(1, None))[0]
    assert with_k["decisions"] == 0 and with_k["imbalance"] == pytest.approx(312 / 303 - 1, abs=1e-4)
    without = settle(*run_records(times, [], [(0, "HL8")], batch=[60, 4]))[0]
    assert without["decisions"] is None
    assert without["imbalance"] == pytest.approx(312 / (64 / (60 / 160 + 4 / 312)) - 1, abs=1e-4)


def test_settle_takes_the_least_k_the_fit_allows() -> None:
    assert settle_fixed_cost({"k": 150.0, "k_se": 38.0, "k_status": "fitted"}) == pytest.approx(74.0)
    assert settle_fixed_cost({"k": 20.0, "k_se": 15.0, "k_status": "fitted"}) == 0.0
    # k at the top of its range (a few noisy steps whose time did not follow the batch) would call any
    # split balanced; not identified, there is nothing to go on: both judge as time in proportion to batch
    assert settle_fixed_cost({"k": 3072.0, "k_se": None, "k_status": "upper bound"}) == 0.0
    assert settle_fixed_cost({"k": 0.0, "k_se": None, "k_status": "not identified"}) == 0.0
