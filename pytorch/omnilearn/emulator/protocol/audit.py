"""The toggler's audit, ``toggler-audit.jsonl``: every decision on a request line, and the toggler's only state.

A change is written ahead: an ``applying`` record before the backend is called, its outcome
(``applied`` or ``rejected``) after, and between them a ``retrying`` record for each failed attempt
that will be made again (:mod:`.retry`). A restarted toggler rebuilds where each log stands from these
records alone (:func:`recover`), completes a change it finds without outcome and resumes every log
after the last line decided. Workers find the decision on their own line here, by its ``offset_end``.

The audit lives in the log folder, which local workers can write too (containers only read it): it
is opened without following links, every read of it is bounded against forged lines
(:meth:`Audit.records` streams for the toggler, :func:`read_bounded_audit` for the workers and the
reports), and a record is trusted for positions only: the toggler applies the plan's allocation,
never one a record names. The toggler's lock (:func:`toggler_lock`) keeps the audit to one writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.bounded_json import loads_bounded
from omnilearn.emulator.protocol.requests import (
    AUDIT_NAME,
    MAX_AUDIT_DEPTH,
    MAX_AUDIT_LINE_BYTES,
    MAX_SEQ,
    MAX_STRAY_REPORTS,
    audit_path,
)
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.errors import UserError
from omnilearn.files import iter_lines, read_jsonl

FINAL_STATUSES = ("applied", "rejected", "refused", "malformed", "duplicate")
"""The audit's decisions on a line; "applying" is only the toggler's note that it is about to apply."""
ACK_STATUSES = (*FINAL_STATUSES, "retrying")
"""What answers a worker's request: a decision, or a failed attempt the toggler will make again
(with the allocation in force meanwhile, :mod:`.retry`)."""
MAX_ATTEMPTS_KEPT = 10**6
"""A retrying record's ``attempts`` above this is not one the toggler wrote: ignored on recovery."""
CLOSING = ("log-too-large", "too-many-refusals")
"""Refusals after which a log is no longer read."""

# Files of the log folder are opened relative to it and never through a symlink.
OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OPEN_APPEND = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class AuditUnavailable(OSError):
    """The audit cannot be written: nothing may be applied (nor a line consumed) until it can."""


@dataclass
class LogState:
    """One rank's request log, bound to its target, and how far it has been consumed."""

    rank: int
    name: str
    target: str
    offset: int = 0
    last_seq: int = -1  # of the last change attempted (applying written)
    skipping: bool = False  # inside an over-long line: drop bytes up to its newline
    refusals: int = 0
    closed: str | None = None  # the reason this log is no longer read
    file_refusal: str | None = None  # the file-level refusal last audited (once until it changes)
    pending: dict[str, Any] | None = None  # an applying record without outcome yet
    attempts: int = 0  # backend calls made for the pending change
    retry_at: float = 0.0  # time.monotonic() at which the pending change is tried again


def new_record(lg: LogState | None, **fields: Any) -> dict[str, Any]:
    """An audit record about ``lg`` (None: about no log of the job), every key present."""
    record: dict[str, Any] = {
        "time": None, "file": lg.name if lg else None, "offset_end": None, "seq": None,
        "rank": lg.rank if lg else None, "target": lg.target if lg else None, "level": None, "epoch": None,
        "status": None, "reason": None, "detail": None, "requested": None, "effective": None,
    }
    record.update(fields)
    return record


class Audit:
    """The audit file of a log folder, reached only through the folder's descriptor ``dir_fd``."""

    def __init__(self, log_dir: Path, dir_fd: int) -> None:
        self.path = audit_path(log_dir)
        self._dir_fd = dir_fd

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append one record durably, stamped with the time; AuditUnavailable when it cannot be."""
        record["time"] = time.time()
        data = (json.dumps(record, ensure_ascii=True, allow_nan=False) + "\n").encode()
        try:
            fd = os.open(AUDIT_NAME, _OPEN_APPEND, 0o644, dir_fd=self._dir_fd)
        except OSError as e:
            raise AuditUnavailable(f"cannot open the audit {self.path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise AuditUnavailable(f"the audit {self.path} is not a plain regular file")
            if st.st_size > 0 and os.pread(fd, 1, st.st_size - 1) != b"\n":
                data = b"\n" + data  # close a record torn by a crash, so this one stands alone
            os.write(fd, data)
            os.fsync(fd)
        except AuditUnavailable:
            raise
        except OSError as e:
            raise AuditUnavailable(f"cannot write the audit {self.path}: {e.strerror}") from None
        finally:
            os.close(fd)
        return record

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, streamed in bounded memory (for recovery); a UserError when the audit exists
        but cannot be trusted (a link, not a regular file): a toggler must not start without its state."""
        try:
            fd = os.open(AUDIT_NAME, OPEN_READ, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise UserError(f"cannot read the toggler's audit {self.path}: {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UserError(f"the toggler's audit {self.path} is not a regular file")
            for raw, _ in iter_lines(fd, MAX_AUDIT_LINE_BYTES):
                record = _load_record(raw) if raw is not None else None
                if isinstance(record, dict):
                    yield record
        finally:
            os.close(fd)


def recover(records: Iterable[dict[str, Any]], logs: dict[str, LogState]) -> tuple[int, set[str]]:
    """Rebuild every log's offset, last seq and pending change from the records a previous toggler
    wrote; returns how many records there were and the stray log names already audited.

    Records are checked like any input: only the names in ``logs`` count, and a pending change is
    left for the toggler to complete with the plan's allocation, never the record's (at once, counting
    the attempts its ``retrying`` records name). The state kept
    is bounded (one LogState per rank, at most MAX_STRAY_REPORTS stray names) however long the audit.
    """
    count = 0
    strays: set[str] = set()
    for record in records:
        count += 1
        name = record.get("file")
        status, reason = record.get("status"), record.get("reason")
        lg = logs.get(name) if isinstance(name, str) else None
        if lg is None:
            if status == "refused" and reason == "unexpected-log-name" and isinstance(name, str) \
                    and len(strays) < MAX_STRAY_REPORTS:
                strays.add(name)
            continue
        offset_end, seq = record.get("offset_end"), record.get("seq")
        if type(offset_end) is int and offset_end >= lg.offset:
            lg.offset, lg.skipping = offset_end, record.get("unterminated") is True
        if status == "applying":
            lg.pending = record if type(offset_end) is int else None
            lg.attempts = 0
        elif status in ("applied", "rejected") and lg.pending is not None \
                and lg.pending.get("offset_end") == offset_end:
            lg.pending = None
        elif status == "retrying" and lg.pending is not None and lg.pending.get("offset_end") == offset_end:
            attempts = record.get("attempts")
            if type(attempts) is int and 0 < attempts <= MAX_ATTEMPTS_KEPT:
                lg.attempts = max(lg.attempts, attempts)
        if status in ("applying", "applied", "rejected") and type(seq) is int and seq <= MAX_SEQ:
            lg.last_seq = max(lg.last_seq, seq)
        if status in ("malformed", "refused", "duplicate") and offset_end is not None:
            lg.refusals += 1
        if status == "refused" and reason in CLOSING:
            lg.closed = reason
    return count, strays


def read_bounded_audit(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The records on the complete lines of an audit from byte ``offset``, and where to go on.

    :func:`omnilearn.files.read_jsonl` bounded against forged lines (workers can write the audit):
    a line too long or too deep to be one the toggler wrote, or not a JSON object, is skipped.
    """
    return read_jsonl(path, offset, loads=_load_record)


def _load_record(raw: bytes) -> Any | None:
    return loads_bounded(raw, MAX_AUDIT_LINE_BYTES, MAX_AUDIT_DEPTH)


def read_audit(log_dir: Path, status: str | None = "applied") -> list[dict[str, Any]]:
    """The audit records of a run; by default the applied ones, i.e. the run's HL timeline."""
    records, _ = read_bounded_audit(audit_path(Path(log_dir)))
    return [r for r in records if status is None or r.get("status") == status]


def timeline(log_dir: Path) -> list[tuple[float, str, Allocation]]:
    """(time, target, effective allocation) of every applied change, in the order applied."""
    return [(r["time"], r["target"], Allocation.from_dict(r["effective"])) for r in read_audit(log_dir)]


@contextlib.contextmanager
def toggler_lock(log_dir: Path) -> Iterator[None]:
    """Hold ``toggler.lock`` in the log directory: one toggler per job, or changes would be applied twice."""
    path = Path(log_dir) / "toggler.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a symlink a worker may have put there
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UserError(f"cannot open the toggler's lock {path}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another toggler is already running for {log_dir} (lock {path})") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
