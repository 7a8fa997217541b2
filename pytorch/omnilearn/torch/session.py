"""A torchrun script's run folder: its job file, and the levels of ``omnilearn emulate`` around it.

A script that adopts :mod:`omnilearn.torch` gets an ordinary run folder (``job.json``,
``metrics/rank-<r>.jsonl``, ``summary.json``), so ``omnilearn report`` and the figures read it as
they read a run's. Under ``omnilearn emulate`` the folder is emulate's (``OMNILEARN_OUT``): the job
file keeps emulate's plan and gets the script's batch and control settings. Levels then come from
emulate's schedule: one in seconds is applied by emulate, and the script only labels its steps with
it (by rank 0's clock, so every rank changes label at the same step); one in epochs is applied by
the script itself, through the same request log and toggler as a run's workers.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from omnilearn import config
from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.emulator.spec.plan import build_plan, worker_target
from omnilearn.errors import UserError
from omnilearn.jobfile import JOB_FILE, OUT_ENV, T0_ENV, JobSpec, new_job_id


def _shared_text(value: str) -> str:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def make_job(world: int, rank: int, global_batch: int, settings: dict[str, Any], names: tuple[str, str],
             out: str | Path | None) -> tuple[JobSpec, bool]:
    """The job of this script (rank 0 writes its job file); returns it and whether emulate runs it.

    ``settings``: dotted config keys (``control.policy``, ``train.seed``, ...) checked as a job
    config's are. A mistake is a UserError naming the key.
    """
    emulated = out is None and bool(os.environ.get(OUT_ENV))
    folder = Path(os.environ[OUT_ENV]) if emulated else Path(out) if out is not None else None
    base: dict[str, Any] = {"emulation": {"backend": "none", "hl": "HL1"}}
    plan, job_id, backend = None, "", "none"
    if emulated:
        assert folder is not None
        if not (folder / JOB_FILE).is_file():
            raise UserError(f"{OUT_ENV}={folder}: no {JOB_FILE} there (set by omnilearn emulate)")
        outer = JobSpec.load(folder / JOB_FILE, out_dir=folder)
        base, plan, job_id, backend = outer.config.to_dict(), outer.plan, outer.job_id, outer.backend
        if len(plan.targets) != world:
            raise UserError(f"omnilearn emulate was given {len(plan.targets)} workers (--workers), the "
                            f"script runs {world} ranks: give emulate --workers {world}")
    else:
        job_id = _shared_text(new_job_id() if rank == 0 else "")
        if folder is None:
            folder = Path("runs") / f"torch-{job_id}"
    data = copy.deepcopy(base)
    keys = {"mode": "bsp", "workers": world, "train.global_batch": global_batch, "train.epochs": 1,
            "model.name": f"torch:{names[0]}", "data.name": f"torch:{names[1]}", **settings}
    for key, value in keys.items():
        config.set_key(data, key, value)
    cfg = config.from_dict(data, "omnilearn.torch settings").validate()
    if plan is None:
        plan = build_plan(cfg)
    job = JobSpec(job_id=job_id, config=cfg, plan=plan, out_dir=folder.resolve(), backend=backend)
    if rank == 0:
        job.save()
    dist.barrier()
    return job, emulated


@dataclass
class Levels:
    """The level in force at each step, and this rank's allocation, under ``omnilearn emulate``."""

    job: JobSpec
    rank: int
    emulated: bool
    level: str | None = None
    cpus: float | None = None
    threads: int | None = None
    t0: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.target = worker_target("bsp", self.rank)
        self.targets = [worker_target("bsp", r) for r in range(self.job.config.workers)]
        self.client: AllocationClient | None = None
        if self.emulated:
            self.t0 = float(os.environ.get(T0_ENV) or time.time())
            if self.schedule.unit != "seconds":  # levels follow the script's epochs: the script asks for them
                self.client = AllocationClient(self.job.plan, self.job.log_dir, self.rank, self.target,
                                               self.job.config.emulation.ack_timeout)

    @property
    def schedule(self):  # noqa: ANN201 - emulator.schedule.Schedule
        return self.job.plan.schedule

    def clock(self) -> float:
        """Seconds since emulate's schedule began (rank 0's is shared with every step's gather)."""
        return time.time() - self.t0

    def at(self, epoch_position: float, clock: float) -> dict[str, Any] | None:
        """Move to the level the schedule holds now; returns the change event, or None."""
        if not self.emulated:
            return None
        if self.client is not None:
            event = self.client.ensure(self.schedule.level_at(epoch_position), epoch_position)
            if event is not None:
                self.level, self.cpus, self.threads = self.client.level, self.client.allocation.share, \
                    self.client.threads
            return event
        level = self.schedule.level_at(clock)
        if level == self.level:
            return None
        previous, self.level = self.level, level
        self.cpus = self.job.plan.allocation(level, self.target).share
        return {"from_level": previous, "level": level, "epoch": epoch_position, "target": self.target,
                "status": "applied by omnilearn emulate", "clock_s": round(clock, 3)}

    def outcome(self, epoch_position: float) -> dict[str, Any] | None:
        """The outcome of a change the toggler was still retrying, once it has one (else None)."""
        late = self.client.settle(epoch_position) if self.client is not None else None
        if late is not None and self.client is not None:
            self.cpus, self.threads = self.client.allocation.share, self.client.threads
        return late

    def shares(self) -> list[float | None]:
        """Every rank's allocated CPUs at the level in force (for the policies named for them)."""
        if self.level is None:
            raise UserError("policies static and dynamic+prior need the allocations of omnilearn emulate: "
                            "run the script under `omnilearn emulate`, or use dynamic")
        return [self.job.plan.allocation(self.level, t).share for t in self.targets]
