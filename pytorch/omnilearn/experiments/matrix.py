"""Benchmark matrices: a YAML file naming base configs, policies, levels or schedules, and seeds.

```yaml
expected_minutes: 22          # what the whole matrix took when measured (printed beside this run's)
modes:                        # mode -> its base job config, policies and overrides
  bsp: {config: demo.yaml, policies: [uniform, static, dynamic, ddp], set: {train.epochs: 2}}
  asp: {config: asp-demo.yaml, policies: [uniform, dynamic]}
  asp-8: {mode: asp, config: asp-demo.yaml, policies: [uniform, dynamic], set: {workers: 8}}  # a variant
levels: [HL8]                 # pinned levels, each a group of cells
schedules: [staircase]        # and/or schedules (a name in configs/schedules.yaml, or a file)
seeds: [1, 2, 3]              # train.seed of each repeat
epochs: null                  # every cell (else each base config's own)
time_budget_s: null           # every cell: stop after this many seconds (epochs stay a cap)
set: {emulation.backend: auto}     # any config key, every cell (a mode's own set wins)
target: {value: null, fraction: 0.95}   # time-to-target: a given value, or this share of the best
links:                        # optional: each level or schedule under each of these emulation.links
  unshaped: null
  slow-worker1: {worker1: 100mbit}
```

With ``links``, a group is a level (or schedule) under one link setting, named ``HL8+slow-worker1``:
policies are compared under network heterogeneity as under CPU heterogeneity.

A ``modes`` entry is named by its mode (``bsp``, ``asp``), or by any name with ``mode:`` saying
which: a variant of a mode (another workload, worker count or setting) whose cells are a group of
their own, ``<name>/<level>/<policy>/seed-<s>``.

Config paths are relative to the matrix file, else the project's ``configs/`` folder. Every cell's
config and emulation plan are built and checked when the file is loaded: a mistake anywhere stops
the bench before any cell runs, with one message naming the matrix file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilearn import config
from omnilearn.config import MODES, JobConfig
from omnilearn.emulator.spec.plan import EmulationPlan, build_plan
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml

DEFAULT_MATRIX = CONFIG_DIR / "bench" / "default.yaml"
TOP_KEYS = ("description", "expected_minutes", "modes", "levels", "schedules", "seeds", "epochs", "time_budget_s",
            "set", "target", "links")
MODE_KEYS = ("mode", "config", "policies", "set", "epochs", "time_budget_s")
TARGET_KEYS = ("value", "fraction")


@dataclass
class Cell:
    """One run of the matrix: its place, its checked config and plan."""

    mode: str  # the matrix's name for it: its mode (bsp, asp) or a variant's name (config.mode says which)
    group: str  # the level (HL8) or the schedule's name
    kind: str  # "level" | "schedule"
    policy: str
    seed: int
    config: JobConfig
    plan: EmulationPlan

    @property
    def path(self) -> Path:
        """``<mode>/<level-or-schedule>/<policy>/seed-<s>`` under the bench folder."""
        return Path(self.mode) / self.group / self.policy / f"seed-{self.seed}"

    @property
    def label(self) -> str:
        return f"{self.mode} {self.group} {self.policy} seed {self.seed}"

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "group": self.group, "kind": self.kind, "policy": self.policy,
                "seed": self.seed, "path": str(self.path)}


@dataclass
class Matrix:
    source: Path
    text: str
    cells: list[Cell]
    target_value: float | None = None
    target_fraction: float = 0.95
    expected_minutes: float | None = None
    description: str = ""
    base_configs: dict[str, Path] = field(default_factory=dict)


def _bad(path: Path, key: str, msg: str) -> UserError:
    return UserError(f"{path}: {key}: {msg}")


def _mapping(path: Path, key: str, value: Any, known: tuple[str, ...] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, key, f"expected a mapping, got {value!r}")
    if known is not None:
        for k in value:
            if k not in known:
                raise UserError(f"{path}: unknown key '{key + '.' if key else ''}{k}' (known: {', '.join(known)})")
    return value


def _names(path: Path, key: str, value: Any, kind: type = str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise _bad(path, key, f"expected a list of {kind.__name__}s, got {value!r}")
    if len(set(value)) != len(value):
        raise _bad(path, key, f"lists {[v for v in value if value.count(v) > 1][0]!r} twice")
    return value


def _number(path: Path, key: str, value: Any, positive: bool = True) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise _bad(path, key, f"expected a positive number, got {value!r}")
    return float(value)


def _config_path(path: Path, key: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise _bad(path, key, f"expected a config file name, got {value!r}")
    for candidate in (path.parent / value, CONFIG_DIR / value):
        if candidate.is_file():
            return candidate
    raise _bad(path, key, f"config {value!r} not found beside the matrix or in {CONFIG_DIR}")


def _assignments(path: Path, key: str, value: Any) -> list[tuple[str, Any]]:
    return [(str(k), v) for k, v in _mapping(path, key, value or {}).items()]


def load_matrix(path: Path, extra: list[tuple[str, Any]] | None = None) -> Matrix:
    """Read, check and expand a matrix file into its cells (``extra``: ``--set`` for every cell)."""
    path = Path(path)
    data = load_yaml(path, "matrix file")
    data = _mapping(path, "", data if data is not None else {}, TOP_KEYS)
    modes = _mapping(path, "modes", data.get("modes"))
    if not modes:
        raise _bad(path, "modes", "names no mode (bsp, asp)")
    for name in modes:
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise _bad(path, "modes", f"{name!r} is not a name (letters, digits, - and _)")
    levels = _names(path, "levels", data.get("levels"))
    schedules = _names(path, "schedules", data.get("schedules"))
    if not levels and not schedules:
        raise _bad(path, "levels", "the matrix needs levels (e.g. [HL8]) or schedules (e.g. [staircase])")
    seeds = _names(path, "seeds", data.get("seeds", [1]), int)
    if not seeds:
        raise _bad(path, "seeds", "needs at least one seed")
    target = _mapping(path, "target", data.get("target") or {}, TARGET_KEYS)
    fraction = _number(path, "target.fraction", target.get("fraction", 0.95))
    if fraction is None or fraction > 1:
        raise _bad(path, "target.fraction", f"must be in (0, 1], not {target.get('fraction')!r}")
    common = _assignments(path, "set", data.get("set"))
    for key in ("epochs", "time_budget_s"):
        _number(path, key, data.get(key))
    matrix = Matrix(source=path, text=path.read_text(), cells=[], target_fraction=fraction,
                    target_value=_number(path, "target.value", target.get("value")),
                    expected_minutes=_number(path, "expected_minutes", data.get("expected_minutes")),
                    description=str(data.get("description") or ""))
    groups = [(lv, "level") for lv in levels] + [(sc, "schedule") for sc in schedules]
    link_sets: list[tuple[str | None, Any]] = [(None, None)]
    if data.get("links") is not None:
        link_sets = [(str(name), spec) for name, spec in _mapping(path, "links", data["links"]).items()]
        if not link_sets:
            raise _bad(path, "links", "names no link setting (e.g. {unshaped: null, slow: {worker1: 100mbit}})")
    for mode, spec in modes.items():
        where = f"modes.{mode}"
        spec = _mapping(path, where, spec, MODE_KEYS)
        job_mode = spec.get("mode", mode)
        if job_mode not in MODES:
            raise _bad(path, f"{where}.mode", f"must be one of {', '.join(MODES)} (a variant says which), "
                                              f"not {job_mode!r}")
        base = _config_path(path, f"{where}.config", spec.get("config"))
        matrix.base_configs[mode] = base
        policies = _names(path, f"{where}.policies", spec.get("policies"))
        if not policies:
            raise _bad(path, f"{where}.policies", "needs at least one policy (e.g. [uniform, dynamic])")
        run_keys = [(f"train.{k}", spec.get(k, data.get(k))) for k in ("epochs", "time_budget_s")
                    if spec.get(k, data.get(k)) is not None]
        for k in ("epochs", "time_budget_s"):
            _number(path, f"{where}.{k}", spec.get(k))
        overrides = common + _assignments(path, f"{where}.set", spec.get("set")) + run_keys + (extra or [])
        for (group, kind), (link_name, link_spec) in ((g, k) for g in groups for k in link_sets):
            emulation = ([("emulation.hl", group)] if kind == "level" else
                         [("emulation.hl", None), ("emulation.schedule", group)])
            if link_name is not None:
                emulation.append(("emulation.links", link_spec))
            plan = None
            for seed in seeds:
                for policy in policies:
                    cell_keys = [("mode", job_mode), *emulation, ("control.policy", policy), ("train.seed", seed)]
                    at = f"{kind} {group}" + (f", links {link_name}" if link_name is not None else "")
                    try:
                        cfg = config.build(base, overrides + cell_keys)
                        plan = plan or build_plan(cfg)  # the same for every policy and seed of the group
                    except UserError as e:
                        raise UserError(f"{path}: {where} ({at}, policy {policy}): {e}") from None
                    name = (Path(group).stem if kind == "schedule" else group) + (
                        f"+{link_name}" if link_name is not None else "")
                    matrix.cells.append(Cell(mode, name, kind, policy, seed, cfg, plan))
    return matrix
