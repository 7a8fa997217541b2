"""Job configuration: one tree of dataclasses, loaded from YAML, overridden by CLI flags, validated.

Every mistake is reported as a :class:`UserError` naming the file and the dotted key, before
anything starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from omnilearn.control.policies import POLICIES
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml

MODES = ("bsp", "asp")
PEERS = ("ddp",)
"""Policies that are not ours: ``ddp`` is plain DistributedDataParallel with equal batches (BSP only),
the peer a user would otherwise run."""
BACKENDS = ("auto", "cgroup", "affinity", "docker", "none")
ALLOCATION_MODES = ("auto", "cpuset", "quota")


@dataclass
class ModelConfig:
    name: str = "resnet18"
    """resnet18 | resnet50 | vgg11 | alexnet | smallcnn | gpt2 (with data.name: text)."""
    stem: str = "auto"
    """ResNet stem for small images: auto | imagenet | small | cifar."""
    size: str = "tiny"
    """GPT-2 size: tiny (2 layers, 128 wide) | mini | small (GPT-2's 124M)."""
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    """GPT-2 overrides of the size's layer count, heads and width."""


@dataclass
class DataConfig:
    name: str = "digits"
    """digits (offline default) | cifar10 | cifar100 | synthetic | food101 | caltech256 | places365 | text."""
    root: str = "data"
    """Where torchvision datasets live (and are downloaded to)."""
    image_size: int = 32
    download: bool = False
    """Let torchvision download a missing dataset."""
    test_fraction: float = 0.2
    """Held-out share for datasets without a test split (digits, synthetic, caltech256)."""
    augment: bool = False
    """Random crop + flip on training batches."""
    synthetic_size: int = 2048
    path: str = "stdlib"
    """data.name text: a UTF-8 text file (e.g. Tiny Shakespeare), or stdlib: the Python standard library's
    sources, an offline corpus present wherever the project is installed."""
    tokenizer: str = "byte"
    """byte (no files needed) | gpt2 (GPT-2's BPE from data.tokenizer_path, a local folder)."""
    tokenizer_path: str | None = None
    seq_len: int = 128
    """Tokens per training window."""
    max_bytes: int = 2_000_000
    """Read at most this much of the corpus."""


@dataclass
class TrainConfig:
    epochs: int = 3
    global_batch: int = 256
    """B: the samples of one synchronous step, summed over workers."""
    optimizer: str = "sgd"
    """sgd (momentum, weight decay) | adamw (GPT-2)."""
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: list[int] = field(default_factory=list)
    """Epochs at which the learning rate is multiplied by gamma."""
    gamma: float = 0.1
    eval_every: int = 1
    """Evaluate on the held-out split every N epochs (and always after the last)."""
    seed: int = 1234
    dist_backend: str = "auto"
    """torch.distributed backend: auto (nccl with CUDA, else gloo) | gloo | nccl."""
    drop_last: bool = False
    time_budget_s: float | None = None
    """Stop training after this many seconds of wall time since training started (evaluations
    included); ``epochs`` stays a cap. BSP stops at the end of the step that crosses it (rank 0's
    clock, shared by the step's all-reduce), ASP when the server sees it."""


@dataclass
class ControlConfig:
    policy: str = "dynamic"
    """uniform | static | dynamic (the controller's policies), or ddp: plain DistributedDataParallel
    with equal batches (BSP only), the peer to compare with."""
    interval: int = 2
    """Decide every N steps; 0 decides at the end of each epoch."""
    window: int = 3
    """Compute-time measurements kept per worker."""
    min_samples: int = 2
    """Fresh measurements each worker needs before a decision."""
    deadband: float = 0.05
    """Relative compute-time spread (and batch change) below which nothing changes."""
    skip_after_change: int = 1
    """Steps not measured after a batch or allocation change."""
    prior: str = "allocation"
    """Where dynamic starts, at the beginning and after a level change: allocation (batches in proportion
    to the allocated CPU, scaled by the speeds measured before the change) | uniform (equal batches, as
    the paper). Measurement corrects either."""
    min_batch: int = 2
    max_batch: int | None = None
    memory_bounds: bool = True
    """Probe memory per sample at start-up and never give a worker more than fits its memory budget
    (its cgroup/container limit, else available RAM; GPU memory on a GPU). Uniform batching, the
    baseline, ignores it (and is warned)."""
    memory_margin: float = 0.15
    """Share of the budget kept free when deriving the memory bound."""


@dataclass
class EmulationConfig:
    backend: str = "auto"
    """auto (cgroup as root, else affinity) | cgroup | affinity | docker | none."""
    allocation: str = "auto"
    """auto (cpusets if the host has the table's cores, else quotas) | cpuset | quota."""
    schedule: str = "demo"
    """A named schedule (configs/schedules.yaml) or a YAML file."""
    hl: str | None = None
    """Pin one level for the whole run (overrides schedule)."""
    levels: dict[str, list[Any]] | None = None
    """Own level table: level -> one cpuset string or CPU quota number per worker."""
    ack_timeout: float = 20.0
    """Seconds a worker waits for the toggler to apply its request."""
    links: list[Any] | dict[str, Any] | None = None
    """Network links per worker: a list (one entry per worker), a mapping target -> entry
    (``{worker1: 100mbit}``), or a mapping level -> either. An entry is null (unshaped), a rate
    (``100mbit``) or ``{rate, delay, jitter, loss}`` (``10ms``, ``0.5%``; these three need the kernel's
    sch_netem). Shaping needs root; ``--set emulation.links=null`` switches links off. Checked when
    the plan is built (emulator/links.py)."""
    trace: str | None = None
    """A trace file (CSV or JSONL, configs/traces/) whose CPU shares, links and stalls drive the run,
    stretched over train.epochs; ``hl`` names the level a share is a fraction of (default HL1).
    ``schedule`` may name the trace file instead (emulator/trace_plan.py)."""
    calibration: str | None = None
    """A file written by ``omnilearn calibrate``: its calibrated level table replaces the nominal one."""


@dataclass
class AspConfig:
    """Asynchronous training (mode: asp): one parameter server, workers push gradients."""

    lr_reference_batch: int | None = None
    """b_ref: a gradient of a b-sample batch is applied with lr * b / b_ref (default: global_batch / workers)."""
    staleness_damping: bool = False
    """Also divide a gradient's learning rate by 1 + its staleness."""
    eval_interval: float = 1.0
    """Epochs (samples applied / training-set size) between snapshots of the server's model; each
    snapshot is evaluated on the held-out split after training (the end is always snapshotted)."""
    worker_timeout_s: float = 60.0
    """A worker silent for this long (no pull or push) stops the job, after a server checkpoint."""


@dataclass
class DockerConfig:
    """The container launcher (``emulation.backend: docker``)."""

    image: str = "omnilearn-worker:latest"
    build: bool = True
    """Build the image first when it is missing or older than this checkout (``omnilearn image build``)."""
    network: str | None = None
    """Attachable overlay network; default ``omnilearn-<job id>``, created and removed with the job."""
    encrypted: bool | None = None
    """Encrypt the overlay network's traffic (IPsec between hosts). Unset: on when ``hosts`` places a
    target on another daemon, off on one host (where the traffic never leaves the machine)."""
    advertise_addr: str | None = None
    """Address for ``docker swarm init`` when this host is not in a swarm yet (default: Docker's choice,
    falling back to 127.0.0.1 on a host with no routable address)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """Target (worker1, ...) -> daemon URL (``ssh://user@host``, ``tcp://...``); others run locally.
    The run folder must be the same path on every host (a shared file system)."""
    master_port: int = 29500
    stop_timeout: float = 10.0
    pids_limit: int = 4096
    """Processes and threads one container may hold (a fork bomb stops there). A BSP worker held 6 on a
    2-CPU host; torch's thread pools grow with the host's CPUs, hence the margin."""


@dataclass
class ReportConfig:
    """What a run reports besides ``summary.json`` and its figures."""

    tensorboard: bool = False
    """Write TensorBoard scalars to ``OUT/tensorboard/`` while the job runs (``--tensorboard``)."""
    target: float | None = None
    """Held-out metric to reach for time-to-target (accuracy, or perplexity for language models);
    default: ``target_fraction`` of the best final value among the compared runs."""
    target_fraction: float = 0.95
    """The default target: this share of the best final accuracy (perplexity: the best / this)."""


@dataclass
class JobConfig:
    mode: str = "bsp"
    workers: int = 4
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    asp: AspConfig = field(default_factory=AspConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
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
        if c.prior not in ("allocation", "uniform"):
            raise bad("control.prior", f"must be allocation or uniform, not {c.prior!r}")
        if not 0 <= c.memory_margin < 1:
            raise bad("control.memory_margin", f"must be in [0, 1), not {c.memory_margin}")
        if not 0 <= c.deadband < 1:
            raise bad("control.deadband", f"must be in [0, 1), not {c.deadband}")
        if c.skip_after_change < 0:
            raise bad("control.skip_after_change", "must be >= 0")
        if e.backend not in BACKENDS:
            raise bad("emulation.backend", f"must be one of {', '.join(BACKENDS)}, not {e.backend!r}")
        if e.allocation not in ALLOCATION_MODES:
            raise bad("emulation.allocation",
                      f"must be one of {', '.join(ALLOCATION_MODES)}, not {e.allocation!r}")
        if e.ack_timeout <= 0:
            raise bad("emulation.ack_timeout", "must be positive")
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
        for target, url in self.docker.hosts.items():
            if not url.startswith(("unix://", "tcp://", "ssh://", "http://", "https://")):
                raise bad(f"docker.hosts.{target}", f"{url!r} is not a daemon URL (unix://, tcp://, ssh://)")
        return self


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, where)
            except UserError as err:
                errors.append(err)
        raise UserError(f"{where}: {key}: expected {' or '.join(_type_name(a) for a in args)}, "
                        f"got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{where}: {key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: {key}: expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}", where) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: {key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: {key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: {key}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, where)
    raise AssertionError(f"unsupported config type {tp} for {key}")


def _build(cls: type, data: Any, prefix: str, where: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"{where}: {prefix or 'top level'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise UserError(f"{where}: unknown key '{dotted}' (known: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], dotted, where)
    return cls(**kwargs)


def from_dict(data: dict[str, Any], where: str) -> JobConfig:
    cfg = _build(JobConfig, data, "", where)
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
    return from_dict(data, where).validate()
