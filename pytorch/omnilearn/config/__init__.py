"""Job configuration: one tree of dataclasses, loaded from YAML, overridden by CLI flags, validated.

Every mistake is reported as a :class:`UserError` naming the file and the dotted key, before
anything starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from omnilearn.config.sections import (  # noqa: F401  (the sections are part of this module's interface)
    ALLOCATION_MODES,
    BACKENDS,
    MODES,
    PEERS,
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
from omnilearn.control.policies import POLICIES
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
        """Cross-field checks; raises UserError naming the file and key."""
        w = self.source

        def bad(key: str, msg: str) -> UserError:
            return UserError(f"{w}: {key}: {msg}")

        if self.mode not in MODES:
            raise bad("mode", f"must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.workers < 1:
            raise bad("workers", f"must be at least 1, not {self.workers}")
        t, c, e = self.train, self.control, self.emulation
        if t.global_batch <= 0:
            raise bad("train.global_batch", f"must be positive, not {t.global_batch}")
        if t.epochs <= 0:
            raise bad("train.epochs", f"must be positive, not {t.epochs}")
        if t.lr <= 0:
            raise bad("train.lr", f"must be positive, not {t.lr}")
        if t.eval_every < 1:
            raise bad("train.eval_every", f"must be at least 1, not {t.eval_every}")
        if t.optimizer not in ("sgd", "adamw"):
            raise bad("train.optimizer", f"must be sgd or adamw, not {t.optimizer!r}")
        if t.time_budget_s is not None and t.time_budget_s <= 0:
            raise bad("train.time_budget_s", f"must be positive (or null), not {t.time_budget_s}")
        if t.dist_backend not in ("auto", "gloo", "nccl"):
            raise bad("train.dist_backend", f"must be auto, gloo or nccl, not {t.dist_backend!r}")
        if any(m <= 0 for m in t.milestones) or t.milestones != sorted(t.milestones):
            raise bad("train.milestones", f"must be increasing positive epochs, not {t.milestones}")
        if not 0 < self.data.test_fraction < 1:
            raise bad("data.test_fraction", f"must be between 0 and 1, not {self.data.test_fraction}")
        if self.data.image_size < 8:
            raise bad("data.image_size", f"must be at least 8, not {self.data.image_size}")
        if c.policy not in (*POLICIES, *PEERS):
            raise bad("control.policy", f"must be one of {', '.join((*POLICIES, *PEERS))}, not {c.policy!r}")
        if c.policy in PEERS and self.mode != "bsp":
            raise bad("control.policy", f"{c.policy} is a BSP peer; mode is {self.mode}")
        if c.min_batch < 1:
            raise bad("control.min_batch", f"must be at least 1, not {c.min_batch}")
        if c.max_batch is not None and c.max_batch < c.min_batch:
            raise bad("control.max_batch", f"{c.max_batch} is below control.min_batch {c.min_batch}")
        if c.min_batch * self.workers > t.global_batch:
            raise bad("train.global_batch", f"{t.global_batch} cannot give {self.workers} workers "
                      f"control.min_batch={c.min_batch} each")
        if c.max_batch is not None and c.max_batch * self.workers < t.global_batch:
            raise bad("train.global_batch", f"{t.global_batch} exceeds {self.workers} workers x "
                      f"control.max_batch={c.max_batch}")
        if c.interval < 0 or c.window < 1 or c.min_samples < 1 or c.min_samples > c.window:
            raise bad("control", "need interval >= 0, window >= 1 and 1 <= min_samples <= window")
        if c.change_threshold < 0:
            raise bad("control.change_threshold", f"must be >= 0, not {c.change_threshold}")
        if not 0 <= c.memory_margin < 1:
            raise bad("control.memory_margin", f"must be in [0, 1), not {c.memory_margin}")
        if not 0 <= c.deadband < 1:
            raise bad("control.deadband", f"must be in [0, 1), not {c.deadband}")
        if c.confidence < 0:
            raise bad("control.confidence", f"must be >= 0, not {c.confidence}")
        if not 0 < c.drift < 1:
            raise bad("control.drift", f"must be in (0, 1), not {c.drift}")
        if not 0 < c.hazard < 1:
            raise bad("control.hazard", f"must be in (0, 1), not {c.hazard}")
        if c.probe_steps < 0:
            raise bad("control.probe_steps", f"must be >= 0, not {c.probe_steps}")
        if c.skip_after_change < 0:
            raise bad("control.skip_after_change", "must be >= 0")
        if e.backend not in BACKENDS:
            raise bad("emulation.backend", f"must be one of {', '.join(BACKENDS)}, not {e.backend!r}")
        if e.allocation not in ALLOCATION_MODES:
            raise bad("emulation.allocation",
                      f"must be one of {', '.join(ALLOCATION_MODES)}, not {e.allocation!r}")
        if e.ack_timeout <= 0:
            raise bad("emulation.ack_timeout", "must be positive")
        if not 1_000 <= e.cpu_period_us <= 1_000_000:  # the kernel's range of CFS periods
            raise bad("emulation.cpu_period_us", f"must be in 1000-1000000 (microseconds), not {e.cpu_period_us}")
        a = self.asp
        if a.lr_reference_batch is not None and a.lr_reference_batch < 1:
            raise bad("asp.lr_reference_batch", f"must be at least 1, not {a.lr_reference_batch}")
        if a.eval_interval <= 0:
            raise bad("asp.eval_interval", f"must be positive, not {a.eval_interval}")
        if a.worker_timeout_s <= 0:
            raise bad("asp.worker_timeout_s", f"must be positive, not {a.worker_timeout_s}")
        if self.mode == "asp" and a.worker_timeout_s <= e.ack_timeout:
            raise bad("asp.worker_timeout_s", f"{a.worker_timeout_s:g} must exceed emulation.ack_timeout "
                      f"{e.ack_timeout:g}: a worker waits that long for the toggler without calling the server")
        r = self.report
        if r.target is not None and r.target <= 0:
            raise bad("report.target", f"must be positive, not {r.target}")
        if not 0 < r.target_fraction <= 1:
            raise bad("report.target_fraction", f"must be in (0, 1], not {r.target_fraction}")
        if not 0 < self.docker.master_port < 65536:
            raise bad("docker.master_port", f"must be a TCP port, not {self.docker.master_port}")
        if self.docker.pids_limit < 64:
            raise bad("docker.pids_limit", f"must be at least 64 (torch's threads grow with the host's CPUs), "
                      f"not {self.docker.pids_limit}")
        for req in self.docker.requirements:
            if not isinstance(req, str) or not req.strip() or req.lstrip().startswith("-"):
                raise bad("docker.requirements", f"{req!r} is not a requirement (a name with an optional version, "
                          f"no pip options)")
        for target, url in self.docker.hosts.items():
            if not url.startswith(("unix://", "tcp://", "ssh://", "http://", "https://")):
                raise bad(f"docker.hosts.{target}", f"{url!r} is not a daemon URL (unix://, tcp://, ssh://)")
        self._validate_faults(bad)
        return self

    def _validate_faults(self, bad: Any) -> None:
        every = self.checkpoint.every
        if every is not None and (isinstance(every, int) and every < 1 or isinstance(every, str) and not _seconds(every)):
            raise bad("checkpoint.every", f"must be a number of epochs >= 1 or seconds such as '30s', not {every!r}")
        if self.fault.max_restarts < 0:
            raise bad("fault.max_restarts", f"must be >= 0, not {self.fault.max_restarts}")
        if self.fault.drop_after < 0:
            raise bad("fault.drop_after", f"must be >= 0 (0: never go on without a worker), not {self.fault.drop_after}")
        if not 1 <= self.fault.min_workers <= self.workers:
            raise bad("fault.min_workers", f"must be between 1 and workers ({self.workers}), not {self.fault.min_workers}")
        if self.fault.timeout_s <= 0:
            raise bad("fault.timeout_s", f"must be positive, not {self.fault.timeout_s}")


def _seconds(text: str) -> bool:
    """Whether ``text`` is a positive number of seconds with an ``s`` suffix (``30s``, ``2.5s``)."""
    text = text.strip()
    try:
        return text.endswith("s") and float(text[:-1]) > 0 and text[:-1].replace(".", "", 1).isdigit()
    except ValueError:
        return False


def from_dict(data: dict[str, Any], where: str) -> JobConfig:
    if isinstance(data, dict) and isinstance(data.get("control"), dict) and "prior" in data["control"]:
        raise UserError(f"{where}: control.prior: no longer a key: use policy dynamic+prior")
    cfg = build_dataclass(JobConfig, data, "", where)
    cfg.source = where
    return cfg


def load(path: str | Path | None) -> dict[str, Any]:
    """Read a YAML job config into a plain dict (validated later, after CLI overrides)."""
    if path is None:
        return {}
    p = Path(path)
    data = load_yaml(p, "config file")
    if data is None:
        return {}
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
