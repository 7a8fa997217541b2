"""What the launcher reads back from a job's containers: their states, when they ended, their output."""

from __future__ import annotations

import contextlib
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.files import write_in


def finished_at(stamp: str | None) -> float:
    """Docker's ``State.FinishedAt`` (RFC 3339, nanoseconds) as a POSIX time; +inf when unknown."""
    if not stamp or stamp.startswith("0001-"):
        return math.inf
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    if m is None:
        return math.inf
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float("0." + (m.group(2) or "0"))


def container_states(default: Any, remote: dict[str, Any], containers: dict[str, str]
                     ) -> dict[str, tuple[str, int, float]]:
    """target -> (status, exit code, when it ended: POSIX time, +inf if running or unknown)."""
    dk = docker_sdk()
    out = {}
    for target, cid in containers.items():
        client = remote.get(target, default)
        try:
            c = client.containers.get(cid)
            st = c.attrs["State"]
            out[target] = (c.status, int(st.get("ExitCode", 0)), finished_at(st.get("FinishedAt")))
        except dk.errors.NotFound:
            out[target] = ("vanished", -1, math.inf)
    return out


def save_logs(default: Any, remote: dict[str, Any], containers: dict[str, str], log_dir: Path,
              targets: list[str]) -> None:
    """Keep each container's output (``logs/worker-<slot>.out``, the slot being its target's index in
    ``targets``, the plan's) before the container is removed; never written through a link someone
    planted under that name."""
    for target, cid in containers.items():
        with contextlib.suppress(Exception):
            write_in(log_dir, f"worker-{targets.index(target)}.out",
                     remote.get(target, default).containers.get(cid).logs())


def tail_logs(client: Any, cid: str, lines: int = 15) -> str:
    with contextlib.suppress(Exception):
        return client.containers.get(cid).logs(tail=lines).decode(errors="replace")
    return "(no logs)"
