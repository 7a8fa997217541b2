"""Hostile request inputs against a toggler on a fake cgroup v2 tree.

Each input of the corpus (malformed, binary, huge, nested, wrong types and ranges, non-canonical,
replayed, out of order, another rank's target, out of the plan, links, FIFOs and strays in the log
folder) must be refused with its reason, leave every cgroup file as it was, keep the toggler alive,
and let the worker's next good request apply. A property test does the same for random lines.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from omnilearn.emulator.backends.cgroup import CgroupV2Backend
from omnilearn.emulator.backends.cgroupfs import PERIOD_US, cfs_limits
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import append_line
from omnilearn.emulator.protocol.requests import (
    MAX_CPUSET_CHARS,
    MAX_ECHO_CHARS,
    MAX_LINE_BYTES,
    MAX_LOG_BYTES,
    MAX_NAME_CHARS,
    MAX_REFUSALS_PER_LOG,
    MAX_SEQ,
    MAX_SEQ_STEP,
    CpuRequest,
    HostLimits,
    Refusal,
    parse_request,
    request_log,
)
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation, format_cpuset, parse_cpuset
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.emulator.spec.schedule import Schedule

HOST = [0, 1, 2, 3]
HOST_MEMORY = 2**34
LIMITS = HostLimits.of(HOST, HOST_MEMORY)
TARGETS = ("worker1", "worker2", "worker3")
PLAN = EmulationPlan(
    mode="cpuset",
    targets=TARGETS,
    levels={
        "HL1": {t: Allocation() for t in TARGETS},
        "HL2": {"worker1": Allocation(cpuset="0", cpus=0.5), "worker2": Allocation(cpuset="1-2", cpus=1.5),
                "worker3": Allocation(cpus=0.25, memory=2**30)},
        "HL4": {"worker1": Allocation(cpuset="0", cpus=0.25), "worker2": Allocation(cpuset="1-3"),
                "worker3": Allocation(cpus=1.0, memory=2**31)},
    },
    schedule=Schedule.pinned("HL1"),
)
# What the fake kernel files say for each target's plan allocations (cpu.max, cpuset.cpus, memory.max).
KERNEL = {
    "HL1": ("max 10000", "", "max"),
    ("worker1", "HL2"): ("5000 10000", "0", "max"),
    ("worker1", "HL4"): ("2500 10000", "0", "max"),
    ("worker2", "HL4"): ("max 10000", "1-3", "max"),
}


def fake_v2(root: Path) -> Path:
    """The files the kernel shows at the root of a unified hierarchy."""
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("\n")
    (root / "cgroup.procs").write_text("1\n")
    (root / "cpuset.cpus.effective").write_text("0-3\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def kernel(root: Path, target: str) -> tuple[str, str, str]:
    d = root / "omnilearn" / "fuzz" / target
    return tuple((d / f).read_text() for f in ("cpu.max", "cpuset.cpus", "memory.max"))  # type: ignore[return-value]


class CountingBackend(CgroupV2Backend):
    applies = 0

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self.applies += 1
        return super().apply(target, allocation)


def good(seq: int, level: str = "HL2", rank: int = 0) -> str:
    """A request exactly as the worker writes it (RequestWriter)."""
    target = TARGETS[rank]
    a = PLAN.allocation(level, target)
    return CpuRequest(seq=seq, rank=rank, target=target, level=level, cpuset=a.cpuset, cpus=a.cpus,
                      memory=a.memory, epoch=1.0, time=1763800000.1).to_line()


def line(**changes: Any) -> bytes:
    """The history's next request (rank 0, seq 1, HL2) with fields changed (None: key removed)."""
    fields = json.loads(good(1))
    for key, value in changes.items():
        if value is DROP:
            fields.pop(key)
        else:
            fields[key] = value
    return json.dumps(fields).encode() + b"\n"


def raw_field(key: str, text: str) -> bytes:
    """The history's next request with ``key``'s value written as raw JSON ``text``."""
    fields = json.loads(good(1))
    fields[key] = "@@"
    return json.dumps(fields).replace('"@@"', text).encode() + b"\n"


DROP = object()


@dataclass
class Case:
    id: str
    status: str
    reason: str
    data: bytes | None = None  # appended to cpu-0.log
    setup: Callable[[Path], None] | None = None  # makes something in the log folder instead
    rank: int | None = 0  # the rank whose log the input concerns (None: a stray file)
    closes: bool = False  # that log can no longer be used
    cleanup: Callable[[Path], None] | None = None  # undoes setup, so that rank 1's log can be used


def lines(status: str, reason: str, items: dict[str, bytes]) -> list[Case]:
    return [Case(f"{reason}:{name}", status, reason, data) for name, data in items.items()]


def _symlink(to: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        target = to.replace("{d}", str(d))
        os.symlink(target, d / "cpu-1.log")
    return setup


def _remove_log1(d: Path) -> None:
    p = d / "cpu-1.log"
    if p.is_dir() and not p.is_symlink():
        p.rmdir()
    else:
        p.unlink()


def _fifo(d: Path) -> None:
    os.mkfifo(d / "cpu-1.log")


def _directory(d: Path) -> None:
    (d / "cpu-1.log").mkdir()


def _socket(d: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "cpu-1.log"))
    s.close()


def _hard_link(d: Path) -> None:
    other = d.parent / "elsewhere.log"
    other.write_text(good(0, rank=1))
    os.link(other, d / "cpu-1.log")


def _huge(d: Path) -> None:
    with open(d / "cpu-1.log", "wb") as f:
        f.write(good(0, rank=1).encode())
        f.truncate(MAX_LOG_BYTES + 1)  # sparse: no disk used


def _shrunk(d: Path) -> None:
    os.truncate(d / "cpu-0.log", 10)


def _stray(name: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_text(good(1))
    return setup


def _rng_bytes(seed: int, n: int) -> bytes:
    data = random.Random(seed).randbytes(n).replace(b"\n", b"")
    return b"\xff" + data + b"\n"


def corpus() -> list[Case]:
    cases: list[Case] = []
    cases += lines("malformed", "not-json", {
        "words": b"not json at all\n", "open": b"{\n", "close": b"}\n", "unclosed": b'{"seq": 1, "level": "HL2"\n',
        "extra-brace": b'{"seq": 1, "level": "HL2"}}\n', "two-objects": b'{"seq": 1, "level": "HL2"} {"seq": 2}\n',
        "single-quotes": b"{'seq': 1, 'level': 'HL2'}\n", "trailing-comma": b'{"seq": 1, "level": "HL2",}\n',
        "comment": b'{"seq": 1, /* c */ "level": "HL2"}\n', "bare-keys": b"{seq: 1, level: HL2}\n",
        "bom": b"\xef\xbb\xbf" + good(1).encode(), "nul-after": good(1).encode()[:-1] + b"\x00\n",
        "nuls": b"\x00\x00\x00\n", "raw-control-char": b'{"seq": 1, "level": "HL\x07"}\n',
        "hex-int": raw_field("seq", "0x1"), "leading-zero": raw_field("seq", "01"), "plus": raw_field("seq", "+1"),
        "dot-number": raw_field("cpus", ".5"), "utf16-no-bom": good(1)[:-1].encode("utf-16-le") + b"\n",
        "python-none": raw_field("cpuset", "None"), "python-true": raw_field("memory", "True"),
    })
    cases += lines("malformed", "not-object", {
        "null": b"null\n", "int": b"1\n", "string": b'"HL2"\n', "true": b"true\n", "empty-array": b"[]\n",
    })
    cases += lines("malformed", "missing-key", {
        "empty-object": b"{}\n", "no-seq": line(seq=DROP), "no-level": line(level=DROP),
    })
    cases += lines("malformed", "unknown-key", {
        "extra": line(extra=1), "case": line(Seq=1), "nul-in-key": line(**{"seq\x00": 1}),
        "space-in-key": line(**{"level ": "HL2"}), "many-keys": line(**{f"k{i}": 0 for i in range(300)}),
        "cpu": line(cpu="0"),
    })
    cases += lines("malformed", "duplicate-key", {
        "seq": b'{"seq": 1, "seq": 2, "level": "HL2"}\n', "level": b'{"seq": 1, "level": "HL2", "level": "HL1"}\n',
        "escaped": b'{"seq": 1, "s\\u0065q": 2, "level": "HL2"}\n',
    })
    cases += lines("malformed", "not-finite", {
        "nan": raw_field("cpus", "NaN"), "inf": raw_field("cpus", "Infinity"), "-inf": raw_field("epoch", "-Infinity"),
        "1e400": raw_field("cpus", "1e400"), "-1e400": raw_field("time", "-1e400"),
    })
    cases += lines("malformed", "non-canonical-int", {"minus-zero": raw_field("seq", "-0")})
    cases += lines("malformed", "number-too-long", {
        "seq-100-digits": raw_field("seq", "9" * 100), "memory-45-digits": raw_field("memory", "1" * 45),
        "cpus-50-chars": raw_field("cpus", "0." + "5" * 48),
    })
    cases += lines("malformed", "not-utf8", {
        "ff": b"\xff\xfe\xfd\n", "overlong-nul": b'{"seq": 1, "level": "\xc0\x80"}\n',
        "encoded-surrogate": b'{"seq": 1, "level": "\xed\xa0\x80"}\n', "latin1": b'{"seq": 1, "level": "HL\xe9"}\n',
        "truncated-sequence": b'{"seq": 1, "level": "HL\xe2\x82"}\n', "beyond-unicode": b"\xf4\x90\x80\x80\n",
        "utf16-bom": b"\xff\xfe" + good(1)[:-1].encode("utf-16-le") + b"\n", "random-1": _rng_bytes(1, 300),
        "random-2": _rng_bytes(2, 3000),
    })
    cases += lines("malformed", "line-too-long", {
        "4097": b'{"seq": 1, "level": "HL2"' + b" " * (MAX_LINE_BYTES - 25) + b"}\n",
        "1MiB": b"x" * 2**20 + b"\n", "4MiB-target": line(target="w" * 4 * 2**20),
        "5MiB-unterminated": b"[" * 5 * 2**20, "deep-nesting-10k": b"[" * 10_000 + b"]" * 10_000 + b"\n",
        "seq-5000-digits": raw_field("seq", "9" * 5000),
    })
    cases += lines("malformed", "nested", {
        "object-value": line(level={"name": "HL2"}), "array-value": line(cpuset=["0"]),
        "memory-object": line(memory={"x": 1}), "array-of-request": b"[" + good(1).encode()[:-1] + b"]\n",
        "brackets-4000": b"[" * 4000 + b"\n", "objects-800": b'{"a":' * 800 + b"\n",
        "after-string-brackets": b'{"level": "[[[", "seq": [1]}\n', "empty-array-value": line(seq=[]),
    })
    cases += lines("malformed", "string-too-long", {
        "level-200": line(level="H" * 200), "target-129": line(target="w" * (MAX_NAME_CHARS + 1)),
    })
    cases += lines("malformed", "cpuset-too-long", {"2100-chars": line(cpuset="0" * (MAX_CPUSET_CHARS + 52))})
    cases += lines("malformed", "bad-type", {
        "seq-str": line(seq="1"), "seq-float": line(seq=1.0), "seq-exp": raw_field("seq", "1e0"),
        "seq-bool": line(seq=True), "seq-null": line(seq=None),
        "rank-str": line(rank="0"), "rank-float": line(rank=0.0), "rank-bool": line(rank=False),
        "rank-null": line(rank=None),
        "target-int": line(target=1), "target-null": line(target=None), "target-bool": line(target=True),
        "target-float": line(target=1.5),
        "level-int": line(level=2), "level-null": line(level=None), "level-bool": line(level=False),
        "cpuset-int": line(cpuset=0), "cpuset-bool": line(cpuset=True), "cpuset-float": line(cpuset=1.5),
        "cpus-str": line(cpus="0.5"), "cpus-bool": line(cpus=True),
        "memory-float": line(memory=1.5), "memory-str": line(memory="1G"), "memory-bool": line(memory=True),
        "memory-exp": raw_field("memory", "1e9"),
        "epoch-str": line(epoch="1"), "epoch-bool": line(epoch=True),
        "time-str": line(time="now"), "time-null": line(time=None), "time-bool": line(time=False),
    })
    for key, values in {
        "seq": {"-1": -1, "2^53": MAX_SEQ + 1, "2^62": 2**62},
        "rank": {"-1": -1, "2^16": 2**16, "2^40": 2**40},
        "cpus": {"0": 0, "-0.5": -0.5, "0.0": 0.0, "4.0001": 4.0001, "5": 5, "1e308": 1e308, "-tiny": -1e-300},
        "memory": {"0": 0, "-1": -1, "host+1": HOST_MEMORY + 1, "2^70": 2**70},
        "epoch": {"-1": -1, "1e13": 1e13},
        "time": {"-5": -5, "1e300": 1e300},
    }.items():
        cases += lines("malformed", f"{key}-out-of-range", {n: line(**{key: v}) for n, v in values.items()})
    cases += lines("malformed", "cpuset-out-of-range", {
        "0-4294967295": line(cpuset="0-4294967295"), "4": line(cpuset="4"), "0-4": line(cpuset="0-4"),
        "99999": line(cpuset="99999"), "3,100000": line(cpuset="3,100000"), "0-3,5": line(cpuset="0-3,5"),
    })
    cases += lines("malformed", "cpuset-non-canonical", {name: line(cpuset=text) for name, text in {
        "underscore": "0_1", "plus": "+1", "spaces": " 0 - 1 ", "arabic-indic": "\u0660-\u0661",
        "fullwidth": "\uff10", "leading-zero": "01", "down": "1-0", "one-range": "1-1", "repeat": "0,0",
        "descending": "1,0", "touching": "0,1", "touching-range": "0-1,2", "trailing-comma": "0-1,",
        "leading-comma": ",0", "double-dash": "0--1", "two-dashes": "0-1-2", "empty": "", "space": " ",
        "trailing-space": "0 ", "hex": "0x1", "exp": "1e0", "inner-down": "0,2-1", "overlap": "0-2,1-3",
        "superscript": "\u00b2", "semicolon": "0;1", "negative": "-1", "newline": "0\n",
    }.items()})
    cases += lines("malformed", "bad-string", {
        "level-empty": line(level=""), "level-escape": line(level="\x1b[31mHL2"), "level-surrogate": line(level="\ud800"),
        "level-nul": line(level="HL2\x00"), "level-rtl": line(level="\u202eHL2"), "level-nbsp": line(level="HL\u00a02"),
        "target-surrogate": line(target="\udfff"), "target-newline": line(target="worker1\n"),
        "level-line-separator": line(level="\u2028"), "level-clear-screen": line(level="HL2\x1b[2J\x1b[H"),
        "target-empty": line(target=""),
    })
    cases += lines("duplicate", "seq-replayed", {
        "history-copy": good(0).encode(), "same-seq-other-level": good(0, "HL4").encode(),
        "bare": b'{"seq": 0, "level": "HL4"}\n',
    })
    cases += lines("refused", "seq-jump", {
        "17": line(seq=MAX_SEQ_STEP + 1), "1000": line(seq=1000), "2^53-1": line(seq=MAX_SEQ),
    })
    cases += lines("refused", "wrong-target", {name: line(target=t) for name, t in {
        "worker2": "worker2", "worker3": "worker3", "server": "aspworker1", "path": "../../etc/passwd",
        "trailing-space": "worker1 ", "upper": "WORKER1", "other-job": "omnilearn-other-worker1",
        "cgroup-path": "/sys/fs/cgroup/omnilearn",
    }.items()})
    cases += lines("refused", "wrong-rank", {"1": line(rank=1), "2": line(rank=2), "3-not-in-job": line(rank=3)})
    cases += lines("refused", "unknown-level", {name: line(level=lv) for name, lv in {
        "HL99": "HL99", "path": "../../../etc/shadow", "dotdot": "HL2/../HL1", "cgroup": "/sys/fs/cgroup",
        "lower": "hl2", "trailing-space": "HL2 ", "HL8": "HL8", "unicode-lookalike": "\u041dL2",
    }.items()})
    cases += lines("refused", "not-in-plan", {
        "all-host-cpus": line(cpuset="0-3"), "no-cpu-limit": line(cpus=None), "no-cpuset": line(cpuset=None),
        "worker2-share": line(cpuset="1-2", cpus=1.5), "memory-4KiB": line(memory=4096),
        "memory-8GiB": line(memory=2**33), "other-levels-quota": line(cpus=0.25), "worker3-memory": line(memory=2**30),
        "more-cpus": line(cpus=4.0), "other-cpuset": line(cpuset="3"),
    })
    files = [
        Case("symlink:dev-zero", "refused", "symlink", setup=_symlink("/dev/zero"), cleanup=_remove_log1, rank=1),
        Case("symlink:good-file", "refused", "symlink", setup=lambda d: (
            (d.parent / "good.log").write_text(good(0, rank=1)), os.symlink(d.parent / "good.log", d / "cpu-1.log")),
            cleanup=_remove_log1, rank=1),
        Case("symlink:dangling", "refused", "symlink", setup=_symlink("{d}/nowhere"), cleanup=_remove_log1, rank=1),
        Case("symlink:directory", "refused", "symlink", setup=_symlink("/etc"), cleanup=_remove_log1, rank=1),
        Case("symlink:rank0-log", "refused", "symlink", setup=_symlink("{d}/cpu-0.log"), cleanup=_remove_log1, rank=1),
        Case("symlink:proc-self-mem", "refused", "symlink", setup=_symlink("/proc/self/mem"), cleanup=_remove_log1, rank=1),
        Case("not-regular-file:fifo", "refused", "not-regular-file", setup=_fifo, cleanup=_remove_log1, rank=1),
        Case("not-regular-file:directory", "refused", "not-regular-file", setup=_directory, cleanup=_remove_log1, rank=1),
        Case("cannot-open:socket", "refused", "cannot-open", setup=_socket, cleanup=_remove_log1, rank=1),
        Case("hard-linked", "refused", "hard-linked", setup=_hard_link, cleanup=_remove_log1, rank=1),
        Case("log-too-large:sparse", "refused", "log-too-large", setup=_huge, closes=True, rank=1),
        Case("log-shrank:truncated", "refused", "log-shrank", setup=_shrunk, closes=True, rank=0),
    ]
    for name in ["cpu-00.log", "cpu-01.log", "cpu-\u0660.log", "cpu-\u0661.log", "cpu-+1.log", "cpu--1.log",
                 "cpu-1.log.bak", "cpu-3.log", "cpu-99999999999999999999.log", "cpu-0.log~", "cpu-1.LOG",
                 "cpu-0.log ", "cpu- 0.log", "cpu-0.log\n", "cpu-\x1b[31m.log", "cpu-\uff10.log", "cpu-.log"]:
        files.append(Case(f"unexpected-log-name:{name!r}", "refused", "unexpected-log-name", setup=_stray(name),
                          rank=None))
    return cases + files


CORPUS = corpus()


def settle(tog: Toggler, polls: int = 200) -> list[dict[str, Any]]:
    """Poll until every log is read to its end (or cannot be read); the decisions written."""
    records: list[dict[str, Any]] = []
    for _ in range(polls):
        records += tog.poll_once()
        done = True
        for lg in tog._logs:
            p = tog.log_dir / lg.name
            readable = lg.closed is None and lg.file_refusal is None and p.is_file() and not p.is_symlink()
            if readable and lg.offset < p.stat().st_size:
                done = False
        if done:
            return records + tog.poll_once()
    raise AssertionError("the toggler did not get through the logs")


def make(tmp_path: Path) -> tuple[Toggler, CountingBackend, Path, Path]:
    root = fake_v2(tmp_path / "cgroup")
    backend = CountingBackend("fuzz", list(TARGETS), root=root)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return Toggler(logs, backend, PLAN, host=HOST, host_memory=HOST_MEMORY), backend, root, logs


def test_the_corpus_is_large_and_its_ids_unique() -> None:
    assert len(CORPUS) >= 150
    assert len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[ascii(c.id)[1:-1][:60] for c in CORPUS])
def test_hostile_input_is_refused_with_its_reason(tmp_path: Path, case: Case) -> None:
    tog, backend, root, logs = make(tmp_path)
    append_line(request_log(logs, 0), good(0))  # a history: rank 0 runs HL2 at seq 0
    assert [r["status"] for r in settle(tog)] == ["applied"]
    assert kernel(root, "worker1") == KERNEL[("worker1", "HL2")]
    before, applies = snapshot(root), backend.applies

    if case.data is not None:
        with open(request_log(logs, 0), "ab") as f:
            f.write(case.data)
    else:
        assert case.setup is not None
        case.setup(logs)
    records = settle(tog)
    assert [(r["status"], r["reason"]) for r in records] == [(case.status, case.reason)], records
    (rec,) = records
    assert rec["effective"] is None and rec["requested"] is None
    assert len(json.dumps(rec)) < 10 * MAX_ECHO_CHARS  # nothing unbounded copied into the audit
    assert snapshot(root) == before and backend.applies == applies  # no cgroup file touched

    # Alive, and the worker's next good request applies: in the same log, or where that log cannot be
    # read any more, in the other rank's; a hostile file once removed, rank 1's log works again.
    if case.cleanup is not None:
        case.cleanup(logs)
    if case.rank == 1 and case.cleanup is not None or case.rank == 0 and case.closes:
        append_line(request_log(logs, 1), good(0, "HL4", rank=1))
        assert [r["status"] for r in settle(tog)] == ["applied"]
        assert kernel(root, "worker2") == KERNEL[("worker2", "HL4")]
    if not (case.rank == 0 and case.closes):
        append_line(request_log(logs, 0), good(1, "HL4"))  # closes an unterminated line first, as the worker does
        assert [r["status"] for r in settle(tog)] == ["applied"]
        assert kernel(root, "worker1") == KERNEL[("worker1", "HL4")]

    # A restarted toggler re-reads nothing: at most it says again that a log cannot be read.
    after = snapshot(root)
    tog2, backend2, _, _ = make_again(tmp_path, root, logs)
    again = settle(tog2)
    assert all(r["status"] == "refused" and r["offset_end"] is None for r in again), again
    assert backend2.applies == 0 and snapshot(root) == after


def make_again(tmp_path: Path, root: Path, logs: Path) -> tuple[Toggler, CountingBackend, Path, Path]:
    backend = CountingBackend("fuzz", list(TARGETS), root=root)
    return Toggler(logs, backend, PLAN, host=HOST, host_memory=HOST_MEMORY), backend, root, logs


def test_one_toggler_through_the_whole_corpus(tmp_path: Path) -> None:
    """Every line of the corpus into one log, each followed by the worker's next good request."""
    tog, backend, root, logs = make(tmp_path)
    log = request_log(logs, 0)
    append_line(log, good(0))
    settle(tog)
    seq, level = 0, "HL2"
    line_cases = [c for c in CORPUS if c.data is not None and c.reason not in ("seq-replayed", "seq-jump")]
    with mock.patch("os.fsync"):  # durability is tested elsewhere; thousands of fsyncs are not the point
        for case in line_cases:
            with open(log, "ab") as f:
                f.write(case.data)
            seq, level = seq + 1, "HL4" if level == "HL2" else "HL2"
            append_line(log, good(seq, level))
            records = settle(tog)
            assert [(r["status"], r["reason"]) for r in records] == [(case.status, case.reason), ("applied", None)], \
                case.id
            assert kernel(root, "worker1") == KERNEL[("worker1", level)]
    assert backend.applies == 1 + len(line_cases)
    applied = read_audit(logs)
    assert [r["seq"] for r in applied] == list(range(seq + 1))
    tog2, backend2, _, _ = make_again(tmp_path, root, logs)
    assert settle(tog2) == [] and backend2.applies == 0


def test_a_flood_of_bad_lines_closes_only_that_log(tmp_path: Path) -> None:
    tog, backend, root, logs = make(tmp_path)
    with mock.patch("os.fsync"):
        with open(request_log(logs, 0), "ab") as f:
            f.write(b"x\n" * (MAX_REFUSALS_PER_LOG + 500))
        append_line(request_log(logs, 0), good(0))
        append_line(request_log(logs, 1), good(0, "HL4", rank=1))
        records = settle(tog)
    refusals = [r for r in records if r["file"] == "cpu-0.log"]
    assert len(refusals) == MAX_REFUSALS_PER_LOG + 1 and refusals[-1]["reason"] == "too-many-refusals"
    assert [r["status"] for r in records if r["file"] == "cpu-1.log"] == ["applied"]
    assert not (root / "omnilearn/fuzz/worker1/cpu.max").exists() and backend.applies == 1
    # A restarted toggler keeps it closed, without auditing it again.
    tog2, _, _, _ = make_again(tmp_path, root, logs)
    assert settle(tog2) == []


# ---------------------------------------------------------------- properties (Hypothesis)

REASONS = {
    "line-too-long", "not-utf8", "nested", "not-json", "not-object", "unknown-key", "missing-key", "bad-type",
    "duplicate-key", "number-too-long", "non-canonical-int", "not-finite", "string-too-long", "bad-string",
    "cpuset-too-long", "cpuset-non-canonical", "cpuset-out-of-range",
    *(f"{k}-out-of-range" for k in ("seq", "rank", "cpus", "memory", "epoch", "time")),
}

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["HL2", "HL4", "0", "0-1", "1-3", "worker1", "worker2"]),
)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
request_keys = st.sampled_from(["seq", "rank", "target", "level", "cpuset", "cpus", "memory", "epoch", "time"])
request_like = st.dictionaries(st.one_of(request_keys, st.text(max_size=8)), json_values, max_size=10)


def _dump(d: Any) -> bytes:
    try:
        return json.dumps(d).encode("utf-8", "surrogatepass")
    except (ValueError, TypeError):
        return b"?"


def _near_valid(key: str, value: Any) -> bytes:
    """A good request with one field set to ``value``."""
    fields = json.loads(good(1))
    fields[key] = value
    return _dump(fields)


random_lines = st.one_of(
    st.binary(max_size=600),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
    request_like.map(_dump),
    json_values.map(_dump),
    st.builds(_near_valid, request_keys, json_scalars),
    st.builds(_near_valid, request_keys, json_values),
)


@settings(max_examples=15 * settings.default.max_examples, deadline=None)  # 1500 under make test
@given(raw=random_lines)
def test_parser_answers_every_line_within_its_bounds(raw: bytes) -> None:
    result = parse_request(raw, LIMITS)
    event(result.reason if isinstance(result, Refusal) else "request")
    if isinstance(result, Refusal):
        assert result.reason in REASONS, result
        assert result.detail.isascii() and result.detail.isprintable() and len(result.detail) < 1000
        return
    assert isinstance(result, CpuRequest)
    assert 0 <= result.seq <= MAX_SEQ and result.level.isprintable() and 0 < len(result.level) <= MAX_NAME_CHARS
    if result.cpuset is not None:
        assert format_cpuset(parse_cpuset(result.cpuset)) == result.cpuset
        assert set(parse_cpuset(result.cpuset)) <= set(HOST)
    assert result.cpus is None or 0 < result.cpus <= len(HOST)
    assert result.memory is None or 0 < result.memory <= HOST_MEMORY


# A request as a worker might write it: each field right, someone else's, or absent.
def _request(rank: int, seq: int, level: str, target_kind: str, rank_kind: str, alloc_kind: str) -> bytes:
    target = TARGETS[rank]
    fields: dict[str, Any] = {"seq": seq, "level": level}
    if rank_kind != "absent":
        fields["rank"] = rank if rank_kind == "own" else (rank + 1) % len(TARGETS)
    if target_kind != "absent":
        fields["target"] = target if target_kind == "own" else TARGETS[(rank + 1) % len(TARGETS)]
    if alloc_kind != "absent" and level in PLAN.levels:
        owner = target if alloc_kind == "own" else TARGETS[(rank + 1) % len(TARGETS)]
        fields.update(PLAN.allocation(level, owner).to_dict())
    return json.dumps(fields).encode()


actions = st.lists(st.one_of(
    st.tuples(st.just("request"), st.integers(0, 2), st.integers(-2, MAX_SEQ_STEP + 3),
              st.sampled_from(["HL1", "HL2", "HL4", "HL99"]), st.sampled_from(["own", "own", "other", "absent"]),
              st.sampled_from(["own", "own", "other", "absent"]), st.sampled_from(["own", "own", "other", "absent"])),
    st.tuples(st.just("junk"), st.integers(0, 2), random_lines),
), max_size=12)


@settings(max_examples=3 * settings.default.max_examples, deadline=None,  # 300 under make test
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions)
def test_toggler_applies_only_what_the_plan_allows(steps: list[tuple]) -> None:
    """Random lines in random ranks' logs: every line gets one decision, a request is applied exactly
    when the model says so, and the kernel only ever holds the plan's allocations for each target."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch("os.fsync"):
        tog, backend, root, logs = make(Path(tmp))
        last = [-1] * len(TARGETS)
        applied_in_force = {t: Allocation() for t in TARGETS}
        for step in steps:
            if step[0] == "junk":
                _, rank, raw = step
                data = raw.replace(b"\n", b" ") + b"\n"
                expect_applied = None  # junk may happen to be a request; the model below checks it
            else:
                _, rank, delta, level, target_kind, rank_kind, alloc_kind = step
                seq = max(0, last[rank] + delta)
                data = _request(rank, seq, level, target_kind, rank_kind, alloc_kind) + b"\n"
                other_alloc = (alloc_kind == "other" and level in PLAN.levels
                               and PLAN.allocation(level, TARGETS[rank])
                               != PLAN.allocation(level, TARGETS[(rank + 1) % len(TARGETS)]))
                expect_applied = (target_kind != "other" and rank_kind != "other" and level in PLAN.levels
                                  and not other_alloc and last[rank] < seq <= last[rank] + MAX_SEQ_STEP)
            with open(request_log(logs, rank), "ab") as f:
                f.write(data)
            records = settle(tog)
            blank = not data.strip()
            assert len(records) == (0 if blank else 1), records
            if blank:
                continue
            (rec,) = records
            event(f"{step[0]}: {rec['status']}")
            assert rec["file"] == f"cpu-{rank}.log" and rec["target"] == TARGETS[rank]
            if expect_applied is not None:
                assert (rec["status"] == "applied") == expect_applied, (step, rec)
            if rec["status"] == "applied":
                assert rec["requested"] == PLAN.allocation(rec["level"], TARGETS[rank]).to_dict()
                assert rec["seq"] > last[rank]
                last[rank] = rec["seq"]
                applied_in_force[TARGETS[rank]] = PLAN.allocation(rec["level"], TARGETS[rank])
            else:
                assert rec["effective"] is None
            for t in TARGETS:  # the kernel holds exactly what was applied last, a plan allocation
                files = root / "omnilearn" / "fuzz" / t
                a = applied_in_force[t]
                if (files / "cpu.max").exists():
                    quota, period = ("max", PERIOD_US) if a.cpus is None else cfs_limits(a.cpus)
                    assert (files / "cpu.max").read_text() == f"{quota} {period}"
                    assert (files / "cpuset.cpus").read_text() == (a.cpuset or "")
                    assert (files / "memory.max").read_text() == ("max" if a.memory is None else str(a.memory))
        tog.close()
