"""The one synchronous step's clock (``omnilearn.train.step``), on a fake clock with known work and waits:
what every BSP path (the CLI's workers, ``omnilearn.torch``, DDP's hook) puts in its time slot."""

from __future__ import annotations

import types

import pytest
import torch

from fakes import FakeClock
from omnilearn.train import step as step_module
from omnilearn.train.step import Slots, StepClock

COMPUTE_S = 0.05  # a step's forward and backward
WAIT_S = 0.3  # its wait in the all-reduce for a slower rank
UPDATE_S = 0.02  # its optimizer step after the all-reduce


class FakeQuota:
    """A CPU quota of ``cpus`` (None: none) whose reading is always there."""

    def __init__(self, cpus: float | None) -> None:
        self._cpus = cpus

    def read(self) -> tuple[str, float]:
        return ("cgroup", 0.0)

    def cpus(self, reading: object) -> float | None:
        return self._cpus if reading is not None else None


def _clock(monkeypatch: pytest.MonkeyPatch, *, cpu_rate: float = 1.0, cpus: float | None = None,
           times_update: bool = True, times_quota: bool = True, rank: int = 1, world: int = 2
           ) -> tuple[StepClock, FakeClock, list[float]]:
    """A clock whose wall time the test moves; its CPU time runs at ``cpu_rate`` CPUs while it computes."""
    wall, cpu = FakeClock(), [0.0]
    monkeypatch.setattr(step_module, "time", types.SimpleNamespace(perf_counter=wall, process_time=lambda: cpu[0]))
    timer = StepClock(Slots(world), rank, on_cpu=True, times_update=times_update, times_quota=times_quota,
                      quota=FakeQuota(cpus))  # type: ignore[arg-type]
    return timer, wall, cpu


def _step(timer: StepClock, wall: FakeClock, cpu: list[float], rate: float = 1.0) -> list[float]:
    """One step: compute, the all-reduce (a wait, no CPU), the update; returns this rank's slots as filled."""
    timer.open()
    wall.advance(COMPUTE_S)
    cpu[0] += COMPUTE_S * rate
    extra = torch.zeros(timer.slots.size)
    timer.fill(extra, clock=12.5, stop=False, cost_s=0.001)
    filled = extra.tolist()
    wall.advance(WAIT_S)
    timer.read(extra)
    wall.advance(UPDATE_S)
    cpu[0] += UPDATE_S * rate
    timer.close()
    return filled


def test_a_steps_time_is_its_compute_and_the_update_before_it_never_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, wall, cpu = _clock(monkeypatch)
    first, second, third = (_step(timer, wall, cpu) for _ in range(3))
    me = timer.slots.time(1)
    # the first step's update is a one-off (the optimizer's state allocated): it rides in no step's time
    assert first[me] == pytest.approx(COMPUTE_S)
    assert second[me] == pytest.approx(COMPUTE_S)
    assert third[me] == pytest.approx(COMPUTE_S + UPDATE_S)
    # the record's: this step's compute and update, and its wait apart
    assert timer.compute_s == pytest.approx(COMPUTE_S + UPDATE_S)
    assert timer.sync_s == pytest.approx(WAIT_S)
    assert first[Slots.CLOCK] == 0.0  # only rank 0 writes its clock
    assert first[timer.slots.cost(1)] == pytest.approx(0.001)
    assert first[timer.slots.threads(1)] == torch.get_num_threads()
    assert first[timer.slots.time(0)] == 0.0  # another rank's slot is that rank's to fill


def test_a_controller_that_does_not_time_the_update_gets_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, wall, cpu = _clock(monkeypatch, times_update=False)
    shared = [_step(timer, wall, cpu)[timer.slots.time(1)] for _ in range(3)]
    assert shared == pytest.approx([COMPUTE_S] * 3)


def test_under_a_quota_a_part_counts_its_cpu_at_the_quotas_rate_where_that_is_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads burn CPU at 2 cores' speed inside a CFS period under a 0.5-CPU quota: the quota's wait
    lands later, in the all-reduce; the step costs its CPU at 0.5 CPUs, four times its wall time."""
    timer, wall, cpu = _clock(monkeypatch, cpus=0.5)
    shared = [_step(timer, wall, cpu, rate=2.0)[timer.slots.time(1)] for _ in range(3)]
    assert shared == pytest.approx([4 * COMPUTE_S, 4 * COMPUTE_S, 4 * (COMPUTE_S + UPDATE_S)])
    assert timer.held_ms == pytest.approx(3e3 * (COMPUTE_S + UPDATE_S))  # what the quota held back
    wall_only, wall, cpu = _clock(monkeypatch, cpus=0.5, times_quota=False)
    shared = [_step(wall_only, wall, cpu, rate=2.0)[wall_only.slots.time(1)] for _ in range(3)]
    assert shared == pytest.approx([COMPUTE_S, COMPUTE_S, COMPUTE_S + UPDATE_S])
    assert wall_only.held_ms == pytest.approx(3e3 * (COMPUTE_S + UPDATE_S))  # recorded whatever the policy


def test_a_start_up_pass_update_stands_in_for_the_first_two_steps_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, wall, cpu = _clock(monkeypatch)
    timer.stand_in(0.07)
    shared = [_step(timer, wall, cpu)[timer.slots.time(1)] for _ in range(3)]
    assert shared == pytest.approx([COMPUTE_S + 0.07, COMPUTE_S + 0.07, COMPUTE_S + UPDATE_S])


def test_a_retried_step_starts_again_and_keeps_the_update_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    timer, wall, cpu = _clock(monkeypatch)
    _step(timer, wall, cpu)
    _step(timer, wall, cpu)
    timer.open()
    wall.advance(1.0)  # a step that ran out of memory somewhere: every rank retries it
    extra = torch.zeros(timer.slots.size)
    timer.fill(extra, clock=0.0, stop=False, cost_s=0.0, oom=True)
    assert extra[Slots.OOM] == 1.0
    timer.read(extra)
    timer.retry()
    wall.advance(COMPUTE_S)
    timer.fill(extra, clock=0.0, stop=True, cost_s=0.0)
    assert extra[timer.slots.time(1)] == pytest.approx(COMPUTE_S + UPDATE_S)
    assert extra[Slots.STOP] == 1.0 and extra[Slots.OOM] == 0.0


def test_the_slots_are_apart_and_read_back_by_kind() -> None:
    slots = Slots(3, stats=2)
    places = [Slots.CLOCK, Slots.STOP, Slots.OOM, *(f(r) for f in (slots.time, slots.cost, slots.threads)
                                                    for r in range(3)), slots.stat(0), slots.stat(1)]
    assert sorted(places) == list(range(slots.size))
    values = list(range(slots.size))
    assert slots.times(values) == [slots.time(r) for r in range(3)]
    assert slots.costs(values) == [slots.cost(r) for r in range(3)]
    assert slots.kinds(values) == [slots.threads(r) for r in range(3)]
