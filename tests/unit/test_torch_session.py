"""omnilearn.torch's step session on one rank, on a fake clock: what each step's time, shared through
the all-reduce's spare slots, is made of."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from fakes import FakeClock
from omnilearn.control import loop as loop_module
from omnilearn.control.priors import PRIORS
from omnilearn.torch import session as session_module
from omnilearn.torch.session import StepSession
from omnilearn.train import step as step_module

COMPUTE_S = 0.05  # each step's forward and backward
AFTER_S = 0.2  # what each step spends after its all-reduce (an optimizer step, the loop's own work)


def test_the_first_steps_one_off_costs_do_not_ride_into_the_second_steps_time(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fake_time = types.SimpleNamespace(perf_counter=clock, time=clock, process_time=clock)
    monkeypatch.setattr(session_module, "time", fake_time)
    monkeypatch.setattr(step_module, "time", fake_time)
    monkeypatch.setattr(session_module, "dist", types.SimpleNamespace(
        broadcast_object_list=lambda box, src: None, barrier=lambda: None, get_backend=lambda: "gloo"))
    session = StepSession(1, 0, policy="dynamic", out=str(tmp_path / "run"))
    session.quota = types.SimpleNamespace(read=lambda: None, rate=lambda r: 1.0, cpus=lambda r: None,
                                          limited=lambda: False)
    sampler = session.attach(64, 8, 0, True, ("model", "data"))
    shared = []
    for step in range(3):
        session.begin_step(0, step, sampler.steps_per_epoch)
        clock.advance(COMPUTE_S)
        extra = torch.zeros(session.extra_slots)
        session.fill_slots(extra)
        shared.append(float(extra[session.slots.time(0)]))  # this rank's time of the step, as every rank reads it
        session.read_slots(extra)
        clock.advance(AFTER_S)
    session.end_epoch(0)
    # The second step's time leaves out what the first spent after its all-reduce (its one-off costs);
    # the third's carries what the second spent there, one step late.
    assert shared == pytest.approx([COMPUTE_S, COMPUTE_S, COMPUTE_S + AFTER_S])


def test_what_a_loop_does_between_closing_a_step_and_opening_the_next_rides_with_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework closes a step at its step-end hook and opens the next at its step-begin hook; in
    between it draws and collates the next batch and keeps its books, work of this rank's that grows
    with its share. That time rides with the next step's, as the update after the all-reduce does;
    the first step's (one-off costs) and an epoch's end (evaluation) do not."""
    clock = FakeClock()
    fake_time = types.SimpleNamespace(perf_counter=clock, time=clock, process_time=clock)
    monkeypatch.setattr(session_module, "time", fake_time)
    monkeypatch.setattr(step_module, "time", fake_time)
    monkeypatch.setattr(session_module, "dist", types.SimpleNamespace(
        broadcast_object_list=lambda box, src: None, barrier=lambda: None, get_backend=lambda: "gloo"))
    monkeypatch.setattr(session_module, "summarize", lambda out: None)
    session = StepSession(1, 0, policy="dynamic", out=str(tmp_path / "run"))
    session.quota = types.SimpleNamespace(read=lambda: None, rate=lambda r: 1.0, cpus=lambda r: None,
                                          limited=lambda: False)
    sampler = session.attach(32, 8, 0, True, ("model", "data"))  # 4 steps an epoch
    gap_s, shared = 0.03, []
    for epoch in range(2):
        for step in range(sampler.steps_per_epoch):
            session.begin_step(epoch, step, sampler.steps_per_epoch)
            clock.advance(COMPUTE_S)
            extra = torch.zeros(session.extra_slots)
            session.fill_slots(extra)
            shared.append(float(extra[session.slots.time(0)]))
            session.read_slots(extra)
            clock.advance(AFTER_S)
            if step == sampler.steps_per_epoch - 1:
                session.end_epoch(epoch)
                clock.advance(5.0)  # the loop's evaluation
            else:
                session.finish_step()  # the step-end hook
                clock.advance(gap_s)  # the next batch drawn, the books kept
    late = COMPUTE_S + AFTER_S
    assert shared == pytest.approx([COMPUTE_S, COMPUTE_S, late + gap_s, late + gap_s,
                                    late, late + gap_s, late + gap_s, late + gap_s])


@pytest.mark.parametrize("quota", [True, False])
def test_a_framework_loops_start_up_probe_splits_before_step_one_and_leaves_its_first_step_out(
        quota: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wall, cpu = FakeClock(), FakeClock(0.0)
    fake_time = types.SimpleNamespace(perf_counter=wall, time=wall, process_time=cpu)
    monkeypatch.setattr(session_module, "time", fake_time)
    monkeypatch.setattr(step_module, "time", fake_time)
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=wall, process_time=cpu))
    monkeypatch.setattr(session_module, "dist", types.SimpleNamespace(
        broadcast_object_list=lambda box, src: None, barrier=lambda: None, get_backend=lambda: "gloo"))
    # rank 1 (not this process) takes three times as long at every size: under a quota, the same CPU
    # seconds at a third of the rate
    monkeypatch.setattr(session_module, "all_gather_floats", lambda own, device: [
        own, [*own[:3], own[3] / 3, *own[4:]] if quota else [3 * own[0], 3 * own[1], *own[2:]]])
    monkeypatch.setattr(session_module, "summarize", lambda out: None)  # rank 1 writes no records here
    session = StepSession(2, 0, policy="dynamic", out=str(tmp_path / "run"))
    session.quota = types.SimpleNamespace(read=lambda: None, rate=lambda r: 1.0, cpus=lambda r: None,
                                          limited=lambda: quota)
    sampler = session.attach(256, 64, 0, True, ("model", "data"))
    ran: list[int] = []

    def batch(size: int) -> list[int]:  # collating takes time, before the step's clock
        wall.advance(1.0)
        cpu.advance(1.0)
        return list(range(size))

    def local_step(samples: list[int]) -> None:  # this rank's step: 1 ms a sample, one CPU
        ran.append(len(samples))
        wall.advance(1e-3 * (len(samples) + 4))
        cpu.advance(1e-3 * (len(samples) + 4))

    session.start_up(batch, local_step)
    session.start_up(batch, local_step)  # once only
    # B/(8n) and B/(4n) in turn, control.probe_steps rounds each; under a CPU quota more: 20-ms pairs
    # until the pass has lasted Priors.min_pass_s, so its CPU rate is read over scheduler periods
    pairs = len(ran) // 2
    assert ran == [4, 8] * pairs
    if quota:
        assert (pairs - 1) * 0.020 < PRIORS.min_pass_s + 1e-9 <= pairs * 0.020 + 2e-9
    else:
        assert pairs == session.job.config.control.probe_steps
    assert session.batch_sizes[0] > 40  # balanced before step 1: the slower rank 1 gets less
    for step in range(sampler.steps_per_epoch):
        session.begin_step(0, step, sampler.steps_per_epoch)
        wall.advance(COMPUTE_S)
        extra = torch.zeros(session.extra_slots)
        session.fill_slots(extra)
        session.read_slots(extra)
    session.end_epoch(0)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    probe = [r for r in records if r["kind"] == "batch_change" and r["reason"] == "probe"]
    assert len(probe) == 1 and probe[0]["warm"] is False and probe[0]["step"] == 0
    assert probe[0]["probe_times_s"][0][0] == pytest.approx(8e-3)  # its rounds at 4 samples, no data
    end = [r for r in records if r["kind"] == "end"][-1]
    # the pass is set-up: the training time is the steps' alone
    assert end["train_time_s"] == pytest.approx(sampler.steps_per_epoch * COMPUTE_S)


def test_under_a_cpu_quota_a_steps_time_is_its_cpu_at_the_quotas_rate(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A quarter of a core: a 2-ms compute that ran at a core's speed within a period costs the step
    8 ms (the wait for its CPU lands in the all-reduce), recorded as 6 ms held; a 400-ms compute that
    used 100 ms of CPU shows the quota in its wall time already, and nothing is held."""
    wall, cpu = FakeClock(), FakeClock(0.0)
    fake_time = types.SimpleNamespace(perf_counter=wall, time=wall, process_time=cpu)
    monkeypatch.setattr(session_module, "time", fake_time)
    monkeypatch.setattr(step_module, "time", fake_time)
    monkeypatch.setattr(session_module, "dist", types.SimpleNamespace(
        broadcast_object_list=lambda box, src: None, barrier=lambda: None, get_backend=lambda: "gloo"))
    monkeypatch.setattr(session_module, "summarize", lambda out: None)
    session = StepSession(1, 0, policy="dynamic", out=str(tmp_path / "run"))
    session.quota = types.SimpleNamespace(read=lambda: (tmp_path, 0.0), rate=lambda r: 0.25, cpus=lambda r: 0.25,
                                          limited=lambda: True)
    sampler = session.attach(64, 8, 0, True, ("model", "data"))
    shared = []
    for step, (wall_s, cpu_s) in enumerate([(0.002, 0.002), (0.400, 0.100)]):
        session.begin_step(0, step, sampler.steps_per_epoch)
        wall.advance(wall_s)
        cpu.advance(cpu_s)
        extra = torch.zeros(session.extra_slots)
        session.fill_slots(extra)
        shared.append(float(extra[session.slots.time(0)]))
        session.read_slots(extra)
    session.end_epoch(0)
    assert shared == pytest.approx([0.008, 0.400])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    held = [r["held_ms"] for r in records if r["kind"] == "step"]
    assert held == pytest.approx([6.0, 0.0])
