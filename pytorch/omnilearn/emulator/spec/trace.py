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

This module holds the trace itself; :mod:`.trace_parse` is the one parser (its limits are the
constants at its top; it returns a :class:`Trace` or a :class:`Refusal`, never raising on bad input)
and :mod:`.trace_convert` turns a public cluster trace into this format.
"""

from __future__ import annotations

import bisect
import csv
import io
from dataclasses import dataclass, replace
from typing import Any

from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.links import Link

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
        """The trace as CSV text that :func:`~.trace_parse.parse_trace` reads back to an equal trace."""
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
