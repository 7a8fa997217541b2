"""Damped reversals: a decision that moves the split back against the previous one moves half way.

Simulated workers follow ``t_i = b_i ** alpha / s_i``: with ``alpha > 1`` a step's time per sample
grows with its batch (activations that no longer fit the caches), which the model ``t = c (b + k)``,
``k >= 0``, cannot follow: the proportional rule overshoots, and the next decision swings back.
"""

from __future__ import annotations

import random
import statistics

import pytest

from omnilearn import config
from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.policies import Bounds
from omnilearn.control.v1 import BatchController
from omnilearn.errors import UserError

SPEEDS = [16.0, 16.0, 10.0, 62.0]
B = 128


def test_a_reversal_moves_half_way_within_the_sum_and_bounds() -> None:
    b = Bounds.make(3, 2, None, 192)
    # [64, 64, 64] -> [17, 31, 144]; the proposal [25, 57, 110] moves back: half way.
    half = policies.damped([64, 64, 64], [17, 31, 144], [25, 57, 110], 192, b)
    assert sum(half) == 192 and half == [21, 44, 127]
    # A proposal that goes on the same way is adopted whole.
    assert policies.damped([64, 64, 64], [40, 50, 102], [30, 45, 117], 192, b) == [30, 45, 117]
    # Rounding stays within the bounds.
    tight = Bounds.make(3, 2, [10, 200, 200], 192)
    out = policies.damped([10, 91, 91], [2, 60, 130], [9, 100, 83], 192, tight)
    assert sum(out) == 192 and all(2 <= x <= h for x, h in zip(out, tight.max_batch, strict=True))


def simulate(alpha: float, noise: float, seed: int, damp: bool, steps: int = 40) -> tuple[list[float], int]:
    """The BSP controller (default settings) against ``t_i = b_i ** alpha / s_i`` with Gaussian noise;
    returns the true imbalance (noise-free) after each step and the number of decisions."""
    rng = random.Random(seed)
    ctl = BatchController(ControlConfig(policy="dynamic-v1", damp_reversals=damp), global_batch=B,
                          bounds=Bounds.make(len(SPEEDS), 2, None, B))
    imbalance, decisions = [], 0
    for step in range(1, steps + 1):
        true = [b ** alpha / s for b, s in zip(ctl.batch, SPEEDS, strict=True)]
        ctl.observe_step([t * (1 + rng.gauss(0, noise)) for t in true])
        imbalance.append(max(true) / min(true) - 1)
        if ctl.due(step, False) and ctl.decide() is not None:
            decisions += 1
    return imbalance, decisions


@pytest.mark.parametrize("noise", [0.02, 0.08])
def test_superlinear_steps_converge_instead_of_swinging(noise: float) -> None:
    # 100 seeds each way: with damping, fewer decisions and a smaller worst imbalance after step 20
    # (noise 0.08: 11.8 -> 7.9 decisions, worst 0.445 -> 0.207; noise 0.02: 5.9 -> 4.3, 0.039 -> 0.027).
    runs = {damp: [simulate(1.4, noise, seed, damp) for seed in range(100)] for damp in (False, True)}
    decisions = {d: statistics.mean(n for _, n in r) for d, r in runs.items()}
    worst = {d: statistics.mean(max(h[20:]) for h, _ in r) for d, r in runs.items()}
    assert decisions[True] < 0.85 * decisions[False], decisions
    assert worst[True] < 0.8 * worst[False], worst


def test_linear_steps_are_left_alone() -> None:
    # Times linear in the batch, no noise: the first decision balances (to the one sample a 10-sample
    # worker lacks); nothing reverses, and damping changes nothing.
    undamped, damped = simulate(1.0, 0.0, 0, False), simulate(1.0, 0.0, 0, True)
    assert undamped == damped and damped[1] == 1 and damped[0][-1] < 0.06


def test_damping_is_asked_for_and_never_under_the_paper_policy() -> None:
    assert ControlConfig().damp_reversals is False
    cfg = policies.effective(ControlConfig(policy="paper", damp_reversals=True), B, 4)
    assert cfg.damp_reversals is False


def test_the_config_key_reaches_the_controller_and_bad_values_name_it() -> None:
    cfg = config.build(None, [config.parse_assignment("control.damp_reversals=true")])
    assert cfg.control.damp_reversals is True
    with pytest.raises(UserError, match="damp_reversals"):
        config.build(None, [("control.damp_reversals", "half")])
