"""Properties of the batching policies and the baselines' controllers (pure functions, no processes)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.baselines import Paper, Prior, Static, Uniform
from omnilearn.control.controller import Controller, build_controller, controller_class
from omnilearn.control.dynamic import DynamicController
from omnilearn.control.policies import Bounds
from omnilearn.errors import UserError


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


def test_rows_are_each_rows_own_split() -> None:
    """The row-wise water-filling and rounding give every row what it gives alone: rows of other
    sizes of total, other bounds and other pinning orders do not leak into each other."""
    rng = np.random.default_rng(3)
    n, rows = 6, 40
    weights = rng.gamma(0.7, size=(rows, n)) * (rng.random((rows, n)) > 0.1)
    lo = rng.integers(0, 3, size=(rows, n)).astype(float)
    hi = lo + rng.integers(0, 30, size=(rows, n))
    totals = np.floor(lo.sum(1) + rng.random(rows) * (hi.sum(1) - lo.sum(1)))
    shares = policies.bounded_shares_rows(weights, totals, lo, hi)
    assert np.allclose(shares.sum(1), totals) and (shares >= lo - 1e-9).all() and (shares <= hi + 1e-9).all()
    for r in range(rows):
        assert shares[r].tolist() == policies.bounded_shares(weights[r].tolist(), totals[r], lo[r].tolist(),
                                                             hi[r].tolist())
    low = 2
    top = np.maximum(hi, low)
    whole = policies.round_rows(np.clip(shares, low, top), np.maximum(totals, n * low), low, top)
    assert (whole.sum(1) == np.maximum(totals, n * low)).all() and (whole >= low).all() and (whole <= top).all()
    for r in range(rows):
        assert whole[r].tolist() == policies.round_preserving_sum(np.clip(shares[r], low, top[r]).tolist(),
                                                                  int(max(totals[r], n * low)), low, top[r].tolist())


def test_unique_rows_are_numpys_in_its_order() -> None:
    """A decision's distinct candidates, quicker than numpy's, are the same rows in the same order (its
    first best row is the split it takes)."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        rows = rng.integers(0, 4, size=(int(rng.integers(1, 40)), int(rng.integers(1, 6)))).astype(float)
        assert policies.unique_rows(rows).tolist() == np.unique(rows, axis=0).tolist()


def test_water_filling_pins_the_side_that_violates() -> None:
    # proportional shares 80 / 10 / 10: the first is pinned at 50 and the rest split again 25 / 25
    assert policies.bounded_shares([8, 1, 1], 100, 0, [50, 100, 100]) == [50.0, 25.0, 25.0]
    # 0.01 / 50 / 50 against a floor of 10: the last two share the 90 left
    assert policies.bounded_shares([0.0002, 1, 1], 100, 10, [100, 100, 100]) == [10.0, 45.0, 45.0]


def test_uniform_and_static() -> None:
    assert policies.uniform(4, 128, bounds(4)) == [32, 32, 32, 32]
    # The paper's HL8 scaled to 2 CPUs: 0.25/0.25/0.1667/1.333.
    b = policies.static([0.25, 0.25, 0.1667, 1.3333], 128, bounds(4))
    assert b == [16, 16, 11, 85]  # 128 * share / 2.0, rounded by largest remainder


def measured(ctl: Controller, times: list[float], steps: int = 1) -> Controller:
    for _ in range(steps):
        ctl.observe_step(times)
    return ctl


class Unreadable(Sequence):
    """Allocations that fail the test when anything reads them."""

    def __getitem__(self, i):  # type: ignore[override]
        raise AssertionError("the policy read the allocations")

    def __len__(self) -> int:
        raise AssertionError("the policy read the allocations")


def test_one_builder_picks_every_policy_and_refuses_the_retired_one() -> None:
    kinds = {"uniform": Uniform, "static": Static, "paper": Paper, "dynamic": DynamicController,
             "dynamic+prior": Prior}
    for policy, cls in kinds.items():
        ctl = build_controller(ControlConfig(policy=policy), 128, 4)
        assert type(ctl) is cls and ctl.policy == policy and sum(ctl.batch) == 128
        assert controller_class(policy) is cls
    with pytest.raises(UserError, match="retired.*results/2026-11-29_2cpu_fresh-clone-bounds.md"):
        build_controller(ControlConfig(policy="dynamic-v1"), 128, 4)
    with pytest.raises(UserError, match="not a batch controller"):
        controller_class("ddp")
    assert build_controller(ControlConfig(policy="paper"), 128, 4).bounds == Bounds(16, (96,) * 4)
    assert build_controller(ControlConfig(policy="uniform"), 128, 4, min_batch=5).bounds.min_batch == 5


def test_capabilities_say_what_differs() -> None:
    def built(policy: str) -> Controller:
        return build_controller(ControlConfig(policy=policy), 128, 4)

    assert not built("uniform").bounded_by_memory and built("static").bounded_by_memory
    assert [built(p).knows_allocation for p in ("uniform", "static", "paper", "dynamic", "dynamic+prior")] == \
        [False, True, False, False, True]
    assert [built(p).measures for p in ("uniform", "static", "paper", "dynamic")] == [False, False, True, True]
    assert not built("paper").times_update and built("paper").per_epoch and not built("dynamic").per_epoch
    assert built("dynamic").times_quota and not built("paper").times_quota
    assert controller_class("dynamic", asynchronous=True).times_quota


@pytest.mark.parametrize("policy", ["uniform", "paper", "dynamic"])
def test_policies_not_named_for_allocations_never_read_them(policy: str) -> None:
    c = build_controller(ControlConfig(policy=policy), 128, 4)

    def read() -> list[float]:
        raise AssertionError("the allocations were read")

    assert c.allocations(read) is None  # the trainers' only way to them
    assert c.initial(Unreadable()) == [32, 32, 32, 32]
    assert c.reallocate(Unreadable()) is None
    measured(c, [1.0, 1.0, 2.0, 0.5], steps=8).decide(Unreadable())


@pytest.mark.parametrize("policy", ["static", "dynamic+prior"])
def test_policies_named_for_allocations_read_them(policy: str) -> None:
    c = build_controller(ControlConfig(policy=policy, min_batch=1), 128, 4)
    assert c.allocations(lambda: [1.0, 1.0, 1.0, 5.0]) == [1.0, 1.0, 1.0, 5.0]
    assert c.initial([1.0, 1.0, 1.0, 5.0]) == [16, 16, 16, 80]


def test_uniform_never_changes_and_static_follows_allocation() -> None:
    u = build_controller(ControlConfig(policy="uniform"), 64, 4)
    assert not u.due(4, True)
    assert measured(u, [0.1, 0.2, 0.3, 0.4], steps=8).decide(None) is None
    s = build_controller(ControlConfig(policy="static"), 64, 4)
    assert s.initial([1.0, 1.0, 1.0, 5.0]) == [8, 8, 8, 40]
    assert s.reallocate([2.0, 2.0, 2.0, 2.0]) == [16, 16, 16, 16]
    assert s.reallocate([2.0, 2.0, 2.0, 2.0]) is None  # nothing moved


@pytest.mark.parametrize("policy", ["uniform", "static", "paper", "dynamic"])
def test_set_bounds_resplits_when_violated(policy: str) -> None:
    c = build_controller(ControlConfig(policy=policy, min_batch=2), 120, 3)
    c.bounds = Bounds(2, (120, 120, 120))
    c.batch = [20, 20, 80]
    assert c.set_bounds(Bounds(2, (120, 120, 120))) is None
    assert c.set_bounds(Bounds(2, (120, 120, 50))) is not None
    assert c.batch[2] == 50 and sum(c.batch) == 120


def test_allocation_prior_starts_from_the_shares_and_rescales_its_speeds_at_a_level_change() -> None:
    c = build_controller(ControlConfig(policy="dynamic+prior", min_batch=1), 120, 3)
    assert c.initial([1.0, 1.0, 4.0]) == [20, 20, 80]
    # Measured (t = c (b + k) with workers of 10, 10 and 30 samples a second): balanced on the measured speeds.
    c.observe_probe(8, 16, [0.8, 0.8, 0.8 / 3], [1.6, 1.6, 1.6 / 3])
    for _ in range(6):
        c.observe_step([(b + 0.0) / s for b, s in zip(c.batch, (10, 10, 30), strict=True)])
        c.decide(steps_left=500)
    assert c.batch == [24, 24, 72]
    # A new level doubles worker 0's CPU: its speed is expected to double before anything is measured.
    new = c.reallocate([2.0, 1.0, 4.0])
    assert new is not None and new[0] > 1.6 * new[1] and sum(new) == 120
    unknown = build_controller(ControlConfig(policy="dynamic+prior"), 120, 3)
    assert unknown.initial([None, None, None]) == [40, 40, 40]  # no allocation known: equal start
    assert unknown.reallocate([1.0, 2.0, 3.0]) is None  # nothing known to scale from


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


def test_imbalance() -> None:
    assert policies.imbalance([1.0, 1.0]) == 0
    assert policies.imbalance([1.0, 1.5]) == pytest.approx(0.5)


def test_paper_preset_and_rule() -> None:
    eff = policies.effective(ControlConfig(policy="paper", interval=3), global_batch=128, workers=4)
    assert (eff.interval, eff.min_batch, eff.max_batch) == (0, 16, 96)  # its [16, 96] at 32
    assert policies.effective(ControlConfig(policy="dynamic"), 128, 4) == ControlConfig(policy="dynamic")
    b = Bounds(16, (96,) * 4)
    # Every batch would move by less than 20% of its new size: kept.
    assert policies.paper([32, 32, 32, 32], [1.0, 1.0, 1.1, 0.95], 128, b) == [32, 32, 32, 32]
    moved = policies.paper([32, 32, 32, 32], [1.0, 1.0, 2.0, 0.5], 128, b)
    assert sum(moved) == 128 and moved[2] == 16 and moved[3] > 32
    c = build_controller(ControlConfig(policy="paper"), 128, 4)
    assert c.due(6, True) and not c.due(5, False) and not c.times_update
    # The mean of the epoch's steps (an outlier counts), then a fresh epoch.
    assert measured(c, [1.0, 1.0, 1.0, 1.0], steps=3).observe_step([1.0, 1.0, 1.0, 5.0]) == []
    assert c.estimates()[0] == [1.0, 1.0, 1.0, 2.0]
    assert c.decide() == [37, 37, 36, 18] and c.estimates() == (None, [0, 0, 0, 0])
    # ASP: a push at a batch the worker no longer has does not count
    assert not c.observe(3, 32, 1.0) and c.estimates()[1] == [0, 0, 0, 0]
    assert not c.observe(3, 18, 1.0) and c.estimates()[1] == [0, 0, 0, 1]
