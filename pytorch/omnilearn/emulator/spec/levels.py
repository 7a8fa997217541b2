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
from dataclasses import asdict, dataclass
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
