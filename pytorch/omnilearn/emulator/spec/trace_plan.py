"""A trace as a schedule: its segments become the plan's levels, so the toggler still applies only
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.links import Link
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.emulator.spec.trace import Trace

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
