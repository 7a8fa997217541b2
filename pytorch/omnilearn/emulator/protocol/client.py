"""The worker's side of the emulator: ask for the allocation of a level, wait, adapt threads.

:class:`RequestWriter` is the worker's half of the request protocol (:mod:`.requests`): it appends
requests to the rank's own log and finds the toggler's decision on each in the audit (:mod:`.audit`).
:class:`AllocationClient` drives it from the level the schedule asks for.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnilearn.bounded_json import loads_bounded
from omnilearn.emulator.protocol.audit import ACK_STATUSES, read_bounded_audit
from omnilearn.emulator.protocol.requests import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    MAX_SEQ_STEP,
    CpuRequest,
    audit_path,
    canonical_cpuset,
    request_log,
)
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.files import read_jsonl

log = logging.getLogger("omnilearn.worker")


def append_line(path: Path, line: str) -> int:
    """Append one complete line durably (the only way a worker writes its log); returns the offset
    just after it, which the toggler's decision on the line names as ``offset_end``.

    If the file ends with an unfinished line (its writer crashed mid-line), that line is closed
    first: otherwise the new line would be glued to it and both would be lost as one bad line.
    """
    assert line.endswith("\n") and "\n" not in line[:-1], line
    data = line.encode("utf-8")
    with open(path, "ab") as f:
        if f.tell() > 0 and not _ends_with_newline(path):
            data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def next_seq(seqs: list[int]) -> int:
    """The seq after the last one the toggler's rule takes from ``seqs`` (the seqs of a log's lines, in
    order): each taken seq is above the previous one by at most MAX_SEQ_STEP."""
    last = -1
    for seq in seqs:
        if last < seq <= last + MAX_SEQ_STEP:
            last = seq
    return last + 1


class RequestWriter:
    """The worker's side: appends requests to its own ``cpu-<rank>.log``, never rewrites it."""

    def __init__(self, log_dir: Path, rank: int) -> None:
        self.log_dir = Path(log_dir)
        self.rank = rank
        self.path = request_log(self.log_dir, rank)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # A restarted worker continues after the seqs already written: the toggler takes each seq
        # once per file, and no further than MAX_SEQ_STEP past the last one it took.
        self._next_seq = self._continue_seq()
        self._offsets: dict[int, int] = {}  # seq -> offset_end of the line that carried it
        self._audit_offset = 0
        self._audit_seen: dict[int, dict[str, Any]] = {}  # offset_end -> decision

    def _continue_seq(self) -> int:
        records, _ = read_jsonl(self.path, loads=lambda raw: loads_bounded(raw, MAX_LINE_BYTES, MAX_JSON_DEPTH))
        return next_seq([r["seq"] for r in records if type(r.get("seq")) is int])

    def submit(self, target: str, level: str, allocation: Allocation, epoch: float | None) -> CpuRequest:
        """Append a request for ``target`` to get ``allocation`` (durable when this returns)."""
        with self._lock:
            req = CpuRequest(
                seq=self._next_seq,
                rank=self.rank,
                target=target,
                level=level,
                cpuset=canonical_cpuset(allocation.cpuset),  # the protocol takes the canonical form only
                cpus=allocation.cpus,
                memory=allocation.memory,
                epoch=epoch,
                time=time.time(),
            )
            self._offsets[req.seq] = append_line(self.path, req.to_line())
            self._next_seq += 1
        return req

    def wait_applied(self, req: CpuRequest, timeout: float, poll: float = 0.05) -> dict[str, Any] | None:
        """The toggler's latest answer on ``req`` (status "applied", "retrying", or why not), None on timeout.

        Reads the audit incrementally and matches the answer by the offset of the request's line,
        so a line someone else wrote with the same seq is never taken for this one. An applied
        record carries the ``effective`` allocation the toggler read back from the kernel; a
        retrying one (the backend failed, the toggler tries again) or a rejected one the allocation
        in force, read back likewise (or null where it could not be read). ``timeout`` 0: look once.
        """
        deadline = time.monotonic() + timeout
        audit = audit_path(self.log_dir)
        offset_end = self._offsets.get(req.seq)
        while True:
            with self._lock:
                records, self._audit_offset = read_bounded_audit(audit, self._audit_offset)
                for record in records:
                    end = record.get("offset_end")
                    if (record.get("file") == self.path.name and record.get("status") in ACK_STATUSES
                            and type(end) is int):
                        self._audit_seen[end] = record
                found = self._audit_seen.get(offset_end) if offset_end is not None else None
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(poll, remaining))


@dataclass
class AllocationClient:
    """Tracks the level in force for one target and the allocation the toggler confirmed.

    A change goes through the CPU-request log (never straight to the kernel), so the same worker
    code drives local cgroups and Docker containers alike. ``set_threads``: match torch's threads to
    each allocation (a run's workers); without it the threads stay as the process set them (a user's
    script under its launcher's ``OMP_NUM_THREADS``) and :attr:`threads` reports them.
    """

    plan: EmulationPlan
    log_dir: Path
    rank: int
    target: str
    ack_timeout: float
    level: str | None = None
    allocation: Allocation = field(default_factory=Allocation)
    threads: int = 0
    set_threads: bool = True

    def __post_init__(self) -> None:
        self._writer = RequestWriter(self.log_dir, self.rank)
        self._retrying: tuple[CpuRequest, float] | None = None  # a change the toggler is still retrying

    def ensure(self, level: str, epoch: float) -> dict[str, Any] | None:
        """Switch to ``level`` if it is not in force; returns the change event, or None.

        While the toggler retries a change the backend rejected, the event's status is "retrying" and
        its ``effective`` allocation the one in force, read back; :meth:`settle` tells the outcome later.
        """
        if level == self.level:
            return None
        wanted = self.plan.allocation(level, self.target)
        t0 = time.time()
        req = self._writer.submit(self.target, level, wanted, epoch)
        record = self._writer.wait_applied(req, timeout=self.ack_timeout)
        waited = time.time() - t0
        if record is None:
            log.warning("rank %d: toggler did not confirm %s for %s within %.0f s; continuing with "
                        "the requested allocation", self.rank, level, self.target, self.ack_timeout)
            effective, status = wanted, "unconfirmed"
        else:
            effective, status = self._adopt(record)
        self._retrying = (req, t0) if status == "retrying" else None
        previous = self.level
        self.level = level
        return self._event(previous, epoch, wanted, effective, status, waited, record)

    def settle(self, epoch: float) -> dict[str, Any] | None:
        """The outcome of a change the toggler was still retrying when it answered (see :meth:`ensure`),
        once it has one: the allocation now in force is adopted and the event returned (None until then).
        Looks at the audit once, without waiting; nothing else changes, so it is no collective's business."""
        if self._retrying is None or self.level is None:
            return None
        req, t0 = self._retrying
        record = self._writer.wait_applied(req, timeout=0)
        if record is None or record.get("status") == "retrying":
            return None
        self._retrying = None
        effective, status = self._adopt(record)
        wanted = self.plan.allocation(self.level, self.target)
        return self._event(self.level, epoch, wanted, effective, status, time.time() - t0, record)

    def _adopt(self, record: dict[str, Any]) -> tuple[Allocation, str]:
        """The allocation a toggler's answer puts in force, and the answer's status."""
        status = record.get("status")
        in_force = record.get("effective")
        if status == "applied":
            return Allocation.from_dict(in_force or {}), "applied"
        # Refused, or not (yet) applied by the backend: the allocation in force stays, as read back if it was.
        log.warning("rank %d: request for %s %s: %s (%s)", self.rank, record.get("level"), status,
                    record.get("reason"), record.get("detail"))
        read_back = Allocation.from_dict(in_force) if isinstance(in_force, dict) else self.allocation
        return read_back, "retrying" if status == "retrying" else "rejected"

    def _event(self, previous: str | None, epoch: float, wanted: Allocation, effective: Allocation, status: str,
               waited: float, record: dict[str, Any] | None) -> dict[str, Any]:
        self.allocation = effective
        if self.set_threads:
            torch.set_num_threads(effective.threads())
        self.threads = torch.get_num_threads()
        attempts = record.get("attempts") if record is not None else None
        return {
            "from_level": previous, "level": self.level, "epoch": epoch, "target": self.target,
            "requested": wanted.to_dict(), "effective": effective.to_dict(), "status": status,
            "threads": self.threads, "ack_s": round(waited, 3),
            "retries": attempts - 1 if type(attempts) is int and attempts > 0 else 0,
            # the level's link as the toggler read it back, and a stall the level began with
            **{k: record[k] for k in ("link", "effective_link", "stall_s") if record is not None and k in record},
        }
