"""Checkpoints, resume and restarts: state objects round-trip, a failed save keeps the previous
checkpoint, a checkpoint of another config is refused, and a BSP job that loses a worker restarts
from its checkpoint and sees the same samples as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from omnilearn import config
from omnilearn.config import ControlConfig
from omnilearn.control.controller import build_controller
from omnilearn.train import checkpoint
from omnilearn.train.checkpoint import (
    CheckpointSchedule,
    ControllerState,
    MetricsOffset,
    ModelBuffers,
    RngState,
    RunProgress,
    SamplerPosition,
)


@pytest.mark.parametrize("policy", ["dynamic", "dynamic+prior", "paper"])
def test_controller_state_round_trips_its_whole_state(policy: str) -> None:
    """Everything a controller decides from survives a checkpoint: the same next decisions after."""
    def controller():
        return build_controller(ControlConfig(policy=policy), 64, 2)

    a = controller()
    for k in range(12):
        a.observe_step([0.1 + 0.001 * k, 0.3 + 0.002 * (k % 3)])
    assert a.decide() is not None  # the slow worker's batch moves
    a.observe_step([0.2, 0.2])
    b = controller()
    ControllerState(b).load_state_dict(json.loads(json.dumps(ControllerState(a).state_dict())))
    assert b.batch == a.batch
    assert ControllerState(b).state_dict() == ControllerState(a).state_dict()
    for ctl in (a, b):  # the same next decisions from the same next measurements
        for t in (0.15, 0.17, 0.3, 0.31, 0.3):
            ctl.observe_step([0.15, t])
            ctl.decide(steps_left=50)
    assert a.batch == b.batch and a.holds == b.holds
    assert ControllerState(b).state_dict() == ControllerState(a).state_dict()


def test_rng_buffers_sampler_progress_and_schedule_round_trip(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    rng = RngState(augment=gen)
    saved = rng.state_dict()
    first = (random.random(), float(np.random.rand()), torch.rand(1).item(), torch.rand(1, generator=gen).item())
    rng.load_state_dict(saved)
    assert (random.random(), float(np.random.rand()), torch.rand(1).item(),
            torch.rand(1, generator=gen).item()) == first
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model(torch.randn(8, 3))
    other = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    ModelBuffers(other).load_state_dict(ModelBuffers(model).state_dict())
    assert torch.equal(other[1].running_mean, model[1].running_mean)
    pos = SamplerPosition(seed=1, global_batch=64, epoch=2, step=5)
    back = SamplerPosition(seed=1, global_batch=64)
    back.load_state_dict(pos.state_dict())
    assert (back.epoch, back.step) == (2, 5)
    prog = RunProgress(steps=9, samples=300, clock=4.5, position=2.3, eval_time=0.5, started=1.0, level="HL8")
    again = RunProgress()
    again.load_state_dict(prog.state_dict())
    assert again == prog
    sched = CheckpointSchedule(("seconds", 30.0))
    assert not sched.due_clock(29.9) and sched.due_clock(30.0)
    sched.saved(31.0)
    assert not sched.due_clock(60.0) and sched.due_clock(61.0)
    by_epoch = CheckpointSchedule(("epochs", 2.0))
    assert [by_epoch.due_epoch(e, e - 1) for e in (1, 2, 3, 4)] == [False, True, False, True]
    assert by_epoch.due_epoch(2.1, last_epochs=1.9) and not by_epoch.due_epoch(1.9, last_epochs=1.1)
    metrics = tmp_path / "rank-0.jsonl"
    metrics.write_text('{"a":1}\n')
    offset = MetricsOffset(metrics).state_dict()
    metrics.write_text('{"a":1}\n{"b":2}\n')
    MetricsOffset(metrics).load_state_dict(offset)
    assert metrics.read_text() == '{"a":1}\n'


def test_a_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    cfg = config.build(None, [])
    path = tmp_path / "checkpoints" / "checkpoint.pt"
    checkpoint.save(path, {"step": 1, "weights": torch.ones(1000)}, cfg)

    def killed(*_: object) -> None:  # the process dies after writing, before the rename
        raise OSError("killed during the save")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        checkpoint.save(path, {"step": 2, "weights": torch.zeros(1000)}, cfg)
    monkeypatch.undo()
    state = checkpoint.load(path, cfg)
    assert state["step"] == 1 and torch.equal(state["weights"], torch.ones(1000))
    other = config.build(None, [("train.lr", 0.5)])
    with pytest.raises(Exception, match="another config"):
        checkpoint.load(path, other)
    # Where things are and how long to wait do not change what is trained.
    assert checkpoint.config_hash(cfg) == checkpoint.config_hash(config.build(None, [("data.root", "/x"),
                                                                                     ("fault.max_restarts", 3)]))
