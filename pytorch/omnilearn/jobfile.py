"""The job file: everything a worker needs, resolved by the launcher and written once.

Workers (local processes, containers, or ranks under torchrun) read ``OUT/job.json`` and nothing
else: the validated config, the emulation plan, where logs and metrics go.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.config import JobConfig, from_dict
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.errors import UserError
from omnilearn.files import write_atomic

JOB_FILE = "job.json"
OUT_ENV = "OMNILEARN_OUT"
"""Set by ``omnilearn emulate`` for its command: the run folder (holding job.json) a script's
:mod:`omnilearn.torch` writes its metrics to."""
T0_ENV = "OMNILEARN_EMULATE_T0"
"""Set by ``omnilearn emulate``: the wall time (``time.time()``) its schedule's second 0 fell on."""
HOOK_ENV = "OMNILEARN_HOOK"
"""Set (to ``1``) by ``omnilearn record`` and ``omnilearn emulate``: every rank of an unmodified DDP script
loads the timing module (:mod:`omnilearn.torch.hook_timing`), which writes its step records."""


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class JobSpec:
    job_id: str
    config: JobConfig
    plan: EmulationPlan
    out_dir: Path
    backend: str  # the emulation backend actually used, e.g. "cgroup-v1"
    resume: bool = False
    """Workers go on from the run folder's checkpoint (``--resume``, or a restart after a failure)."""
    members: list[int] | None = None
    """The plan's targets that run, by index: rank r runs ``plan.targets[members[r]]``. None: all of
    them. After a BSP worker was lost for good (``fault.drop_after``), the survivors."""

    @property
    def slots(self) -> list[int]:
        """The index in the plan's targets of each rank's target (:attr:`members`, or all of them).

        A worker's files (``metrics/rank-<i>.jsonl``, ``logs/cpu-<i>.log``) and its allocations are
        named by this index, which stays the same when survivors are re-ranked."""
        return list(range(len(self.plan.targets))) if self.members is None else list(self.members)

    @property
    def log_dir(self) -> Path:
        """Shared with the toggler: cpu-<rank>.log requests and the audit."""
        return self.out_dir / "logs"

    @property
    def metrics_dir(self) -> Path:
        return self.out_dir / "metrics"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "config": self.config.to_dict(),
            "source": self.config.source,
            "plan": self.plan.to_dict(),
            "out_dir": str(self.out_dir),
            "backend": self.backend,
            "resume": self.resume,
            "members": self.members,
        }

    def save(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.metrics_dir.mkdir(exist_ok=True)
        path = self.out_dir / JOB_FILE
        write_atomic(path, json.dumps(self.to_dict(), indent=2))
        return path

    @staticmethod
    def load(path: Path, out_dir: Path | None = None) -> JobSpec:
        """Read a job file; ``out_dir`` re-roots it (a container sees the run folder elsewhere)."""
        try:
            d = json.loads(Path(path).read_text())
            config = d["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path}: not a readable job file ({type(e).__name__}: {e})") from None
        cfg = from_dict(config, d.get("source", str(path)), saved=True)
        return JobSpec(
            job_id=d["job_id"],
            config=cfg,
            plan=EmulationPlan.from_dict(d["plan"]),
            out_dir=Path(out_dir) if out_dir is not None else Path(d["out_dir"]),
            backend=d["backend"],
            resume=bool(d.get("resume", False)),
            members=d.get("members"),
        )
