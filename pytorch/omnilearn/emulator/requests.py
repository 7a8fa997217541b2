"""The CPU-request protocol: workers append requests, the host's toggler applies them.

One file per rank, ``cpu-<rank>.log``, in a log directory the workers and the toggler share (a bind
mount for containers). A worker only ever appends one JSON object per line; the toggler reads
complete lines only and answers each decision with a line in ``toggler-audit.jsonl``. Both files
only grow, so a crash of either side leaves nothing half-applied that a restart cannot recover.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omnilearn.emulator.levels import Allocation, parse_cpuset
from omnilearn.files import read_jsonl, read_lines

AUDIT_NAME = "toggler-audit.jsonl"
REQUEST_GLOB = "cpu-*.log"

# Every key a request line carries, with the JSON types it may have. ``memory`` may be absent
# (older writers and the design notes' example omit it); every other key is required.
_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,),
    "rank": (int,),
    "target": (str,),
    "level": (str,),
    "cpuset": (str, type(None)),
    "cpus": (int, float, type(None)),
    "memory": (int, type(None)),
    "epoch": (int, float, type(None)),
    "time": (int, float),
}
_OPTIONAL = {"memory"}


def request_log(log_dir: Path, rank: int) -> Path:
    """The file rank ``rank`` appends its requests to."""
    return Path(log_dir) / f"cpu-{rank}.log"


def audit_path(log_dir: Path) -> Path:
    """The toggler's audit file in ``log_dir`` (its decisions, and its persistent state)."""
    return Path(log_dir) / AUDIT_NAME


@dataclass(frozen=True)
class CpuRequest:
    """One worker's request to run ``target`` with a new allocation from ``level`` on."""

    seq: int
    rank: int
    target: str
    level: str
    cpuset: str | None
    cpus: float | None
    memory: int | None
    epoch: float | None
    time: float

    @property
    def allocation(self) -> Allocation:
        return Allocation(cpuset=self.cpuset, cpus=self.cpus, memory=self.memory)

    def to_line(self) -> str:
        """The request as one JSON line, as the worker appends it."""
        return json.dumps(asdict(self), allow_nan=False) + "\n"

    @staticmethod
    def parse(line: str) -> CpuRequest:
        """Parse one line of a request log; ValueError says what is wrong with it.

        Ranges that depend on the host or the job (cpus > 0, CPUs the host has, the job's
        targets) are the toggler's checks, not syntax: such a request parses and is rejected.
        """
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        missing = sorted(set(_FIELDS) - _OPTIONAL - set(raw))
        if missing:
            raise ValueError(f"missing key(s): {', '.join(missing)}")
        extra = sorted(set(raw) - set(_FIELDS))
        if extra:
            raise ValueError(f"unknown key(s): {', '.join(extra)}")
        for key, types in _FIELDS.items():
            value = raw.get(key)
            # bool is an int in Python, never a valid value here.
            if isinstance(value, bool) or not isinstance(value, types):
                names = "/".join("null" if t is type(None) else t.__name__ for t in types)
                raise ValueError(f"{key}: expected {names}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key}: not a finite number: {value!r}")
        if raw["seq"] < 0:
            raise ValueError(f"seq: must be >= 0, got {raw['seq']}")
        if raw["rank"] < 0:
            raise ValueError(f"rank: must be >= 0, got {raw['rank']}")
        if not raw["target"]:
            raise ValueError("target: empty")
        if raw["cpuset"] is not None:
            try:
                parse_cpuset(raw["cpuset"])
            except ValueError as e:
                raise ValueError(f"cpuset: {e}") from None
        cpus = raw["cpus"]
        return CpuRequest(
            seq=raw["seq"],
            rank=raw["rank"],
            target=raw["target"],
            level=raw["level"],
            cpuset=raw["cpuset"],
            cpus=float(cpus) if cpus is not None else None,
            memory=raw.get("memory"),
            epoch=raw["epoch"],
            time=float(raw["time"]),
        )


def append_line(path: Path, line: str) -> None:
    """Append one complete line durably (the only way either side writes its file).

    If the file ends with an unfinished line (its writer crashed mid-line), that line is closed
    first: otherwise the new line would be glued to it and both would be lost as one bad line.
    """
    assert line.endswith("\n") and "\n" not in line[:-1], line
    with open(path, "a", encoding="utf-8") as f:
        if f.tell() > 0 and not _ends_with_newline(path):
            line = "\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class RequestWriter:
    """The worker's side: appends requests to its own ``cpu-<rank>.log``, never rewrites it."""

    def __init__(self, log_dir: Path, rank: int) -> None:
        self.log_dir = Path(log_dir)
        self.rank = rank
        self.path = request_log(self.log_dir, rank)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # A restarted worker continues after the highest seq already written: the toggler skips
        # any seq it has seen in this file, so reusing one would silently drop the request.
        self._next_seq = self._highest_seq() + 1
        self._audit_offset = 0
        self._audit_seen: dict[int, dict[str, Any]] = {}

    def _highest_seq(self) -> int:
        lines, _ = read_lines(self.path)
        highest = -1
        for raw, _ in lines:
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            seq = record.get("seq") if isinstance(record, dict) else None
            if isinstance(seq, int) and not isinstance(seq, bool):
                highest = max(highest, seq)
        return highest

    def submit(self, target: str, level: str, allocation: Allocation, epoch: float | None) -> CpuRequest:
        """Append a request for ``target`` to get ``allocation`` (durable when this returns)."""
        with self._lock:
            req = CpuRequest(
                seq=self._next_seq,
                rank=self.rank,
                target=target,
                level=level,
                cpuset=allocation.cpuset,
                cpus=allocation.cpus,
                memory=allocation.memory,
                epoch=epoch,
                time=time.time(),
            )
            append_line(self.path, req.to_line())
            self._next_seq += 1
        return req

    def wait_applied(self, req: CpuRequest, timeout: float, poll: float = 0.05) -> dict[str, Any] | None:
        """The toggler's decision on ``req`` (status "applied" or "rejected"), None on timeout.

        Reads the audit incrementally; an applied record carries the ``effective`` allocation the
        toggler read back from the kernel.
        """
        deadline = time.monotonic() + timeout
        audit = audit_path(self.log_dir)
        while True:
            with self._lock:
                records, self._audit_offset = read_jsonl(audit, self._audit_offset)
                for record in records:
                    if (record.get("file") == self.path.name and record.get("status") in ("applied", "rejected")
                            and isinstance(record.get("seq"), int)):
                        self._audit_seen[record["seq"]] = record
                found = self._audit_seen.get(req.seq)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(poll, remaining))
