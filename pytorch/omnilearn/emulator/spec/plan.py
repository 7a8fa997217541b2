"""The emulation plan of one job: for every level of its schedule, every target's allocation.

Resolved once by the launcher, on the host (which knows the host's CPUs), checked before anything
starts, and handed to the workers in the job file: a worker only looks up its own allocation.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from omnilearn.config import JobConfig
from omnilearn.emulator.spec.levels import (
    Allocation,
    LevelTable,
    format_cpuset,
    host_cpus,
    load_tables,
    parse_cpuset,
    resolve_level,
)
from omnilearn.emulator.spec.links import Link, parse_links
from omnilearn.emulator.spec.schedule import Schedule, load_schedule
from omnilearn.emulator.spec.trace import load_trace, trace_file, trace_levels
from omnilearn.errors import UserError


def worker_target(mode: str, rank: int) -> str:
    """Container/target name of training worker ``rank`` (0-based), in the paper's words.

    BSP: worker1, worker2, ... ASP: aspworker2, aspworker3, ... (aspworker1 is the parameter server).
    """
    return f"worker{rank + 1}" if mode == "bsp" else f"aspworker{rank + 2}"


SERVER_TARGET = "aspworker1"
"""The ASP parameter server's target: process rank 0, so ASP worker ``i`` is process rank ``i + 1``."""


@dataclass(frozen=True)
class EmulationPlan:
    mode: str  # "cpuset" | "quota" | "none"
    targets: tuple[str, ...]  # one per process, in rank order: BSP workers; ASP server (rank 0), then workers
    levels: dict[str, dict[str, Allocation]]
    schedule: Schedule
    links: dict[str, dict[str, Link]] = field(default_factory=dict)
    """level -> target -> its network link at that level; unshaped targets are absent."""
    stalls: dict[str, dict[str, float]] = field(default_factory=dict)
    """level -> target -> seconds the target is paused on entering that level (a trace's stalls)."""

    def allocation(self, level: str, target: str) -> Allocation:
        return self.levels[level][target]

    def link(self, level: str, target: str) -> Link | None:
        return self.links.get(level, {}).get(target)

    def stall(self, level: str, target: str) -> float | None:
        return self.stalls.get(level, {}).get(target)

    def stalls_passed(self, after: float, upto: float) -> list[str]:
        """Levels that begin with a stall, start in ``(after, upto]`` and are over by ``upto``: a trace's
        stalls shorter than a step, which a worker still goes through so that no stall is lost."""
        if not self.stalls:
            return []
        starts, levels = self.schedule.starts, self.schedule.levels
        current = bisect.bisect_right(starts, upto) - 1
        return [levels[i] for i in range(current) if starts[i] > after and levels[i] in self.stalls]

    def target(self, rank: int) -> str:
        """The target of process ``rank`` (the world size is ``len(targets)``)."""
        return self.targets[rank]

    def first_level(self) -> str:
        return self.schedule.levels[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "targets": list(self.targets),
            "levels": {lv: {t: a.to_dict() for t, a in m.items()} for lv, m in self.levels.items()},
            "schedule": self.schedule.to_dict(),
            "links": {lv: {t: k.to_dict() for t, k in m.items()} for lv, m in self.links.items()},
            "stalls": self.stalls,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EmulationPlan:
        return EmulationPlan(
            mode=d["mode"],
            targets=tuple(d["targets"]),
            levels={lv: {t: Allocation.from_dict(a) for t, a in m.items()} for lv, m in d["levels"].items()},
            schedule=Schedule.from_dict(d["schedule"]),
            links={lv: {t: Link.from_dict(k) for t, k in m.items()} for lv, m in d.get("links", {}).items()},
            stalls=d.get("stalls", {}),
        )


def _custom_table(cfg: JobConfig, table: dict[str, list[Any]], key: str) -> dict[str, list[Any]]:
    """A table of the config's own (or a calibration's); ASP may give workers + 1 entries, the server's
    first (rank order)."""
    where = f"{cfg.source}: {key}"
    sizes = (cfg.workers, cfg.workers + 1) if cfg.mode == "asp" else (cfg.workers,)
    for level, entries in table.items():
        if len(entries) not in sizes:
            server = f" (or {cfg.workers + 1}: the server's first)" if cfg.mode == "asp" else ""
            raise UserError(f"{where}.{level}: has {len(entries)} entries for {cfg.workers} workers{server}")
        for i, entry in enumerate(entries):
            if isinstance(entry, dict):
                unknown = set(entry) - {"cpus", "cpuset", "memory"}
                if unknown:
                    raise UserError(f"{where}.{level}[{i}]: unknown key(s) {', '.join(sorted(unknown))} "
                                    f"(known: cpus, cpuset, memory)")
                if "memory" in entry:
                    parse_memory(entry["memory"], f"{where}.{level}[{i}].memory")
                if "cpuset" in entry and not isinstance(entry["cpuset"], str):
                    raise UserError(f"{where}.{level}[{i}].cpuset: expected a cpuset string, "
                                    f"got {entry['cpuset']!r}")
                parts = [entry[k] for k in ("cpuset", "cpus") if k in entry]
            else:
                parts = [entry]
            for part in parts:
                _check_cpu_entry(part, f"{where}.{level}[{i}]")
    return table


def _check_cpu_entry(entry: Any, where: str) -> None:
    """A level entry's CPU side is a cpuset string or a positive CPU count."""
    if isinstance(entry, str):
        try:
            parse_cpuset(entry)
        except ValueError as e:
            raise UserError(f"{where}: {e}") from None
    elif isinstance(entry, (int, float)) and not isinstance(entry, bool):
        if entry <= 0:
            raise UserError(f"{where}: a CPU quota must be positive, not {entry}")
    else:
        raise UserError(f"{where}: expected a cpuset string or a CPU count, got {entry!r}")


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_memory(value: Any, where: str) -> int:
    """``"600M"``, ``"1.5G"`` or a number of bytes -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        text = value.strip().upper().removesuffix("B").removesuffix("I")
        unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
        try:
            number = float(text[:-1] if unit else text)
        except ValueError:
            number = -1
        if number > 0:
            return int(number * _UNITS[unit])
    raise UserError(f"{where}: expected a memory size such as 600M or 2G, got {value!r}")


def _cpu_part(entry: Any) -> Any:
    """The CPU side of a level entry: the entry itself, or the cpuset (else the cpus) of
    {cpus, cpuset, memory}."""
    return entry.get("cpuset", entry.get("cpus")) if isinstance(entry, dict) else entry


def _quota_in_cpuset(entry: Any) -> float | None:
    """The quota of an entry that gives both a cpuset and cpus (a quota on those cores), else None."""
    return float(entry["cpus"]) if isinstance(entry, dict) and {"cpuset", "cpus"} <= set(entry) else None


def _entry_allocation(entry: Any, mode: str, host: list[int], where: str) -> Allocation:
    """One worker's allocation from a level entry: a cpuset, a CPU count, or {cpus|cpuset, memory}."""
    memory = None
    if isinstance(entry, dict) and "memory" in entry:
        memory = parse_memory(entry["memory"], f"{where}.memory")
    quota = _quota_in_cpuset(entry)
    entry = _cpu_part(entry)
    if mode == "none":
        return Allocation()
    if entry is None:
        return Allocation(memory=memory)
    if quota is not None:
        if quota > len(parse_cpuset(entry)):
            raise UserError(f"{where}: asks for {quota:g} CPUs on cpuset {entry}, which has "
                            f"{len(parse_cpuset(entry))}")
        return Allocation(cpuset=entry, cpus=quota, memory=memory)
    if mode == "cpuset":
        if not isinstance(entry, str):
            raise UserError(f"{where}: cpuset mode needs cpuset strings, got {entry!r}")
        return Allocation(cpuset=entry, memory=memory)
    share = float(len(parse_cpuset(entry))) if isinstance(entry, str) else float(entry)
    if share > len(host):
        raise UserError(f"{where}: asks for {share} CPUs, the host has {len(host)}")
    return Allocation(cpus=share, memory=memory)


def _check_cpusets(allocs: dict[str, Allocation], host: list[int], where: str, shared_ok: bool = False) -> None:
    """Cpusets must exist on the host, and (unless ``shared_ok``) two workers must not share a CPU."""
    seen: dict[int, str] = {}
    for target, a in allocs.items():
        if a.cpuset is None:
            continue
        cpus = parse_cpuset(a.cpuset)
        missing = sorted(set(cpus) - set(host))
        if missing:
            raise UserError(f"{where}: {target}'s cpuset {a.cpuset} names CPUs this host lacks: "
                            f"{format_cpuset(missing)} (host CPUs: {format_cpuset(host)})")
        for c in cpus:
            if c in seen and not shared_ok:
                raise UserError(f"{where}: {target} and {seen[c]} share CPU {c} in cpuset mode")
            seen[c] = target


def build_plan(cfg: JobConfig, host: list[int] | None = None, tables: dict[str, LevelTable] | None = None
               ) -> EmulationPlan:
    """Resolve every level the run can reach into allocations; every error names its source."""
    host = host if host is not None else host_cpus()
    e = cfg.emulation
    where = cfg.source
    trace = trace_file(e.trace, e.schedule)
    if trace is not None:
        schedule = Schedule.pinned(e.hl or "HL1")  # the level a trace's shares are fractions of
    elif e.hl is not None:
        schedule = Schedule.pinned(e.hl)
    else:
        try:
            schedule = load_schedule(e.schedule)
        except UserError as err:
            raise UserError(f"{where}: emulation.schedule: {err}") from None
    targets = [worker_target(cfg.mode, r) for r in range(cfg.workers)]
    server_target = SERVER_TARGET if cfg.mode == "asp" else None
    all_targets = tuple(([server_target] if server_target else []) + targets)
    mode, levels = _levels(cfg, schedule, host, tables, targets, server_target)
    links: dict[str, dict[str, Link]] | None = None
    stalls: dict[str, dict[str, float]] = {}
    if trace is not None:
        try:
            traced = trace_levels(load_trace(trace, workers=cfg.workers), levels[schedule.levels[0]], targets,
                                  cfg.train.epochs)
        except UserError as err:
            raise UserError(f"{where}: emulation.trace: {err}") from None
        schedule, levels, stalls = traced.schedule, traced.levels, traced.stalls
        for level, allocs in levels.items():
            _check_cpusets(allocs, host, f"{where}: emulation.trace {trace} ({level})", shared_ok=mode != "cpuset")
        if traced.links is not None:
            if e.links is not None:
                raise UserError(f"{where}: emulation.links: the trace {trace} sets links itself; "
                                f"set emulation.links to null, or take the link columns out of the trace")
            links = traced.links
    if links is None:
        links = parse_links(e.links, all_targets, targets, list(levels), f"{where}: emulation.links")
    if e.backend == "none":
        links, stalls = {}, {}  # emulation off: checked, not applied
    return EmulationPlan(mode=mode, targets=all_targets, levels=levels, schedule=schedule, links=links,
                         stalls=stalls)


def _levels(cfg: JobConfig, schedule: Schedule, host: list[int], tables: dict[str, LevelTable] | None,
            targets: list[str], server_target: str | None) -> tuple[str, dict[str, dict[str, Allocation]]]:
    """The allocation mode and every level of ``schedule`` resolved for every target."""
    e = cfg.emulation
    where = cfg.source
    key = "emulation.hl" if e.hl is not None else "emulation.schedule"
    if e.backend == "none":
        mode = "none"
    elif e.allocation != "auto":
        mode = e.allocation
    else:
        mode = None  # decided below
    custom, table_key = e.levels, "emulation.levels"
    if e.calibration is not None:
        if e.levels:
            raise UserError(f"{where}: emulation.calibration: replaces the level table; emulation.levels "
                            f"gives one too: keep one of them")
        from omnilearn.emulator.spec.calibration import calibrated_levels
        custom = calibrated_levels(e.calibration, cfg.mode, cfg.workers, f"{where}: emulation.calibration")
        table_key = f"emulation.calibration ({e.calibration})"
    levels: dict[str, dict[str, Allocation]] = {}
    if custom:
        custom = _custom_table(cfg, custom, table_key)
        if mode is None:
            cpu_parts = [_cpu_part(x) for v in custom.values() for x in v]
            mode = "cpuset" if all(isinstance(x, str) for x in cpu_parts if x is not None) else "quota"
        for level in dict.fromkeys(schedule.levels):
            if level not in custom:
                raise UserError(f"{where}: {key}: level {level!r} is not in {table_key} "
                                f"(defined: {', '.join(custom)})")
            allocs = {}
            entries = custom[level]
            named = list(zip(targets, entries[-len(targets):], strict=True))
            if server_target:
                # No server entry: the server runs unlimited.
                named.insert(0, (server_target, entries[0] if len(entries) > len(targets) else None))
            for t, entry in named:
                allocs[t] = (Allocation() if entry is None else
                             _entry_allocation(entry, mode, host, f"{where}: {table_key}.{level} ({t})"))
            if mode != "none":
                _check_cpusets(allocs, host, f"{where}: {table_key}.{level}", shared_ok=mode != "cpuset")
            levels[level] = allocs
    else:
        table = (tables or load_tables())[cfg.mode]
        if mode is None:
            mode = "cpuset" if (len(host) >= table.server_cores and cfg.workers == table.workers) else "quota"
        for level in dict.fromkeys(schedule.levels):
            if level not in table.levels:
                raise UserError(f"{where}: {key}: level {level!r} is not in the {cfg.mode.upper()} table "
                                f"(known: {', '.join(table.levels)})")
            try:
                workers, server = resolve_level(table, level, cfg.workers, mode, host, e.host_share)
            except UserError as err:
                raise UserError(f"{where}: emulation.allocation: {err}") from None
            allocs = {server_target: server or Allocation()} if server_target else {}
            allocs.update(zip(targets, workers, strict=True))
            if mode == "cpuset":
                _check_cpusets(allocs, host, f"{where}: {key} {level}")
            levels[level] = allocs
    return mode, levels
