"""Job configuration: one tree of dataclasses, loaded from YAML, overridden by CLI flags, validated.

Every mistake is reported as a :class:`UserError` naming the file and the dotted key, before
anything starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from omnilearn.config.sections import (  # noqa: F401  (the sections are part of this module's interface)
    ALLOCATION_MODES,
    BACKENDS,
    MODES,
    PEERS,
    POLICIES,
    RETIRED,
    AspConfig,
    CheckpointConfig,
    ControlConfig,
    DataConfig,
    DockerConfig,
    EmulationConfig,
    FaultConfig,
    ModelConfig,
    ReportConfig,
    TrainConfig,
)
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml
from omnilearn.typed import build_dataclass


@dataclass
class JobConfig:
    """A job: the top-level keys, then one section per component."""

    mode: str = "bsp"
    """bsp (synchronous: every step an all-reduce) | asp (asynchronous: a parameter server, workers push)."""
    workers: int = 4
    """Training workers (ASP adds one parameter server)."""
    workload: str | None = None
    """The user's workload, ``"package.module:function"`` or ``"path/to/file.py:function"``: a function
    of this config returning an ``omnilearn.Workload`` (then ``model`` and ``data`` name no built-in)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    asp: AspConfig = field(default_factory=AspConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    source: str = "<defaults>"
    """Where the config came from (for messages); not a YAML key."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def validate(self) -> JobConfig:
        """Every section's own checks (next to its fields, in :mod:`.sections`), then the checks across
        sections; raises UserError naming the file and key."""
        w = self.source

        def bad(key: str, msg: str) -> UserError:
            return UserError(f"{w}: {key}: {msg}")

        if self.mode not in MODES:
            raise bad("mode", f"must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.workers < 1:
            raise bad("workers", f"must be at least 1, not {self.workers}")
        for name in ("train", "data", "control", "emulation", "asp", "report", "docker", "checkpoint", "fault"):
            getattr(self, name).check(lambda key, msg, name=name: bad(f"{name}.{key}" if key else name, msg))
        self._check_across(bad)
        return self

    def _check_across(self, bad: Callable[[str, str], UserError]) -> None:
        """What one section's value means for another's."""
        t, c = self.train, self.control
        if c.policy in PEERS and self.mode != "bsp":
            raise bad("control.policy", f"{c.policy} is a BSP peer; mode is {self.mode}")
        if c.min_batch * self.workers > t.global_batch:
            raise bad("train.global_batch", f"{t.global_batch} cannot give {self.workers} workers "
                      f"control.min_batch={c.min_batch} each")
        if c.max_batch is not None and c.max_batch * self.workers < t.global_batch:
            raise bad("train.global_batch", f"{t.global_batch} exceeds {self.workers} workers x "
                      f"control.max_batch={c.max_batch}")
        if self.mode == "asp" and self.asp.worker_timeout_s <= self.emulation.ack_timeout:
            raise bad("asp.worker_timeout_s", f"{self.asp.worker_timeout_s:g} must exceed emulation.ack_timeout "
                      f"{self.emulation.ack_timeout:g}: a worker waits that long for the toggler without calling "
                      f"the server")
        if not 1 <= self.fault.min_workers <= self.workers:
            raise bad("fault.min_workers", f"must be between 1 and workers ({self.workers}), not {self.fault.min_workers}")


RETIRED_KEYS = ("window", "min_samples", "deadband", "hysteresis", "skip_after_change", "change_threshold",
                "fit_overhead", "damp_reversals")
"""``control`` keys only the retired ``dynamic-v1`` read."""


def from_dict(data: dict[str, Any], where: str, saved: bool = False) -> JobConfig:
    """The job config of ``data`` (``where``: its file, for messages). ``saved``: a run folder's job file,
    perhaps written before a key was retired: ``control.prior: allocation`` is read as the policy
    ``dynamic+prior`` it meant and the retired ``dynamic-v1`` keys are dropped; a user's config naming
    them is refused, the key named."""
    control = data.get("control") if isinstance(data, dict) else None
    if isinstance(control, dict):
        data = {**data, "control": _retire(dict(control), where, saved)}
    cfg = build_dataclass(JobConfig, data, "", where)
    cfg.source = where
    return cfg


def _retire(control: dict[str, Any], where: str, saved: bool) -> dict[str, Any]:
    """``control`` without the keys since retired (``saved``), or the first of them refused."""
    old = [k for k in ("prior", *RETIRED_KEYS) if k in control]
    if old and not saved:
        why = "use policy dynamic+prior" if old[0] == "prior" else f"it was dynamic-v1's ({RETIRED['dynamic-v1']})"
        raise UserError(f"{where}: control.{old[0]}: no longer a key: {why}")
    if control.pop("prior", None) == "allocation" and control.get("policy") == "dynamic":
        control["policy"] = "dynamic+prior"
    for k in RETIRED_KEYS:
        control.pop(k, None)
    return control


def load(path: str | Path | None) -> dict[str, Any]:
    """Read a YAML job config into a plain dict (validated later, after CLI overrides)."""
    if path is None:
        return {}
    p = Path(path)
    data = load_yaml(p, "config file")
    if data is None:  # nothing but comments, or nothing at all: not a job anyone meant to run
        raise UserError(f"{p}: the config file is empty: give it at least one key, or leave --config out "
                        f"to run the defaults")
    if not isinstance(data, dict):
        raise UserError(f"{p}: top level must be a mapping of keys")
    return data


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Apply one override ``a.b.c = value`` to the nested dict."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` from ``--set``; the value is read as YAML (numbers, lists, true/false)."""
    if "=" not in text:
        raise UserError(f"--set {text}: expected KEY=VALUE, e.g. train.lr=0.1")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


# Without --config, an ASP job starts from this file rather than from the (BSP-tuned) defaults:
# ASP needs a model whose pulls and pushes a small parameter server keeps up with.
ASP_DEFAULTS = "asp-demo.yaml"


def build(path: str | Path | None, overrides: list[tuple[str, Any]]) -> JobConfig:
    """File, then overrides, then checks: the one way a job config is made."""
    data = load(path)
    for key, value in overrides:
        set_key(data, key, value)
    where = str(path) if path is not None else "<defaults>"
    if path is None and data.get("mode") == "asp":
        base = load(CONFIG_DIR / ASP_DEFAULTS)
        for key, value in overrides:
            set_key(base, key, value)
        data, where = base, f"{CONFIG_DIR / ASP_DEFAULTS} (ASP defaults)"
    if overrides:
        where += " (with command-line overrides)"
    cfg = from_dict(data, where)
    if cfg.workload:  # a file is found from the folder the job was started in, whoever imports it later
        target, sep, function = str(cfg.workload).rpartition(":")
        if not sep or not target or not function:
            raise UserError(f"{where}: workload: {cfg.workload!r} must be \"package.module:function\" "
                            f"or \"path/to/file.py:function\"")
        if target.endswith(".py"):
            cfg.workload = f"{Path(target).expanduser().resolve()}:{function}"
    return cfg.validate()
