"""Properties of the batching policies and the controller (pure functions, no processes)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

import pytest

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.policies import Bounds
from omnilearn.control.v1 import BatchController
from omnilearn.control.windows import ComputeWindow, StepWindow


def bounds(n: int, lo: int = 1, hi: int | list[int] | None = None, B: int = 128) -> Bounds:
    return Bounds.make(n, lo, hi, B)


@pytest.mark.parametrize("seed", range(50))
def test_split_keeps_sum_and_bounds(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    lo = rng.randint(1, 4)
    B = rng.randint(lo * n, 400)
    his = [rng.randint(lo, B) for _ in range(n)]
    if sum(his) < B:
        his[0] += B - sum(his)
    weights = [rng.choice([0.0, rng.random() * 10, rng.random() * 1000]) for _ in range(n)]
    b = policies.split(weights, B, Bounds(lo, tuple(his)))
    assert sum(b) == B
    assert all(lo <= x <= h for x, h in zip(b, his, strict=True))
    assert all(isinstance(x, int) for x in b)


def test_max_bound_redistributes_to_others() -> None:
    # Worker 0 is 10x faster but can hold at most 40: the rest goes to the others by their speed.
    b = policies.split([10, 1, 1, 2], 128, Bounds(2, (40, 128, 128, 128)))
    assert b[0] == 40
    assert sum(b) == 128
    assert b[3] == pytest.approx(2 * b[1], abs=1)


def test_min_bound_takes_from_others() -> None:
    b = policies.split([1000, 1000, 1000, 0.001], 128, Bounds(8, (128,) * 4))
    assert b[3] == 8
    assert sum(b) == 128


def test_rounding_is_largest_remainder() -> None:
    assert policies.split([1, 1, 1], 100, bounds(3, B=100)) == [34, 33, 33]
    assert sum(policies.split([1, 2, 3, 4, 5, 6, 7], 101, bounds(7, B=101))) == 101


def test_uniform_and_static() -> None:
    assert policies.uniform(4, 128, bounds(4)) == [32, 32, 32, 32]
    # The paper's HL8 scaled to 2 CPUs: 0.25/0.25/0.1667/1.333.
    b = policies.static([0.25, 0.25, 0.1667, 1.3333], 128, bounds(4))
    assert b == [16, 16, 11, 85]  # 128 * share / 2.0, rounded by largest remainder


def test_deadband_suppresses_small_changes() -> None:
    batch = [32, 32, 32, 32]
    assert policies.dynamic(batch, [1.0, 1.02, 0.99, 1.03], 128, bounds(4), deadband=0.05) == batch
    moved = policies.dynamic(batch, [1.0, 1.02, 0.99, 1.5], 128, bounds(4), deadband=0.05)
    assert moved != batch and sum(moved) == 128 and moved[3] < 32


def test_fixed_point_is_proportional_to_throughput() -> None:
    # If t_i = b_i / s_i, one decision lands on b_i proportional to s_i (up to rounding).
    speeds = [10.0, 20.0, 30.0, 60.0]
    batch = [30, 30, 30, 30]
    new = policies.dynamic(batch, [b / s for b, s in zip(batch, speeds, strict=True)], 120, bounds(4, B=120))
    assert new == [10, 20, 30, 60]
    again = policies.dynamic(new, [b / s for b, s in zip(new, speeds, strict=True)], 120, bounds(4, B=120),
                             deadband=0.01)
    assert again == new


def measured(ctl: BatchController, times: list[float], steps: int = 1) -> BatchController:
    """Feed ``steps`` identical BSP steps of these compute times."""
    for _ in range(steps):
        ctl.observe_step(times)
    return ctl


def simulate(speeds: list[float], k: float, B: int, steps: int, noise: float, seed: int = 0,
             fit: bool = True, change_at: int | None = None, new_speeds: list[float] | None = None,
             common: float = 0.0) -> tuple[BatchController, list[float], list[int]]:
    """Drive the controller as the BSP trainer does, against simulated workers with t = (b + k) / s:
    a fixed per-step cost of k samples' worth (update step, framework) that scales with each worker's
    speed like its per-sample work, times per-worker noise and a factor common to the step (a busy
    host). Every worker's time is observed after every step. At ``change_at`` the speeds become
    ``new_speeds`` and nobody is told. Returns the controller, the per-step imbalance and the steps
    after which batches changed."""
    rng = random.Random(seed)
    ctl = BatchController(ControlConfig(policy="dynamic-v1", fit_overhead=fit), global_batch=B,
                          bounds=bounds(len(speeds), 2, B=B))
    history, changed = [], []
    for step in range(1, steps + 1):
        if step == change_at:
            speeds = new_speeds or speeds
        host = 1 + rng.uniform(0, common)
        times = [(b + k) / s * host * (1 + rng.uniform(-noise, noise)) for b, s in zip(ctl.batch, speeds, strict=True)]
        ctl.observe_step(times)
        history.append(max(times) / min(times) - 1)
        if ctl.due(step, False) and ctl.decide() is not None:
            changed.append(step)
    return ctl, history, changed


SPEEDS = [16.0, 16.0, 10.0, 62.0]  # HL8-like, samples/s


def test_converges_in_a_few_decisions_on_simulated_speeds() -> None:
    ctl, history, changed = simulate(SPEEDS, 12.0, B=128, steps=24, noise=0.02, common=0.5)
    assert sum(ctl.batch) == 128
    assert history[0] > 2.0  # uniform start: the slow worker takes 3x+ longer
    assert changed[0] == 1  # the first decision after the first step
    assert max(history[changed[1]:]) < 0.12  # balanced after the second decision (k fitted), up to
    assert max(history[-8:]) < 0.05  # the one sample worker 2's 5 lacks, which the evidence then moves
    assert len(changed) <= 3  # and then left alone: noise within the deadband moves nothing
    assert ctl.overhead == pytest.approx(12, abs=3)


def test_fitted_overhead_beats_the_plain_rule_on_fixed_costs() -> None:
    _, fitted, _ = simulate(SPEEDS, 12.0, B=128, steps=8, noise=0.0)
    _, plain, _ = simulate(SPEEDS, 12.0, B=128, steps=8, noise=0.0, fit=False)
    assert fitted[4] < 0.02 < 0.1 < plain[4]  # the plain rule creeps toward balance


def test_a_speed_change_nobody_announces_is_found_and_balanced() -> None:
    # At step 12 worker 0 gets twice its speed and worker 3 half of it; the controller is not told.
    new = [32.0, 16.0, 10.0, 31.0]
    ctl, history, changed = simulate(SPEEDS, 12.0, B=128, steps=24, noise=0.02, change_at=12, new_speeds=new)
    after = [c for c in changed if c >= 12]
    assert after[0] == 13  # two departing steps confirm the change, then it decides
    assert len(after) <= 2  # (a second one may fix rounding, once eight steps back it)
    assert max(history[after[0]:]) < 0.1
    assert ctl.overhead == pytest.approx(12, abs=3)  # the split before the change was evidence too


def test_controller_decision_is_identical_for_identical_inputs() -> None:
    a = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=100, bounds=bounds(3, B=100))
    b = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=100, bounds=bounds(3, B=100))
    assert measured(a, [0.3, 0.9, 0.31]).decide() == measured(b, [0.3, 0.9, 0.31]).decide()
    assert a.batch == b.batch


def test_controller_waits_for_enough_samples() -> None:
    c = BatchController(ControlConfig(policy="dynamic-v1", min_samples=2), global_batch=100, bounds=bounds(2, B=100))
    assert measured(c, [0.1, 0.5]).decide() is None
    assert measured(c, [0.1, 0.5]).decide() is not None
    # After a change the next step carries the new sizes (skipped), then measuring starts again.
    assert measured(c, [0.3, 0.3], steps=2).decide() is None


def test_asp_windows_are_per_worker_and_take_only_the_current_batch() -> None:
    c = BatchController(ControlConfig(policy="dynamic-v1", min_samples=2), global_batch=100, bounds=bounds(2, B=100),
                        synchronous=False)
    for _ in range(2):
        c.observe(0, 50, 0.1)
    assert c.decide() is None  # worker 1 has nothing yet
    c.observe(1, 40, 0.5)  # measured at a batch it no longer has: ignored
    assert c.decide() is None
    c.observe(1, 50, 0.5)
    c.observe(1, 50, 0.5)
    assert c.decide() == [84, 16]  # 0.168 s and 0.16 s: one sample more for worker 1 would take 0.17 s


def test_deadband_widens_with_few_measurements() -> None:
    # A 10% spread is noise with one measurement (0.04 * sqrt(16 / 1) = 0.16), a real imbalance with eight.
    one = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    assert measured(one, [1.0, 1.0, 1.0, 1.1]).decide() is None
    eight = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    assert measured(eight, [1.0, 1.0, 1.0, 1.1], steps=8).decide() is not None


def test_relative_times_ignore_what_slows_every_worker_alike() -> None:
    c = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    for host in (1.0, 1.6, 0.8, 1.3, 1.0, 2.0, 1.0, 1.1):
        c.observe_step([host * t for t in (1.0, 1.0, 1.0, 1.0)])
    assert c.steps.count == 8 and c.regimes() == [0, 0, 0, 0] and c.decide() is None


def test_noisy_steps_need_more_of_them_and_are_no_speed_change() -> None:
    # Steps a few CFS periods long: each worker's time jumps by up to 2x either way from step to step.
    rng = random.Random(3)
    c = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    for _ in range(6):
        c.observe_step([t * math.exp(rng.uniform(-0.7, 0.7)) for t in (1.0, 1.0, 1.0, 1.0)])
    noise = c.steps.noise()
    assert noise is not None and noise > 0.2
    assert c.samples_needed() == 8  # half the window, not one step
    assert c.regimes() == [0, 0, 0, 0]  # jumps within the noise changed nobody's speed
    quiet = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    for host in (1.0, 1.3, 0.9, 1.1):
        quiet.observe_step([host * t * (1 + 0.02 * i) for i, t in enumerate((1.0, 1.0, 1.0, 1.0))])
    assert quiet.samples_needed() == 1
    # Noise of about 6% a step: a 20% spread after one step is within it, after eight it is not.
    c = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    for _ in range(6):
        c.observe_step([t * math.exp(rng.gauss(0, 0.06)) for t in (1.0, 1.0, 1.0, 1.0)])
    noise = c.steps.noise()
    assert noise is not None and 0.03 < noise < 0.12
    assert c.deadband(1) > 0.2 > c.deadband(8) >= 0.04


def test_steps_that_jump_by_a_period_now_and_then_are_noisy() -> None:
    # Steps within 1%, but one in about sixteen a whole CFS period (2x) longer: the median of the
    # step-to-step changes stays near 1%, and a controller trusting it alone would chase every jump.
    rng = random.Random(3)
    c = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    for _ in range(17):
        c.observe_step([t * (1 + rng.uniform(-0.01, 0.01)) * (2.0 if rng.random() < 0.06 else 1.0)
                        for t in (1.0, 1.0, 1.0, 1.0)])
    flat = [abs(d) for row in c.steps.changes for d in row]
    by_median = 1.4826 * statistics.median(flat) / math.sqrt(2)
    assert by_median < 0.015  # what the median alone says
    assert c.steps.noise() > 5 * by_median and c.deadband(8) > 0.15


class Unreadable(Sequence):
    """Allocations that fail the test when anything reads them."""

    def __getitem__(self, i):  # type: ignore[override]
        raise AssertionError("the policy read the allocations")

    def __len__(self) -> int:
        raise AssertionError("the policy read the allocations")


@pytest.mark.parametrize("policy", ["uniform", "dynamic-v1", "paper"])
def test_policies_not_named_for_allocations_never_read_them(policy: str) -> None:
    c = BatchController(policies.effective(ControlConfig(policy=policy), 128, 4), global_batch=128, bounds=bounds(4))

    def read() -> list[float]:
        raise AssertionError("the allocations were read")

    assert c.allocations(read) is None  # the trainers' only way to them
    assert c.initial(Unreadable()) == [32, 32, 32, 32]
    assert c.reallocate(Unreadable()) is None
    measured(c, [1.0, 1.0, 2.0, 0.5], steps=8).decide(Unreadable())


def test_dynamic_decides_alike_whatever_the_allocations() -> None:
    a = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    b = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=128, bounds=bounds(4))
    a.initial([1.0, 1.0, 1.0, 8.0])
    b.initial([8.0, 1.0, 1.0, 1.0])
    for times in ([4.0, 4.0, 6.0, 1.0], [1.2, 1.1, 1.0, 1.3], [1.0, 1.0, 1.0, 1.02]):
        assert measured(a, times, steps=9).decide([1.0, 2.0, 3.0, 4.0]) == \
            measured(b, times, steps=9).decide([4.0, 3.0, 2.0, 1.0])
        assert a.batch == b.batch
    assert a.reallocate([0.1, 0.1, 0.1, 0.1]) is None and b.reallocate([9, 9, 9, 9]) is None


@pytest.mark.parametrize("policy", ["static", "dynamic+prior"])
def test_policies_named_for_allocations_read_them(policy: str) -> None:
    c = BatchController(ControlConfig(policy=policy), global_batch=128, bounds=bounds(4))
    assert c.allocations(lambda: [1.0, 1.0, 1.0, 5.0]) == [1.0, 1.0, 1.0, 5.0]
    assert c.initial([1.0, 1.0, 1.0, 5.0]) == [16, 16, 16, 80]


def test_uniform_never_changes_and_static_follows_allocation() -> None:
    u = BatchController(ControlConfig(policy="uniform"), global_batch=64, bounds=bounds(4, B=64))
    assert not u.due(4, True)
    assert measured(u, [0.1, 0.2, 0.3, 0.4], steps=8).decide(None) is None
    s = BatchController(ControlConfig(policy="static"), global_batch=64, bounds=bounds(4, B=64))
    assert s.initial([1.0, 1.0, 1.0, 5.0]) == [8, 8, 8, 40]
    assert s.decide([2.0, 2.0, 2.0, 2.0]) == [16, 16, 16, 16]


def test_window_skips_first_step_after_change_and_uses_median() -> None:
    w = ComputeWindow(size=3, skip=1)
    w.add(10.0)  # the step right after a change: dropped
    assert w.count == 0
    for t in (1.0, 1.2, 9.0, 1.1):
        w.add(t)
    assert w.count == 3
    assert w.estimate() == pytest.approx(1.2)  # median of 1.2, 9.0, 1.1
    w.reset()
    w.add(5.0)
    assert w.estimate() is None


def test_set_bounds_resplits_when_violated() -> None:
    c = BatchController(ControlConfig(policy="dynamic-v1"), global_batch=120, bounds=bounds(3, B=120), batch=[20, 20, 80])
    assert c.set_bounds(Bounds(2, (120, 120, 50))) is not None
    assert c.batch[2] == 50 and sum(c.batch) == 120


def test_imbalance() -> None:
    assert policies.imbalance([1.0, 1.0]) == 0
    assert policies.imbalance([1.0, 1.5]) == pytest.approx(0.5)


def test_allocation_prior_starts_and_follows_level_changes() -> None:
    c = BatchController(ControlConfig(policy="dynamic+prior"), global_batch=120, bounds=bounds(3, B=120))
    assert c.initial([1.0, 1.0, 4.0]) == [20, 20, 80]
    # Measured: worker 2 is slower than its share says (t = b / s with s = 10, 10, 30).
    assert measured(c, [2.0, 2.0, 80 / 30], steps=8).decide([1.0, 1.0, 4.0]) == [24, 24, 72]
    # A new level doubles worker 0's CPU: its measured speed is expected to double.
    assert c.reallocate([2.0, 1.0, 4.0]) == [40, 20, 60]
    assert c.speeds is None  # measured under the old allocation
    unknown = BatchController(ControlConfig(policy="dynamic+prior"), global_batch=120, bounds=bounds(3, B=120))
    assert unknown.initial([None, None, None]) == [40, 40, 40]  # no allocation known: equal start


def test_window_notices_a_speed_change_and_drops_a_lone_outlier() -> None:
    w = ComputeWindow(size=8, skip=0, change=0.15)
    for t in (1.0, 1.02, 0.98):
        assert not w.add(t)
    assert not w.add(1.5)  # departs: held back, the estimate is not ready meanwhile
    assert w.count == 0
    assert not w.add(1.01)  # back in line: the 1.5 was an outlier, dropped
    assert w.count == 4 and w.regime == 0
    assert not w.add(0.6)
    assert w.add(0.62)  # a second step departing the same way: a new regime of these two steps
    assert w.regime == 1 and w.times == [0.6, 0.62] and w.count == 2
    assert not w.add(1.4) and not w.add(0.61)  # opposite departures confirm nothing
    assert w.regime == 1


def test_step_window_finds_which_worker_changed_speed() -> None:
    w = StepWindow(workers=3, size=8, skip=0, change=0.15)
    for host in (1.0, 1.3, 0.9):
        assert w.add([host * 1.0, host * 2.0, host * 0.5]) == []
    assert w.add([1.0, 2.0, 1.0]) == [] and w.count == 0  # worker 2 departs: held back
    assert w.add([1.2, 2.4, 1.2]) == [2]  # and again: its speed changed (worker 0 and 1 did not)
    assert w.regimes == [0, 0, 1] and w.count == 2
    est = w.estimates()
    assert est is not None and est[0] / est[2] == pytest.approx(1.0) and est[1] / est[0] == pytest.approx(2.0)


def test_overhead_fit_recovers_the_fixed_cost() -> None:
    # t_i = c_i (b_i + 12) with c = 1/16, 1/16, 1/10, 1/62; the second split also 1.3x slower for all.
    c = [1 / 16, 1 / 16, 1 / 10, 1 / 62]
    b1, b2, b3 = [32, 32, 32, 32], [20, 20, 12, 76], [15, 15, 5, 93]
    t1 = [ci * (b + 12) for ci, b in zip(c, b1, strict=True)]
    t2 = [1.3 * ci * (b + 12) for ci, b in zip(c, b2, strict=True)]
    t3 = [0.9 * ci * (b + 12) for ci, b in zip(c, b3, strict=True)]
    assert policies.fit_overhead([(b1, t1, b2, t2)], cap=128) == pytest.approx(12, abs=0.1)
    assert policies.fit_overhead([(b1, t1, b2, t2), (b2, t2, b3, t3)], cap=128) == pytest.approx(12, abs=0.1)
    assert policies.fit_overhead([(b1, t1, b1, t1)], cap=128) is None  # nothing moved: every k fits
    assert policies.fit_overhead([(b1, t1, [64] * 4, [2 * t for t in t1])], cap=128) is None  # moved alike
    # A speed that changed in between (worker 2 twice as fast) is no evidence: the model misses it.
    t2_changed = [t / 2 if i == 2 else t for i, t in enumerate(t2)]
    assert policies.fit_overhead([(b1, t1, b2, t2_changed)], cap=128) is None
    assert policies.fit_overhead([(b1, t1, b2, t2), (b2, t2, b3, t3), (b1, t1, b2, t2_changed)],
                                 cap=128) == pytest.approx(12, abs=0.1)  # the median of the pairs that fit
    zero = [ci * b for ci, b in zip(c, b2, strict=True)]
    assert policies.fit_overhead([(b1, [ci * b for ci, b in zip(c, b1, strict=True)], b2, zero)], 128) == 0


def test_balanced_equalises_predicted_times_and_keeps_bounds() -> None:
    speeds, k = [10.0, 20.0, 30.0, 60.0], 12.0
    batch = [30, 30, 30, 30]
    times = [(b + k) / s for b, s in zip(batch, speeds, strict=True)]
    new = policies.balanced(batch, times, k, 120, bounds(4, B=120))
    predicted = [(b + k) / s for b, s in zip(new, speeds, strict=True)]
    assert sum(new) == 120 and max(predicted) / min(predicted) - 1 < 0.1
    assert policies.balanced(batch, times, 0.0, 120, bounds(4, B=120)) == [10, 20, 30, 60]  # the paper's rule
    capped = policies.balanced(batch, times, k, 120, Bounds(8, (120, 120, 120, 50)))
    assert capped[3] == 50 and sum(capped) == 120 and min(capped) >= 8


def test_paper_preset_and_rule() -> None:
    eff = policies.effective(ControlConfig(policy="paper", deadband=0.01, interval=3), global_batch=128, workers=4)
    assert (eff.interval, eff.deadband, eff.min_batch, eff.max_batch) == (0, 0.2, 16, 96)  # its [16, 96] at 32
    assert not eff.fit_overhead and eff.change_threshold == 0 and eff.skip_after_change == 0
    assert policies.effective(ControlConfig(policy="dynamic-v1"), 128, 4) == ControlConfig(policy="dynamic-v1")
    b = Bounds(16, (96,) * 4)
    # Every batch would move by less than 20% of its new size: kept.
    assert policies.paper([32, 32, 32, 32], [1.0, 1.0, 1.1, 0.95], 128, b) == [32, 32, 32, 32]
    moved = policies.paper([32, 32, 32, 32], [1.0, 1.0, 2.0, 0.5], 128, b)
    assert sum(moved) == 128 and moved[2] == 16 and moved[3] > 32
    c = BatchController(eff, global_batch=128, bounds=b)
    assert c.due(6, True) and not c.due(5, False) and not c.times_update and not c.relative
    # The mean of the epoch's steps (an outlier counts), then a fresh epoch.
    assert measured(c, [1.0, 1.0, 1.0, 1.0], steps=3).observe_step([1.0, 1.0, 1.0, 5.0]) == []
    assert c.estimates()[0] == [1.0, 1.0, 1.0, 2.0]
    assert c.decide() == [37, 37, 36, 18] and c.estimates() == (None, [0, 0, 0, 0])


def test_a_settled_controller_needs_hysteresis_times_the_deadband_until_a_speed_change() -> None:
    cfg = ControlConfig(policy="dynamic-v1", interval=1, window=4, min_samples=1, deadband=0.04, hysteresis=2.0,
                        change_threshold=0.0, fit_overhead=False, skip_after_change=0)
    c = BatchController(cfg, 64, Bounds(1, (64, 64)), synchronous=False)
    for _ in range(4):  # within the deadband: nothing to do, and now settled
        c.observe(0, 32, 1.00)
        c.observe(1, 32, 1.03)
    assert c.decide() is None and c.settled
    for _ in range(4):  # 6% apart: above the deadband, below twice it: a settled job keeps its split
        c.observe(0, 32, 1.00)
        c.observe(1, 32, 1.06)
    assert c.decide() is None and c.settled
    fresh = BatchController(cfg, 64, Bounds(1, (64, 64)), synchronous=False)
    for _ in range(4):  # the same times to a controller that never settled: it rebalances
        fresh.observe(0, 32, 1.00)
        fresh.observe(1, 32, 1.06)
    assert fresh.decide() is not None and not fresh.settled
    for _ in range(4):  # 20% apart: beyond the hysteresis too
        c.observe(0, 32, 1.00)
        c.observe(1, 32, 1.20)
    assert c.decide() is not None and not c.settled


def test_after_a_quick_first_decision_bsp_waits_for_two_steps_per_split_until_it_knows_its_noise() -> None:
    """A job deciding every other step on one step each never measures its noise and chases it."""
    c = policies.effective(ControlConfig(policy="dynamic-v1"), 120, 3)
    ctl = BatchController(c, 120, bounds(3, B=120))
    ctl.forget(skip=0)
    ctl.observe_step([1.0, 2.0, 4.0])
    assert ctl.decide() is not None  # one step shows a 4x imbalance: the first decision takes it
    assert ctl.samples_needed() == 2 and ctl.steps.noise() is None
    for split in range(3):  # every later split is measured twice, which measures the noise
        for _ in range(c.skip_after_change):
            ctl.observe_step([1.0, 1.0, 1.0])  # the steps after a change are not measured
        ctl.observe_step([1.0, 3.0, 1.0] if split % 2 else [3.0, 1.0, 1.0])  # a jump of a few CFS periods
        assert ctl.decide() is None  # one step at this split: not yet
        ctl.observe_step([1.0, 1.1, 1.0] if split % 2 else [1.1, 1.0, 1.0])
        ctl.decide()
    assert ctl.steps.noise() is not None
