"""A BSP worker that cannot come back: the job goes on with the survivors (``fault.drop_after``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.control.controller import Controller, build_controller
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.jobfile import JobSpec
from omnilearn.launch.restart import without_lost
from omnilearn.train.checkpoint import ControllerState


def _controller(cfg: config.JobConfig, workers: int) -> Controller:
    return build_controller(cfg.control, cfg.train.global_batch, workers)


@pytest.mark.parametrize("policy", ["static", "paper"])
def test_survivors_take_the_lost_workers_batch_in_proportion(policy: str) -> None:
    cfg = config.build(None, [("workers", 4), ("train.global_batch", 200), ("control.policy", policy),
                              ("control.min_batch", 2)])
    whole = _controller(cfg, 4)
    whole.bounds = dataclasses.replace(whole.bounds, min_batch=2)
    whole.batch = [20, 40, 60, 80]
    for row in ([1.0, 1.1, 0.9, 1.0], [1.0, 1.2, 0.9, 1.1]):
        whole.observe_step(row)
    saved = json.loads(json.dumps(ControllerState(whole).state_dict()))
    survivors = _controller(cfg, 3)
    ControllerState(survivors).load_state_dict(saved, keep=[0, 2, 3])  # worker 1 is gone
    assert survivors.batch == [25, 75, 100] and sum(survivors.batch) == 200  # 20:60:80 scaled up to B
    assert survivors.estimates()[0] is None  # times measured by a set of workers that is gone
    same = _controller(cfg, 4)
    ControllerState(same).load_state_dict(saved, keep=[0, 1, 2, 3])  # nobody lost: loaded as saved
    assert same.batch == [20, 40, 60, 80] and same.state_dict() == whole.state_dict()


def test_a_worker_is_dropped_only_after_drop_after_losses_in_a_row_and_never_below_min_workers() -> None:
    def job(*overrides: tuple[str, object], members: list[int] | None = None) -> JobSpec:
        cfg = config.build(None, [("workers", 3), ("train.global_batch", 96), *overrides])
        return JobSpec("j", cfg, build_plan(cfg), Path("/nonexistent"), "none", members=members)

    assert without_lost(job(), 1, 1)[0] is None  # lost once: it may come back
    assert without_lost(job(), 1, 2) == ([0, 2], "")
    assert without_lost(job(), None, 5)[0] is None  # a failure naming no worker drops nobody
    assert without_lost(job(("fault.drop_after", 0)), 1, 9)[0] is None
    survivors, why = without_lost(job(("fault.min_workers", 2), members=[0, 2]), 2, 2)
    assert survivors is None and "fault.min_workers (2)" in why
    survivors, why = without_lost(job(("control.max_batch", 40)), 1, 2)
    assert survivors is None and "cannot hold the global batch 96" in why
    asp = job(("mode", "asp"))  # ASP: slot 0 is the parameter server
    assert without_lost(asp, 2, 2) == ([0, 1, 3], "")
    assert without_lost(asp, 0, 2) == (None, "the parameter server cannot be left behind")
    with pytest.raises(Exception, match="fault.min_workers"):
        config.build(None, [("workers", 3), ("fault.min_workers", 4)])


def test_workers_whose_host_does_not_answer_are_left_behind_at_the_first_loss(tmp_path: Path) -> None:
    from rich.console import Console

    from omnilearn.launch.failures import WorkerFailed
    from omnilearn.launch.restart import read_restarts, run_with_restarts

    cfg = config.build(None, [("workers", 4), ("train.global_batch", 96), ("fault.max_restarts", 1)])
    job = JobSpec("j", cfg, build_plan(cfg), tmp_path, "docker")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "rank-3.jsonl").write_text('{"kind": "step"}\n')  # before any checkpoint: cut to empty
    attempts: list[list[int]] = []

    def run_once(j: JobSpec) -> None:
        attempts.append(j.slots)
        if len(attempts) == 1:
            raise WorkerFailed("container worker3 (rank 2) ended: exited, exit code 3; last lines: ...", slot=2)

    run_with_restarts(job, run_once, Console(file=open(os.devnull, "w")), "t", unreachable=lambda j: [2, 3])
    assert attempts == [[0, 1, 2, 3], [0, 1]] and job.members == [0, 1] and job.resume
    assert [(r["dropped"], r["workers"]) for r in read_restarts(tmp_path)] == [(["worker3", "worker4"],
                                                                              ["worker1", "worker2"])]
    assert (tmp_path / "metrics" / "rank-3.jsonl").read_text() == ""
