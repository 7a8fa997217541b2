"""The job file: everything a worker needs, resolved by the launcher and written once.

Workers (local processes, containers, or ranks under torchrun) read ``OUT/job.json`` and nothing
else: the validated config, the emulation plan, where logs and metrics go.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.config import JobConfig, from_dict
from omnilearn.emulator.plan import EmulationPlan


class WorkerFailed(Exception):
    """A worker (process or container) ended with an error; the message names it and holds its log's end."""


def first_failure(failures: dict[int, tuple[float, int]], user_error: int = 2) -> int:
    """The rank whose failure started it all, from ``{rank: (when, exit status)}``.

    When one worker dies, its peers fail a moment later on the broken connection, often before the
    launcher looks again: the earliest time wins; failures seen together are ordered by kind (killed
    by a signal, then a user error, then any other status: the peers' consequence errors), then rank.
    Signal deaths are negative statuses (``Popen``) or 128 + signal (containers).
    """
    def kind(status: int) -> int:
        return 0 if status < 0 or status > 128 else 1 if status == user_error else 2

    return min(failures, key=lambda r: (failures[r][0], kind(failures[r][1]), r))


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary name and rename: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class JobSpec:
    job_id: str
    config: JobConfig
    plan: EmulationPlan
    out_dir: Path
    backend: str  # the emulation backend actually used, e.g. "cgroup-v1"

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
        }

    def save(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.metrics_dir.mkdir(exist_ok=True)
        path = self.out_dir / "job.json"
        write_atomic(path, json.dumps(self.to_dict(), indent=2))
        return path

    @staticmethod
    def load(path: Path, out_dir: Path | None = None) -> JobSpec:
        """Read a job file; ``out_dir`` re-roots it (a container sees the run folder elsewhere)."""
        d = json.loads(Path(path).read_text())
        cfg = from_dict(d["config"], d.get("source", str(path)))
        return JobSpec(
            job_id=d["job_id"],
            config=cfg,
            plan=EmulationPlan.from_dict(d["plan"]),
            out_dir=Path(out_dir) if out_dir is not None else Path(d["out_dir"]),
            backend=d["backend"],
        )
