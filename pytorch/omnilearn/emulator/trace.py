"""Trace-driven interference: per-worker CPU shares, links and stalls that change over a run.

A trace is a CSV (with a header) or JSONL file of rows, in time order::

    t,worker,share,stall
    0,1,1.0,
    10,2,0.25,
    12,3,,2s

- ``t`` (seconds since training began) or ``step`` (training steps): exactly one of the two;
- ``worker``: the worker's number, 1..N (BSP's worker1..N; ASP's aspworker2..N+1);
- the CPU part: ``cpus`` (a quota in CPUs), ``share`` (a fraction in (0, 1] of the worker's full
  allocation, resolved by the plan: what cluster traces give), and/or ``cpuset`` (canonical, as the
  kernel prints it: ``0-3,8``); ``cpus`` and ``share`` exclude each other;
- the link: ``rate``, ``delay``, ``jitter``, ``loss`` as in ``emulation.links`` (``100mbit``,
  ``10ms``, ``0.5%``); ``rate`` may be ``none``: unshaped from then on;
- ``stall``: a pause of that duration (``2s``) starting at that time, as chaos tools inject.

A row changes what it names and nothing else: its CPU part replaces the worker's CPU part, its link
fields replace the worker's whole link, a stall is an event. Before its first row a worker has its
full allocation and no link. The trace lasts until its last row's time (write a last row that
restates a state to give the trace a tail).

:func:`parse_trace` is the one parser: limits are the constants below, and it returns a
:class:`Trace` or a :class:`Refusal` (line and reason), never raising on bad input.
:func:`load_trace` reads a file within those limits and turns a refusal into a UserError
``file:line: reason``. :func:`convert_trace` turns a public cluster trace into this format.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omnilearn.emulator.levels import Allocation, format_cpuset
from omnilearn.emulator.links import Link, parse_duration, parse_link, shown
from omnilearn.errors import UserError

MAX_TRACE_BYTES = 8 * 2**20  # a trace file larger than this is refused unread
MAX_ROWS = 100_000
MAX_LINE_CHARS = 1024
MAX_WORKERS = 1024
MAX_TIME_S = 30 * 86_400.0  # a month of training
MAX_STEP = 10**9
MAX_CPUS = 1024.0
MAX_CPU_ID = 4095
MAX_STALL_S = 3600.0
MAX_JSON_DEPTH = 1  # a row is one flat object: no value nests

# Public cluster traces (convert_trace): streamed, so only what is kept is bounded.
FORMATS = ("alibaba2018", "google2011")
MAX_SOURCE_LINE_CHARS = 4096
MAX_SOURCE_SAMPLES = 5_000_000  # samples kept over all selected machines
MAX_MACHINE_ID_CHARS = 64
MIN_SHARE = 0.05  # a fully used machine still leaves the job this much (a CPU quota must be > 0)
DEFAULT_POINTS = 20  # output windows over the run

UNITS = ("seconds", "step")
TIME_COLUMNS = {"t": "seconds", "step": "step"}
CPU_COLUMNS = ("cpus", "share", "cpuset")
LINK_COLUMNS = ("rate", "delay", "jitter", "loss")
COLUMNS = ("t", "step", "worker", *CPU_COLUMNS, *LINK_COLUMNS, "stall")
_CPUSET = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")
_MACHINE_ID = re.compile(rf"[\w.:-]{{1,{MAX_MACHINE_ID_CHARS}}}", re.ASCII)
_UNSET = object()  # a link cell left empty: the worker's link does not change


@dataclass(frozen=True)
class WorkerState:
    """What a trace gives one worker at one moment. All None: its full allocation, unshaped."""

    cpus: float | None = None
    share: float | None = None
    cpuset: str | None = None
    link: Link | None = None

    def allocation(self, full: Allocation) -> Allocation:
        """This state as an allocation, given the worker's ``full`` one (what ``share`` is a fraction of;
        a share of an unlimited allocation is unlimited, so give ``full`` a quota or a cpuset)."""
        if self.cpus is None and self.share is None and self.cpuset is None:
            return full
        cpus = self.cpus
        if self.share is not None:
            base = full.share
            cpus = None if base is None else round(self.share * base, 4)
        return Allocation(cpuset=self.cpuset, cpus=cpus, memory=full.memory)


FULL = WorkerState()


@dataclass(frozen=True)
class Stall:
    """Worker ``worker`` pauses for ``duration`` seconds from ``at`` (in the trace's unit) on."""

    at: float
    worker: int
    duration: float


@dataclass(frozen=True)
class TraceEvent:
    """One row: what it changes (``cpu``: (cpus, share, cpuset); ``link``: a Link, None for unshaped,
    or unchanged when ``sets_link`` is False) and an optional stall."""

    at: float
    worker: int
    cpu: tuple[float | None, float | None, str | None] | None = None
    sets_link: bool = False
    link: Link | None = None
    stall: float | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a trace was refused: ``line`` (1-based; None for the whole file) and the reason."""

    line: int | None
    reason: str

    def message(self, name: str) -> str:
        return f"{name}:{self.line}: {self.reason}" if self.line is not None else f"{name}: {self.reason}"


@dataclass(frozen=True)
class Trace:
    """Per-worker states over time (``unit``: seconds or step), for ``workers`` workers, until ``span``."""

    unit: str
    workers: int
    events: tuple[TraceEvent, ...]
    span: float
    source: str = "<trace>"

    def __post_init__(self) -> None:
        assert self.unit in UNITS, self.unit
        assert all(a.at <= b.at for a, b in zip(self.events, self.events[1:], strict=False)), "unsorted"
        assert all(1 <= e.worker <= self.workers for e in self.events), "a worker beyond the trace's count"
        timelines: dict[int, tuple[list[float], list[WorkerState]]] = {}
        state = {w: FULL for w in range(1, self.workers + 1)}
        for e in self.events:
            s = state[e.worker]
            if e.cpu is not None:
                s = replace(s, cpus=e.cpu[0], share=e.cpu[1], cpuset=e.cpu[2])
            if e.sets_link:
                s = replace(s, link=e.link)
            state[e.worker] = s
            times, states = timelines.setdefault(e.worker, ([], []))
            if times and times[-1] == e.at:
                states[-1] = s  # two rows at one time: the later one wins
            else:
                times.append(e.at)
                states.append(s)
        object.__setattr__(self, "_timelines", timelines)

    def at(self, position: float) -> dict[int, WorkerState]:
        """Every worker's state at ``position`` (seconds or steps, as the trace's unit)."""
        result = {}
        for w in range(1, self.workers + 1):
            times, states = self._timelines.get(w, ((), ()))  # type: ignore[attr-defined]
            i = bisect.bisect_right(times, position) - 1
            result[w] = states[i] if i >= 0 else FULL
        return result

    def changes(self) -> list[float]:
        """The positions at which some worker's CPU part or link changes."""
        return sorted({e.at for e in self.events if e.cpu is not None or e.sets_link})

    def segments(self) -> list[tuple[float, dict[int, WorkerState]]]:
        """``(start, states)`` for each stretch where nothing changes, from 0 on: what a schedule
        turns into levels (one level per distinct ``states``)."""
        starts = sorted({0.0, *self.changes()})
        return [(s, self.at(s)) for s in starts]

    def stalls(self, worker: int | None = None) -> list[Stall]:
        return [Stall(e.at, e.worker, e.stall) for e in self.events
                if e.stall is not None and (worker is None or e.worker == worker)]

    def stalls_between(self, start: float, end: float, worker: int | None = None) -> list[Stall]:
        """Stalls that begin in ``[start, end)``: what a worker checks between two steps."""
        return [s for s in self.stalls(worker) if start <= s.at < end]

    def resample(self, length: float, unit: str | None = None) -> Trace:
        """The same trace stretched or squeezed so that ``span`` becomes ``length`` (in ``unit``, by default
        the trace's own; a step trace's positions are rounded to whole steps, later rows winning).

        Stall durations are seconds: they scale with the time axis when both units are seconds, so that
        a stall keeps its share of the run, and are kept as they are otherwise.
        """
        unit = unit or self.unit
        assert unit in UNITS and length > 0, (unit, length)
        scale = length / self.span if self.span > 0 else 1.0
        scale_stalls = unit == self.unit == "seconds"
        events = []
        for e in self.events:
            at = e.at * scale
            at = float(round(at)) if unit == "step" else at
            stall = e.stall * scale if (e.stall is not None and scale_stalls) else e.stall
            events.append(replace(e, at=at, stall=stall))
        return Trace(unit=unit, workers=self.workers, events=tuple(events), span=float(length),
                     source=f"{self.source} (resampled to {length:g} {unit})")

    def to_csv(self) -> str:
        """The trace as CSV text that :func:`parse_trace` reads back to an equal trace."""
        used = {"stall"} if any(e.stall is not None for e in self.events) else set()
        for e in self.events:
            if e.cpu is not None:
                used.update(c for c, v in zip(CPU_COLUMNS, e.cpu, strict=True) if v is not None)
            if e.sets_link:
                used.update(e.link.to_dict() if e.link is not None else {"rate"})
        columns = [_time_column(self.unit), "worker", *(c for c in COLUMNS if c in used)]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for e in self.events:
            row: dict[str, Any] = {"worker": e.worker, columns[0]: _num(e.at)}
            if e.cpu is not None:
                row.update(cpus=_num(e.cpu[0]), share=_num(e.cpu[1]), cpuset=e.cpu[2])
            if e.sets_link:
                row.update(e.link.to_dict() if e.link is not None else {"rate": "none"})
            if e.stall is not None:
                row["stall"] = f"{_num(e.stall)}s"
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
        return out.getvalue()


def _time_column(unit: str) -> str:
    return next(c for c, u in TIME_COLUMNS.items() if u == unit)


def _num(x: float | None) -> str | None:
    """A number as the parser reads it back: exactly (repr), but never in exponent notation."""
    if x is None:
        return None
    if float(x).is_integer():
        return str(int(x))
    text = repr(float(x))
    return text if "e" not in text else f"{x:.9f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------- the parser


def parse_trace(data: bytes, name: str = "<trace>", fmt: str | None = None,
                workers: int | None = None) -> Trace | Refusal:
    """Parse a trace (CSV or JSONL: ``fmt``, else guessed from ``name``'s suffix, else from the first
    row); ``workers``, when given, is the job's worker count (a row naming another worker is refused).

    Returns the trace or a Refusal naming the line and the reason; never raises on bad input.
    """
    if len(data) > MAX_TRACE_BYTES:
        return Refusal(None, f"{len(data)} bytes: larger than the {MAX_TRACE_BYTES}-byte limit for a trace")
    if b"\x00" in data:
        return Refusal(None, "binary data (NUL bytes): not a CSV or JSONL trace")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        return Refusal(line, f"not UTF-8 text (byte {e.start}): not a CSV or JSONL trace")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        return Refusal(None, f"workers must be in 1..{MAX_WORKERS}, not {workers}")
    lines = [(n, raw.strip()) for n, raw in enumerate(text.split("\n"), start=1)]
    lines = [(n, s) for n, s in lines if s and not s.startswith("#")]
    if not lines:
        return Refusal(None, "empty trace: no header and no rows")
    for n, s in lines:
        if len(s) > MAX_LINE_CHARS:
            return Refusal(n, f"line longer than {MAX_LINE_CHARS} characters")
    if fmt is None:
        suffix = os.path.splitext(name)[1].lower()
        fmt = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(suffix)
        fmt = fmt or ("jsonl" if lines[0][1].startswith("{") else "csv")
    if fmt not in ("csv", "jsonl"):
        return Refusal(None, f"unknown trace format {fmt!r} (csv or jsonl)")
    rows = _csv_rows(lines) if fmt == "csv" else _jsonl_rows(lines)
    if isinstance(rows, Refusal):
        return rows
    if not rows:
        return Refusal(None, "no rows")
    if len(rows) > MAX_ROWS:
        return Refusal(rows[MAX_ROWS][0], f"more than {MAX_ROWS} rows")
    unit: str | None = None
    events: list[TraceEvent] = []
    seen: dict[tuple[int, float], int] = {}
    for n, row in rows:
        event = _event(row, workers)
        if isinstance(event, str):
            return Refusal(n, event)
        event, row_unit = event
        if unit is None:
            unit = row_unit
        elif row_unit != unit:
            return Refusal(n, f"uses {_time_column(row_unit)} where earlier rows use {_time_column(unit)}")
        if events and event.at < events[-1].at:
            return Refusal(n, f"{_time_column(unit)} {_num(event.at)} comes after {_num(events[-1].at)}: "
                              f"rows must be in time order")
        key = (event.worker, event.at)
        if key in seen:
            return Refusal(n, f"worker {event.worker} already has a row at {_time_column(unit)} {_num(event.at)} "
                              f"(line {seen[key]}); put both in one row")
        seen[key] = n
        events.append(event)
    assert unit is not None
    count = workers if workers is not None else max(e.worker for e in events)
    return Trace(unit=unit, workers=count, events=tuple(events), span=events[-1].at, source=name)


def _csv_rows(lines: list[tuple[int, str]]) -> list[tuple[int, dict[str, Any]]] | Refusal:
    def cells(n: int, s: str) -> list[str] | Refusal:
        try:
            parsed = list(csv.reader([s], strict=True))
        except csv.Error as e:
            return Refusal(n, f"not valid CSV: {e}")
        return [c.strip() for c in parsed[0]] if parsed else []

    n0, first = lines[0]
    header = cells(n0, first)
    if isinstance(header, Refusal):
        return header
    if all(_NUMBER.fullmatch(c) for c in header):
        return Refusal(n0, f"the first row must be a header naming the columns ({', '.join(COLUMNS)})")
    problem = _check_columns(header)
    if problem:
        return Refusal(n0, problem)
    rows = []
    for n, s in lines[1:]:
        if len(rows) > MAX_ROWS:
            break
        values = cells(n, s)
        if isinstance(values, Refusal):
            return values
        if len(values) != len(header):
            return Refusal(n, f"has {len(values)} fields, the header {len(header)} ({','.join(header)})")
        rows.append((n, {k: (v if v != "" else None) for k, v in zip(header, values, strict=True)}))
    return rows


def _check_columns(columns: list[str]) -> str | None:
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        return f"unknown column(s) {', '.join(repr(c) for c in unknown)} (known: {', '.join(COLUMNS)})"
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        return f"column(s) {', '.join(duplicated)} appear twice"
    times = [c for c in columns if c in TIME_COLUMNS]
    if len(times) != 1:
        return "needs exactly one time column: t (seconds) or step"
    if "worker" not in columns:
        return "missing column 'worker'"
    if not set(columns) & {*CPU_COLUMNS, *LINK_COLUMNS, "stall"}:
        return f"sets nothing: needs one of {', '.join((*CPU_COLUMNS, *LINK_COLUMNS, 'stall'))}"
    return None


def _jsonl_rows(lines: list[tuple[int, str]]) -> list[tuple[int, dict[str, Any]]] | Refusal:
    rows = []
    for n, s in lines:
        if len(rows) > MAX_ROWS:
            break
        if _json_depth(s) > MAX_JSON_DEPTH:
            return Refusal(n, "a row must be one flat JSON object (no nested values)")
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            return Refusal(n, f"not JSON: {e.msg} at column {e.colno}")
        if not isinstance(obj, dict):
            return Refusal(n, f"expected a JSON object, got {type(obj).__name__}")
        problem = _check_columns(list(obj))
        if problem:
            return Refusal(n, problem)
        rows.append((n, obj))
    return rows


def _json_depth(s: str) -> int:
    """How deeply ``s`` nests brackets outside strings, counted without recursion (json.loads recurses)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in s:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _event(row: dict[str, Any], workers: int | None) -> tuple[TraceEvent, str] | str:
    """One row as an event, or the reason it is refused."""
    (time_key,) = [k for k in row if k in TIME_COLUMNS]
    unit = TIME_COLUMNS[time_key]
    limit = MAX_TIME_S if unit == "seconds" else MAX_STEP
    at = _number(row[time_key], time_key, 0, limit, integer=unit == "step")
    if isinstance(at, str):
        return at
    worker = _number(row.get("worker"), "worker", 1, MAX_WORKERS, integer=True)
    if isinstance(worker, str):
        return worker
    if workers is not None and worker > workers:
        return f"worker: unknown worker {int(worker)}: the job has {workers} (1..{workers})"
    cpus = share = cpuset = None
    if row.get("cpus") is not None:
        cpus = _number(row["cpus"], "cpus", 0, MAX_CPUS, open_low=True)
        if isinstance(cpus, str):
            return cpus
    if row.get("share") is not None:
        share = _number(row["share"], "share", 0, 1, open_low=True)
        if isinstance(share, str):
            return share
    if cpus is not None and share is not None:
        return "cpus and share exclude each other (share is a fraction of the worker's full allocation)"
    if row.get("cpuset") is not None:
        cpuset = _cpuset(row["cpuset"])
        if cpuset.startswith("cpuset:"):
            return cpuset
    link: Any = _UNSET
    given = {k: row[k] for k in LINK_COLUMNS if row.get(k) is not None}
    if given.get("rate") == "none":
        if len(given) > 1:
            return "rate: none (unshaped) leaves no room for delay, jitter or loss"
        link = None
    elif given:
        try:
            link = parse_link(given, "link")
        except UserError as e:
            return str(e).removeprefix("link.").removeprefix("link: ")
    stall = None
    if row.get("stall") is not None:
        try:
            stall = parse_duration(row["stall"], MAX_STALL_S)
        except ValueError as e:
            return f"stall: {e}"
        if stall <= 0:
            return "stall: must last longer than 0s"
    cpu = (cpus, share, cpuset) if (cpus, share, cpuset) != (None, None, None) else None
    if cpu is None and link is _UNSET and stall is None:
        return "sets nothing: give cpus, share, cpuset, a link field or stall"
    event = TraceEvent(at=float(at), worker=int(worker), cpu=cpu, sets_link=link is not _UNSET,
                       link=None if link is _UNSET else link, stall=stall)
    return event, unit


def _number(value: Any, key: str, low: float, high: float, integer: bool = False,
            open_low: bool = False) -> float | str:
    """A bounded number from a JSON number or a CSV cell, or the reason it is refused."""
    if value is None:
        return f"{key}: missing"
    if isinstance(value, str):
        if _NUMBER.fullmatch(value) is None:
            return f"{key}: expected a non-negative {'integer' if integer else 'number'}, got {shown(value)}"
        number = float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # a JSON integer of hundreds of digits
            number = math.inf
    else:
        return f"{key}: expected a number, got {shown(value)}"
    if not math.isfinite(number) or number < low or number > high or (open_low and number == low):
        interval = f"{'(' if open_low else '['}{_num(low)}, {_num(high)}]"
        text = _num(number) if math.isfinite(number) else value
        return f"{key}: {str(text)[:40]} is outside {interval}"
    if integer and not number.is_integer():
        return f"{key}: expected an integer, got {shown(value)}"
    return number


def _cpuset(value: Any) -> str:
    """A canonical, bounded cpuset, or the reason (prefixed ``cpuset:``) it is refused."""
    if not isinstance(value, str) or _CPUSET.fullmatch(value) is None:
        return f"cpuset: expected CPU numbers and ranges such as 0-3,8, got {shown(value)}"
    cpus: list[int] = []
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b > MAX_CPU_ID or a > b:
            return f"cpuset: range {part} is empty or beyond CPU {MAX_CPU_ID}"
        cpus.extend(range(a, b + 1))
    canonical = format_cpuset(cpus)
    if canonical != value:
        return f"cpuset: {shown(value)} is not canonical; write {shown(canonical)}"
    return value


def load_trace(path: str | Path, workers: int | None = None, fmt: str | None = None) -> Trace:
    """Read and parse a trace file; UserError ``file:line: reason`` when it is refused."""
    p = Path(path)
    try:
        if not p.is_file():
            raise UserError(f"trace {p}: not found, or not a regular file")
        size = p.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise UserError(f"{p}: {size} bytes: larger than the {MAX_TRACE_BYTES}-byte limit for a trace")
        with open(p, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)  # the file may have grown since stat
    except OSError as e:
        raise UserError(f"trace {p}: cannot read: {e.strerror}") from None
    result = parse_trace(data, str(p), fmt, workers)
    if isinstance(result, Refusal):
        raise UserError(result.message(str(p)))
    return result


# ---------------------------------------------------------------- public cluster traces

def convert_trace(
    src: str | Path,
    fmt: str,
    workers: int,
    length_s: float,
    out: str | Path | None = None,
    *,
    points: int = DEFAULT_POINTS,
    machines: list[str] | None = None,
    capacity: float = 1.0,
) -> Trace:
    """Turn a public cluster trace into a trace of ``workers`` workers over ``length_s`` seconds.

    The first ``workers`` machines of ``src`` that have CPU data (or ``machines``, in that order)
    become workers 1..N. The machines' common time range is cut into ``points`` equal windows, the
    run into as many; in each the worker's ``share`` of its full allocation is 1 - the machine's mean
    CPU utilisation there, to the hundredth and at least MIN_SHARE (a window without samples keeps
    the previous value). The result is written to ``out`` (CSV, with a comment saying how it was
    made) when given, and returned.

    Formats (both without a header, streamed line by line, so the full traces' size is no problem):

    - ``alibaba2018``: the Alibaba cluster-trace v2018 ``machine_usage.csv``: machine_id, time_stamp
      (s), cpu_util_percent, mem_util_percent, mem_gps, mkpi, net_in, net_out, disk_io_percent.
      Lines with an empty cpu_util_percent (gaps in the trace) are skipped.
    - ``google2011``: the Google cluster-data 2011 (clusterdata-2011-2) ``task_usage`` table: start
      time (µs), end time, job ID, task index, machine ID, mean CPU usage rate, … (19 or 20 fields;
      only the first six are read). A machine's utilisation over a measurement window is the sum of
      its tasks' mean CPU rates starting at that time (CPU rates are normalised to the largest
      machine), divided by ``capacity``: the machine's normalised CPU capacity from the
      ``machine_events`` table (1.0: the largest machine).
    """
    if fmt not in FORMATS:
        raise UserError(f"trace format {fmt!r}: known formats are {', '.join(FORMATS)}")
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"workers must be in 1..{MAX_WORKERS}, not {workers}")
    if not 0 < length_s <= MAX_TIME_S:
        raise UserError(f"length_s must be in (0, {MAX_TIME_S:g}], not {length_s}")
    if not 1 <= points <= MAX_ROWS // max(workers, 1) - 1:
        raise UserError(f"points must be in 1..{MAX_ROWS // workers - 1} for {workers} workers, not {points}")
    if not capacity > 0:
        raise UserError(f"capacity must be positive, not {capacity}")
    src = Path(src)
    series = _read_usage(src, fmt, workers, machines, capacity)
    chosen = list(series)
    t0 = min(series[m][0][0] for m in chosen)
    # The last sample covers one sampling period (the median gap between samples), not an instant.
    gaps = sorted(b[0] - a[0] for m in chosen for a, b in zip(series[m], series[m][1:], strict=False))
    t1 = max(series[m][-1][0] for m in chosen) + (gaps[len(gaps) // 2] if gaps else 1.0)
    window = (t1 - t0) / points
    events = []
    for w, machine in enumerate(chosen, start=1):
        shares = _window_means(series[machine], t0, window, points)
        previous = None
        for k, util in enumerate(shares):
            share = round(max(MIN_SHARE, 1.0 - util), 2)  # hundredths: no level change for noise
            if share != previous:
                events.append(TraceEvent(at=k * length_s / points, worker=w, cpu=(None, share, None)))
            previous = share
        # A last row restating the last share: the trace then lasts the whole run.
        events.append(TraceEvent(at=float(length_s), worker=w, cpu=(None, previous, None)))
    events.sort(key=lambda e: (e.at, e.worker))
    trace = Trace(unit="seconds", workers=workers, events=tuple(events), span=float(length_s),
                  source=f"{src} ({fmt})")
    if out is not None:
        names = chosen if len(chosen) <= 8 else [*chosen[:4], "...", chosen[-1]]
        header = (f"# Converted from the {fmt} trace {src.name!r} by\n"
                  f"# omnilearn.emulator.trace.convert_trace({str(src)!r}, {fmt!r}, {workers}, {length_s:g}, out, "
                  f"points={points}):\n"
                  f"# machines {', '.join(names)} -> workers 1..{workers}; share = 1 - CPU utilisation, the mean\n"
                  f"# over each of {points} equal windows ({window:g} s) of the source (at least {MIN_SHARE}),\n"
                  f"# stretched to a run of {length_s:g} s.\n")
        _write_atomic(Path(out), header + trace.to_csv())
        return load_trace(out, workers)
    return trace


def _read_usage(src: Path, fmt: str, workers: int, machines: list[str] | None,
                capacity: float) -> dict[str, list[tuple[float, float]]]:
    """machine -> [(time s, utilisation 0..1)], sorted, for the selected machines only."""
    wanted = list(machines) if machines is not None else None
    if wanted is not None and len(wanted) != workers:
        raise UserError(f"machines: {len(wanted)} named for {workers} workers")
    samples: dict[str, dict[float, float]] = {}
    kept = 0
    for n, fields in _source_lines(src):
        if fmt == "alibaba2018":
            if len(fields) != 9:
                raise UserError(f"{src}:{n}: has {len(fields)} fields; alibaba2018 machine_usage has 9 "
                                f"(machine_id, time_stamp, cpu_util_percent, ...)")
            machine, stamp, util_text = fields[0], fields[1], fields[2]
            if util_text == "":
                continue
            time_s = _source_number(stamp, src, n, "time_stamp")
            util = _source_number(util_text, src, n, "cpu_util_percent") / 100
            if util > 1:
                raise UserError(f"{src}:{n}: cpu_util_percent {util_text} is above 100")
        else:
            if len(fields) not in (19, 20):
                raise UserError(f"{src}:{n}: has {len(fields)} fields; google2011 task_usage has 19 or 20")
            machine, cpu_text = fields[4], fields[5]
            if machine == "" or cpu_text == "":
                continue
            time_s = _source_number(fields[0], src, n, "start time") / 1e6
            util = _source_number(cpu_text, src, n, "CPU rate") / capacity
        if _MACHINE_ID.fullmatch(machine) is None:
            raise UserError(f"{src}:{n}: machine id {machine[:80]!r} is not 1-{MAX_MACHINE_ID_CHARS} letters, "
                            f"digits or _.:-")
        if machine not in samples:
            if (wanted is not None and machine not in wanted) or (wanted is None and len(samples) == workers):
                continue
            samples[machine] = {}
        per_time = samples[machine]
        if fmt == "google2011":
            per_time[time_s] = per_time.get(time_s, 0.0) + util  # tasks on one machine add up
        else:
            per_time[time_s] = util
        kept += 1
        if kept > MAX_SOURCE_SAMPLES:
            raise UserError(f"{src}:{n}: more than {MAX_SOURCE_SAMPLES} samples for the selected machines; "
                            f"cut the source to the time range you need")
    order = wanted if wanted is not None else list(samples)
    missing = [m for m in order if m not in samples]
    if wanted is not None and missing:
        raise UserError(f"{src}: no CPU data for machine(s) {', '.join(missing)}")
    if len(samples) < workers:
        raise UserError(f"{src}: {len(samples)} machine(s) with CPU data, {workers} workers asked for")
    return {m: sorted((t, min(u, 1.0)) for t, u in samples[m].items()) for m in order}


def _source_lines(src: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        f = open(src, "rb")
    except OSError as e:
        raise UserError(f"trace source {src}: cannot read: {e.strerror}") from None
    with f:
        for n, raw in enumerate(f, start=1):
            if len(raw) > MAX_SOURCE_LINE_CHARS:
                raise UserError(f"{src}:{n}: line longer than {MAX_SOURCE_LINE_CHARS} bytes")
            if b"\x00" in raw:
                raise UserError(f"{src}:{n}: binary data (NUL bytes): not a CSV trace")
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise UserError(f"{src}:{n}: not UTF-8 text") from None
            if line:
                yield n, [c.strip() for c in line.split(",")]


def _source_number(text: str, src: Path, n: int, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{src}:{n}: {key} {text[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{src}:{n}: {key} {text[:40]!r} must be a finite number >= 0")
    return value


def _window_means(samples: list[tuple[float, float]], t0: float, window: float, points: int) -> list[float]:
    """The mean utilisation in each of ``points`` windows from ``t0`` (the last window includes its end);
    a window without samples holds the previous value (the first such holds the first sample)."""
    sums = [0.0] * points
    counts = [0] * points
    for t, u in samples:
        k = min(int((t - t0) // window), points - 1)
        sums[k] += u
        counts[k] += 1
    means: list[float] = []
    previous = samples[0][1]
    for s, c in zip(sums, counts, strict=True):
        previous = s / c if c else previous
        means.append(previous)
    return means


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
