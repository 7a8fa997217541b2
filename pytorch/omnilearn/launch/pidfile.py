"""What a job started, on disk: a record per job in a state folder, and a copy in its run folder.

The record names the launcher (pid and start time, so a reused pid is never taken for it), every
worker process, and the job's id (its cgroups, network namespaces and Docker resources carry it).
``omnilearn cleanup`` (:func:`omnilearn.launch.cleanup.cleanup_dead`) removes what a job left when its launcher is gone, and
never touches a job whose launcher still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

STATE_ENV = "OMNILEARN_STATE_DIR"
RUN_FILE = "pids.json"
"""The record's copy in the run folder."""


def state_dir() -> Path:
    """Where job records live: $OMNILEARN_STATE_DIR, else /run/omnilearn (root), else /tmp/omnilearn-<uid>."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    return Path("/run/omnilearn") if os.geteuid() == 0 else Path(f"/tmp/omnilearn-{os.geteuid()}")


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def same_process(pid: int, start: int | None) -> bool:
    return start is not None and start_time(pid) == start


class JobRecord:
    """The record of one running job; :meth:`add` each process as it starts, :meth:`close` at the end."""

    def __init__(self, job_id: str, out_dir: Path, backend: str, hosts: dict[str, str] | None = None) -> None:
        self.path = state_dir() / f"{job_id}.json"
        self.run_copy = Path(out_dir) / RUN_FILE
        pid = os.getpid()
        self.data: dict[str, Any] = {"job_id": job_id, "out_dir": str(out_dir), "backend": backend,
                                     "hosts": dict(hosts or {}), "launcher": {"pid": pid, "start": start_time(pid)},
                                     "workers": [], "started": time.time()}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write()

    def add(self, rank: int, pid: int) -> None:
        self.data["workers"].append({"rank": rank, "pid": pid, "start": start_time(pid)})
        self._write()

    def _write(self) -> None:
        text = json.dumps(self.data, indent=1)
        for path in (self.path, self.run_copy):
            with contextlib.suppress(OSError):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, path)

    def close(self) -> None:
        """The job ended and its launcher removed what it made: the record goes."""
        with contextlib.suppress(OSError):
            self.path.unlink()


def records() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    folder = state_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            out.append((path, json.loads(path.read_text())))
    return out


def launcher_alive(record: dict[str, Any]) -> bool:
    launcher = record.get("launcher") or {}
    return same_process(int(launcher.get("pid", 0)), launcher.get("start"))


def kill_workers(record: dict[str, Any], wait_s: float = 5.0) -> list[str]:
    """SIGKILL (after SIGCONT: none stays stopped) every recorded worker that is still the same process."""
    killed = []
    for w in record.get("workers", []):
        pid = int(w["pid"])
        if same_process(pid, w.get("start")):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            killed.append(f"process {pid} (rank {w['rank']})")
    deadline = time.time() + wait_s
    while time.time() < deadline and any(same_process(int(w["pid"]), w.get("start"))
                                         and _state(int(w["pid"])) != "Z" for w in record.get("workers", [])):
        time.sleep(0.05)
    return killed


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None
