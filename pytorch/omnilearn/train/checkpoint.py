"""Checkpoints: what a stopped run needs to go on, one small state object per concern.

Each concern has its own ``state_dict()`` / ``load_state_dict()``: the sampler's position
(:class:`SamplerPosition`), the run's progress and schedule position (:class:`RunProgress`), the
controller's batches, windows and fitted model (:class:`ControllerState`), random generators
(:class:`RngState`), the floating-point buffers a replica holds alone (:class:`ModelBuffers`) and
where its metrics file stood (:class:`MetricsOffset`). The model, optimizer and LR scheduler have
their own. :func:`save` writes them together as one file, atomically (temporary file, fsync,
rename): a kill at any moment leaves the previous checkpoint whole and loadable.

Two writers use them (:mod:`omnilearn.train.checkpointers`): rank 0 of a BSP job, every rank's small
state gathered to it, and the parameter server.

A checkpoint records a hash of the config's training-relevant parts (:func:`config_hash`), and
:func:`load` refuses one made under another config.
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
