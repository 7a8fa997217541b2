"""The CPU-request protocol: workers append requests, the host's toggler applies them.

One file per rank, ``cpu-<rank>.log``, in a log directory the workers and the toggler share (a bind
mount for containers). A worker only ever appends one JSON object per line; the toggler reads
complete lines only and answers each decision with a line in ``toggler-audit.jsonl``. Both files
only grow, so a crash of either side leaves nothing half-applied that a restart cannot recover.
This module is the protocol itself (its limits, the request, its parser); the worker's side is
:mod:`.client`, the toggler's :mod:`.toggler`, and its audit :mod:`.audit`.

Workers run user code, so a line is untrusted input. :func:`parse_request` is the one parser of it:
every limit below is checked before the value it bounds is looked at (the length on the raw bytes
before decoding, the depth before JSON decoding, an integer's digits before converting it, a
cpuset's text before expanding a range), and it answers a :class:`Refusal` with a reason code
instead of raising. The README's "Request protocol limits" lists these limits.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilearn.bounded_json import json_depth
from omnilearn.emulator.spec.levels import Allocation, format_cpuset, parse_cpuset

# ---------------------------------------------------------------- limits of the protocol

MAX_LINE_BYTES = 4096  # one request line, its newline excluded; longer lines are refused unread
MAX_JSON_DEPTH = 1  # a request is one flat JSON object: no value is an object or an array
MAX_NAME_CHARS = 128  # a level or target name
MAX_INT_DIGITS = 40  # an integer's text; longer ones are refused before conversion
MAX_FLOAT_CHARS = 40  # a number's text with a fraction or an exponent
MAX_SEQ = 2**53 - 1  # the largest seq (exact in every JSON reader)
MAX_SEQ_STEP = 16  # a seq may skip at most MAX_SEQ_STEP - 1 values past the last one taken
MAX_RANK = 2**16 - 1
MAX_CPUSET_CHARS = 2048  # a cpuset's text, checked before any range is expanded
MAX_CPU_DIGITS = 5  # one CPU number in a cpuset (the kernel's NR_CPUS is at most 8192)
MAX_STAMP = 1e12  # epoch and time: finite, in [0, MAX_STAMP]
MAX_ECHO_CHARS = 200  # of an untrusted value quoted in the audit, a warning or the console

# Reading the logs (the toggler's side).
MAX_READ_BYTES = 64 * 2**10  # read from one log per poll
MAX_LINES_PER_POLL = 64  # non-blank lines handled from one log per poll (each is an fsync'ed record)
MAX_LOG_BYTES = 16 * 2**20  # a log past this size is refused as a whole and no longer read
MAX_REFUSALS_PER_LOG = 1000  # refused lines after which a log is no longer read
MAX_DIR_ENTRIES = 4096  # directory entries looked at per poll for stray request logs
MAX_STRAY_REPORTS = 64  # stray names audited per toggler
MAX_AUDIT_LINE_BYTES = 64 * 2**10  # an audit line longer than this is skipped when the audit is read
MAX_AUDIT_DEPTH = 2  # audit records hold the allocations as objects

AUDIT_NAME = "toggler-audit.jsonl"

# Every key a request line may carry and the JSON types it may have; only seq and level are required.
# The toggler takes the target from the file (its rank's), and the allocation from the job's plan:
# rank, target, cpuset, cpus and memory, where present, must equal those (older writers, and the
# design notes' example, leave memory out).
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
_REQUIRED = ("seq", "level")
ALLOCATION_KEYS = ("cpuset", "cpus", "memory")


def request_name(rank: int) -> str:
    """The name of rank ``rank``'s request log (the only name the toggler reads for that rank)."""
    return f"cpu-{rank}.log"


def request_log(log_dir: Path, rank: int) -> Path:
    """The file rank ``rank`` appends its requests to."""
    return Path(log_dir) / request_name(rank)


def audit_path(log_dir: Path) -> Path:
    """The toggler's audit file in ``log_dir`` (its decisions, and its persistent state)."""
    return Path(log_dir) / AUDIT_NAME


def echo(value: object) -> str:
    """An untrusted value as bounded, printable ASCII (control characters, escapes and lone
    surrogates escaped), for the audit, a warning or the console."""
    if isinstance(value, (str, bytes)):
        value = value[:MAX_ECHO_CHARS]
    text = ascii(value)
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


@dataclass(frozen=True)
class HostLimits:
    """What a request's numbers must fit in: the host's CPUs and memory."""

    cpus: tuple[int, ...]
    memory: int  # bytes

    def __post_init__(self) -> None:
        assert self.cpus and self.memory > 0, self

    @staticmethod
    def of(cpus: list[int] | tuple[int, ...] | None = None, memory: int | None = None) -> HostLimits:
        """This host's (the CPUs this process may use, its physical memory), or the ones given."""
        if cpus is None:
            cpus = sorted(os.sched_getaffinity(0))
        if memory is None:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return HostLimits(tuple(sorted(set(cpus))), memory)


@dataclass(frozen=True)
class CpuRequest:
    """One worker's request to run with the allocation of ``level`` from now on.

    A parsed request remembers which of rank, target, cpuset, cpus and memory its line carried
    (``claims``): the toggler compares those with the file's rank and the plan's allocation.
    """

    seq: int
    rank: int | None
    target: str | None
    level: str
    cpuset: str | None
    cpus: float | None
    memory: int | None
    epoch: float | None
    time: float | None
    claims: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def allocation(self) -> Allocation:
        return Allocation(cpuset=self.cpuset, cpus=self.cpus, memory=self.memory)

    def to_line(self) -> str:
        """The request as one JSON line, as the worker appends it."""
        fields = {k: getattr(self, k) for k in _FIELDS}
        return json.dumps(fields, allow_nan=False) + "\n"


@dataclass(frozen=True)
class Refusal:
    """Why a line is not a request: ``reason`` a short code, ``detail`` bounded, printable text."""

    reason: str
    detail: str


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


# ---------------------------------------------------------------- the parser


def parse_request(line: bytes | str, host: HostLimits) -> CpuRequest | Refusal:
    """One request line (without its newline) -> the request, or a refusal saying why.

    Checks the syntax and the host's bounds; never raises on bad input and never recurses on its
    depth. Whether the request may be applied (its rank's target, the job's plan, its seq) is the
    toggler's decision.
    """
    try:
        return _parse(line, host)
    except _Refused as r:
        return Refusal(r.reason, r.detail)


def _parse(line: bytes | str, host: HostLimits) -> CpuRequest:
    if isinstance(line, str):
        try:
            line = line.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _Refused("not-utf8", f"character {e.start} cannot be encoded") from None
    if len(line) > MAX_LINE_BYTES:
        raise _Refused("line-too-long", f"{len(line)} bytes, more than {MAX_LINE_BYTES}")
    try:
        text = line.decode("utf-8")  # strict: overlong forms and encoded surrogates are errors
    except UnicodeDecodeError as e:
        raise _Refused("not-utf8", f"invalid UTF-8 at byte {e.start}") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise _Refused("nested", f"an object or array inside the request (at most depth {MAX_JSON_DEPTH})")
    try:
        raw = _DECODER.decode(text)
    except ValueError as e:  # JSONDecodeError, and anything else json raises on text
        raise _Refused("not-json", echo(str(e))) from None
    if not isinstance(raw, dict):
        raise _Refused("not-object", f"expected a JSON object, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in _FIELDS]
    if unknown:
        raise _Refused("unknown-key", f"unknown key {echo(unknown[0])}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise _Refused("missing-key", f"missing key(s): {', '.join(missing)}")
    for key, types in _FIELDS.items():
        if key in raw and type(raw[key]) not in types:  # type(), not isinstance: a bool is no int
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            raise _Refused("bad-type", f"{key}: expected {names}, got {echo(raw[key])}")

    seq = raw["seq"]
    _check_range("seq", seq, 0, MAX_SEQ)
    rank = raw.get("rank")
    if rank is not None:
        _check_range("rank", rank, 0, MAX_RANK)
    target = raw.get("target")
    if target is not None:
        _check_name("target", target)
    level = raw["level"]
    _check_name("level", level)
    cpuset = raw.get("cpuset")
    if cpuset is not None:
        _check_cpuset(cpuset, host)
    cpus = raw.get("cpus")
    if cpus is not None:
        cpus = float(cpus)
        if not 0 < cpus <= len(host.cpus):
            raise _Refused("cpus-out-of-range", f"cpus {cpus!r} is outside (0, {len(host.cpus)}]")
    memory = raw.get("memory")
    if memory is not None:
        _check_range("memory", memory, 1, host.memory)
    epoch, stamp = raw.get("epoch"), raw.get("time")
    for key, value in (("epoch", epoch), ("time", stamp)):
        if value is not None:
            _check_range(key, value, 0, MAX_STAMP)
    return CpuRequest(
        seq=seq, rank=rank, target=target, level=level, cpuset=cpuset, cpus=cpus, memory=memory,
        epoch=float(epoch) if epoch is not None else None, time=float(stamp) if stamp is not None else None,
        claims=frozenset(k for k in ("rank", "target", *ALLOCATION_KEYS) if k in raw),
    )


def _check_range(key: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise _Refused(f"{key}-out-of-range", f"{key} {echo(value)} is outside [{lo:g}, {hi:g}]")


def _check_name(key: str, value: str) -> None:
    if not value:
        raise _Refused("bad-string", f"{key}: empty")
    if len(value) > MAX_NAME_CHARS:
        raise _Refused("string-too-long", f"{key}: {len(value)} characters, more than {MAX_NAME_CHARS}")
    # Not printable: control characters (terminal escapes), lone surrogates, other separators.
    if not value.isprintable():
        raise _Refused("bad-string", f"{key}: unprintable characters in {echo(value)}")


def _check_cpuset(text: str, host: HostLimits) -> None:
    """A cpuset in the kernel's canonical form (``format_cpuset``) naming only CPUs of the host.

    ASCII digits only, no leading zeros, ranges going up, parts ascending and not touching, so
    that every range is bounded by the host's highest CPU before it is expanded.
    """
    if len(text) > MAX_CPUSET_CHARS:
        raise _Refused("cpuset-too-long", f"cpuset: {len(text)} characters, more than {MAX_CPUSET_CHARS}")
    allowed = set(host.cpus)
    top = host.cpus[-1]
    previous = -2
    for part in text.split(","):
        lo_s, dash, hi_s = part.partition("-")
        numbers = (lo_s, hi_s) if dash else (lo_s,)
        for s in numbers:
            if not (s.isascii() and s.isdigit()) or (len(s) > 1 and s[0] == "0"):
                raise _Refused("cpuset-non-canonical", f"cpuset {echo(text)}: {echo(part)} is not N or N-M "
                                                       f"(ASCII digits, no leading zeros, no spaces)")
            if len(s) > MAX_CPU_DIGITS:
                raise _Refused("cpuset-out-of-range", f"cpuset {echo(text)}: CPU {echo(s)} is not on this host")
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if dash and hi <= lo:
            raise _Refused("cpuset-non-canonical", f"cpuset {echo(text)}: range {echo(part)} does not go up")
        if lo <= previous + 1:
            raise _Refused("cpuset-non-canonical", f"cpuset {echo(text)}: {echo(part)} is not after the "
                                                   f"previous part with a gap (canonical: "
                                                   f"{echo(_canonical_or_none(text))})")
        if hi > top:
            raise _Refused("cpuset-out-of-range", f"cpuset {echo(text)}: CPU {hi} is not on this host "
                                                  f"(highest {top})")
        # lo..hi lies within 0..top and after every earlier part: all expansions together <= top + 1.
        absent = [c for c in range(lo, hi + 1) if c not in allowed]
        if absent:
            raise _Refused("cpuset-out-of-range", f"cpuset {echo(text)}: CPU {absent[0]} is not on this host "
                                                  f"({format_cpuset(allowed)})")
        previous = hi


def _canonical_or_none(text: str) -> str | None:
    try:
        return format_cpuset(parse_cpuset(text)) if len(text) <= 64 else None
    except ValueError:
        return None


def canonical_cpuset(text: str | None) -> str | None:
    """A cpuset in canonical form (``"1,0-0,2"`` -> ``"0-2"``); for trusted text (the plan's)."""
    return None if text is None else format_cpuset(parse_cpuset(text))


def _int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise _Refused("number-too-long", f"an integer of {len(text)} characters (at most {MAX_INT_DIGITS})")
    if text == "-0" or not text.isascii():
        raise _Refused("non-canonical-int", f"integer {echo(text)}")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise _Refused("number-too-long", f"a number of {len(text)} characters (at most {MAX_FLOAT_CHARS})")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused("not-finite", f"number {echo(text)} is not finite")
    return value


def _constant(text: str) -> Any:
    raise _Refused("not-finite", f"{text} is not a number a request may hold")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused("duplicate-key", f"key {echo(key)} appears twice")
        out[key] = value
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int, parse_float=_float,
                            parse_constant=_constant, strict=True)
