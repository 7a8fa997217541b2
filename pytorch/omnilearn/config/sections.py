"""The sections of a job config (``model``, ``data``, ``train``, ``control``, ...), one dataclass each.

Field defaults are the documented defaults; cross-field checks live in :meth:`JobConfig.validate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODES = ("bsp", "asp")
PEERS = ("ddp",)
"""Policies that are not ours: ``ddp`` is plain DistributedDataParallel with equal batches (BSP only),
the peer a user would otherwise run."""
BACKENDS = ("auto", "cgroup", "affinity", "docker", "none")
ALLOCATION_MODES = ("auto", "cpuset", "quota")

POLICIES = ("uniform", "static", "dynamic", "dynamic+prior", "paper")
RETIRED = {"dynamic-v1": "results/2026-11-29_2cpu_fresh-clone-bounds.md"}
"""Policies no longer shipped, and the results file that holds their last figures."""

KNOWS = {
    "uniform": "nothing: equal batches, never changed",
    "static": "the allocated CPU shares (the emulator's allocations); nothing measured",
    "dynamic": "measured compute times only (every step's): no allocations, no level events",
    "dynamic+prior": "measured compute times and the allocated CPU shares (its start and its level changes)",
    "paper": "measured compute times only (per-epoch means), with the paper's fixed settings",
    "ddp": "nothing: plain DistributedDataParallel with equal batches (the peer, not a policy of ours)",
}

Bad = Callable[[str, str], Exception]
"""Makes the error for a key of a section (relative to it) and a message; the job's config names its file
and the section (:meth:`omnilearn.config.JobConfig.validate`)."""


def _seconds(text: str) -> bool:
    """Whether ``text`` is a positive number of seconds with an ``s`` suffix (``30s``, ``2.5s``)."""
    text = text.strip()
    try:
        return text.endswith("s") and float(text[:-1]) > 0 and text[:-1].replace(".", "", 1).isdigit()
    except ValueError:
        return False


@dataclass
class ModelConfig:
    """The model every worker trains (a built-in one; ``workload`` names the user's own)."""

    name: str = "resnet18"
    """resnet18 | resnet50 | vgg11 | alexnet | smallcnn | gpt2 (with data.name: text)."""
    stem: str = "auto"
    """ResNet stem for small images: auto | imagenet | small | cifar."""
    size: str = "tiny"
    """GPT-2 size: tiny (2 layers, 128 wide) | mini | small (GPT-2's 124M)."""
    n_layer: int | None = None
    """GPT-2: override the size's layer count."""
    n_head: int | None = None
    """GPT-2: override the size's attention heads."""
    n_embd: int | None = None
    """GPT-2: override the size's width (embedding dimension)."""


@dataclass
class DataConfig:
    """The data set: its name, where it lives, and how it is split and fed."""

    name: str = "digits"
    """digits (offline default) | cifar10 | cifar100 | synthetic | food101 | caltech256 | places365 | text."""
    root: str = "data"
    """Where torchvision datasets live (and are downloaded to)."""
    image_size: int = 32
    """Side of the square images the model sees, in pixels (at least 8)."""
    download: bool = False
    """Let torchvision download a missing dataset."""
    test_fraction: float = 0.2
    """Held-out share for datasets without a test split (digits, synthetic, caltech256)."""
    augment: bool = False
    """Random crop + flip on training batches."""
    synthetic_size: int = 2048
    """data.name synthetic: how many generated images (training and held-out together)."""
    path: str = "stdlib"
    """data.name text: a UTF-8 text file (e.g. Tiny Shakespeare), or stdlib: the Python standard library's
    sources, an offline corpus present wherever the project is installed."""
    tokenizer: str = "byte"
    """byte (no files needed) | gpt2 (GPT-2's BPE from data.tokenizer_path, a local folder)."""
    tokenizer_path: str | None = None
    """tokenizer gpt2: the local folder holding GPT-2's tokenizer files."""
    seq_len: int = 128
    """Tokens per training window."""
    max_bytes: int = 2_000_000
    """Read at most this much of the corpus."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if not 0 < self.test_fraction < 1:
            raise bad("test_fraction", f"must be between 0 and 1, not {self.test_fraction}")
        if self.image_size < 8:
            raise bad("image_size", f"must be at least 8, not {self.image_size}")


ADAMW_BETA2 = 0.999
"""AdamW's beta2 everywhere (its beta1 is ``train.momentum``)."""


@dataclass
class TrainConfig:
    """The training loop: length, global batch, optimizer and seed."""

    epochs: int = 3
    """Epochs to train (a cap when time_budget_s is set)."""
    global_batch: int = 256
    """B: the samples of one synchronous step, summed over workers. ASP: the unit a push is counted in
    (B / workers, unless asp.lr_reference_batch) and the most the workers' batches sum to; dynamic's
    pushes may sum to less (a smaller push is fresher)."""
    optimizer: str = "sgd"
    """sgd (momentum, weight decay) | adamw (GPT-2)."""
    lr: float = 0.1
    """Learning rate."""
    momentum: float = 0.9
    """SGD's momentum; AdamW's beta1 (the decay of its first moment; beta2 stays 0.999)."""
    weight_decay: float = 5e-4
    """Weight decay of the optimizer."""
    milestones: list[int] = field(default_factory=list)
    """Epochs at which the learning rate is multiplied by gamma."""
    gamma: float = 0.1
    """Factor applied to the learning rate at each milestone."""
    eval_every: int = 1
    """Evaluate on the held-out split every N epochs (and after the last)."""
    seed: int = 1234
    """Seed of the model's initialisation and of the per-epoch data permutation."""
    dist_backend: str = "auto"
    """torch.distributed backend: auto (nccl with CUDA, else gloo) | gloo | nccl."""
    drop_last: bool = False
    """Drop an epoch's partial last step of fewer than global_batch samples (BSP sampler)."""
    time_budget_s: float | None = None
    """Stop after this many seconds of wall time since training started (evaluations included; epochs
    stay a cap): BSP at the end of the step that crosses it (rank 0's clock), ASP at the server."""

    @property
    def betas(self) -> tuple[float, float]:
        """AdamW's betas: ``momentum`` and :data:`ADAMW_BETA2`."""
        return (self.momentum, ADAMW_BETA2)

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if self.global_batch <= 0:
            raise bad("global_batch", f"must be positive, not {self.global_batch}")
        if self.epochs <= 0:
            raise bad("epochs", f"must be positive, not {self.epochs}")
        if self.lr <= 0:
            raise bad("lr", f"must be positive, not {self.lr}")
        if self.eval_every < 1:
            raise bad("eval_every", f"must be at least 1, not {self.eval_every}")
        if self.optimizer not in ("sgd", "adamw"):
            raise bad("optimizer", f"must be sgd or adamw, not {self.optimizer!r}")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", f"must be in [0, 1), not {self.momentum}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise bad("time_budget_s", f"must be positive (or null), not {self.time_budget_s}")
        if self.dist_backend not in ("auto", "gloo", "nccl"):
            raise bad("dist_backend", f"must be auto, gloo or nccl, not {self.dist_backend!r}")
        if any(m <= 0 for m in self.milestones) or self.milestones != sorted(self.milestones):
            raise bad("milestones", f"must be increasing positive epochs, not {self.milestones}")


@dataclass
class ControlConfig:
    """The batching policy and the controller's settings."""

    policy: str = "dynamic"
    """uniform | static (knows allocations) | dynamic (measured times only: a start-up probe, then every
    step) | dynamic+prior (dynamic told the allocations: it starts from them and rescales its speeds by
    the new shares at a level change) | paper (measured times, the paper's rule and settings: per-epoch
    means, deadband 0.2, bounds [B/n / 2, 3 B/n]) | ddp (plain DistributedDataParallel with equal
    batches, BSP only: the peer to compare with)."""
    interval: int = 1
    """Consider a decision every N steps (0: at epoch ends)."""
    confidence: float = 2.0
    """dynamic: standard deviations of the predicted gain a move must clear: it moves only when the
    step time it saves, less this many sds, exceeds the measured cost of a re-split spread over the
    steps the new split serves."""
    drift: float = 0.005
    """dynamic: how far a worker's speed may wander in one step without a level change (sd of its log,
    a random walk): larger follows slow drifts sooner, smaller averages more steps (the estimate's sd
    settles near sqrt(drift x noise): the smallest imbalance it resolves)."""
    hazard: float = 0.01
    """dynamic: the prior probability, per worker and step, that its speed jumps (a level change, a
    neighbour's job): larger believes one surprising step sooner. 1 / hazard also bounds the steps a
    new split is expected to serve."""
    probe_steps: int = 2
    """dynamic: rounds of the start-up probe (each worker times one step at B/(8n) and one at B/(4n) a
    round, once its first allocation is in force; the least of two rounds counts, of more the median of
    each pair's least; under a CPU quota more rounds where steps are short, until the pass has lasted 0.1 s); 0: no
    probe, the equal split until steps are measured."""
    min_batch: int = 2
    """The smallest local batch any worker is given."""
    max_batch: int | None = None
    """The largest local batch any worker is given (null: no bound beyond the global batch)."""
    memory_bounds: bool = True
    """Probe memory per sample at start-up and never give a worker more than fits its memory budget
    (its cgroup/container limit, else available RAM; GPU memory on a GPU). Uniform batching, the
    baseline, ignores it (and is warned)."""
    memory_margin: float = 0.15
    """Share of the budget kept free when deriving the memory bound."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it); how it fits the job's batch is the job's."""
        if self.policy in RETIRED:
            raise bad("policy", f"{self.policy!r} is retired; its figures are in {RETIRED[self.policy]}")
        if self.policy not in (*POLICIES, *PEERS):
            raise bad("policy", f"must be one of {', '.join((*POLICIES, *PEERS))}, not {self.policy!r}")
        if self.min_batch < 1:
            raise bad("min_batch", f"must be at least 1, not {self.min_batch}")
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise bad("max_batch", f"{self.max_batch} is below control.min_batch {self.min_batch}")
        if self.interval < 0:
            raise bad("interval", f"must be >= 0, not {self.interval}")
        if not 0 <= self.memory_margin < 1:
            raise bad("memory_margin", f"must be in [0, 1), not {self.memory_margin}")
        if self.confidence < 0:
            raise bad("confidence", f"must be >= 0, not {self.confidence}")
        if not 0 < self.drift < 1:
            raise bad("drift", f"must be in (0, 1), not {self.drift}")
        if not 0 < self.hazard < 1:
            raise bad("hazard", f"must be in (0, 1), not {self.hazard}")
        if self.probe_steps < 0:
            raise bad("probe_steps", f"must be >= 0, not {self.probe_steps}")


@dataclass
class EmulationConfig:
    """How heterogeneity is emulated: backend, level table, schedule, links and traces."""

    backend: str = "auto"
    """auto (cgroup as root, else affinity) | cgroup | affinity | docker | none."""
    allocation: str = "auto"
    """auto (cpusets if the host has the table's cores, else quotas) | cpuset | quota."""
    schedule: str = "demo"
    """A named schedule (configs/schedules.yaml) or a YAML file."""
    hl: str | None = None
    """Pin one level for the whole run (overrides schedule)."""
    levels: dict[str, list[Any]] | None = None
    """Own level table: level -> one entry per worker: a cpuset string, a CPU quota number, or
    ``{cpuset, cpus, memory}`` (any of them; a cpuset with cpus is a quota on those cores)."""
    ack_timeout: float = 20.0
    """Seconds a worker waits for the toggler to apply its request."""
    links: list[Any] | dict[str, Any] | None = None
    """Network links per worker: a list (one entry per worker), a mapping target -> entry
    (``{worker1: 100mbit}``), or a mapping level -> either. An entry is null (unshaped), a rate
    (``100mbit``) or ``{rate, delay, jitter, loss}`` (``10ms``, ``0.5%``; these three need the kernel's
    sch_netem). Shaping needs root; ``--set emulation.links=null`` switches links off. Checked when
    the plan is built (emulator/spec/links.py)."""
    trace: str | None = None
    """A trace file (CSV or JSONL, configs/traces/) whose CPU shares, links and stalls drive the run,
    stretched over train.epochs; ``hl`` names the level a share is a fraction of (default HL1).
    ``schedule`` may name the trace file instead (emulator/spec/trace.py)."""
    calibration: str | None = None
    """A file written by ``omnilearn calibrate``: its calibrated level table replaces the nominal one."""
    cpu_period_us: int = 10_000
    """The CFS period of the workers' CPU quotas (cgroup and Docker backends), 1000-1000000 µs;
    lengthened for a share whose quota would fall below 1 ms. Under a quota a worker runs at a core's
    speed, then waits out the period: with the kernel's 100 ms, a step of a few tens of ms runs at
    full speed or waits whole periods by its phase, and its time jumps rather than growing with the
    batch. A short period makes a share of a core behave like a slower core."""
    host_share: float = 0.85
    """Quota allocation: the share of the host's CPUs the workers' (and the server's) quotas add up
    to. The rest runs what the host runs beside them: the launcher, the toggler, the kernel, the
    all-reduce's own threads. Quotas that add up to every CPU are not met whenever anything else runs,
    and each worker's step time jitters with it: on 2 CPUs, a worker's time about the others' read
    0.045 (sd of the log) at 1.0 and 0.027 at 0.85 (``results/2026-11-29_2cpu_host-share.md``)."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if self.backend not in BACKENDS:
            raise bad("backend", f"must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.allocation not in ALLOCATION_MODES:
            raise bad("allocation", f"must be one of {', '.join(ALLOCATION_MODES)}, not {self.allocation!r}")
        if self.ack_timeout <= 0:
            raise bad("ack_timeout", "must be positive")
        if not 1_000 <= self.cpu_period_us <= 1_000_000:  # the kernel's range of CFS periods
            raise bad("cpu_period_us", f"must be in 1000-1000000 (microseconds), not {self.cpu_period_us}")
        if not 0 < self.host_share <= 1:
            raise bad("host_share", f"must be in (0, 1], not {self.host_share}")


LR_SCALINGS = ("auto", "linear", "sqrt", "none")
ASP_UPDATES = ("sample-time", "scaled-gradient")
ASP_PUSHES = ("gradients", "parameters")
ASP_SECOND_MOMENTS = ("reference", "push")


@dataclass
class AspConfig:
    """Asynchronous training (mode: asp): one parameter server, workers push gradients (or parameters)."""

    update: str = "sample-time"
    """The server's update rule (docs/design/asp.md): ``sample-time`` (a push of b samples counts as
    b / b_ref units of the optimizer's time, and its gradient is weighed by min(1, delay_tolerance /
    staleness)) | ``scaled-gradient`` (torch's optimizer on the gradient scaled by (b / b_ref) ** p,
    ``lr_scaling``; the rule kept for comparison)."""
    push: str = "gradients"
    """What a worker pushes: ``gradients`` (the server applies each one) | ``parameters`` (the paper's
    released code: each worker steps its own optimizer, sample-time at staleness 0, and the server
    keeps the last writer's parameters; the workers' own optimizer states are not checkpointed)."""
    delay_tolerance: float = 1.0
    """sample-time: rho, the staleness (in units of b_ref samples applied since the gradient's pull) up
    to which a gradient keeps its full weight; beyond, its weight is rho / staleness. 1 suits a step
    tuned without delay; a step small enough for the delays of n workers tolerates about n (.inf: no
    cut). The ASP controller's model uses the same rho."""
    batch_tolerance: float | None = None
    """sample-time: the units of batch (b / b_ref) one push's step may take at once: a push of more
    moves the model as far as one of this many. Default (null): delay_tolerance, one number for both.
    With momentum beta a step stays stable for about (1 + beta) / (1 - beta) times more batch than
    delay, but a large batch may be worth less than its units (docs/design/asp.md: on the ASP demo a
    wider cap cost perplexity)."""
    delay_correction: float = 0.0
    """sample-time: lambda0 of a late gradient's first-order correction to the current parameters
    (DC-ASGD: g + lambda0 g*g*(theta - theta_pulled) / rms(g), the Hessian's diagonal taken as g*g); 0:
    none. The server keeps each worker's pulled parameters for it (one copy of the model a worker)."""
    second_moment: str = "push"
    """sample-time with adamw: what a push brings to Adam's second moment. ``push``: its gradient's
    square, whose noise is that of its own b samples (sigma^2 / b: small pushes raise the denominator
    and shrink every step); ``reference``: the square a push of b_ref samples would bring, (1 - kappa)
    m_hat^2 + kappa g^2 (at least 0, kappa = b / b_ref, m_hat the first moment before the push), the
    noise of the batch the step was tuned at whatever the split (docs/design/asp.md)."""
    warmup_epochs: float = 0.0
    """The server's learning rate rises in proportion to the epochs applied (samples applied / training-set
    size) up to ``train.lr`` at this many, then follows ``train.milestones``; 0: none. Adam's moments and
    the step's first updates rest on few pushes, most of them late."""
    lr_reference_batch: int | None = None
    """b_ref: the batch a push counts one unit of the optimizer's time at (default: global_batch /
    workers, the equal share)."""
    lr_scaling: str = "auto"
    """scaled-gradient: how a gradient's weight follows its batch b (the gradient is scaled before it
    enters the optimizer's momentum or moments): ``linear`` (b / b_ref), ``sqrt`` (sqrt(b / b_ref)),
    ``none``; ``auto``: linear."""
    staleness_damping: bool = False
    """scaled-gradient: also divide a gradient's weight by 1 + its staleness (in updates)."""
    eval_interval: float = 1.0
    """Epochs (samples applied / training-set size) between snapshots of the server's model; each
    snapshot is evaluated on the held-out split after training (the end is always snapshotted)."""
    worker_timeout_s: float = 60.0
    """A worker silent for this long (no pull or push) stops the job, after a server checkpoint."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if self.lr_reference_batch is not None and self.lr_reference_batch < 1:
            raise bad("lr_reference_batch", f"must be at least 1, not {self.lr_reference_batch}")
        if self.lr_scaling not in LR_SCALINGS:
            raise bad("lr_scaling", f"must be one of {', '.join(LR_SCALINGS)}, not {self.lr_scaling!r}")
        if self.update not in ASP_UPDATES:
            raise bad("update", f"must be one of {', '.join(ASP_UPDATES)}, not {self.update!r}")
        if self.push not in ASP_PUSHES:
            raise bad("push", f"must be one of {', '.join(ASP_PUSHES)}, not {self.push!r}")
        if self.second_moment not in ASP_SECOND_MOMENTS:
            raise bad("second_moment", f"must be one of {', '.join(ASP_SECOND_MOMENTS)}, not {self.second_moment!r}")
        if self.batch_tolerance is not None and not self.batch_tolerance > 0:
            raise bad("batch_tolerance", f"must be positive (or null: delay_tolerance), not {self.batch_tolerance}")
        if not self.delay_correction >= 0:
            raise bad("delay_correction", f"must be at least 0 (0: none), not {self.delay_correction}")
        if not self.delay_tolerance > 0:
            raise bad("delay_tolerance", f"must be positive (.inf: no cut), not {self.delay_tolerance}")
        if not self.warmup_epochs >= 0:
            raise bad("warmup_epochs", f"must be at least 0 (0: none), not {self.warmup_epochs}")
        if self.eval_interval <= 0:
            raise bad("eval_interval", f"must be positive, not {self.eval_interval}")
        if self.worker_timeout_s <= 0:
            raise bad("worker_timeout_s", f"must be positive, not {self.worker_timeout_s}")


@dataclass
class DockerConfig:
    """The container launcher (``emulation.backend: docker``)."""

    image: str = "omnilearn-worker:latest"
    """The worker image every container runs."""
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
    """Target (worker2, ...) -> daemon URL (``ssh://user@host``, ``tcp://...``, ``unix://...``) of a host
    joined to the launcher's swarm; others run on the launcher's daemon, rank 0 always. No folder is
    shared: a remote container's run folder is a volume on its host, kept in step over the Docker API
    (docs/guide/across-hosts.md)."""
    master_port: int = 29500
    """TCP port of rank 0's rendezvous (``MASTER_PORT``) on the job's overlay network."""
    stop_timeout: float = 10.0
    """Seconds a stopping container gets after SIGTERM before Docker kills it."""
    pids_limit: int = 4096
    """Processes + threads per container (a fork bomb stops there); a BSP worker held 6 on 2 CPUs, but
    torch's thread pools grow with the host's CPUs."""
    requirements: list[str] = field(default_factory=list)
    """Extra pip requirements of a user's workload (``["scikit-learn==1.5.2"]``): installed in a layer on
    ``image``, tagged by their hash and built once."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if not 0 < self.master_port < 65536:
            raise bad("master_port", f"must be a TCP port, not {self.master_port}")
        if self.pids_limit < 64:
            raise bad("pids_limit", f"must be at least 64 (torch's threads grow with the host's CPUs), "
                      f"not {self.pids_limit}")
        for req in self.requirements:
            if not isinstance(req, str) or not req.strip() or req.lstrip().startswith("-"):
                raise bad("requirements", f"{req!r} is not a requirement (a name with an optional version, "
                          f"no pip options)")
        for target, url in self.hosts.items():
            if not url.startswith(("unix://", "tcp://", "ssh://", "http://", "https://")):
                raise bad(f"hosts.{target}", f"{url!r} is not a daemon URL (unix://, tcp://, ssh://)")


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

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        if self.target is not None and self.target <= 0:
            raise bad("target", f"must be positive, not {self.target}")
        if not 0 < self.target_fraction <= 1:
            raise bad("target_fraction", f"must be in (0, 1], not {self.target_fraction}")


@dataclass
class CheckpointConfig:
    """Checkpoints a stopped or failed run resumes from (``omnilearn run --resume OUT``)."""

    every: int | str | None = None
    """Save every N epochs (an integer), or every N seconds of training (``"30s"``), and at the end
    (ASP: epochs of the server's applied samples, seconds of its clock); null: no checkpoints (an
    ASP server still saves one when it stops on a fault or SIGTERM)."""

    def interval(self) -> tuple[str, float] | None:
        """``("epochs", n)``, ``("seconds", s)`` or None; the value is checked by the job's validation."""
        if self.every is None:
            return None
        if isinstance(self.every, int):
            return "epochs", float(self.every)
        return "seconds", float(self.every.strip()[:-1])

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it)."""
        every = self.every
        if every is not None and (isinstance(every, int) and every < 1 or isinstance(every, str) and not _seconds(every)):
            raise bad("every", f"must be a number of epochs >= 1 or seconds such as '30s', not {every!r}")


@dataclass
class FaultConfig:
    """What happens when a worker fails."""

    timeout_s: float = 60.0
    """A worker that makes no step for this long is reported hung (also the process group's timeout)."""
    max_restarts: int = 0
    """Restart the job from its last checkpoint (or from the start, without one) after a worker loss,
    up to this many times."""
    drop_after: int = 2
    """BSP: a worker lost this many attempts in a row cannot come back; the next restart goes on with
    the survivors (the global batch re-split among them). 0: always restart with every worker."""
    min_workers: int = 1
    """BSP: the fewest survivors a restart may go on with; below it the job fails."""

    def check(self, bad: Bad) -> None:
        """This section's own checks (keys relative to it); ``min_workers`` against the job's is the job's."""
        if self.max_restarts < 0:
            raise bad("max_restarts", f"must be >= 0, not {self.max_restarts}")
        if self.drop_after < 0:
            raise bad("drop_after", f"must be >= 0 (0: never go on without a worker), not {self.drop_after}")
        if self.timeout_s <= 0:
            raise bad("timeout_s", f"must be positive, not {self.timeout_s}")
