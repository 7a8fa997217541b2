"""Heterogeneity levels: per-worker CPU allocations (cpusets or CPU quotas).

The paper's tables give each worker a set of cores on a 48-core server (``configs/levels.yaml``).
On a host with at least that many CPUs the sets are used as they are; on a smaller host each
allocation becomes a CFS quota of ``cores / server_cores * host_cpus * share`` CPUs, which keeps the
ratios between workers (HL8 stays 8:1 on 2 cores); ``share`` (``emulation.host_share``) leaves the
rest of the host to its own processes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml

LEVELS_FILE = CONFIG_DIR / "levels.yaml"
MAX_CLUSTER_SERVERS = 4  # the cluster tables describe up to four servers (32 workers), as the paper's runs


def parse_cpuset(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``. Raises ValueError on malformed text."""
    cpus: set[int] = set()
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty cpuset {text!r}")
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad cpuset range {part!r}")
            cpus.update(range(lo, hi + 1))
        else:
            cpu = int(part)
            if cpu < 0:
                raise ValueError(f"negative CPU {part!r}")
            cpus.add(cpu)
    return sorted(cpus)


def format_cpuset(cpus: list[int] | set[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: the form the kernel and Docker print."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def effective_cpuset(kernel: str, requested: str | None, full: str) -> str | None:
    """The cpuset read back; None ("no narrower than the parent") when none was asked and none is set."""
    if requested is None and (not kernel or not full or parse_cpuset(kernel) == parse_cpuset(full)):
        return None
    return format_cpuset(parse_cpuset(kernel)) if kernel else None


def host_cpus() -> list[int]:
    """The CPUs this process may use (what a cpuset can name)."""
    return sorted(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Allocation:
    """The CPU share of one worker: exact cores (``cpuset``), a quota in CPUs (``cpus``), or both.

    ``None`` everywhere means unlimited. ``memory`` (bytes) is an optional memory limit.
    """

    cpuset: str | None = None
    cpus: float | None = None
    memory: int | None = None

    @property
    def share(self) -> float | None:
        """The CPU capacity in CPUs: the quota if set, else the size of the cpuset."""
        if self.cpus is not None:
            return self.cpus
        if self.cpuset is not None:
            return float(len(parse_cpuset(self.cpuset)))
        return None

    def threads(self, default: int | None = None) -> int:
        """How many compute threads make sense for this share (at least 1)."""
        share = self.share
        if share is None:
            return max(1, default or len(host_cpus()))
        # A quota of 1.33 CPUs is only usable by 2 threads; round up, but not for float noise.
        return max(1, math.ceil(share - 1e-6))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Allocation:
        return Allocation(cpuset=d.get("cpuset"), cpus=d.get("cpus"), memory=d.get("memory"))

    def describe(self) -> str:
        parts = []
        if self.cpus is not None:
            parts.append(f"{self.cpus:.3g} CPU")
        if self.cpuset is not None:
            parts.append(f"cpuset {self.cpuset}")
        if self.memory is not None:
            parts.append(f"{self.memory / 2**20:.0f} MiB")
        return ", ".join(parts) or "unlimited"


@dataclass(frozen=True)
class LevelTable:
    """The paper's per-level core sets for one mode (BSP or ASP)."""

    mode: str
    server_cores: int
    levels: dict[str, list[str]]  # level -> one cpuset per worker, on the reference server
    server: str | None = None  # ASP's parameter-server cpuset
    clusters: dict[str, list[int]] | None = None
    """BSP clusters: level -> cores of each worker of one server, for jobs of a multiple of ``per_server``
    workers up to :data:`MAX_CLUSTER_SERVERS` servers (``bsp_clusters`` in levels.yaml)."""
    per_server: int = 0

    def cluster_cores(self, level: str, workers: int) -> list[int] | None:
        """Cores per worker of ``level`` for a ``workers``-worker cluster (None: no cluster table for it)."""
        if not self.clusters or level not in self.clusters or workers % self.per_server \
                or not 1 <= workers // self.per_server <= MAX_CLUSTER_SERVERS:
            return None
        return self.clusters[level] * (workers // self.per_server)

    @property
    def workers(self) -> int:
        return len(next(iter(self.levels.values())))

    def level_names(self) -> list[str]:
        return list(self.levels)


def load_tables(path: Path = LEVELS_FILE) -> dict[str, LevelTable]:
    """Read ``levels.yaml`` into one LevelTable per mode, checking its shape."""
    raw = load_yaml(path, "HL table file")
    if not isinstance(raw, dict) or "server_cores" not in raw:
        raise UserError(f"{path}: expected keys 'server_cores', 'bsp', 'asp'")
    server_cores = raw["server_cores"]
    tables: dict[str, LevelTable] = {}
    for mode in ("bsp", "asp"):
        section = dict(raw.get(mode) or {})
        server = section.pop("server", None)
        levels: dict[str, list[str]] = {}
        width = None
        for name, sets in section.items():
            if not isinstance(sets, list) or not sets:
                raise UserError(f"{path}: {mode}.{name} must be a list of cpusets")
            for s in sets:
                try:
                    cpus = parse_cpuset(s)
                except ValueError as e:
                    raise UserError(f"{path}: {mode}.{name}: {e}") from None
                if cpus[-1] >= server_cores:
                    raise UserError(f"{path}: {mode}.{name}: cpuset {s} exceeds server_cores={server_cores}")
            if width is not None and len(sets) != width:
                raise UserError(f"{path}: {mode}.{name} has {len(sets)} workers, other levels {width}")
            width = len(sets)
            levels[str(name)] = [str(s) for s in sets]
        tables[mode] = LevelTable(mode=mode, server_cores=server_cores, levels=levels, server=server,
                                  **(_clusters(raw.get("bsp_clusters"), levels, server_cores, path) if mode == "bsp"
                                     else {}))
    return tables


def _clusters(raw: Any, levels: dict[str, list[str]], server_cores: int, path: Path) -> dict[str, Any]:
    """``bsp_clusters`` checked: the same levels, ``per_server`` core counts each, within one server."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("per_server"), int) or raw["per_server"] < 1:
        raise UserError(f"{path}: bsp_clusters needs per_server (workers per server) and one list per level")
    per = raw["per_server"]
    clusters = {str(k): v for k, v in raw.items() if k != "per_server"}
    if set(clusters) != set(levels):
        raise UserError(f"{path}: bsp_clusters has levels {', '.join(clusters)}, the BSP table {', '.join(levels)}")
    for name, cores in clusters.items():
        if not isinstance(cores, list) or len(cores) != per or not all(
                isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in cores) or sum(cores) > server_cores:
            raise UserError(f"{path}: bsp_clusters.{name}: expected {per} positive core counts summing to at "
                            f"most {server_cores}")
    return {"clusters": clusters, "per_server": per}


_FIT = 1e-6  # float slack when a share is compared with whole CPUs


def _placement(shares: Sequence[float], n: int) -> list[list[int]] | None:
    """CPU indices (0..n-1) for each share, or None where they do not fit ``n`` CPUs.

    A share over one CPU gets whole CPUs of its own (its threads then meet no other worker's), largest
    first; each other share, largest first, goes to the least loaded of the remaining CPUs it fits
    (capacity 1), so that workers share a CPU only where the CPUs run out.
    """
    sets: list[list[int]] = [[] for _ in shares]
    order = sorted(range(len(shares)), key=lambda i: -shares[i])
    cpu = 0
    for i in order:
        if shares[i] > 1 + _FIT:
            whole = math.ceil(shares[i] - _FIT)
            sets[i], cpu = list(range(cpu, cpu + whole)), cpu + whole
    if cpu > n:
        return None
    load = dict.fromkeys(range(cpu, n), 0.0)
    for i in order:
        if shares[i] > 1 + _FIT:
            continue
        fits = [c for c in load if load[c] + shares[i] <= 1 + _FIT]
        if not fits:
            return None
        c = min(fits, key=lambda c: (load[c], c))
        load[c] += shares[i]
        sets[i] = [c]
    return sets


def _largest_scale(shares: Sequence[float], n: int) -> float:
    """The largest factor (at most 1) by which ``shares`` fit :func:`_placement` on ``n`` CPUs."""
    if _placement(shares, n) is not None:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _placement([s * mid for s in shares], n) is not None else (lo, mid)
    sets = _placement([s * lo for s in shares], n)
    assert sets is not None
    # The placement found holds up to the scale that fills its fullest CPU (not the search's last step).
    load: dict[tuple[int, ...], float] = {}
    for s, cpus in zip(shares, sets, strict=True):
        load[tuple(cpus)] = load.get(tuple(cpus), 0.0) + s
    return min(1.0, min(len(cpus) / total for cpus, total in load.items()))


def pack_levels(levels: dict[str, dict[str, Allocation]], host: Sequence[int]) -> dict[str, dict[str, Allocation]]:
    """The quota levels placed on ``host``'s CPUs (``emulation.placement: packed``).

    Spread over every CPU, a worker shares each CPU with the others, and one that wakes from its wait in
    the all-reduce onto a CPU another worker is using gets part of it until the kernel moves one of them:
    its speed then depends on how much of each step it waits, which no worker of a real cluster sees
    (``results/2026-12-06_2cpu_cpu-weight.md``). Packed, a worker of more than one CPU gets whole CPUs
    of its own and the others share as few CPUs as their quotas allow, each on one. Where the shares
    do not fit so (on 2 CPUs at HL8 the fastest worker's 1.13 CPUs would need both), every quota of
    every level is scaled down by one factor, the ratios kept, until they do. Allocations without a
    quota, or with a cpuset of their own, are left as they are.
    """
    n = len(host)

    def quotas(allocs: dict[str, Allocation]) -> list[str]:
        return [t for t, a in allocs.items() if a.cpus is not None and a.cpuset is None]

    scale = min((_largest_scale([allocs[t].cpus for t in quotas(allocs)], n)  # type: ignore[misc]
                 for allocs in levels.values() if quotas(allocs)), default=1.0)
    out: dict[str, dict[str, Allocation]] = {}
    for level, allocs in levels.items():
        placed = dict(allocs)
        targets = quotas(allocs)
        shares = [round(allocs[t].cpus * scale, 4) for t in targets]  # type: ignore[operator]
        sets = _placement(shares, n)
        if sets is None:  # first fit is not monotone in the scale; this level's own largest one fits
            shares = [round(allocs[t].cpus * _largest_scale(shares, n) * (1 - _FIT), 4)  # type: ignore[operator]
                      for t in targets]
            sets = _placement(shares, n)
            assert sets is not None
        for t, share, cpus in zip(targets, shares, sets, strict=True):
            placed[t] = replace(allocs[t], cpus=share, cpuset=format_cpuset([host[c] for c in cpus]))
        out[level] = placed
    return out


def _scaled_share(cores: int, server_cores: int, host: float) -> float:
    return round(cores / server_cores * host, 4)


def _stretch(shares: list[int], workers: int) -> list[int]:
    """Repeat a 4-worker level's pattern over ``workers`` workers (the paper's layout, tiled)."""
    return [shares[i % len(shares)] for i in range(workers)]


def resolve_level(
    table: LevelTable,
    level: str,
    workers: int,
    mode: str,
    host: list[int] | None = None,
    share: float = 1.0,
) -> tuple[list[Allocation], Allocation | None]:
    """Allocations of ``level`` for ``workers`` workers (and the ASP server) on this host.

    ``mode``: ``cpuset`` uses the table's core sets (the host needs the server's cores, and only
    4-worker tables have sets), ``quota`` scales core counts to CPU quotas of ``share`` of the host's
    CPUs (``emulation.host_share``), ``none`` gives unlimited allocations (emulation off).
    """
    if level not in table.levels:
        raise UserError(f"heterogeneity level {level!r} is not in the {table.mode.upper()} table "
                        f"(known: {', '.join(table.levels)})")
    host = host if host is not None else host_cpus()
    sets = table.levels[level]
    cluster = table.cluster_cores(level, workers)
    if mode == "none":
        return [Allocation() for _ in range(workers)], (Allocation() if table.server else None)
    if mode == "cpuset" and cluster is not None and workers == table.per_server:
        sets, cpus = [], 0  # one server's cpusets, in order
        for c in cluster:
            sets.append(format_cpuset(list(range(cpus, cpus + c))))
            cpus += c
    if mode == "cpuset":
        if workers != len(sets):
            raise UserError(f"cpuset allocation needs exactly {len(sets)} workers for {level}; "
                            f"use allocation: quota for {workers}")
        missing = sorted(set(parse_cpuset(",".join(sets + ([table.server] if table.server else []))))
                         - set(host))
        if missing:
            raise UserError(f"cpuset allocation for {level} names CPUs this host lacks: "
                            f"{format_cpuset(missing)} (host has {format_cpuset(host)}); use allocation: quota")
        server = Allocation(cpuset=table.server) if table.server else None
        return [Allocation(cpuset=s) for s in sets], server
    assert mode == "quota", mode
    counts = cluster or _stretch([len(parse_cpuset(s)) for s in sets], workers)
    # Scale so the whole job (workers, and the server in ASP) gets its share of the host's CPUs in the table's
    # proportions: with more workers than the table, the reference server is as many times bigger.
    server_cores = table.server_cores * workers / (table.per_server if cluster else len(sets))
    n_host = len(host) * share
    server = (Allocation(cpus=_scaled_share(len(parse_cpuset(table.server)), table.server_cores, n_host))
              if table.server else None)
    return [Allocation(cpus=_scaled_share(c, server_cores, n_host)) for c in counts], server
