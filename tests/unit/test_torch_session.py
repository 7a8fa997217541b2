"""omnilearn.torch's step session on one rank, on a fake clock: what each step's time, shared through
the all-reduce's spare slots, is made of."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from fakes import FakeClock
from omnilearn.torch import session as session_module
from omnilearn.torch.session import StepSession

COMPUTE_S = 0.05  # each step's forward and backward
AFTER_S = 0.2  # what each step spends after its all-reduce (an optimizer step, the loop's own work)


def test_the_first_steps_one_off_costs_do_not_ride_into_the_second_steps_time(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(session_module, "time", types.SimpleNamespace(perf_counter=clock, time=clock))
    monkeypatch.setattr(session_module, "dist", types.SimpleNamespace(
        broadcast_object_list=lambda box, src: None, barrier=lambda: None, get_backend=lambda: "gloo"))
    session = StepSession(1, 0, policy="dynamic", out=str(tmp_path / "run"))
    session.quota = types.SimpleNamespace(read=lambda: None, held_since=lambda before: 0.0, rate=lambda r: 1.0)
    sampler = session.attach(64, 8, 0, True, ("model", "data"))
    shared = []
    for step in range(3):
        session.begin_step(0, step, sampler.steps_per_epoch)
        clock.advance(COMPUTE_S)
        extra = torch.zeros(session.extra_slots)
        session.fill_slots(extra)
        shared.append(float(extra[1]))  # this rank's time of the step, as every rank reads it
        session.read_slots(extra)
        clock.advance(AFTER_S)
    session.end_epoch(0)
    # The second step's time leaves out what the first spent after its all-reduce (its one-off costs);
    # the third's carries what the second spent there, one step late.
    assert shared == pytest.approx([COMPUTE_S, COMPUTE_S, COMPUTE_S + AFTER_S])
