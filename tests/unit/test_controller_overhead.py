"""The fitted fixed cost ``k`` against level changes the change detector did not flag.

Workers follow ``t_i = (b_i + k) / s_i`` with the speeds ``s_i`` proportional to the BSP level
table's cores (HL2 12:12:8:16, HL4 9:9:6:24, HL8 6:6:4:32), and the controller is driven as the BSP
trainer drives it, with the demo job's control section (a decision every 2 steps, a window of 3,
B = 256). A level changes at a window's boundary, where no detector can see it: the step after a
batch change is skipped, and the window starts over at the new speeds.
"""

from __future__ import annotations

import math
import random

import pytest

from omnilearn.config import ControlConfig
from omnilearn.control import policies
from omnilearn.control.policies import Bounds
from omnilearn.control.v1 import BatchController

CORES = {"HL1": [12, 12, 12, 12], "HL2": [12, 12, 8, 16], "HL4": [9, 9, 6, 24], "HL8": [6, 6, 4, 32]}
K = 8.0  # samples' worth of fixed cost per step
B = 256
STEPS_PER_LEVEL = 6


def times(batch: list[int], level: str, k: float = K) -> list[float]:
    return [(b + k) / s for b, s in zip(batch, CORES[level], strict=True)]


def replay(levels: list[str], noise: float, seed: int) -> tuple[BatchController, list[tuple[str, list[int]]]]:
    """The demo job's controller through ``levels`` (6 steps each), never told of a level; step times
    with log-normal noise ``noise``, seeded. Returns the controller and its decisions (level, split)."""
    rng = random.Random(seed)
    cfg = ControlConfig(policy="dynamic-v1", interval=2, window=3, min_samples=2, deadband=0.05)
    ctl = BatchController(cfg, global_batch=B, bounds=Bounds.make(4, 2, None, B))
    decisions, step = [], 0
    for level in levels:
        for _ in range(STEPS_PER_LEVEL):
            step += 1
            ctl.observe_step([t * math.exp(rng.gauss(0, noise)) for t in times(ctl.batch, level)])
            if ctl.due(step, False) and (new := ctl.decide()) is not None:
                decisions.append((level, new))
    return ctl, decisions


def test_a_level_change_at_a_window_boundary_does_not_overshoot() -> None:
    # HL2 -> HL4 -> HL8: the split made for HL4 is measured at HL8, where the unloaded workers
    # slowed by 1.5x and the loaded one sped up: the times hardly moved with the batches, which a
    # k of the whole global batch would explain. The pair of splits before (at HL2) says k = 8.
    ctl, decisions = replay(["HL2", "HL4", "HL8"], noise=0.03, seed=181)
    at_hl8 = [split for level, split in decisions if level == "HL8"]
    assert at_hl8, decisions
    assert ctl.overhead == pytest.approx(K, abs=4)  # not 133, the median of the two pairs' fits (8 and 258)
    assert min(min(split) for split in at_hl8) >= 10  # balanced: [28, 28, 16, 184]; k = 133 gives [2, 2, 2, 250]
    final = times(ctl.batch, "HL8")
    assert max(final) / min(final) - 1 < 0.15


@pytest.mark.parametrize("noise", [0.03, 0.06, 0.15])
def test_the_demo_schedule_never_empties_a_worker(noise: float) -> None:
    # The median of the pairs' fits, pairs across unflagged level changes counted, drops the slow
    # workers to 3 samples or fewer in 1 (noise 0.03), 3 (noise 0.06) and 60 (noise 0.15) of these
    # 200 seeds, with k up to 133, 139 and 258.
    for seed in range(200):
        ctl, decisions = replay(["HL2", "HL4", "HL8"], noise=noise, seed=seed)
        assert min(min(split) for _, split in decisions) > 3, (seed, decisions)
        assert ctl.overhead < 48, (seed, ctl.overhead)  # the workload's k is 8


def straddling() -> tuple[list[int], list[float], list[int], list[float]]:
    """The split made for HL4 ([62, 65, 41, 88] -> [45, 44, 29, 138]) measured at HL8: the level
    change sped the loaded worker up as much as its batch grew, relative to the others; exactly fit
    by a k as large as the grid allows."""
    before, after = [62, 65, 41, 88], [45, 44, 29, 138]
    return before, times(before, "HL4"), after, times(after, "HL8")


def clean(level: str, before: list[int], after: list[int], k: float = K) -> tuple[list[int], list[float], list[int],
                                                                                list[float]]:
    return before, times(before, level, k), after, times(after, level, k)


def test_pairs_that_disagree_give_the_smaller_k_and_agreeing_ones_outvote() -> None:
    good = clean("HL2", [64] * 4, [65, 64, 43, 84])
    bad = straddling()
    assert policies.fit_overhead([bad], cap=B) > 200  # alone it fits a k beyond the global batch
    assert policies.fit_overhead([good, bad], cap=B) > 100  # the median of two without the noise: their mean
    assert policies.fit_overhead([good, bad], cap=B, noise=[0.03, 0.03]) == pytest.approx(K, abs=0.5)
    # Open to the cap, it bounds nothing: alone or twice, it is no estimate of k.
    assert policies.fit_overhead([bad], cap=B, noise=[0.03]) is None
    assert policies.fit_overhead([bad, bad, good], cap=B, noise=[0.03] * 3) == pytest.approx(K, abs=0.5)
    # Pairs with bounded ranges: two that agree outvote one; one against one, the smaller k.
    other = clean("HL8", [28, 28, 16, 184], [40, 40, 20, 156], k=40)
    assert policies.fit_overhead([other, good], cap=B, noise=[0.03] * 2) == pytest.approx(K, abs=0.5)
    assert policies.fit_overhead([good, other, other], cap=B, noise=[0.03] * 3) == pytest.approx(40, abs=2)
    again = clean("HL4", [46, 46, 28, 136], [28, 28, 16, 184])
    assert policies.fit_overhead([good, other, other, again, bad], cap=B, noise=[0.03] * 5) == pytest.approx(K, abs=1)


def test_a_clean_k_is_still_found() -> None:
    good = clean("HL2", [64] * 4, [65, 64, 43, 84])
    # One pair, nothing against it: its best fit, whatever the noise.
    for sd in (0.01, 0.03, 0.1):
        assert policies.fit_overhead([good], cap=B, noise=[sd]) == pytest.approx(K, abs=0.5)
    # Noisy clean pairs agree within their noise: the median of their fits.
    rng = random.Random(0)
    pairs = []
    for before, after in (([64] * 4, [65, 64, 43, 84]), ([65, 64, 43, 84], [46, 46, 28, 136]),
                          ([46, 46, 28, 136], [28, 28, 16, 184])):
        t2 = [t * math.exp(rng.gauss(0, 0.02)) for t in times(after, "HL4")]
        pairs.append((before, times(before, "HL4"), after, t2))
    assert policies.fit_overhead(pairs, cap=B, noise=[0.03] * 3) == pytest.approx(K, abs=3)
    # A pair whose times did not follow its batches bounds k from below only: no estimate.
    flat = ([64] * 4, times([64] * 4, "HL2"), [66, 62, 52, 76], times([64] * 4, "HL2"))
    assert policies.fit_overhead([flat], cap=B, noise=[0.1]) is None
    # Without level changes the controller still fits k and balances (the staircase's first levels).
    ctl, decisions = replay(["HL8", "HL8", "HL8"], noise=0.02, seed=1)
    assert ctl.overhead == pytest.approx(K, abs=3)
    final = times(ctl.batch, "HL8")
    assert max(final) / min(final) - 1 < 0.1 and len(decisions) <= 4
