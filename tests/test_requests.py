"""The CPU-request protocol end to end: RequestWriter -> request log -> Toggler -> audit."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from omnilearn.emulator.levels import Allocation
from omnilearn.emulator.requests import (
    AUDIT_NAME,
    CpuRequest,
    RequestWriter,
    request_log,
)
from omnilearn.emulator.toggler import Toggler, read_audit, timeline
from omnilearn.files import read_lines

TARGETS = ["worker0", "worker1"]
HOST = [0, 1]


class RecordingBackend:
    """Applies nothing, remembers every call; can be told to fail."""

    name = "recording"

    def __init__(self, fail: Exception | None = None) -> None:
        self.applied: list[tuple[str, Allocation]] = []
        self.fail = fail

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if self.fail is not None:
            raise self.fail
        self.applied.append((target, allocation))
        return allocation

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
    return Toggler(log_dir, backend, TARGETS, host=HOST), backend


# ---------------------------------------------------------------- CpuRequest


def test_roundtrip_and_allocation() -> None:
    req = CpuRequest(seq=3, rank=1, target="worker1", level="HL4", cpuset="0-1", cpus=None, memory=2**30,
                     epoch=10, time=1.5)
    line = req.to_line()
    assert line.endswith("\n") and line.count("\n") == 1
    assert CpuRequest.parse(line) == req
    assert req.allocation == Allocation(cpuset="0-1", memory=2**30)


def test_parse_allows_unlimited_and_absent_memory() -> None:
    req = CpuRequest.parse(json.dumps(dict(seq=0, rank=0, target="w", level="HL1", cpuset=None, cpus=None,
                                           epoch=None, time=1)))
    assert req.allocation == Allocation() and req.memory is None


@pytest.mark.parametrize(
    "line, reason",
    [
        ("not json at all", "not JSON"),
        ("[1, 2]", "JSON object"),
        (req_line(1).replace('"level": "HL2", ', ""), "missing key(s): level"),
        (req_line(1, extra=1), "unknown key(s): extra"),
        (req_line("1"), "seq: expected int"),
        (req_line(1, rank=True), "rank: expected int"),
        (req_line(-1), "seq: must be >= 0"),
        (req_line(1, cpus="half"), "cpus: expected"),
        (req_line(1, cpuset="0-x"), "cpuset:"),
        (req_line(1, cpuset=""), "cpuset:"),
        (req_line(1, target=""), "target: empty"),
        (req_line(1).replace("0.5", "NaN"), "finite"),
    ],
)
def test_parse_rejects(line: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        CpuRequest.parse(line)


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
    assert timeline(tmp_path) == [(rec["time"], "worker1", Allocation(cpuset="1", cpus=0.25))]


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    line = req_line(0)
    append(log, line[:20])
    assert tog.poll_once() == [] and backend.applied == []
    append(log, line[20:])
    assert [r["status"] for r in tog.poll_once()] == ["applied"]
    assert tog.poll_once() == []
    assert len(backend.applied) == 1


def test_garbage_is_skipped_and_next_line_applied(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, "{{{ garbage\n" + "\n" + req_line(0, cpus=1.0))
    records = tog.poll_once()
    assert [r["status"] for r in records] == ["malformed", "applied"]
    assert records[0]["seq"] is None and "not JSON" in records[0]["reason"]
    assert backend.applied == [("worker0", Allocation(cpus=1.0))]


def test_duplicate_seq_not_applied_twice(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, req_line(0) + req_line(1) + req_line(1, cpus=1.0) + req_line(0))
    statuses = [r["status"] for r in tog.poll_once()]
    assert statuses == ["applied", "applied", "duplicate", "duplicate"]
    assert len(backend.applied) == 2


@pytest.mark.parametrize(
    "line, reason",
    [
        (req_line(0, target="other-job-worker"), "not part of this job"),
        (req_line(0, rank=1), "does not match the file's rank 0"),
        (req_line(0, cpuset="0-3"), "CPUs this host lacks: 2-3"),
        (req_line(0, cpus=0), "outside"),
        (req_line(0, cpus=-1.0), "outside"),
        (req_line(0, cpus=2.5), "outside"),
        (req_line(0, memory=0), "memory"),
    ],
)
def test_rejections_apply_nothing(tmp_path: Path, line: str, reason: str) -> None:
    tog, backend = make(tmp_path)
    append(request_log(tmp_path, 0), line)
    (rec,) = tog.poll_once()
    assert rec["status"] == "rejected" and reason in rec["reason"]
    assert rec["effective"] is None
    assert backend.applied == []
    assert read_audit(tmp_path) == []
    assert read_audit(tmp_path, status=None) == [rec]


def test_backend_failure_is_a_rejection_and_toggler_survives(tmp_path: Path) -> None:
    backend = RecordingBackend(fail=OSError(22, "Invalid argument"))
    tog, _ = make(tmp_path, backend)
    log = request_log(tmp_path, 0)
    append(log, req_line(0))
    (rec,) = tog.poll_once()
    assert rec["status"] == "rejected" and "Invalid argument" in rec["reason"]
    backend.fail = None
    append(log, req_line(1))
    assert [r["status"] for r in tog.poll_once()] == ["applied"]


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
    append(log1, req_line(1, rank=1, target="worker1", cpuset="0", cpus=None))
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


def test_logs_only_grow(tmp_path: Path) -> None:
    tog, _ = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    log = request_log(tmp_path, 0)
    sizes = []
    for i in range(5):
        writer.submit("worker0" if i % 2 else "nope", "HL1", Allocation(cpus=0.5), epoch=i)
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
    t0 = time.monotonic()
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - t0 < 2
    assert backend.applied == [("worker0", Allocation(cpus=0.5)), ("worker0", Allocation())]


# ---------------------------------------------------------------- RequestWriter


def test_writer_seq_continues_after_restart(tmp_path: Path) -> None:
    w = RequestWriter(tmp_path, 2)
    assert [w.submit("worker0", "HL1", Allocation(), None).seq for _ in range(3)] == [0, 1, 2]
    append(request_log(tmp_path, 2), "garbage\n")
    w2 = RequestWriter(tmp_path, 2)
    assert w2.submit("worker0", "HL1", Allocation(), None).seq == 3


def test_writer_closes_a_torn_line_before_appending(tmp_path: Path) -> None:
    tog, backend = make(tmp_path)
    log = request_log(tmp_path, 0)
    append(log, req_line(0)[:15])  # the previous worker died mid-line
    req = RequestWriter(tmp_path, 0).submit("worker0", "HL2", Allocation(cpus=0.5), None)
    assert req.seq == 0  # the torn line never counted
    assert [r["status"] for r in tog.poll_once()] == ["malformed", "applied"]
    assert backend.applied == [("worker0", Allocation(cpus=0.5))]


def test_wait_applied_returns_record_or_none(tmp_path: Path) -> None:
    tog, _ = make(tmp_path)
    writer = RequestWriter(tmp_path, 0)
    good = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=1)
    bad = writer.submit("elsewhere", "HL2", Allocation(cpus=0.5), epoch=1)
    t0 = time.monotonic()
    assert writer.wait_applied(good, timeout=0.2, poll=0.02) is None
    assert 0.19 <= time.monotonic() - t0 < 2
    # Another rank's record with the same seq is not ours.
    append(request_log(tmp_path, 1), req_line(0, rank=1, target="worker1"))
    tog.poll_once()
    rec = writer.wait_applied(good, timeout=1)
    assert rec is not None and rec["status"] == "applied" and rec["file"] == "cpu-0.log"
    assert rec["effective"] == {"cpuset": None, "cpus": 0.5, "memory": None}
    rej = writer.wait_applied(bad, timeout=1)
    assert rej is not None and rej["status"] == "rejected"


def test_wait_applied_tolerates_partial_audit_line(tmp_path: Path) -> None:
    writer = RequestWriter(tmp_path, 0)
    req = writer.submit("worker0", "HL2", Allocation(cpus=0.5), epoch=1)
    record = json.dumps({"file": "cpu-0.log", "seq": 0, "status": "applied", "effective": {}}) + "\n"
    append(tmp_path / AUDIT_NAME, record[:25])
    assert writer.wait_applied(req, timeout=0.1, poll=0.02) is None

    def finish() -> None:
        time.sleep(0.1)
        append(tmp_path / AUDIT_NAME, record[25:])

    threading.Thread(target=finish).start()
    rec = writer.wait_applied(req, timeout=3, poll=0.02)
    assert rec is not None and rec["seq"] == 0
