"""Job configs the tests share: one home, so a change to the config schema is made once."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SKEW_SCHEDULE = "unit: epoch\npoints:\n  - {at: 0, level: EVEN}\n  - {at: 1, level: SKEW}\n"


def write_skew_job(folder: Path, backend: str, synthetic_size: int, epochs: int = 3) -> Path:
    """A 3-worker BSP job whose level goes from equal quotas (EVEN) to 0.15/0.3/1.2 CPUs (SKEW) after
    epoch 1; writes its schedule beside it and returns the config's path."""
    schedule = folder / "sched.yaml"
    schedule.write_text(SKEW_SCHEDULE)
    cfg = folder / "job.yaml"
    cfg.write_text(f"""
mode: bsp
workers: 3
model: {{name: smallcnn}}
data: {{name: synthetic, image_size: 32, synthetic_size: {synthetic_size}}}
train: {{epochs: {epochs}, global_batch: 192, lr: 0.05}}
control: {{policy: dynamic}}
emulation:
  backend: {backend}
  allocation: quota
  schedule: {schedule}
  levels:
    EVEN: [0.6, 0.6, 0.6]
    SKEW: [0.15, 0.3, 1.2]
""")
    return cfg


def job_id_of(out: Path, timeout: float = 60) -> str:
    """The job id in ``out/job.json``, once a launcher has written it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return json.loads((out / "job.json").read_text())["job_id"]
        time.sleep(0.2)
    raise AssertionError(f"no {out / 'job.json'}")


def live_workers(out: Path) -> dict[int, int]:
    """rank -> pid of the run's worker processes that are alive now, from the run's own pid file
    (``pids.json``; a pid reused by another process, or a zombie, does not count)."""
    from omnilearn.launch import pidfile

    path = out / "pids.json"
    if not path.is_file():
        return {}
    workers = json.loads(path.read_text()).get("workers", [])
    return {w["rank"]: w["pid"] for w in workers
            if pidfile.same_process(w["pid"], w["start"]) and pidfile._state(w["pid"]) not in (None, "Z")}


def wait_until(proc: Any, until: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Poll ``until()`` while the job ``proc`` (a Popen with its output piped) runs: its output if it ends
    first, an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while not until():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def decisions_replay(run: Path, rank: int = 0) -> tuple[list[dict], list[dict]]:
    """The run's batch changes and what a fresh controller decides on the run's recorded inputs."""
    from omnilearn.control.controller import build_controller
    from omnilearn.control.loop import replay
    from omnilearn.jobfile import JobSpec
    from omnilearn.metrics import read_rank

    job = JobSpec.load(run / "job.json", out_dir=run)
    cfg = job.config
    ctl = build_controller(cfg.control, cfg.train.global_batch, cfg.workers)
    records = read_rank(run, rank)
    recorded = [{k: v for k, v in r.items() if k != "time"} for r in records if r["kind"] == "batch_change"]
    return recorded, replay(ctl, records)
