"""Checkpoints: what a stopped run needs to go on, one small state object per concern.

Each concern has its own ``state_dict()`` / ``load_state_dict()``: the sampler's position
(:class:`SamplerPosition`), the run's progress and schedule position (:class:`RunProgress`), the
controller's batches, windows and fitted model (:class:`ControllerState`), random generators
(:class:`RngState`), the floating-point buffers a replica holds alone (:class:`ModelBuffers`) and
where its metrics file stood (:class:`MetricsOffset`). The model, optimizer and LR scheduler have
their own. :func:`save` writes them together as one file, atomically (temporary file, fsync,
rename): a kill at any moment leaves the previous checkpoint whole and loadable.

Two writers use them: rank 0 of a BSP job, every rank's small state gathered to it
(:class:`BSPCheckpoint`), and the parameter server (:class:`ASPCheckpoint`).

A checkpoint records a hash of the config's training-relevant parts (:func:`config_hash`), and
:func:`load` refuses one made under another config.

:class:`BSPCheckpoint` gathers every rank's small state to rank 0, which writes it with the shared
state; :class:`ASPCheckpoint` is the server's (with :class:`ServerProgress`), its workers going on
from what the server tells them and cutting their metrics with :func:`cut_worker_metrics`. A
checkpoint records the slots of the workers it holds (``members``): survivors of a worker lost for
good take their own columns (:func:`cut_lost_worker` cuts the lost one's metrics).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnilearn.config import JobConfig
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.metrics import metrics_path as metrics_file
from omnilearn.records import STEP

BSP_CHECKPOINT = Path("checkpoints") / "checkpoint.pt"
ASP_CHECKPOINT = Path("snapshots") / "checkpoint.pt"  # the one folder the server's container may write
FORMAT = 1
# Keys that do not change what is trained: where things are, how long to wait, what is reported.
UNTRAINED_KEYS = {"checkpoint": None, "fault": None, "report": None, "docker": None,
                  "data": ("root", "download"), "emulation": ("backend", "ack_timeout", "allocation")}


def saved_slots(state: dict[str, Any]) -> list[int]:
    """The slots (targets' indices in the plan) of the ranks whose state a checkpoint holds, by rank (ASP:
    the server's, 0, first)."""
    members = state.get("members")
    if members is not None:
        return [int(s) for s in members]
    return list(range(len(state["ranks"]) if "ranks" in state else len(state["progress"]["last_seq"]) + 1))


def checkpoint_path(out_dir: Path, mode: str) -> Path:
    return Path(out_dir) / (ASP_CHECKPOINT if mode == "asp" else BSP_CHECKPOINT)


def config_hash(cfg: JobConfig) -> str:
    """sha256 of the config without the keys that do not change what is trained (UNTRAINED_KEYS)."""
    d = cfg.to_dict()
    for section, keys in UNTRAINED_KEYS.items():
        if keys is None:
            d.pop(section, None)
        else:
            for key in keys:
                d.get(section, {}).pop(key, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def encode(state: dict[str, Any], cfg: JobConfig) -> bytes:
    """``state`` with the config's hash and the time, serialised: a copy that live tensors may change after."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "config_hash": config_hash(cfg), "saved": time.time(), **state}, buffer)
    return buffer.getvalue()


def write(path: Path, data: bytes) -> None:
    """Write an encoded checkpoint as ``path``, atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def save(path: Path, state: dict[str, Any], cfg: JobConfig) -> None:
    """Write ``state`` (with the config's hash and the time) as ``path``, atomically."""
    write(path, encode(state, cfg))


def load(path: Path, cfg: JobConfig) -> dict[str, Any]:
    """The checkpoint at ``path``; a UserError when it is missing, unreadable or of another config."""
    if not path.is_file():
        raise UserError(f"no checkpoint {path} to resume from")
    try:  # tensors and plain containers only: a file a container could write never runs code here
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever torch finds wrong, the file cannot be used
        raise UserError(f"checkpoint {path} cannot be read: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {path} is not an omnilearn checkpoint of format {FORMAT}")
    if state["config_hash"] != config_hash(cfg):
        raise UserError(f"checkpoint {path} was made under another config (its training keys differ from "
                        f"{cfg.source}'s): resume with the run's own config, or start a new run")
    return state


# ------------------------------------------------------------------------------------ state objects


@dataclass
class SamplerPosition:
    """Where the BSP sampler stands: the next step to run, ``step`` of ``epoch``'s permutation, which
    ``(seed, epoch)`` determine (:class:`~omnilearn.train.sampler.GlobalBatchSampler`)."""

    seed: int
    global_batch: int
    epoch: int = 0
    step: int = 0

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        assert (d["seed"], d["global_batch"]) == (self.seed, self.global_batch), (d, self)
        self.epoch, self.step = int(d["epoch"]), int(d["step"])


@dataclass
class RunProgress:
    """Counters and the schedule's position: steps and samples done, the training clock (the
    schedule's seconds and the time budget), evaluation time, when the run first started, the level."""

    steps: int = 0
    samples: int = 0
    clock: float = 0.0
    position: float = 0.0
    eval_time: float = 0.0
    started: float = 0.0
    level: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, d[f.name])


class ControllerState:
    """The controller's whole state, as the controller itself gives it (``state_dict`` /
    ``load_state_dict``); ``keep``: the saved workers that still run, in rank order (survivors)."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller

    def state_dict(self) -> dict[str, Any]:
        return copy_plain(self.controller.state_dict())

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None:
        self.controller.load_state_dict(copy_plain(d), keep=keep)


def copy_plain(value: Any) -> Any:
    """A deep copy of plain data (lists, dicts, numbers) through JSON: what a checkpoint holds of a
    controller or a server is never shared with the live object."""
    return json.loads(json.dumps(value)) if value is not None else None


class RngState:
    """Python's, NumPy's and torch's global generators, and the generators a trainer owns (NumPy's
    key as a tensor: a checkpoint holds tensors and plain containers only)."""

    def __init__(self, **generators: torch.Generator) -> None:
        self.generators = generators

    def state_dict(self) -> dict[str, Any]:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
        return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state(),
                **{f"gen.{k}": g.get_state() for k, g in self.generators.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        random.setstate(d["python"])
        name, keys, pos, has_gauss, gauss = d["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(d["torch"])
        for k, g in self.generators.items():
            g.set_state(d[f"gen.{k}"])


class ModelBuffers:
    """The floating-point buffers of one replica (BatchNorm statistics): each BSP rank's own,
    averaged over the ranks only at evaluations."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: b.detach().clone() for n, b in self.model.named_buffers() if b.dtype.is_floating_point}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        own = dict(self.model.named_buffers())
        assert set(d) <= set(own), set(d) - set(own)
        with torch.no_grad():
            for n, b in d.items():
                own[n].copy_(b)


class MetricsOffset:
    """How long a metrics file was at the checkpoint: records written later describe work the resumed
    run does again, so they are cut before it appends."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def state_dict(self) -> dict[str, int]:
        return {"size": self.path.stat().st_size if self.path.exists() else 0}

    def load_state_dict(self, d: dict[str, int]) -> None:
        if self.path.exists() and self.path.stat().st_size > d["size"]:
            with open(self.path, "r+b") as f:
                f.truncate(d["size"])
                os.fsync(f.fileno())


# ------------------------------------------------------------------------------------ when to save


class CheckpointSchedule:
    """When ``checkpoint.every`` asks for a checkpoint: at the end of every n-th epoch, or at the first
    point at least s seconds of the training clock after the last one."""

    def __init__(self, every: tuple[str, float] | None) -> None:
        self.unit, self.value = every if every is not None else (None, 0.0)
        self.last_clock = 0.0

    @property
    def enabled(self) -> bool:
        return self.unit is not None

    def due_epoch(self, epochs_done: float, last_epochs: float) -> bool:
        """Epochs: ``epochs_done`` (which may be a fraction, ASP) crossed a multiple of n since ``last_epochs``."""
        return self.unit == "epochs" and int(epochs_done // self.value) > int(last_epochs // self.value)

    def due_clock(self, clock: float) -> bool:
        return self.unit == "seconds" and clock - self.last_clock >= self.value

    def saved(self, clock: float) -> None:
        self.last_clock = clock

    def state_dict(self) -> dict[str, float]:
        return {"last_clock": self.last_clock}

    def load_state_dict(self, d: dict[str, float]) -> None:
        self.last_clock = d["last_clock"]


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
    """The parameter server's counters: gradients applied (``version``) and the optimizer's time they
    took (``kclock``: b / b_ref of each), samples, each worker's pushes
    applied (``last_seq``, ``updates``) and the samples they held (where its data stream stands),
    duplicates, the last epoch the ``paper`` policy decided at, the level, the evaluation snapshots
    taken and the epoch of the next, the run's first start, and the server's training clock (the
    schedule's seconds and the time budget go on from it)."""

    FIELDS = ("version", "samples", "last_seq", "updates", "worker_samples", "duplicates", "decided_epoch",
              "level", "snapshots", "next_snapshot", "started", "kclock")

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
            value = copy_plain(d.get(k, 0.0 if k == "kclock" else d.get(k)))
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
        return {"model": s.model, "optimizer": s.rule, "controller": ControllerState(s.controller),
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
            if record.get("kind") == STEP and record.get("seq", 0) > pushes:
                break
            offset += len(line)
    MetricsOffset(path).load_state_dict({"size": offset})
