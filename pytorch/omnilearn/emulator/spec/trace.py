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

This module holds the trace, its one parser and the trace as a schedule; :mod:`.trace_convert` turns
a public cluster trace into this format.

The parser is bounded and never raises on bad input: :func:`parse_trace` returns a :class:`Trace` or a
:class:`Refusal` (line and reason); :func:`load_trace` reads a file within the limits (the constants
before it) and turns a refusal into a UserError ``file:line: reason``.

A trace as a schedule: its segments become the plan's levels, so the toggler still applies only
allocations (and links) that the job's plan holds.

The trace is stretched (or squeezed) so that its span covers the run's ``train.epochs``: a row at
``t`` of a trace whose last row is at ``span`` takes effect at epoch ``t / span * epochs``, at the
first step boundary past it. Positions are training progress, not wall time, so that two runs of the
same job (uniform and dynamic batching, say) meet the same interference at the same point of
training, however fast each goes. A step trace (column ``step``) is stretched the same way. Stall
durations are wall-clock seconds, kept as the trace gives them: a stall is a pause, not a share.

Every stretch where nothing changes is one level, named ``T00``, ``T01``, ... in order of first
appearance; a stretch that repeats an earlier state reuses its name. A stretch that begins with a
stall is a level of its own, whose entry pauses the stalled worker (:attr:`EmulationPlan.stalls`).
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omnilearn.bounded_json import json_depth
from omnilearn.emulator.spec.levels import Allocation, format_cpuset
from omnilearn.emulator.spec.links import Link, parse_duration, parse_link, shown
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.errors import UserError

UNITS = ("seconds", "step")
TIME_COLUMNS = {"t": "seconds", "step": "step"}
CPU_COLUMNS = ("cpus", "share", "cpuset")
LINK_COLUMNS = ("rate", "delay", "jitter", "loss")
COLUMNS = ("t", "step", "worker", *CPU_COLUMNS, *LINK_COLUMNS, "stall")
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
_CPUSET = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


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
        if json_depth(s) > MAX_JSON_DEPTH:
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


TRACE_SUFFIXES = (".csv", ".jsonl", ".ndjson")
TRACE_PREFIX = "trace:"
"""A trace-driven schedule's name starts with this (reports draw its figure)."""


def trace_file(trace: str | None, schedule: str | None) -> str | None:
    """The trace a job is driven by: ``emulation.trace``, or a ``schedule`` that names a trace file."""
    if trace:
        return trace
    if schedule and Path(schedule).suffix.lower() in TRACE_SUFFIXES:
        return schedule
    return None


@dataclass(frozen=True)
class TraceLevels:
    """What a trace adds to a plan: its schedule, levels, links (None: the trace sets none) and stalls."""

    schedule: Schedule
    levels: dict[str, dict[str, Allocation]]
    links: dict[str, dict[str, Link]] | None
    stalls: dict[str, dict[str, float]]


def trace_levels(trace: Trace, base: dict[str, Allocation], workers: list[str], epochs: int) -> TraceLevels:
    """Levels of ``trace`` for the worker targets ``workers`` (trace worker i is ``workers[i - 1]``).

    ``base``: every target's full allocation (what a ``share`` is a fraction of); targets that are not
    workers (the ASP parameter server) keep theirs throughout.
    """
    assert trace.workers == len(workers), (trace.workers, workers)
    stalls = trace.stalls()
    positions = sorted({0.0, *trace.changes(), *(s.at for s in stalls)})
    sets_links = any(e.sets_link for e in trace.events)
    keys: dict[Any, int] = {}
    segments: list[tuple[float, int, dict[str, Allocation], dict[str, Link], dict[str, float]]] = []
    for pos in positions:
        states = trace.at(pos)
        allocs = dict(base)
        allocs.update({t: states[i].allocation(base[t]) for i, t in enumerate(workers, start=1)})
        links = {t: states[i].link for i, t in enumerate(workers, start=1) if states[i].link is not None}
        paused = {workers[s.worker - 1]: s.duration for s in stalls if s.at == pos}
        key: Any = (tuple(allocs.items()), tuple(links.items()))
        if paused:
            key = ("stall", pos)  # entering this level pauses a worker: it is nobody else's level
        number = keys.setdefault(key, len(keys))
        if segments and segments[-1][1] == number:
            continue  # nothing changes here (the trace restates a state)
        start = pos / trace.span * epochs if trace.span > 0 else 0.0
        segments.append((start, number, allocs, links, paused))
    width = max(2, len(str(len(keys) - 1)))
    name = {n: f"T{n:0{width}d}" for n in keys.values()}
    levels = {name[n]: allocs for _, n, allocs, _, _ in segments}
    schedule = Schedule(name=f"{TRACE_PREFIX}{Path(trace.source).stem}", unit="epoch",
                        starts=tuple(s for s, *_ in segments), levels=tuple(name[n] for _, n, *_ in segments))
    link_levels = {name[n]: links for _, n, _, links, _ in segments if links} if sets_links else None
    paused_levels = {name[n]: paused for _, n, _, _, paused in segments if paused}
    return TraceLevels(schedule=schedule, levels=levels, links=link_levels, stalls=paused_levels)
