"""Properties of the batching policies and the controller (pure functions, no processes)."""

from __future__ import annotations

import random

import pytest

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.controller import BatchController, ComputeWindow
from omnilearn.control.policies import Bounds


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


def simulate(speeds: list[float], overhead: list[float], B: int, decisions: int, noise: float,
             seed: int = 0) -> tuple[list[int], list[float]]:
    """Drive the controller against simulated workers with t = a + b / s (plus noise)."""
    rng = random.Random(seed)
    ctl = BatchController(ControlConfig(policy="dynamic", interval=3, window=3, min_samples=2, deadband=0.05,
                                        skip_after_change=1), global_batch=B, bounds=bounds(len(speeds), 2, B=B))
    history = []
    windows = [ComputeWindow(size=3, skip=1) for _ in speeds]  # each rank keeps its own window
    for step in range(1, 3 * decisions + 1):
        times = [(a + b / s) * (1 + rng.uniform(-noise, noise)) for a, b, s in
                 zip(overhead, ctl.batch, speeds, strict=True)]
        for w, t in zip(windows, times, strict=True):
            w.add(t)
        history.append(max(times) / min(times) - 1)
        if ctl.due(step, False):
            new = ctl.decide([w.estimate() for w in windows], [w.count for w in windows], [None] * len(speeds))
            if new is not None:
                for w in windows:
                    w.reset()
    return ctl.batch, history


def test_converges_in_a_few_decisions_on_simulated_speeds() -> None:
    # HL8-like speeds with a fixed per-step overhead (update step, data) that the rule must absorb.
    speeds = [16.0, 16.0, 10.0, 62.0]
    batch, history = simulate(speeds, overhead=[0.05, 0.05, 0.08, 0.02], B=128, decisions=8, noise=0.02)
    assert sum(batch) == 128
    assert history[0] > 2.0  # uniform start: the slow worker takes 3x+ longer
    assert min(history[-6:]) < 0.15  # balanced within a few decisions
    ideal = [128 * s / sum(speeds) for s in speeds]
    assert all(abs(b - i) <= 0.2 * i + 2 for b, i in zip(batch, ideal, strict=True))


def test_controller_decision_is_identical_for_identical_inputs() -> None:
    a = BatchController(ControlConfig(policy="dynamic"), global_batch=100, bounds=bounds(3, B=100))
    b = BatchController(ControlConfig(policy="dynamic"), global_batch=100, bounds=bounds(3, B=100))
    args = ([0.3, 0.9, 0.31], [3, 3, 3], [None, None, None])
    assert a.decide(*args) == b.decide(*args)
    assert a.batch == b.batch


def test_controller_waits_for_enough_samples() -> None:
    c = BatchController(ControlConfig(policy="dynamic", min_samples=2), global_batch=100, bounds=bounds(2, B=100))
    assert c.decide([0.1, 0.5], [1, 3], [None, None]) is None
    assert c.decide([0.1, None], [3, 3], [None, None]) is None
    assert c.decide([0.1, 0.5], [2, 2], [None, None]) is not None


def test_uniform_never_changes_and_static_follows_allocation() -> None:
    u = BatchController(ControlConfig(policy="uniform"), global_batch=64, bounds=bounds(4, B=64))
    assert not u.due(4, True)
    assert u.decide([0.1, 0.2, 0.3, 0.4], [4] * 4, [1, 1, 1, 1]) is None
    s = BatchController(ControlConfig(policy="static"), global_batch=64, bounds=bounds(4, B=64))
    assert s.initial([1.0, 1.0, 1.0, 5.0]) == [8, 8, 8, 40]
    assert s.decide([None] * 4, [0] * 4, [2.0, 2.0, 2.0, 2.0]) == [16, 16, 16, 16]


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
    c = BatchController(ControlConfig(policy="dynamic"), global_batch=120, bounds=bounds(3, B=120), batch=[20, 20, 80])
    assert c.set_bounds(Bounds(2, (120, 120, 50))) is not None
    assert c.batch[2] == 50 and sum(c.batch) == 120


def test_imbalance() -> None:
    assert policies.imbalance([1.0, 1.0]) == 0
    assert policies.imbalance([1.0, 1.5]) == pytest.approx(0.5)


def test_allocation_prior_starts_and_follows_level_changes() -> None:
    c = BatchController(ControlConfig(policy="dynamic"), global_batch=120, bounds=bounds(3, B=120))
    assert c.initial([1.0, 1.0, 4.0]) == [20, 20, 80]
    # Measured: worker 2 is slower than its share says (t = b / s with s = 10, 10, 30).
    assert c.decide([2.0, 2.0, 80 / 30], [3, 3, 3], [1.0, 1.0, 4.0]) == [24, 24, 72]
    # A new level doubles worker 0's CPU: its measured speed is expected to double.
    assert c.reallocate([2.0, 1.0, 4.0]) == [40, 20, 60]
    assert c.speeds is None  # measured under the old allocation
    u = BatchController(ControlConfig(policy="dynamic", prior="uniform"), global_batch=120, bounds=bounds(3, B=120))
    assert u.initial([1.0, 1.0, 4.0]) == [40, 40, 40]
    assert u.reallocate([2.0, 1.0, 4.0]) is None
    unknown = BatchController(ControlConfig(policy="dynamic"), global_batch=120, bounds=bounds(3, B=120))
    assert unknown.initial([None, None, None]) == [40, 40, 40]  # no allocation known: equal start
