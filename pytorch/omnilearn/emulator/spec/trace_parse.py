"""The one parser of trace files: bounded, never raising on bad input (see :mod:`.trace` for the format).

:func:`parse_trace` returns a :class:`~.trace.Trace` or a :class:`~.trace.Refusal` (line and reason);
:func:`load_trace` reads a file within the limits below and turns a refusal into a UserError
``file:line: reason``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from omnilearn.bounded_json import json_depth
from omnilearn.emulator.spec.levels import format_cpuset
from omnilearn.emulator.spec.links import parse_duration, parse_link, shown
from omnilearn.emulator.spec.trace import (
    _UNSET,
    COLUMNS,
    CPU_COLUMNS,
    LINK_COLUMNS,
    TIME_COLUMNS,
    Refusal,
    Trace,
    TraceEvent,
    _num,
    _time_column,
)
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
