"""Heterogeneity schedules: which level holds when (by epoch, or by seconds since training began)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml

SCHEDULES_FILE = CONFIG_DIR / "schedules.yaml"


@dataclass(frozen=True)
class Schedule:
    """Piecewise-constant level: ``levels[i]`` holds from ``starts[i]`` (epoch or second) on."""

    name: str
    unit: str  # "epoch" | "seconds"
    starts: tuple[float, ...]
    levels: tuple[str, ...]

    def level_at(self, position: float) -> str:
        i = bisect.bisect_right(self.starts, position) - 1
        return self.levels[max(i, 0)]

    def changes(self) -> int:
        return sum(1 for a, b in zip(self.levels, self.levels[1:], strict=False) if a != b)

    @staticmethod
    def pinned(level: str) -> Schedule:
        return Schedule(name=f"pinned-{level}", unit="epoch", starts=(0,), levels=(level,))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "starts": list(self.starts), "levels": list(self.levels)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Schedule:
        return Schedule(d["name"], d["unit"], tuple(d["starts"]), tuple(d["levels"]))


def parse_schedule(name: str, spec: Any, where: str) -> Schedule:
    """Build a schedule from its YAML form; ``where`` names the source in error messages."""
    if not isinstance(spec, dict):
        raise UserError(f"{where}: schedule must be a mapping with 'unit' and 'points' or 'routine'")
    unknown = set(spec) - {"unit", "points", "routine", "length"}
    if unknown:
        raise UserError(f"{where}: unknown schedule key(s) {', '.join(sorted(unknown))}")
    unit = spec.get("unit", "epoch")
    if unit not in ("epoch", "seconds"):
        raise UserError(f"{where}.unit: must be 'epoch' or 'seconds', not {unit!r}")
    starts: list[float] = []
    levels: list[str] = []
    if "routine" in spec:
        length = spec.get("length", 1)
        if not isinstance(length, (int, float)) or isinstance(length, bool) or length <= 0:
            raise UserError(f"{where}.length: must be a positive number, not {length!r}")
        routine = spec["routine"]
        if not isinstance(routine, list) or not routine:
            raise UserError(f"{where}.routine: must be a non-empty list of levels")
        for i, level in enumerate(routine):
            starts.append(i * length)
            levels.append(str(level))
    elif "points" in spec:
        points = spec["points"]
        if not isinstance(points, list) or not points:
            raise UserError(f"{where}.points: must be a non-empty list of {{at, level}}")
        for i, p in enumerate(points):
            if not isinstance(p, dict) or set(p) != {"at", "level"}:
                raise UserError(f"{where}.points[{i}]: must be {{at: NUMBER, level: HLk}}")
            at = p["at"]
            if not isinstance(at, (int, float)) or isinstance(at, bool) or at < 0:
                raise UserError(f"{where}.points[{i}].at: must be a number >= 0, not {at!r}")
            if starts and at <= starts[-1]:
                raise UserError(f"{where}.points[{i}].at: points must be in increasing order")
            starts.append(float(at))
            levels.append(str(p["level"]))
        if starts[0] != 0:
            raise UserError(f"{where}.points[0].at: the first point must be at 0")
    else:
        raise UserError(f"{where}: a schedule needs 'points' or 'routine'")
    return Schedule(name=name, unit=unit, starts=tuple(starts), levels=tuple(levels))


def load_schedule(ref: str) -> Schedule:
    """A named schedule from ``configs/schedules.yaml``, or a YAML file holding one schedule."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return parse_schedule(path.stem, load_yaml(path, "schedule file"), str(path))
    named = load_yaml(SCHEDULES_FILE, "schedule file") or {}
    if ref not in named:
        raise UserError(f"unknown schedule {ref!r} (named schedules: {', '.join(named)}; or give a YAML file)")
    return parse_schedule(ref, named[ref], f"{SCHEDULES_FILE.name}:{ref}")
