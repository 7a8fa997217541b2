"""The CPU-request protocol end to end: RequestWriter -> request log -> Toggler -> audit."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from omnilearn.emulator.protocol.audit import read_audit, timeline, toggler_lock
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.requests import (
    AUDIT_NAME,
    MAX_SEQ_STEP,
    CpuRequest,
    HostLimits,
    Refusal,
    parse_request,
    request_log,
)
from omnilearn.emulator.protocol.retry import Backoff
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.errors import UserError
from omnilearn.files import read_lines

TARGETS = ("worker0", "worker1")
HOST = [0, 1]
HOST_MEMORY = 2**34
LIMITS = HostLimits.of(HOST, HOST_MEMORY)
PLAN = EmulationPlan(
    mode="quota",
    targets=TARGETS,
    levels={
        "HL1": {"worker0": Allocation(), "worker1": Allocation()},
        "HL2": {"worker0": Allocation(cpus=0.5), "worker1": Allocation(cpus=0.5)},
        "HL4": {"worker0": Allocation(cpuset="0", cpus=1.0), "worker1": Allocation(cpuset="1", cpus=0.25)},
        "MEM": {"worker0": Allocation(cpus=1.0, memory=2**30), "worker1": Allocation(cpuset="0 , 1")},
    },
    schedule=Schedule.pinned("HL1"),
)


class RecordingBackend:
    """Applies nothing, remembers every call; can be told to fail."""

    name = "recording"

    def __init__(self, fail: BaseException | None = None) -> None:
        self.applied: list[tuple[str, Allocation]] = []
        self.fail = fail

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if self.fail is not None:
            raise self.fail
        self.applied.append((target, allocation))
        return allocation

    def current(self, target: str) -> Allocation | None:
        return None

    def close(self) -> None:
        pass


def req_line(seq: object, rank: int = 0, target: str = "worker0", **kw: object) -> str:
    fields = dict(seq=seq, rank=rank, target=target, level="HL2", cpuset=None, cpus=0.5, memory=None,
                  epoch=1.0, time=123.0)
    fields.update(kw)
    return json.dumps(fields) + "\n"


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def make(log_dir: Path, backend: RecordingBackend | None = None) -> tuple[Toggler, RecordingBackend]:
    backend = backend or RecordingBackend()
    return Toggler(log_dir, backend, PLAN, host=HOST, host_memory=HOST_MEMORY), backend


def statuses(records: list[dict]) -> list[str]:
    return [r["status"] for r in records]


# ---------------------------------------------------------------- the parser


def test_roundtrip_and_allocation() -> None:
    req = CpuRequest(seq=3, rank=1, target="worker1", level="HL4", cpuset="0-1", cpus=None, memory=2**30,
                     epoch=10, time=1.5)
    line = req.to_line()
    assert line.endswith("\n") and line.count("\n") == 1
    parsed = parse_request(line.rstrip("\n").encode(), LIMITS)
    assert parsed == req and parsed.claims == {"rank", "target", "cpuset", "cpus", "memory"}
    assert req.allocation == Allocation(cpuset="0-1", memory=2**30)


def test_parse_takes_the_design_notes_line_and_a_bare_level() -> None:
    req = parse_request(b'{"seq": 3, "rank": 1, "target": "worker2", "level": "HL4", "cpuset": "1", '
                        b'"cpus": null, "epoch": 10, "time": 1763800000.1}', LIMITS)
    assert isinstance(req, CpuRequest) and req.memory is None and "memory" not in req.claims
    bare = parse_request(b'{"seq": 0, "level": "HL1"}', LIMITS)
    assert isinstance(bare, CpuRequest) and bare.claims == frozenset() and bare.rank is None


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"not json at all", "not-json"),
        (b"[1, 2]", "not-object"),
        (b'{"seq": 1, "level": ["HL2"]}', "nested"),
        (req_line(1).replace('"level": "HL2", ', ""), "missing-key"),
        (req_line(1, extra=1), "unknown-key"),
        (req_line("1"), "bad-type"),
        (req_line(1, rank=True), "bad-type"),
        (req_line(1.0), "bad-type"),
        (req_line(-1), "seq-out-of-range"),
        (req_line(2**62), "seq-out-of-range"),
        (req_line(1, cpus="half"), "bad-type"),
        (req_line(1, cpuset="0-x"), "cpuset-non-canonical"),
        (req_line(1, cpuset=""), "cpuset-non-canonical"),
        (req_line(1, cpuset="0,1"), "cpuset-non-canonical"),
        (req_line(1, cpuset="0-4294967295"), "cpuset-out-of-range"),
        (req_line(1, cpuset="0-3"), "cpuset-out-of-range"),
        (req_line(1, target=""), "bad-string"),
        (req_line(1, level="HL\x1b[2J"), "bad-string"),
        (req_line(1, level="\ud800"), "bad-string"),
        (req_line(1).replace("0.5", "NaN"), "not-finite"),
        (req_line(1, cpus=2.5), "cpus-out-of-range"),
        (req_line(1, memory=2**70), "memory-out-of-range"),
        ('{"seq": 1, "seq": 2, "level": "HL2"}', "duplicate-key"),
        ("x" * 5000, "line-too-long"),
        (b"\xff\xfe", "not-utf8"),
    ],
)
def test_parse_refuses_with_a_reason(line: str | bytes, reason: str) -> None:
    raw = line.encode() if isinstance(line, str) else line
    result = parse_request(raw.rstrip(b"\n"), LIMITS)
    assert isinstance(result, Refusal) and result.reason == reason, result
    assert len(result.detail) < 600 and result.detail.isascii() and result.detail.isprintable()


def test_read_complete_lines_leaves_partial_tail(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"ab\ncd\nef")
    lines, end = read_lines(p)
    assert lines == [(b"ab", 3), (b"cd", 6)] and end == 6
    assert read_lines(tmp_path / "missing", 5) == ([], 5)


# ---------------------------------------------------------------- toggler


def test_writer_to_toggler_applied_with_audit(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    writer = RequestWriter(tmp_path, 1)
    req = writer.submit("worker1", "HL4", Allocation(cpuset="1", cpus=0.25), epoch=2)
    records = tog.poll_once()
    assert backend.applied == [("worker1", Allocation(cpuset="1", cpus=0.25))]
    (rec,) = records
    assert rec["status"] == "applied" and rec["seq"] == req.seq and rec["file"] == "cpu-1.log"
    assert rec["offset_end"] == request_log(tmp_path, 1).stat().st_size
    assert rec["requested"] == rec["effective"] == {"cpuset": "1", "cpus": 0.25, "memory": None}
    assert rec["reason"] is None and rec["level"] == "HL4" and rec["rank"] == 1
    assert read_audit(tmp_path) == [rec]
    # Write-ahead: the change was announced before it was made.
    assert statuses(read_audit(tmp_path, status=None)) == ["applying", "applied"]
    assert timeline(tmp_path) == [(rec["time"], "worker1", Allocation(cpuset="1", cpus=0.25))]


def test_the_plan_decides_the_allocation_and_the_file_the_target(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    append(request_log(tmp_path, 1), '{"seq": 0, "level": "HL4"}\n')
    append(request_log(tmp_path, 0), '{"seq": 0, "level": "MEM", "memory": 1073741824}\n')
    assert statuses(tog.poll_once()) == ["applied", "applied"]
    assert backend.applied == [("worker0", Allocation(cpus=1.0, memory=2**30)),
                               ("worker1", Allocation(cpuset="1", cpus=0.25))]
    # The plan's cpuset "0 , 1" is compared (and applied) in canonical form; the writer sends that form.
    req = RequestWriter(tmp_path, 1).submit("worker1", "MEM", PLAN.allocation("MEM", "worker1"), 1)
    assert req.cpuset == "0-1"
    (rec,) = tog.poll_once()
    assert rec["status"] == "applied" and backend.applied[-1] == ("worker1", Allocation(cpuset="0-1"))


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    line = req_line(0)
    append(log, line[:20])
    assert tog.poll_once() == [] and backend.applied == []
    append(log, line[20:])
    assert statuses(tog.poll_once()) == ["applied"]
    assert tog.poll_once() == []
    assert len(backend.applied) == 1


def test_garbage_is_skipped_and_next_line_applied(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, "{{{ garbage\n" + "\n" + req_line(0, level="HL4", cpuset="0", cpus=1.0))
    records = tog.poll_once()
    assert statuses(records) == ["malformed", "applied"]
    assert records[0]["seq"] is None and records[0]["reason"] == "nested"
    assert backend.applied == [("worker0", Allocation(cpuset="0", cpus=1.0))]


@pytest.mark.parametrize("junk", [b"x" * 5 * 2**20, b'{"seq": 0, "target": "' + b"w" * 4 * 2**20 + b'"}',
                                  b"[" * 50_000 + b"]" * 50_000])
def test_the_request_behind_a_line_of_several_mib_is_applied_in_the_same_poll(tmp_path: Path, junk: bytes) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    with open(log, "ab") as f:
        f.write(junk + b"\n" + req_line(0, level="HL4", cpuset="0", cpus=1.0).encode())
    records = tog.poll_once()
    assert [(r["status"], r["reason"]) for r in records] == [("malformed", "line-too-long"), ("applied", None)]
    assert backend.applied == [("worker0", Allocation(cpuset="0", cpus=1.0))]
    assert tog.poll_once() == []


def test_a_long_line_still_being_written_is_skipped_once_it_ends(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    with open(log, "ab") as f:
        f.write(b"y" * 3 * 2**20)
    assert [r["reason"] for r in tog.poll_once()] == ["line-too-long"]
    with open(log, "ab") as f:
        f.write(b"y" * 2**20 + b"\n" + req_line(0, level="HL4", cpuset="0", cpus=1.0).encode())
    assert statuses(tog.poll_once()) == ["applied"]
    assert backend.applied == [("worker0", Allocation(cpuset="0", cpus=1.0))]


def test_duplicate_seq_not_applied_twice(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, req_line(0) + req_line(1) + req_line(1, level="HL1", cpus=None) + req_line(0))
    records = tog.poll_once()
    assert statuses(records) == ["applied", "applied", "duplicate", "duplicate"]
    assert {r["reason"] for r in records[2:]} == {"seq-replayed"}
    assert len(backend.applied) == 2


def test_seq_gap_is_taken_and_noted_a_jump_is_refused_and_blocks_nothing(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, req_line(0) + req_line(3))
    gap = tog.poll_once()[1]
    assert gap["status"] == "applied" and "2 seq(s) skipped" in gap["detail"]
    append(log, req_line(3 + MAX_SEQ_STEP + 1) + req_line(2**53 - 1) + req_line(4))
    records = tog.poll_once()
    assert [(r["status"], r["reason"]) for r in records] == [
        ("refused", "seq-jump"), ("refused", "seq-jump"), ("applied", None)]
    append(log, req_line(4 + MAX_SEQ_STEP))  # exactly the largest step
    assert statuses(tog.poll_once()) == ["applied"]
    assert len(backend.applied) == 4


@pytest.mark.parametrize(
    "line, status, reason",
    [
        (req_line(0, target="other-job-worker"), "refused", "wrong-target"),
        (req_line(0, target="worker1"), "refused", "wrong-target"),
        (req_line(0, rank=1), "refused", "wrong-rank"),
        (req_line(0, level="HL99"), "refused", "unknown-level"),
        (req_line(0, cpus=1.0), "refused", "not-in-plan"),
        (req_line(0, cpus=None), "refused", "not-in-plan"),
        (req_line(0, level="HL4", cpuset="0-1", cpus=1.0), "refused", "not-in-plan"),
        (req_line(0, memory=4096), "refused", "not-in-plan"),
        (req_line(0, cpuset="0-3"), "malformed", "cpuset-out-of-range"),
        (req_line(0, cpus=0), "malformed", "cpus-out-of-range"),
        (req_line(0, cpus=-1.0), "malformed", "cpus-out-of-range"),
        (req_line(0, cpus=2.5), "malformed", "cpus-out-of-range"),
        (req_line(0, memory=0), "malformed", "memory-out-of-range"),
    ],
)
def test_refusals_apply_nothing_and_the_next_good_line_applies(tmp_path: Path, line: str, status: str,
                                                              reason: str) -> None:
    tog, backend = make(tmp_path)
    append(request_log(tmp_path, 0), line)
    (rec,) = tog.poll_once()
    assert (rec["status"], rec["reason"]) == (status, reason)
    assert rec["effective"] is None and rec["target"] == "worker0"
    assert backend.applied == []
    assert read_audit(tmp_path) == []
    assert read_audit(tmp_path, status=None) == [rec]
    append(request_log(tmp_path, 0), req_line(0))  # the same seq: a refused line does not use it up
    assert statuses(tog.poll_once()) == ["applied"]


def test_backend_failure_is_a_rejection_and_toggler_survives(tmp_path: Path) -> None:
    backend = RecordingBackend(fail=OSError(22, "Invalid argument"))
    tog = Toggler(tmp_path, backend, PLAN, host=HOST, host_memory=HOST_MEMORY, retry=Backoff(max_retries=0))
    log = request_log(tmp_path, 0)
    append(log, req_line(0))
    (rec,) = tog.poll_once()
    assert rec["status"] == "rejected" and rec["reason"] == "backend-failed" and rec["attempts"] == 1
    assert "Invalid argument" in rec["detail"]
    backend.fail = None
    append(log, req_line(1))
    assert statuses(tog.poll_once()) == ["applied"]


def test_restart_neither_repeats_nor_loses(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log0, log1 = request_log(tmp_path, 0), request_log(tmp_path, 1)
    append(log0, req_line(0) + "garbage\n" + req_line(1))
    append(log1, req_line(0, rank=1, target="worker1"))
    assert len(tog.poll_once()) == 4
    append(log0, req_line(2)[:10])  # a half-written line across the restart
    assert tog.poll_once() == []

    tog2, backend2 = make(tmp_path)
    assert tog2.poll_once() == [] and backend2.applied == []
    append(log0, req_line(2)[10:])
    append(log1, req_line(1, rank=1, target="worker1", level="HL4", cpuset="1", cpus=0.25))
    records = tog2.poll_once()
    assert sorted((r["file"], r["seq"], r["status"]) for r in records) == [
        ("cpu-0.log", 2, "applied"), ("cpu-1.log", 1, "applied")]
    assert tog2.poll_once() == []
    assert len(backend.applied) == 3 and len(backend2.applied) == 2
    # A third incarnation starts from the audit alone.
    tog3, backend3 = make(tmp_path)
    assert tog3.poll_once() == [] and backend3.applied == []


def test_audit_with_torn_last_record_is_recovered(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    append(request_log(tmp_path, 0), req_line(0))
    tog.poll_once()
    append(tmp_path / AUDIT_NAME, '{"time": 1, "file": "cpu-0.lo')  # toggler killed mid-write
    tog2, backend2 = make(tmp_path)
    append(request_log(tmp_path, 0), req_line(1))
    assert [r["seq"] for r in tog2.poll_once()] == [1]
    assert [r["seq"] for r in read_audit(tmp_path)] == [0, 1]


class Crash(BaseException):
    """The toggler process dying at this point (not an error it could catch)."""


class StateBackend(RecordingBackend):
    """Keeps the allocation in force per target, like a kernel; dies at the ``crash_at``-th apply,
    before the change (``after`` False) or after it."""

    def __init__(self, state: dict[str, Allocation], crash_at: int = -1, after: bool = False) -> None:
        super().__init__()
        self.state, self.crash_at, self.after, self.calls = state, crash_at, after, 0

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self.calls += 1
        dying = self.calls == self.crash_at
        if dying and not self.after:
            raise Crash
        self.state[target] = allocation
        if dying:
            raise Crash
        return super().apply(target, allocation)


class CrashingToggler(Toggler):
    """Dies at its ``crash_at``-th audit write: before it, half-way through it, or just after it."""

    crash_at = -1
    how = "before"
    writes = 0

    def _write(self, record: dict) -> dict:
        self.writes += 1
        if self.writes != self.crash_at:
            return super()._write(record)
        if self.how == "torn":
            append(self.log_dir / AUDIT_NAME, json.dumps(record)[:40])
        elif self.how == "after":
            super()._write(record)
        raise Crash


CRASH_LINES = [req_line(0), "junk\n", req_line(1, level="HL4", cpuset="0", cpus=1.0), req_line(9, level="HL99"),
               req_line(2, level="HL1", cpus=None)]


@pytest.mark.parametrize("k", range(1, 12))
@pytest.mark.parametrize("mode", ["write-before", "write-torn", "write-after", "apply-before", "apply-after"])
def test_write_ahead_audit_survives_a_crash_at_every_point(tmp_path: Path, mode: str, k: int) -> None:
    """The first toggler dies at its k-th audit write (or backend apply); a second one takes over.
    Every line gets exactly one decision, every change exactly one applying record, and the
    allocations in force are the last ones requested."""
    append(request_log(tmp_path, 0), "".join(CRASH_LINES))
    append(request_log(tmp_path, 1), '{"seq": 0, "level": "HL4"}\n')
    state: dict[str, Allocation] = {}
    kind, how = mode.split("-")
    backend = StateBackend(state, crash_at=k if kind == "apply" else -1, after=how == "after")
    tog = CrashingToggler(tmp_path, backend, PLAN, host=HOST, host_memory=HOST_MEMORY)
    if kind == "write":
        tog.crash_at, tog.how = k, how
    try:
        tog.poll_once()
    except Crash:
        pass
    tog2 = Toggler(tmp_path, StateBackend(state), PLAN, host=HOST, host_memory=HOST_MEMORY)
    tog2.poll_once()
    assert tog2.poll_once() == []

    decisions = [r for r in read_audit(tmp_path, status=None) if r["status"] != "applying"]
    assert sorted((r["file"], r["status"]) for r in decisions) == [
        ("cpu-0.log", "applied"), ("cpu-0.log", "applied"), ("cpu-0.log", "applied"),
        ("cpu-0.log", "malformed"), ("cpu-0.log", "refused"), ("cpu-1.log", "applied")]
    ends = [(r["file"], r["offset_end"]) for r in decisions]
    assert len(ends) == len(set(ends))  # nothing decided twice
    applying = [(r["file"], r["offset_end"]) for r in read_audit(tmp_path, status="applying")]
    assert len(applying) == len(set(applying)) == 4  # nothing begun twice
    assert state == {"worker0": Allocation(), "worker1": Allocation(cpuset="1", cpus=0.25)}


def test_an_interrupted_change_is_completed_by_the_same_toggler(tmp_path: Path) -> None:
    backend = RecordingBackend(fail=KeyboardInterrupt())
    tog, _ = make(tmp_path, backend)
    append(request_log(tmp_path, 0), req_line(0))
    with pytest.raises(KeyboardInterrupt):
        tog.poll_once()
    backend.fail = None
    assert [(r["status"], r["seq"]) for r in tog.poll_once()] == [("applied", 0)]
    assert tog.poll_once() == [] and backend.applied == [("worker0", Allocation(cpus=0.5))]
    assert statuses(read_audit(tmp_path, status=None)) == ["applying", "applied"]


def test_a_forged_applying_record_applies_only_the_plan(tmp_path: Path) -> None:
    forged = {"file": "cpu-1.log", "offset_end": 0, "seq": 0, "status": "applying", "level": "HL4",
              "requested": {"cpuset": "0-1", "cpus": 2.0, "memory": None}}
    bogus = dict(forged, file="cpu-0.log", level=["HL4"])
    append(tmp_path / AUDIT_NAME, json.dumps(forged) + "\n" + json.dumps(bogus) + "\n")
    tog, backend = make(tmp_path)
    records = tog.poll_once()
    assert backend.applied == [("worker1", Allocation(cpuset="1", cpus=0.25))]
    assert sorted((r["file"], r["status"], r["reason"]) for r in records) == [
        ("cpu-0.log", "rejected", "not-in-plan"), ("cpu-1.log", "applied", None)]


def test_logs_only_grow(tmp_path: Path) -> None:
    tog, _ = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    log = request_log(tmp_path, 0)
    sizes = []
    for i in range(5):
        writer.submit("worker0" if i % 2 else "nope", "HL1", Allocation(), epoch=i)
        append(log, "junk\n")
        before = log.read_bytes()
        tog.poll_once()
        after = log.read_bytes()
        assert after == before  # the toggler never rewrites or truncates
        sizes.append(len(after))
    assert sizes == sorted(sizes) and len(set(sizes)) == 5


def test_run_polls_until_stopped_then_once_more(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    stop = threading.Event()
    thread = threading.Thread(target=tog.run, args=(stop, 0.01))
    thread.start()
    req = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=0)
    rec = writer.wait_applied(req, timeout=5)
    assert rec is not None and rec["status"] == "applied"
    stop.set()
    thread.join(5)
    assert not thread.is_alive()

    # A long interval: only the final poll after stop can see a request written just before it.
    stop = threading.Event()
    thread = threading.Thread(target=tog.run, args=(stop, 30.0))
    thread.start()
    writer.submit("worker0", "HL1", Allocation(), epoch=1)
    stop.set()  # wakes the 30-s wait: the join returns long before it would have ended
    thread.join(10)
    assert not thread.is_alive()
    assert backend.applied == [("worker0", Allocation(cpus=0.5)), ("worker0", Allocation())]


# ---------------------------------------------------------------- RequestWriter


def test_writer_seq_continues_after_restart(tmp_path: Path) -> None:
    w = RequestWriter(tmp_path, 2)
    assert [w.submit("worker0", "HL1", Allocation(), None).seq for _ in range(3)] == [0, 1, 2]
    append(request_log(tmp_path, 2), "garbage\n" + req_line(2**50) + "[" * 5000 + "\n")
    w2 = RequestWriter(tmp_path, 2)
    # Past the seqs the toggler takes: a stray huge seq would only have made its requests jumps.
    assert w2.submit("worker0", "HL1", Allocation(), None).seq == 3


def test_writer_closes_a_torn_line_before_appending(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, req_line(0)[:15])  # the previous worker died mid-line
    req = RequestWriter(tmp_path, 0).submit("worker0", "HL2", Allocation(cpus=0.5), None)
    assert req.seq == 0  # the torn line never counted
    assert statuses(tog.poll_once()) == ["malformed", "applied"]
    assert backend.applied == [("worker0", Allocation(cpus=0.5))]


def test_wait_applied_returns_record_or_none(tmp_path: Path) -> None:
    tog, _ = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    good = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=1)
    bad = writer.submit("elsewhere", "HL2", Allocation(cpus=0.5), epoch=1)
    assert writer.wait_applied(good, timeout=0) is None  # nothing applied yet: no record, whatever the wait
    # Another rank's record with the same seq is not ours.
    append(request_log(tmp_path, 1), req_line(0, rank=1, target="worker1"))
    tog.poll_once()
    rec = writer.wait_applied(good, timeout=1)
    assert rec is not None and rec["status"] == "applied" and rec["file"] == "cpu-0.log"
    assert rec["effective"] == {"cpuset": None, "cpus": 0.5, "memory": None}
    rej = writer.wait_applied(bad, timeout=1)
    assert rej is not None and (rej["status"], rej["reason"]) == ("refused", "wrong-target")


def test_wait_applied_is_not_fooled_by_a_line_with_the_same_seq(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    append(request_log(tmp_path, 0), req_line(0, level="HL99"))  # user code, seq 0 out of plan
    req = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=1)
    assert req.seq == 0  # the same seq: a refused line does not use it up
    assert statuses(tog.poll_once()) == ["refused", "applied"]
    rec = writer.wait_applied(req, timeout=1)
    assert rec is not None and rec["status"] == "applied"


def test_wait_applied_tolerates_partial_audit_line(tmp_path: Path) -> None:
    writer = RequestWriter(tmp_path, 0)
    req = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=1)
    end = request_log(tmp_path, 0).stat().st_size
    record = json.dumps({"file": "cpu-0.log", "offset_end": end, "seq": 0, "status": "applied",
                         "effective": {}}) + "\n"
    append(tmp_path / AUDIT_NAME, "[" * 10000 + "\n" + record[:25])  # and a line too deep for json
    assert writer.wait_applied(req, timeout=0) is None
    append(tmp_path / AUDIT_NAME, record[25:])  # the toggler finishes its line
    rec = writer.wait_applied(req, timeout=0)
    assert rec is not None and rec["seq"] == 0


# ---------------------------------------------------------------- the log folder is the workers' too


def test_a_read_error_on_one_log_leaves_the_others_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    tog, backend = make(tmp_path)
    append(request_log(tmp_path, 0), req_line(0))
    append(request_log(tmp_path, 1), req_line(0, rank=1, target="worker1"))
    real_pread = os.pread
    bad = os.stat(request_log(tmp_path, 0)).st_ino

    def pread(fd: int, n: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == bad:
            raise OSError(5, "Input/output error")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    records = tog.poll_once()
    assert [(r["file"], r["status"], r["reason"]) for r in records] == [
        ("cpu-0.log", "refused", "cannot-read"), ("cpu-1.log", "applied", None)]
    monkeypatch.setattr(os, "pread", real_pread)
    assert [(r["file"], r["status"]) for r in tog.poll_once()] == [("cpu-0.log", "applied")]


def test_an_audit_that_is_a_symlink_is_never_written_and_nothing_is_applied(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("precious\n")
    (tmp_path / AUDIT_NAME).symlink_to(victim)
    append(request_log(tmp_path, 0), req_line(0))
    assert tog.poll_once() == [] and backend.applied == []
    assert victim.read_text() == "precious\n"
    (tmp_path / AUDIT_NAME).unlink()
    assert statuses(tog.poll_once()) == ["applied"]  # the line was not consumed meanwhile
    (tmp_path / AUDIT_NAME).rename(tmp_path / "old-audit")
    (tmp_path / AUDIT_NAME).symlink_to(victim)
    with pytest.raises(UserError, match="audit"):  # a restarted toggler cannot trust its state: says so
        make(tmp_path)


def test_the_lock_is_never_taken_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "toggler.lock").symlink_to(victim)
    with pytest.raises(UserError, match="lock"), toggler_lock(tmp_path / "logs"):
        pass
    assert not victim.exists()
