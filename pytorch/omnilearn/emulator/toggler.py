"""The toggler: the host-side process that turns workers' CPU requests into kernel settings.

It watches ``cpu-<rank>.log`` in the job's log directory, validates each new complete line and hands
it to a backend (cgroups, affinity, Docker). Every decision is appended to ``toggler-audit.jsonl``;
that audit is also the toggler's only state, so a restarted toggler resumes exactly where the last
one stopped: nothing is lost, nothing is applied twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omnilearn.emulator.backends import Backend
from omnilearn.emulator.levels import Allocation, format_cpuset, host_cpus, parse_cpuset
from omnilearn.emulator.requests import (
    REQUEST_GLOB,
    CpuRequest,
    append_line,
    audit_path,
)
from omnilearn.errors import UserError
from omnilearn.files import read_jsonl, read_lines

log = logging.getLogger("omnilearn.toggler")

_LOG_NAME = re.compile(r"cpu-(\d+)\.log")


class Printer(Protocol):
    """Anything with ``print`` (a rich Console): where applied changes are shown to the user."""

    def print(self, *objects: Any) -> None: ...


@dataclass
class _FileState:
    """How far one request log has been consumed."""

    offset: int = 0
    last_seq: int = -1


class Toggler:
    """Applies the CPU requests of one job's workers through ``backend``."""

    def __init__(
        self,
        log_dir: Path,
        backend: Backend,
        targets: Iterable[str],
        host: list[int] | None = None,
        console: Printer | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.backend = backend
        self.targets = frozenset(targets)
        self.host = sorted(host if host is not None else host_cpus())
        self.console = console
        self.audit = audit_path(self.log_dir)
        self._files: dict[str, _FileState] = {}
        self._recover()

    def _recover(self) -> None:
        """Rebuild the per-file offsets and last seqs from the audit a previous toggler wrote."""
        records, end = read_jsonl(self.audit)
        for record in records:
            name = record.get("file")
            if not isinstance(name, str):
                continue
            state = self._files.setdefault(name, _FileState())
            offset_end = record.get("offset_end")
            if isinstance(offset_end, int):
                state.offset = max(state.offset, offset_end)
            seq = record.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                state.last_seq = max(state.last_seq, seq)
        if records or end:
            log.info("toggler resumed from %s: %s", self.audit,
                     ", ".join(f"{n} @{s.offset} seq {s.last_seq}" for n, s in sorted(self._files.items())))

    def poll_once(self) -> list[dict[str, Any]]:
        """Handle every new complete request line; returns the audit records written."""
        written: list[dict[str, Any]] = []
        for path in sorted(self.log_dir.glob(REQUEST_GLOB)):
            m = _LOG_NAME.fullmatch(path.name)
            if m is None:
                continue
            state = self._files.setdefault(path.name, _FileState())
            try:
                lines, _ = read_lines(path, state.offset)
            except OSError as e:
                log.warning("cannot read %s: %s", path, e)
                continue
            for raw, offset_end in lines:
                if raw.strip():
                    written.append(self._handle(path.name, int(m.group(1)), raw, offset_end, state))
                state.offset = offset_end
        return written

    def run(self, stop: threading.Event, interval: float = 0.1) -> None:
        """Poll until ``stop`` is set, then once more so that a last request is not lost."""
        while not stop.is_set():
            self.poll_once()
            stop.wait(interval)
        self.poll_once()

    def _handle(self, name: str, rank: int, raw: bytes, offset_end: int, state: _FileState) -> dict[str, Any]:
        record: dict[str, Any] = {
            "time": None, "file": name, "offset_end": offset_end, "seq": None, "rank": rank,
            "target": None, "level": None, "epoch": None, "status": None, "reason": None,
            "requested": None, "effective": None,
        }
        try:
            req = CpuRequest.parse(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("%s: skipping malformed line ending at byte %d: %s", name, offset_end, e)
            return self._record(record, status="malformed", reason=str(e))
        record.update(seq=req.seq, target=req.target, level=req.level, epoch=req.epoch,
                      requested=req.allocation.to_dict())
        if req.seq <= state.last_seq:
            log.warning("%s: skipping seq %d, already at seq %d", name, req.seq, state.last_seq)
            return self._record(record, status="duplicate", reason=f"seq {req.seq} <= last seq {state.last_seq}")
        state.last_seq = req.seq
        reason = self._check(req, rank)
        if reason is not None:
            log.warning("%s: rejecting seq %d: %s", name, req.seq, reason)
            return self._record(record, status="rejected", reason=reason)
        try:
            effective = self.backend.apply(req.target, req.allocation)
        except Exception as e:  # noqa: BLE001 - any backend failure (a vanished container too) is one rejection
            log.warning("%s: %s backend failed to apply seq %d to %s: %s",
                        name, self.backend.name, req.seq, req.target, e)
            return self._record(record, status="rejected", reason=f"backend {self.backend.name}: "
                                                                  f"{type(e).__name__}: {e}")
        if self.console is not None:
            self.console.print(f"toggler: {req.target} -> {req.level} ({effective.describe()})"
                               + (f" at epoch {req.epoch:g}" if req.epoch is not None else ""), markup=False)
        return self._record(record, status="applied", effective=effective.to_dict())

    def _check(self, req: CpuRequest, rank: int) -> str | None:
        """Why the request must not be applied, or None when it may."""
        if req.target not in self.targets:
            return f"target {req.target!r} is not part of this job ({', '.join(sorted(self.targets))})"
        if req.rank != rank:
            return f"rank {req.rank} does not match the file's rank {rank}"
        if req.cpuset is not None:
            missing = sorted(set(parse_cpuset(req.cpuset)) - set(self.host))
            if missing:
                return (f"cpuset {req.cpuset} names CPUs this host lacks: {format_cpuset(missing)} "
                        f"(host has {format_cpuset(self.host)})")
        if req.cpus is not None and not 0 < req.cpus <= len(self.host):
            return f"cpus {req.cpus:g} is outside (0, {len(self.host)}]"
        if req.memory is not None and req.memory <= 0:
            return f"memory {req.memory} must be > 0 bytes"
        return None

    def _record(self, record: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """Append one decision to the audit (after the change it describes has been made)."""
        record.update(fields, time=time.time())
        append_line(self.audit, json.dumps(record) + "\n")
        return record


def read_audit(log_dir: Path, status: str | None = "applied") -> list[dict[str, Any]]:
    """The audit records of a run; by default the applied ones, i.e. the run's HL timeline."""
    records, _ = read_jsonl(audit_path(Path(log_dir)))
    return [r for r in records if status is None or r.get("status") == status]


def timeline(log_dir: Path) -> list[tuple[float, str, Allocation]]:
    """(time, target, effective allocation) of every applied change, in the order applied."""
    return [(r["time"], r["target"], Allocation.from_dict(r["effective"])) for r in read_audit(log_dir)]


@contextlib.contextmanager
def toggler_lock(log_dir: Path) -> Iterator[None]:
    """Hold ``toggler.lock`` in the log directory: one toggler per job, or changes would be applied twice."""
    path = Path(log_dir) / "toggler.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another toggler is already running for {log_dir} (lock {path})") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
