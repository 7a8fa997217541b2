"""The trainers' checkpoints: what rank 0 of a BSP job and the ASP parameter server save and load,
from the state objects and the atomic file format of :mod:`omnilearn.train.checkpoint`.

:class:`BSPCheckpoint` gathers every rank's small state to rank 0, which writes it with the shared
state; :class:`ASPCheckpoint` is the server's (with :class:`ServerProgress`), its workers going on
from what the server tells them and cutting their metrics with :func:`cut_worker_metrics`. A
checkpoint records the slots of the workers it holds (``members``): survivors of a worker lost for
good take their own columns (:func:`cut_lost_worker` cuts the lost one's metrics).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omnilearn.config import JobConfig
from omnilearn.errors import UserError
from omnilearn.metrics import metrics_path as metrics_file
from omnilearn.train.checkpoint import (
    CheckpointSchedule,
    ControllerState,
    MetricsOffset,
    ModelBuffers,
    RngState,
    RunProgress,
    SamplerPosition,
    checkpoint_path,
    copy_plain,
    encode,
    load,
    save,
    saved_slots,
    write,
)

# ------------------------------------------------------------------------------------ BSP


class BSPCheckpoint:
    """A BSP trainer's checkpoints: every rank gathers its own small state (generators, BatchNorm
    buffers, metrics offset) to rank 0, which writes it with the model, optimizer and LR schedule
    (the same on every rank after each all-reduce) and the shared state. Every rank calls
    :meth:`save` at the same step: the decision comes from the epoch or the all-reduced clock."""

    def __init__(self, trainer: Any) -> None:
        self.t = trainer
        job, cfg = trainer.job, trainer.cfg
        self.path = checkpoint_path(job.out_dir, "bsp")
        self.schedule = CheckpointSchedule(cfg.checkpoint.interval())
        self.sampler = SamplerPosition(cfg.train.seed, cfg.train.global_batch)
        self.progress = RunProgress()
        self.metrics = MetricsOffset(metrics_file(job.out_dir, trainer.slot))
        self.state: dict[str, Any] | None = None
        self.saved_slots: list[int] = []
        if getattr(job, "resume", False):
            if self.path.is_file():
                self.state = load(self.path, cfg)
                self.saved_slots = saved_slots(self.state)
                self.metrics.load_state_dict(self._saved_rank(trainer.slot)["metrics"])
            else:  # a restart before the first checkpoint: from the start, the failed attempt's records cut
                self.metrics.load_state_dict({"size": 0})
        self.resumed = self.state is not None

    def _saved_rank(self, slot: int) -> dict[str, Any]:
        """The state the checkpoint holds of the worker in ``slot``."""
        assert self.state is not None
        if slot not in self.saved_slots:
            raise UserError(f"checkpoint {self.path} holds no state of {self.t.job.plan.targets[slot]} (it was "
                            f"saved by {', '.join(self.t.job.plan.targets[s] for s in self.saved_slots)}): "
                            f"a run goes on with the workers it had, or fewer")
        return self.state["ranks"][self.saved_slots.index(slot)]

    def _rank_objects(self) -> dict[str, Any]:
        return {"rng": RngState(augment=self.t.augment_rng), "buffers": ModelBuffers(self.t.model),
                "metrics": self.metrics}

    def _shared_objects(self) -> dict[str, Any]:
        t = self.t
        return {"model": t.model, "optimizer": t.optimizer, "scheduler": t.scheduler,
                "controller": ControllerState(t.controller), "sampler": self.sampler, "progress": self.progress,
                "schedule": self.schedule}

    def restore(self) -> None:
        """Load the checkpoint into the trainer (after its first level change and memory probe)."""
        if self.state is None:
            return
        for name, obj in self._shared_objects().items():
            if isinstance(obj, ControllerState):  # survivors of a lost worker take their own columns
                obj.load_state_dict(self.state[name], keep=[self.saved_slots.index(s) for s in self.t.slots])
            else:
                obj.load_state_dict(self.state[name])
        mine = self._saved_rank(self.t.slot)
        for name, obj in self._rank_objects().items():
            if name != "metrics":  # cut at construction, before the metrics file was opened
                obj.load_state_dict(mine[name])
        self.t.metrics.write("resume", step=self.progress.steps, epoch=self.sampler.epoch,
                             step_in_epoch=self.sampler.step, samples=self.progress.samples,
                             checkpoint_saved=self.state["saved"], clock=self.progress.clock,
                             workers=[self.t.job.plan.targets[s] for s in self.t.slots],
                             batch=list(self.t.controller.batch))

    def save(self, epoch: int, step: int, steps: int, samples: int, clock: float, position: float,
             eval_time: float) -> None:
        """Checkpoint the state before step ``step`` of ``epoch`` (a collective: every rank calls it)."""
        if not self.schedule.enabled:
            return
        import torch.distributed as dist

        self.sampler.epoch, self.sampler.step = epoch, step
        p = self.progress
        p.steps, p.samples, p.clock, p.position, p.eval_time, p.level = (steps, samples, clock, position,
                                                                         eval_time, self.t.client.level)
        self.schedule.saved(clock)
        mine = {name: obj.state_dict() for name, obj in self._rank_objects().items()}
        ranks: list[Any] | None = [None] * self.t.world if self.t.rank == 0 else None
        dist.gather_object(mine, ranks, dst=0)
        if self.t.rank != 0:
            return
        t0 = time.perf_counter()
        shared = {name: obj.state_dict() for name, obj in self._shared_objects().items()}
        save(self.path, {**shared, "ranks": ranks, "members": list(self.t.slots)}, self.t.cfg)
        self.t.metrics.write("checkpoint", step=steps, epoch=epoch, step_in_epoch=step, samples=samples,
                             clock=clock, save_s=round(time.perf_counter() - t0, 3))


def cut_lost_worker(out_dir: Path, cfg: JobConfig, slot: int) -> None:
    """Cut the metrics of the worker in ``slot``, which the job goes on without, back to the checkpoint the
    survivors go on from (empty them before the first; ASP: after its last push the server applied):
    what it did later, they do again. The launcher's work: no survivor's container holds that file."""
    path, metrics = checkpoint_path(out_dir, cfg.mode), metrics_file(out_dir, slot)
    state = load(path, cfg) if path.is_file() else None
    slots = saved_slots(state) if state is not None else []
    if cfg.mode == "asp":
        pushes = state["progress"]["last_seq"][slots.index(slot) - 1] if state is not None and slot in slots else 0
        cut_worker_metrics(metrics, pushes)
        return
    size = int(state["ranks"][slots.index(slot)]["metrics"]["size"]) if state is not None and slot in slots else 0
    MetricsOffset(metrics).load_state_dict({"size": size})


# ------------------------------------------------------------------------------------ ASP


class ServerProgress:
    """The parameter server's counters: gradients applied (``version``), samples, each worker's pushes
    applied (``last_seq``, ``updates``) and the samples they held (where its data stream stands),
    duplicates, the last epoch the ``paper`` policy decided at, the level, the evaluation snapshots
    taken and the epoch of the next, the run's first start, and the server's training clock (the
    schedule's seconds and the time budget go on from it)."""

    FIELDS = ("version", "samples", "last_seq", "updates", "worker_samples", "duplicates", "decided_epoch",
              "level", "snapshots", "next_snapshot", "started")

    def __init__(self, server: Any) -> None:
        self.server = server

    def state_dict(self) -> dict[str, Any]:
        s = self.server
        return {**{k: copy_plain(getattr(s, k)) for k in self.FIELDS}, "clock": s.elapsed()}

    PER_WORKER = ("last_seq", "updates", "worker_samples")

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        """Load ``d``; with ``keep`` (the saved workers that still run, in order) only their counters."""
        s = self.server
        keep = list(range(len(d["last_seq"]))) if keep is None else keep
        assert len(keep) == s.workers, (keep, s.workers)
        for k in self.FIELDS:
            value = copy_plain(d[k])
            setattr(s, k, [value[i] for i in keep] if k in self.PER_WORKER else value)
        s.clock = d["clock"]


class ASPCheckpoint:
    """The parameter server's checkpoints: model (parameters and BatchNorm statistics), optimizer,
    controller, progress, save schedule, generators and where the server's metrics file stood. The
    learning rate follows from the progress (its milestones are epochs of applied samples); each
    worker's data position and push count come back to it in the reply to its ``hello``.

    Saved on ``checkpoint.every`` (epochs of applied samples, or seconds of the server's clock), at
    the end, and whenever the server stops early (SIGTERM, a silent worker, a fault) whatever
    ``every`` says. The state is copied under the server's lock: pushes wait for the copy, not the write.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        out = Path(server.job.out_dir)
        self.path = checkpoint_path(out, "asp")
        self.schedule = CheckpointSchedule(server.cfg.checkpoint.interval())
        self.metrics = MetricsOffset(out / "metrics" / "rank-0.jsonl")
        self.resuming = bool(getattr(server.job, "resume", False))
        self.last_epoch = 0.0
        self.state: dict[str, Any] | None = None
        if self.resuming:  # the metrics cut before the server writes its first record
            self.state = load(self.path, server.cfg) if self.path.is_file() else None
            self.metrics.load_state_dict(self.state["metrics"] if self.state else {"size": 0})
        self.resumed = self.state is not None

    def _objects(self) -> dict[str, Any]:
        s = self.server
        return {"model": s.model, "optimizer": s.optimizer, "controller": ControllerState(s.controller),
                "progress": ServerProgress(s), "schedule": self.schedule, "rng": RngState(), "metrics": self.metrics}

    def restore(self) -> None:
        """Load the checkpoint into the server (before the workers register); snapshots taken after it
        (or all, for a restart before the first checkpoint) are removed: the resumed run takes them again."""
        if not self.resuming:
            return
        if self.state is not None:
            saved = saved_slots(self.state)[1:]  # the workers' (the server is slot 0)
            keep = [saved.index(s) for s in self.server.slots]  # survivors of a lost worker: theirs only
            for name, obj in self._objects().items():
                if isinstance(obj, (ControllerState, ServerProgress)):
                    obj.load_state_dict(self.state[name], keep=keep)
                elif name != "metrics":  # cut at construction
                    obj.load_state_dict(self.state[name])
            self.last_epoch = self.server.epoch
        for f in self.path.parent.glob("snapshot-*.pt"):
            index = f.stem.removeprefix("snapshot-")
            if not index.isdigit() or int(index) >= self.server.snapshots:
                f.unlink()

    def due(self) -> bool:
        s = self.server
        return self.schedule.due_epoch(s.epoch, self.last_epoch) or self.schedule.due_clock(s.elapsed())

    def save(self, reason: str) -> Path:
        """Write the checkpoint now (``reason``: every, end, or why the server stopped)."""
        s = self.server
        t0 = time.perf_counter()
        with s.lock:
            clock, self.last_epoch = s.elapsed(), s.epoch
            self.schedule.saved(clock)
            state = {name: obj.state_dict() for name, obj in self._objects().items()}
            state["members"] = list(s.job.slots)
            data = encode(state, s.cfg)
            copied = time.perf_counter() - t0
            version, samples, epoch = s.version, s.samples, s.epoch
        write(self.path, data)
        s.metrics.write("checkpoint", reason=reason, version=version, samples=samples, epoch=epoch, clock=clock,
                        bytes=len(data), locked_s=round(copied, 4), save_s=round(time.perf_counter() - t0, 4))
        return self.path


def cut_worker_metrics(path: Path, pushes: int) -> None:
    """Cut an ASP worker's metrics file before its first ``step`` record past push ``pushes`` (the
    pushes the server's checkpoint holds): the resumed worker makes those steps again."""
    if not Path(path).exists():
        return
    offset = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by the stop: nothing after it is kept
                break
            if record.get("kind") == "step" and record.get("seq", 0) > pushes:
                break
            offset += len(line)
    MetricsOffset(path).load_state_dict({"size": offset})
