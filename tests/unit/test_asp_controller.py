"""The ASP controller: its model's predictions, its moves and its holds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from omnilearn.control.asp import AsyncController, expected_factor
from omnilearn.control.asp_window import shrunk
from omnilearn.control.policies import Bounds


def controller(n: int = 4, batch: int = 64, rho: float = 1.0, **kw: object) -> AsyncController:
    return AsyncController(batch, Bounds.make(n, 2, None, batch), rho, **kw)


def feed(ctl: AsyncController, seconds_per_sample: list[float], overhead: float = 0.005, rounds: int = 3
         ) -> list[list[int]]:
    """Every worker pushes ``rounds`` times at its current batch; the moves taken."""
    moves = []
    for _ in range(rounds):
        for i, c in enumerate(seconds_per_sample):
            b = ctl.batch[i]
            new = ctl.push(i, b, c * b, c * b + overhead)
            if new is not None:
                moves.append(new)
    return moves


def test_nothing_is_decided_before_every_worker_is_measured() -> None:
    ctl = controller()
    for _ in range(5):
        assert ctl.push(0, 16, 0.1, 0.0) is None
    assert ctl.holds == {} and ctl.batch == [16, 16, 16, 16]


def test_equal_workers_hold_and_the_decisions_thin_out() -> None:
    ctl = controller(rho=4.0)
    assert feed(ctl, [0.004] * 4, rounds=40) == []
    assert set(ctl.holds) == {"no-gain"}
    assert ctl.holds["no-gain"] <= 10  # after each hold the next waits for twice the measurements


def test_equal_batches_wait_n_minus_one_units() -> None:
    ctl = controller()
    ctl.k = 0.0  # time in proportion to the batch
    c, o = np.full(4, 0.004), np.zeros(4)
    _, lam, _ = ctl.worth(np.full((1, 4), 16.0), c, o)
    assert lam[0] == pytest.approx([3.0] * 4)
    split, fast = np.asarray([[8.0, 8.0, 8.0, 40.0]]), np.asarray([0.004, 0.004, 0.004, 0.0008])
    wide = controller(rho=4.0)
    wide.k = 0.0
    _, lam, _ = wide.worth(split, fast, o)
    # equal cycles: each waits one push of each other, in its units: the fast worker 3 x 0.5, a slow one 2 x 0.5 + 2.5
    assert lam[0] == pytest.approx([3.5, 3.5, 3.5, 1.5])
    _, lam, _ = ctl.worth(split, fast, o)
    # at rho = 1 the fast worker's push of 2.5 units steps 1 unit: the slow ones wait 2 x 0.5 + 1
    assert lam[0] == pytest.approx([2.0, 2.0, 2.0, 1.5])


def test_the_expected_factor_is_exact_without_spread() -> None:
    assert expected_factor(np.asarray([0.5, 2.0, 8.0]), np.zeros(3), 2.0) == pytest.approx([1.0, 1.0, 0.25])
    spread = expected_factor(np.asarray([4.0]), np.asarray([1.0]), 2.0)[0]
    assert 0.5 < spread < 0.56  # a convex cut: the spread raises the mean weight above a(4) = 0.5
    assert expected_factor(np.asarray([9.0]), np.asarray([4.0]), math.inf)[0] == 1.0


def test_a_tolerant_step_evens_the_update_rates() -> None:
    ctl = controller(rho=4.0)
    moves = feed(ctl, [0.004, 0.004, 0.006, 0.0008])  # HL8-like: 1, 1, 2/3 and 5 times a unit's speed
    assert moves, ctl.holds
    new = ctl.batch
    assert sum(new) == 64 and new[3] > 32 and new[2] < min(new[0], new[1])
    d = ctl.decision
    assert d is not None and d["worth_new"] > 1.05 * d["worth"]


def test_a_step_that_tolerates_one_unit_takes_smaller_fresher_pushes() -> None:
    ctl = controller(rho=1.0)
    c = [0.004, 0.004, 0.006, 0.0008]
    o = np.full(4, 0.005)
    _, before, _ = ctl.worth(np.asarray([ctl.batch], float), np.asarray(c), o)
    assert feed(ctl, c)
    new = ctl.batch
    # the slow workers' pushes shrink the most, the fast worker's stays within one unit, the sum falls
    assert sum(new) < 64 and max(new) <= 16 and max(new[:3]) < new[3]
    d = ctl.decision
    assert d is not None and d["worth_new"] > 1.05 * d["worth"]
    assert max(d["staleness_predicted"][:3]) < min(before[0][:3])


def test_equal_workers_push_smaller_batches_under_a_harsh_cut() -> None:
    ctl = controller(rho=1.0)
    assert feed(ctl, [0.004] * 4)
    assert len(set(ctl.batch)) == 1 and sum(ctl.batch) < 64  # every push fresher, no worker favoured
    assert max(ctl.decision["staleness_predicted"]) < 3.0


def test_pushes_stay_whole_where_a_cycle_costs_more_than_freshness_wins() -> None:
    ctl = controller(rho=1.0)
    assert feed(ctl, [0.004] * 4, overhead=1.0) == []  # a second of pull and push a cycle: small pushes lose
    assert set(ctl.holds) == {"no-gain"} and ctl.batch == [16] * 4


def test_the_unit_is_the_reference_batch_where_it_is_set() -> None:
    c, o = np.full(4, 0.004), np.zeros(4)
    ctl = controller(reference_batch=8.0, rho=4.0)
    assert ctl.k == pytest.approx(2.0)  # the prior's share of one unit, b_ref = 8
    _, lam, _ = ctl.worth(np.full((1, 4), 16.0), c, o)
    assert lam[0] == pytest.approx([6.0] * 4)  # three pushes of two units each
    _, lam, _ = controller(reference_batch=8.0).worth(np.full((1, 4), 16.0), c, o)
    assert lam[0] == pytest.approx([3.0] * 4)  # under a cap of one unit each of them steps one


def test_the_batch_cap_is_its_own_tolerance_where_it_is_set() -> None:
    ctl = controller(rho=1.0, batch_tolerance=4.0)
    c, o = np.asarray([0.004, 0.004, 0.004, 0.0008]), np.zeros(4)
    one = controller(rho=1.0)
    split = np.asarray([[8.0, 8.0, 8.0, 40.0]])  # the fast worker's push: 2.5 units
    worth, _, _ = ctl.worth(split, c, o)
    capped, _, _ = one.worth(split, c, o)
    assert worth[0] > capped[0]  # the fast worker's 2.5 units count whole under a cap of 4, one under 1
    feed(one, [0.004, 0.004, 0.006, 0.0008])
    assert max(one.batch) <= 16  # under a cap of one unit no push grows beyond it


def test_a_split_the_server_cannot_serve_is_not_taken() -> None:
    ctl = controller(rho=4.0, server_s=0.02)  # 50 updates a second at most
    assert feed(ctl, [0.004, 0.004, 0.006, 0.0008], overhead=0.0) == []
    assert "server" in ctl.holds


def test_parameter_pushes_even_the_cycles() -> None:
    ctl = controller(rho=1.0, parameters=True)
    assert feed(ctl, [0.004, 0.004, 0.004, 0.001], overhead=0.0)
    cycles = [c * (b + ctl.k) for c, b in zip([0.004, 0.004, 0.004, 0.001], ctl.batch, strict=True)]
    assert max(cycles) / min(cycles) < 1.3 and ctl.batch[3] > 16


def test_a_speed_change_drops_the_old_times_and_decides_again() -> None:
    ctl = controller(rho=4.0)
    feed(ctl, [0.004] * 4, rounds=20)
    held = sum(ctl.holds.values())
    moves = feed(ctl, [0.004, 0.004, 0.004, 0.0008], rounds=6)  # worker 4 now 5 times faster
    assert moves and ctl.batch[3] > 16 and sum(ctl.holds.values()) <= held + 2


def test_k_is_told_by_a_worker_measured_at_two_batches() -> None:
    ctl = controller()
    assert ctl._fit_k() == pytest.approx(4.0)  # no worker at two batches: the prior's mean, b_ref / 4
    for b in (16, 16, 16, 32, 32, 32):
        ctl.batch[0] = b
        ctl._observe(ctl.workers[0], b, 0.001 * (b + 6))
    assert ctl._fit_k() == pytest.approx(6.0, abs=0.5)  # exact times: the grid's point nearest 6


def test_k_stays_told_once_every_window_holds_one_batch() -> None:
    ctl = controller()
    for b in (16, 16, 16, 32, 32, 32):
        ctl.batch[0] = b
        ctl._observe(ctl.workers[0], b, 0.001 * (b + 6))
    for _ in range(2 * ctl.priors.window):  # the window now holds 32s only
        ctl._observe(ctl.workers[0], 32, 0.001 * (32 + 6))
    told = ctl.told
    ctl._observe(ctl.workers[0], 32, 0.001 * (32 + 6))
    assert {b for b, _ in ctl.workers[0].times} == {32} and ctl.told == told  # a window of one batch tells nothing
    assert ctl._fit_k() == pytest.approx(6.0, abs=0.5)  # the run's evidence, not the prior's 4


def test_k_is_told_by_each_time_once() -> None:
    ctl = controller()
    for b in (16, 16, 32):
        ctl.batch[0] = b
        ctl._observe(ctl.workers[0], b, 0.001 * (b + 6))
    once = ctl._fit_k()
    assert ctl.told == 1 and ctl._fit_k() == once  # fitting again adds nothing


def test_a_few_noisy_times_leave_k_near_its_prior() -> None:
    ctl = controller()
    # two times at each of two nearby batches, 8% off in opposite directions: they say little of k
    for b, t in ((4, 0.0294), (4, 0.0294), (7, 0.0475), (7, 0.0475)):
        ctl.batch[0] = b
        ctl._observe(ctl.workers[0], b, t)
    assert 1.0 < ctl._fit_k() < 8.0


def test_the_state_round_trips_and_keeps_the_survivors() -> None:
    ctl = controller(rho=4.0)
    feed(ctl, [0.004, 0.004, 0.006, 0.0008])
    state = ctl.state_dict()
    back = controller(n=3, rho=4.0)
    back.load_state_dict(state, keep=[0, 1, 3])
    assert sum(back.batch) == sum(ctl.batch) and len(back.workers) == 3
    assert list(back.workers[2].times) == list(ctl.workers[3].times)
    assert back.told == ctl.told > 0
    assert back._fit_k() == pytest.approx(ctl._fit_k(), rel=0.05)  # k's posterior, read onto 3 workers' grid
    same = controller(rho=4.0)
    same.load_state_dict(state)
    assert same._fit_k() == pytest.approx(ctl._fit_k())


def test_the_scatter_follows_the_windows_through_a_change_of_speed() -> None:
    """The pooled scatter of log times about each batch's median is that of the windows as they are:
    after new times, after a worker's window restarts at a new speed, and after a state round trip."""
    ctl = controller(n=2, batch=32)
    rng = np.random.default_rng(5)

    def direct() -> float:
        about = []
        for w in ctl.workers:
            by: dict[int, list[float]] = {}
            for b, t in w.times:
                by.setdefault(b, []).append(math.log(t))
            about += [abs(x - float(np.median(v))) for v in by.values() if len(v) >= 3 for x in v]
        return 1.4826 * float(np.median(about)) if len(about) >= 3 else ctl._scatter()

    restarted = False
    for step in range(30):
        slow = 0.01 if step < 15 else 0.04  # worker 1 slows down four times: its window restarts
        for i, c in enumerate((0.01, slow)):
            before = len(ctl.workers[i].times)
            ctl.push(i, ctl.batch[i], c * ctl.batch[i] * math.exp(0.05 * rng.standard_normal()), 1.0)
            restarted |= len(ctl.workers[i].times) < before
        assert ctl._scatter() == pytest.approx(direct(), rel=1e-12)
    assert restarted
    back = controller(n=2, batch=32)
    back.load_state_dict(ctl.state_dict())
    assert back._scatter() == pytest.approx(ctl._scatter(), rel=1e-12)


def test_slow_workers_at_their_floor_leave_the_fast_workers_their_share() -> None:
    shares = np.asarray([0.5] * 6 + [1.0, 4.0] + [0.5] * 6 + [1.0, 4.0])  # 16 workers at HL8
    ctl = controller(n=16, batch=256)
    ctl.batch = [4, 3, 4, 3, 3, 4, 4, 6, 4, 4, 4, 4, 3, 4, 4, 6]
    ctl.k = 4.0
    c, o = 0.002 / shares, np.full(16, 0.005)
    splits = ctl.candidates(c, o)
    # a split fitted to a sum of 32 puts every worker at the floor of 2; scaled from the fastest worker's batch,
    # the slow workers are at the floor and the fast ones keep 8
    wanted = np.where(shares == 4.0, 8, 2)
    assert any((row == wanted).all() for row in splits)
    assert (splits.sum(axis=1) <= 256).all()
    worth, _, _ = ctl.worth(splits.astype(float), c, o)
    now = ctl.worth(np.asarray([ctl.batch], float), c, o)[0][0]
    assert worth.max() > 1.15 * now  # the model sees what the fixed splits show (best-fixed: [2, ..., 8])


def test_estimates_that_differ_by_their_noise_alone_are_taken_as_equal() -> None:
    noise = np.full(4, 0.01)
    assert shrunk(np.asarray([0.05, -0.08, 0.11, -0.02]), noise) == pytest.approx([0.015] * 4)
    apart = np.log([1.0, 1.0, 0.5, 8.0])  # HL8's spread: each keeps about its own
    assert shrunk(apart, noise) == pytest.approx(apart, abs=0.02)
    between = shrunk(np.asarray([0.3, -0.3, 0.2, -0.2]), noise)  # spread 0.067 against noise 0.01
    assert abs(between[0]) < 0.3 and between[0] > 0.2 and between.sum() == pytest.approx(0.0, abs=1e-12)


def noisy_feed(ctl: AsyncController, c: float, sd: float, rounds: int, seed: int) -> list[list[int]]:
    """Equal workers push ``rounds`` times, each time ``c (b + 1)`` and a cycle's overhead of 10 ms, both
    scattered by ``sd`` in log."""
    rng, moves = np.random.default_rng(seed), []
    for _ in range(rounds):
        for i in range(len(ctl.batch)):
            b = ctl.batch[i]
            t, o = np.exp(np.log([c * (b + 1.0), 0.01]) + sd * rng.standard_normal(2))
            if (new := ctl.push(i, b, t, t + o)) is not None:
                moves.append(new)
    return moves


def test_equal_workers_on_a_noisy_host_keep_equal_pushes() -> None:
    """The ASP demo at HL1: four equal workers whose times scatter by 0.25 a push (as on a shared host)
    move to equal pushes and stay: neither the scatter of their speeds and overheads nor an outlier taken
    for a change of speed moves the split."""
    moves = [m for seed in range(10)
             for m in noisy_feed(controller(rho=0.5, batch_tolerance=1.0, reference_batch=16.0), 0.004, 0.25, 200, seed)]
    assert sum(len(set(m)) > 1 for m in moves) <= 1 and len(moves) <= 25


HL8_16 = np.asarray([0.5] * 6 + [1.0, 4.0] + [0.5] * 6 + [1.0, 4.0])  # 16 workers at HL8: shares of a CPU


def test_an_idle_worker_adds_nothing_to_the_others_staleness_or_the_servers_load() -> None:
    ctl = controller(rho=4.0, server_s=0.001)
    ctl.k = 0.0
    c, o = np.asarray([0.004, 0.004, 0.006, 0.0008]), np.full(4, 0.002)
    worth, lam, busy = ctl.worth(np.asarray([[8.0, 8.0, 0.0, 40.0], [8.0, 8.0, 8.0, 40.0]]), c, o)
    three = controller(n=3, rho=4.0, server_s=0.001, reference_batch=16.0)  # the same unit
    three.k = 0.0
    worth3, lam3, busy3 = three.worth(np.asarray([[8.0, 8.0, 40.0]]), c[[0, 1, 3]], o[[0, 1, 3]])
    assert lam[0, [0, 1, 3]] == pytest.approx(lam3[0]) and busy[0] == pytest.approx(busy3[0])
    assert worth[0] == pytest.approx(worth3[0]) and busy[1] > busy[0]


def test_many_slow_workers_are_idled_and_measured_again_now_and_then() -> None:
    """At 16 workers the pushes of the twelve slowest (and of the two next), late and cut, add more to the
    fast workers' staleness than they count: the controller idles them. An idle worker is given one push at
    the smallest batch after ``probe_after`` decisions, and that push is measured."""
    ctl = controller(n=16, batch=256)
    moves = feed(ctl, list(0.002 / HL8_16), rounds=200)
    idle = [m for m in moves if 0 in m]
    assert idle and all(m[i] == 0 for m in idle for i in np.flatnonzero(HL8_16 < 1.0))
    assert all(m[i] > 0 for m in moves for i in np.flatnonzero(HL8_16 == 4.0))
    probes = [(a, b) for a, b in zip(moves, moves[1:], strict=False) if 0 in a and 0 not in b]
    assert probes and all(b[i] == 2 for a, b in probes for i in np.flatnonzero(np.asarray(a) == 0))
    probed = ctl.workers[0]
    assert any(batch == 2 for batch, _ in probed.times)  # the probe's push was measured
    assert len(probed.overheads) < len(ctl.workers[7].overheads)  # a woken worker's first cycle holds its idle time


def test_four_workers_at_hl8_keep_every_worker() -> None:
    for ctl in (controller(), controller(rho=0.5, batch_tolerance=1.0, reference_batch=16.0)):
        moves = feed(ctl, [0.016, 0.016, 0.016, 0.0023], rounds=100)
        assert moves and all(0 not in m for m in moves)


def test_an_idle_worker_stays_idle_through_a_state_round_trip() -> None:
    ctl = controller(n=16, batch=256)
    for _ in range(50):
        if 0 in ctl.batch:
            break
        feed(ctl, list(0.002 / HL8_16), rounds=1)
    assert 0 in ctl.batch
    back = controller(n=16, batch=256)
    back.load_state_dict(ctl.state_dict())
    assert back.batch == ctl.batch
    assert [w.last_batch for w in back.workers] == [w.last_batch for w in ctl.workers]
    survivors = controller(n=15, batch=256)
    survivors.load_state_dict(ctl.state_dict(), keep=list(range(1, 16)))
    assert survivors.batch == ctl.batch[1:]
    alone = controller(n=2, batch=256)
    alone.load_state_dict(ctl.state_dict(), keep=[0, 1])  # two idle workers left: both take a batch
    assert all(b > 0 for b in alone.batch) and all(w.woken for w in alone.workers)
    fast = int(np.flatnonzero(np.asarray(ctl.batch) > 0)[0])
    one = controller(n=3, batch=256)
    one.load_state_dict(ctl.state_dict(), keep=[0, 1, fast])  # one active worker left: every survivor takes a batch
    assert all(b > 0 for b in one.batch)


def test_a_split_leaves_at_least_two_workers_active() -> None:
    ctl = controller(n=4, batch=256)
    ctl.k = 0.0
    speed = np.asarray([1.0, 1.0, 1.0, 8.0])
    assert ctl._idle_masks(speed) == []  # idling the three slow workers would leave one
    masks = ctl._idle_masks(np.asarray([1.0, 1.0, 8.0, 8.0]))
    assert len(masks) == 1 and masks[0].tolist() == [True, True, False, False]


def test_no_candidate_leaves_fewer_than_two_workers_active_when_the_split_already_idles_some() -> None:
    """The idle variant of a split that already idles a worker (here worker 1, idled at another speed) leaves
    at least two active: idling workers 0 and 2 as well would leave worker 3 alone."""
    ctl = controller(n=4, batch=256)
    ctl.k = 0.0
    ctl.batch = [4, 0, 2, 16]
    ctl.workers[1].last_batch = 4
    speed = np.asarray([1.0, 8.0, 1.0, 8.0])
    assert [m.tolist() for m in ctl._idle_masks(speed)] == [[True, False, True, False]]
    rows = ctl.candidates(1.0 / speed, np.full(4, 1e-3))
    assert ((rows[1:] > 0).sum(axis=1) >= 2).all()
    assert (rows[0] == ctl.batch).all()
