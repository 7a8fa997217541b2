"""The toggler: the host-side process that turns workers' CPU requests into kernel settings.

It runs as root and workers run user code, so it trusts nothing a worker writes beyond the choice of
a level. When the job starts it binds ``cpu-<rank>.log`` to rank's target in the job's plan; it
reads only those files (regular files, opened without following links, a bounded amount per poll),
parses each new complete line with :func:`parse_request`, and applies the *plan's* allocation of the
requested level to the bound target. A line that names another rank or target, a level outside the
plan or numbers other than the plan's, or a seq that is replayed or jumps too far, is refused.

A level is more than CPU: when the job shapes links, the toggler also gives the target the plan's link
for that level (``links``, read back into the audit's ``effective_link``), and a level that begins with
a trace's stall pauses the target for its duration (``stall_s``), through the same request and audit.

Every decision is appended to ``toggler-audit.jsonl`` (:mod:`.audit`), a change write-ahead: an
``applying`` record before ``backend.apply`` and its outcome after. That audit is the toggler's only
state: a restarted toggler reads it, completes a change it finds without outcome (allocations are
absolute, so applying one again is safe) and resumes every log where the last one stopped. Nothing
is lost, nothing is applied twice.

A change the kernel or Docker rejects is tried again with exponential backoff (:mod:`.retry`) while
the other logs are served; meanwhile its ``retrying`` records carry the allocation in force, read
back from the backend, and a newer request of the same rank replaces it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from omnilearn.emulator.backends import Backend, LinkApplier
from omnilearn.emulator.protocol.audit import (
    OPEN_READ,
    Audit,
    AuditUnavailable,
    LogState,
    new_record,
    recover,
)
from omnilearn.emulator.protocol.requests import (
    MAX_DIR_ENTRIES,
    MAX_ECHO_CHARS,
    MAX_LINE_BYTES,
    MAX_LINES_PER_POLL,
    MAX_LOG_BYTES,
    MAX_READ_BYTES,
    MAX_REFUSALS_PER_LOG,
    MAX_SEQ_STEP,
    MAX_STRAY_REPORTS,
    HostLimits,
    Refusal,
    canonical_cpuset,
    echo,
    parse_request,
    request_name,
)
from omnilearn.emulator.protocol.retry import Backoff, in_force, retriable
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan

log = logging.getLogger("omnilearn.toggler")


class Printer(Protocol):
    """Anything with ``print`` (a rich Console): where applied changes are shown to the user."""

    def print(self, *objects: Any, **kwargs: Any) -> None: ...


class Toggler:
    """Applies the CPU requests of one job's workers, as its plan allows, through ``backend``."""

    def __init__(
        self,
        log_dir: Path,
        backend: Backend,
        plan: EmulationPlan,
        host: list[int] | None = None,
        host_memory: int | None = None,
        console: Printer | None = None,
        links: LinkApplier | None = None,
        retry: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.backend = backend
        self.plan = plan
        assert links is not None or not plan.links, "a plan with links needs a link applier"
        self.links = links
        self.host = HostLimits.of(host, host_memory)
        self.console = console
        self.retry = retry or Backoff()
        self.clock = clock  # when a retried change is due; tests pass a fake one
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self.log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._finalizer = weakref.finalize(self, os.close, self._dir_fd)
        self._audit = Audit(self.log_dir, self._dir_fd)
        self.audit = self._audit.path
        # The plan's allocations, cpusets in canonical form for comparing with a request's.
        self._allocations: dict[str, dict[str, Allocation]] = {
            level: {t: Allocation(canonical_cpuset(a.cpuset), a.cpus, a.memory) for t, a in allocs.items()}
            for level, allocs in plan.levels.items()
        }
        self._plan_beyond_host()
        self._logs = [LogState(rank, request_name(rank), target) for rank, target in enumerate(plan.targets)]
        self._by_name = {lg.name: lg for lg in self._logs}
        self._strays: set[str] = set()
        self._audit_error: str | None = None
        self._recover()

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(self.plan.targets)

    def close(self) -> None:
        """Release the log directory (also done when the toggler is garbage-collected)."""
        self._finalizer()

    def _plan_beyond_host(self) -> None:
        """Say so at the start when a plan's allocation is one no request could carry on this host."""
        for level, allocs in self._allocations.items():
            for target, a in allocs.items():
                probe = json.dumps({"seq": 0, "level": "x", "cpuset": a.cpuset, "cpus": a.cpus, "memory": a.memory})
                result = parse_request(probe, self.host)
                if isinstance(result, Refusal):
                    log.warning("the plan's %s allocation for %s cannot be requested on this host (%s: %s); "
                                "its requests will be refused", level, target, result.reason, result.detail)

    # ------------------------------------------------------------ recovery

    def _recover(self) -> None:
        """Resume from the audit a previous toggler wrote (see :func:`.audit.recover`)."""
        count, strays = recover(self._audit.records(), self._by_name)
        self._strays |= strays
        if count:
            log.info("toggler resumed from %s: %s", self.audit, ", ".join(
                f"{lg.name} @{lg.offset} seq {lg.last_seq}" + (" (change to complete)" if lg.pending else "")
                for lg in self._logs))

    # ------------------------------------------------------------ polling

    def poll_once(self) -> list[dict[str, Any]]:
        """Handle every new complete request line; returns the decisions written to the audit."""
        written: list[dict[str, Any]] = []
        try:
            for lg in self._logs:
                if lg.closed is None or lg.pending is not None:
                    try:
                        self._poll_log(lg, written)
                    except AuditUnavailable:
                        raise
                    except Exception:  # noqa: BLE001 - one log's trouble must not stop the others
                        log.exception("toggler: error reading %s; trying again at the next poll", lg.name)
            self._report_strays(written)
        except AuditUnavailable as e:
            if str(e) != self._audit_error:
                log.error("toggler: %s; applying nothing until it can be written", e)
            self._audit_error = str(e)
        else:
            self._audit_error = None
        return written

    def run(self, stop: threading.Event, interval: float = 0.1) -> None:
        """Poll until ``stop`` is set, then once more so that a last request is not lost."""
        while not stop.is_set():
            self.poll_once()
            stop.wait(interval)
        self.poll_once()

    def _poll_log(self, lg: LogState, written: list[dict[str, Any]]) -> None:
        # A change begun and not finished (a crash, an interrupt), or one to try again when its wait is over.
        if lg.pending is not None and self.clock() >= lg.retry_at:
            written.append(self._complete(lg, lg.pending))
        self._close_if_flooded(lg, written)
        if lg.closed is not None:
            return
        data = self._read(lg, written)
        if data is None:
            return
        start = lg.offset  # the file offset of data[0]
        pos = 0
        if lg.skipping:
            skipped = self._skip_line(lg, data, written)
            if skipped is None:
                return
            data, start, pos = skipped
        handled = 0
        while handled < MAX_LINES_PER_POLL and lg.closed is None:
            self._close_if_flooded(lg, written)
            if lg.closed is not None:
                return
            end = data.find(b"\n", pos)
            if end < 0 and len(data) - pos <= MAX_LINE_BYTES:
                return  # an incomplete line: its writer has not finished it (or the read stopped)
            if end < 0 or end - pos > MAX_LINE_BYTES:
                unterminated = end < 0
                offset_end = start + (len(data) if unterminated else end + 1)
                length = f"at least {len(data) - pos}" if unterminated else str(end - pos)
                written.append(self._refuse(lg, offset_end, "malformed", "line-too-long",
                                            f"a line of {length} bytes, more than {MAX_LINE_BYTES}",
                                            unterminated=unterminated))
                lg.offset, lg.skipping = offset_end, unterminated
                handled += 1
                if unterminated:  # the rest of the line, whatever its length, within this poll
                    skipped = self._skip_line(lg, b"", written)
                    if skipped is None:
                        return
                    data, start, pos = skipped
                    continue
                pos = end + 1
                continue
            line, offset_end = data[pos:end], start + end + 1
            pos = end + 1
            if line.strip():
                handled += 1
                decision = self._handle(lg, line, offset_end, written)
                if decision is not None:
                    written.append(decision)
            lg.offset = offset_end

    def _skip_line(self, lg: LogState, data: bytes, written: list[dict[str, Any]]) -> tuple[bytes, int, int] | None:
        """Read past the rest of a line already refused as too long (``data``: the bytes read from the
        log's offset, perhaps none yet), however many reads it takes: a log holds at most
        MAX_LOG_BYTES, and the worker's next request, behind the line, waits on it. Returns the bytes
        read last, their file offset and the position after the line's newline, or None: the line
        goes on past what is written (the offset moves to the end; the skip goes on next poll)."""
        while True:
            end = data.find(b"\n")
            if end >= 0:
                lg.skipping = False
                lg.offset += end + 1
                return data, lg.offset - end - 1, end + 1
            lg.offset += len(data)
            data = self._read(lg, written) or b""
            if not data:
                return None

    def _read(self, lg: LogState, written: list[dict[str, Any]]) -> bytes | None:
        """The next bytes of ``lg`` to consume (at most MAX_READ_BYTES), or None: nothing to read,
        or the file is refused (audited once until its state changes)."""
        try:
            fd = os.open(lg.name, OPEN_READ, dir_fd=self._dir_fd)  # never through a symlink
        except FileNotFoundError:
            return None
        except OSError as e:
            reason = "symlink" if e.errno == errno.ELOOP else "cannot-open"
            written.extend(self._refuse_file(lg, reason, f"{lg.name}: {e.strerror}"))
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                written.extend(self._refuse_file(lg, "not-regular-file", f"{lg.name} is not a regular file"))
                return None
            if st.st_nlink != 1:
                written.extend(self._refuse_file(lg, "hard-linked", f"{lg.name} has {st.st_nlink} links"))
                return None
            if st.st_size > MAX_LOG_BYTES:
                written.extend(self._refuse_file(lg, "log-too-large", f"{lg.name} holds {st.st_size} bytes, "
                                                                      f"more than {MAX_LOG_BYTES}"))
                lg.closed = "log-too-large"
                return None
            if st.st_size < lg.offset:
                written.extend(self._refuse_file(lg, "log-shrank", f"{lg.name} holds {st.st_size} bytes, "
                                                                   f"less than the {lg.offset} already read"))
                return None
            lg.file_refusal = None
            if st.st_size == lg.offset:
                return None
            return os.pread(fd, min(MAX_READ_BYTES, st.st_size - lg.offset), lg.offset)
        except OSError as e:
            written.extend(self._refuse_file(lg, "cannot-read", f"{lg.name}: {e.strerror}"))
            return None
        finally:
            os.close(fd)

    def _report_strays(self, written: list[dict[str, Any]]) -> None:
        """Audit, once each, files that look like request logs but are no rank's of this job
        (``cpu-00.log``, ``cpu-9.log`` in a job of 4, other digits): they are never read."""
        if len(self._strays) >= MAX_STRAY_REPORTS:
            return
        try:
            with os.scandir(self._dir_fd) as entries:
                names = [e.name for e in islice(entries, MAX_DIR_ENTRIES)]
        except OSError as e:
            log.warning("toggler: cannot list %s: %s", self.log_dir, e)
            return
        for name in names:
            if name.startswith("cpu-") and name not in self._by_name:
                shown = echo(name)
                if shown in self._strays or len(self._strays) >= MAX_STRAY_REPORTS:
                    continue
                self._strays.add(shown)
                log.warning("toggler: ignoring %s: not the request log of a rank of this job "
                            "(cpu-0.log ... cpu-%d.log)", shown, len(self._logs) - 1)
                written.append(self._write(new_record(
                    None, status="refused", reason="unexpected-log-name", file=shown,
                    detail=f"{shown} is not the request log of a rank of this job")))

    # ------------------------------------------------------------ decisions

    def _handle(self, lg: LogState, line: bytes, offset_end: int,
                written: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Decide on one complete line of ``lg``: refuse it, or apply the plan's allocation."""
        try:
            return self._decide(lg, line, offset_end, written)
        except AuditUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - a bug must not stop every rank's changes; it is audited
            log.exception("toggler: internal error on %s up to byte %d", lg.name, offset_end)
            if lg.pending is not None and lg.pending.get("offset_end") == offset_end:
                return None  # the change was begun (write-ahead): the next poll completes it
            return self._refuse(lg, offset_end, "refused", "internal-error", echo(f"{type(e).__name__}: {e}"))

    def _decide(self, lg: LogState, line: bytes, offset_end: int, written: list[dict[str, Any]]) -> dict[str, Any]:
        req = parse_request(line, self.host)
        if isinstance(req, Refusal):
            return self._refuse(lg, offset_end, "malformed", req.reason, req.detail)
        fields = {"seq": req.seq, "epoch": req.epoch, "level": echo(req.level)}
        if req.rank is not None and req.rank != lg.rank:
            return self._refuse(lg, offset_end, "refused", "wrong-rank",
                                f"rank {req.rank} in the log of rank {lg.rank}", **fields)
        if req.target is not None and req.target != lg.target:
            return self._refuse(lg, offset_end, "refused", "wrong-target",
                                f"target {echo(req.target)} in the log of {lg.target}", **fields)
        allocs = self._allocations.get(req.level)
        if allocs is None:
            return self._refuse(lg, offset_end, "refused", "unknown-level",
                                f"level {echo(req.level)} is not in this job's plan "
                                f"({', '.join(self._allocations)})", **fields)
        planned = allocs.get(lg.target)
        if planned is None:
            return self._refuse(lg, offset_end, "refused", "not-in-plan",
                                f"the plan's level {req.level} has no allocation for {lg.target}", **fields)
        asked = req.allocation
        for key in ("cpuset", "cpus", "memory"):
            if key in req.claims and getattr(asked, key) != getattr(planned, key):
                return self._refuse(lg, offset_end, "refused", "not-in-plan",
                                    f"{key} {echo(getattr(asked, key))} is not {lg.target}'s {req.level} "
                                    f"allocation ({echo(getattr(planned, key))})", **fields)
        # The seq last: a line's reason does not depend on where its log's seq stands.
        if req.seq <= lg.last_seq:
            return self._refuse(lg, offset_end, "duplicate", "seq-replayed",
                                f"seq {req.seq} <= last seq {lg.last_seq}", **fields)
        if req.seq > lg.last_seq + MAX_SEQ_STEP:
            return self._refuse(lg, offset_end, "refused", "seq-jump",
                                f"seq {req.seq} jumps past last seq {lg.last_seq} + {MAX_SEQ_STEP}", **fields)
        note = None
        if req.seq > lg.last_seq + 1:
            note = f"seq {req.seq} after {lg.last_seq}: {req.seq - lg.last_seq - 1} seq(s) skipped"
            log.warning("toggler: %s: %s", lg.name, note)
        if lg.pending is not None:  # a change still being retried: this newer one replaces it
            written.append(self._give_up(lg, "superseded", f"seq {req.seq} ({echo(req.level)}) replaced it"))
        applying = new_record(lg, status="applying", offset_end=offset_end, seq=req.seq, level=req.level,
                              epoch=req.epoch, detail=note, requested=planned.to_dict())
        self._write(applying)  # write-ahead: a crash from here on is completed by the next toggler
        lg.pending, lg.offset, lg.last_seq, lg.attempts = applying, offset_end, req.seq, 0
        return self._complete(lg, applying)

    def _outcome(self, lg: LogState, applying: dict[str, Any]) -> tuple[dict[str, Any], str | None, Allocation | None]:
        """The outcome record of an applying record (whose positions only are trusted), its level if the
        plan has it, and the plan's allocation for it."""
        level, seq, epoch = applying.get("level"), applying.get("seq"), applying.get("epoch")
        known = level if isinstance(level, str) and level in self._allocations else None
        planned = self._allocations[known].get(lg.target) if known is not None else None
        outcome = new_record(lg, offset_end=applying.get("offset_end"), seq=seq if type(seq) is int else None,
                             level=known if known is not None else echo(level),
                             epoch=epoch if type(epoch) in (int, float) else None,
                             detail=_plain(applying.get("detail")), attempts=lg.attempts,
                             requested=planned.to_dict() if planned is not None else None)
        return outcome, known, planned

    def _complete(self, lg: LogState, applying: dict[str, Any]) -> dict[str, Any]:
        """Apply the plan's allocation that an applying record names, and audit the outcome: applied,
        rejected, or retrying (a failure that may pass: tried again after a wait, :mod:`.retry`)."""
        outcome, known, planned = self._outcome(lg, applying)
        effective = None
        if planned is None:  # an applying record this toggler never wrote (a worker can write the audit)
            outcome.update(status="rejected", reason="not-in-plan",
                           detail=f"level {outcome['level']} is not in this job's plan for {lg.target}")
        else:
            lg.attempts = outcome["attempts"] = lg.attempts + 1
            try:
                effective = self.backend.apply(lg.target, planned)
                extras = self._link_and_stall(lg.target, known)
            except Exception as e:  # noqa: BLE001 - any backend failure (a vanished container too) is one rejection
                effective, wait = None, self.retry.delay(lg.attempts) if retriable(e) else None
                log.warning("toggler: %s: %s backend failed to apply seq %s to %s (attempt %d%s): %s", lg.name,
                            self.backend.name, outcome["seq"], lg.target, lg.attempts,
                            "" if wait is None else f", again in {wait:g} s", e)
                outcome.update(status="rejected" if wait is None else "retrying", reason="backend-failed",
                               detail=echo(f"backend {self.backend.name}: {type(e).__name__}: {e}"),
                               effective=in_force(self.backend, lg.target))
                if wait is not None:  # the change stays pending, tried again once the wait is over
                    outcome["retry_in_s"], lg.retry_at = wait, self.clock() + wait
                    return self._write(outcome)
            else:
                outcome.update(status="applied", effective=effective.to_dict(), **extras)
        self._write(outcome)
        lg.pending, lg.attempts = None, 0
        if effective is not None and self.console is not None:
            at = f" at epoch {outcome['epoch']:g}" if outcome["epoch"] is not None else ""
            self.console.print(f"toggler: {lg.target} -> {known} ({effective.describe()}){at}", markup=False)
        return outcome

    def _give_up(self, lg: LogState, reason: str, detail: str) -> dict[str, Any]:
        """Reject the change ``lg`` is retrying, with the allocation in force, without another attempt."""
        assert lg.pending is not None
        outcome, _, _ = self._outcome(lg, lg.pending)
        outcome.update(status="rejected", reason=reason, detail=detail, effective=in_force(self.backend, lg.target))
        log.warning("toggler: %s: seq %s to %s given up after %d attempt(s): %s", lg.name, outcome["seq"],
                    lg.target, lg.attempts, detail)
        self._write(outcome)
        lg.pending, lg.attempts = None, 0
        return outcome

    def _link_and_stall(self, target: str, level: str) -> dict[str, Any]:
        """After the allocation: the level's link (every level sets it; None is unshaped) and its stall."""
        extras: dict[str, Any] = {}
        if self.links is not None:
            link = self.plan.link(level, target)
            got = self.links.apply_link(target, link)
            extras.update(link=link.to_dict() if link else None, effective_link=got.to_dict() if got else None)
        seconds = self.plan.stall(level, target)
        if seconds:
            self.backend.stall(target, seconds)
            extras["stall_s"] = seconds
        return extras

    def _refuse(self, lg: LogState, offset_end: int, status: str, reason: str, detail: str,
                unterminated: bool = False, **fields: Any) -> dict[str, Any]:
        """Audit a line that is not applied; it reaches neither a cgroup nor a container."""
        log.warning("toggler: %s: %s line ending at byte %d: %s: %s", lg.name, status, offset_end, reason, detail)
        record = new_record(lg, status=status, reason=reason, detail=detail, offset_end=offset_end, **fields)
        if unterminated:
            record["unterminated"] = True
        self._write(record)
        lg.offset = offset_end
        lg.refusals += 1
        return record

    def _close_if_flooded(self, lg: LogState, written: list[dict[str, Any]]) -> None:
        """Stop reading a log that has had MAX_REFUSALS_PER_LOG lines refused (each costs an audit record)."""
        if lg.refusals >= MAX_REFUSALS_PER_LOG and lg.closed is None:
            log.warning("toggler: %s: %d refused lines, no longer read", lg.name, lg.refusals)
            written.append(self._write(new_record(
                lg, status="refused", reason="too-many-refusals",
                detail=f"{lg.refusals} refused lines: {lg.name} is no longer read")))
            lg.closed = "too-many-refusals"

    def _refuse_file(self, lg: LogState, reason: str, detail: str) -> list[dict[str, Any]]:
        """Audit a log that cannot be read, once until its state changes."""
        if lg.file_refusal == reason:
            return []
        lg.file_refusal = reason
        log.warning("toggler: refusing %s: %s", lg.name, detail)
        return [self._write(new_record(lg, status="refused", reason=reason, detail=detail))]

    def _write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append one record to the audit durably; AuditUnavailable when it cannot be."""
        return self._audit.append(record)


def _plain(value: Any) -> str | None:
    """A note of our own from the audit, or None for anything that is not short printable ASCII."""
    ok = isinstance(value, str) and len(value) <= 2 * MAX_ECHO_CHARS and value.isascii() and value.isprintable()
    return value if ok else None
