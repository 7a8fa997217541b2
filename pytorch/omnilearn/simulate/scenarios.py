"""``omnilearn simulate --scenarios [FILE] --out DIR``: the controllers scored against ground truth.

Every scenario (:mod:`.truth`: each worker's true time of a step over the run) is run for every seed
and policy through the trainers' own :class:`~omnilearn.control.loop.ControlLoop`: ``start``, the
start-up pass every policy runs (the memory probe: two steps at each of two sizes, its cost, the slowest
worker's, added to every policy's time) and ``dynamic``'s ``probe`` of its times (drawn from the true
models), a ``level`` event where the true shares change (only the policies told of allocations,
``static`` and ``dynamic+prior``, read them: the true shares), and ``step`` with every worker's
realised time after each step, at the controller's decision points (``due``).

**The oracle** takes, at every step, the split that minimises ``max_i t_i(b_i)`` under the true
noise-free (fluid) model of that step: integer, summing to B, within the scenario's bounds. It is
found by bisection on the common time T (each worker's largest batch finishing by T, summed against
B), which is exact for any time increasing in the batch (linear or superlinear). The oracle runs no
start-up pass: ``fraction_of_oracle`` compares the training steps (the pass costs every policy alike
and is reported beside it, as its share and as the fraction with it counted).

**Common random numbers.** The oracle's steps and every policy's are timed with the same draws (each
worker's noise factor, the host factor, the CFS phase of every step), so the ratio
``fraction_of_oracle = oracle's total time / policy's time over the steps`` measures the split, not the luck
of a seed. Under CFS quantisation the fluid optimum is not always the best split of a realised step,
so a policy can score slightly above 1 there.

**Settling.** A step's *gap* is the expected step time of the policy's split over that of the
oracle's, less one: each the mean over a fixed set of draws of the noise (and, under a CFS quota, of
the period's phase) of the slowest worker's time (:meth:`~omnilearn.simulate.truth.World.expected`),
so a gap is what the split costs a step on that host, quantisation and noise included. (The fluid
times would count as unsettled a split that CFS quantisation makes as fast as the oracle's, and
magnify differences the noise hides; the imbalance ``max/min - 1`` is not used because bounds and
whole samples can keep even the best split's imbalance above any threshold.) After each change of the
true shares (and the start) a policy has settled at the first step whose gap is at most
:data:`SETTLED` (10%): ``settle_steps`` counts the steps run before it, ``settle_decisions`` the
decisions (``batch_change`` records of reason ``compute-time``) taken meanwhile. A seed's value is
the mean over the run's changes, null when some change never settled before the next one (or the
end). ``worst_overshoot``: the largest gap at any step after the policy had settled within the same
stretch of true speeds (a move away from balance, or a chase of noise); null when it never settled.
``slower_than_uniform``: 1 when the policy's total time exceeds ``uniform``'s on the same seed.
"""

from __future__ import annotations

import csv
import io
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnilearn.config import RETIRED, ControlConfig
from omnilearn.control.controller import build_controller
from omnilearn.control.loop import ControlLoop
from omnilearn.control.policies import POLICIES, Bounds, probe_sizes
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, load_yaml, write_atomic
from omnilearn.records import BATCH_CHANGE
from omnilearn.simulate.truth import Scenario, Timeline, World, describe, timeline
from omnilearn.typed import build_dataclass

SUITE_FILE = CONFIG_DIR / "scenarios.yaml"
DEFAULT_POLICIES = ("uniform", "dynamic", "paper", "static")
SETTLED = 0.10
"""A split whose expected step time is within 10% of the oracle's split's has settled."""
COLUMNS = ("scenario", "policy", "seed", "fraction_of_oracle", "settle_steps", "settle_decisions",
           "worst_overshoot", "slower_than_uniform")
CHUNK = 20
"""Seeds per task handed to a worker process."""


# ---------------------------------------------------------------------------------------------- suite

def load_suite(path: str | Path | None = None) -> list[Scenario]:
    """The scenarios of ``path`` (default ``configs/scenarios.yaml``): a mapping with ``scenarios``
    (name -> fields) and optional ``defaults`` (fields every scenario starts from)."""
    return read_suite(Path(path) if path is not None else SUITE_FILE, Scenario, "scenario file")


def read_suite(path: Path, cls: type, what: str) -> list[Any]:
    """Every scenario of the suite file ``path`` as a ``cls`` (a :class:`Scenario`), each checked and
    its speeds built (a bad level, schedule or trace fails before any run); ``what`` names the file."""
    raw = load_yaml(path, what)
    where = str(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("scenarios"), dict) or not raw["scenarios"]:
        raise UserError(f"{where}: expected a mapping with 'scenarios' (name -> fields) and optional 'defaults'")
    unknown = set(raw) - {"defaults", "scenarios"}
    if unknown:
        raise UserError(f"{where}: unknown key '{sorted(unknown)[0]}' (known: defaults, scenarios)")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{where}: defaults: expected a mapping")
    build_dataclass(cls, defaults, "defaults", where)  # its keys checked once, named as defaults
    suite = []
    for name, fields in raw["scenarios"].items():
        if not isinstance(fields, dict):
            raise UserError(f"{where}: scenarios.{name}: expected a mapping of fields")
        sc = build_dataclass(cls, {**defaults, **fields}, f"scenarios.{name}", where)
        sc.name = str(name)
        sc.check(f"{where}: scenarios")
        timeline(sc, f"{where}: scenarios")
        suite.append(sc)
    return suite


def check_policies(policies: Sequence[str]) -> list[str]:
    retired = [p for p in policies if p in RETIRED]
    if retired:
        raise UserError(f"--policies: policy {retired[0]!r} is retired; its figures are in {RETIRED[retired[0]]}")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise UserError(f"--policies: unknown policy {bad[0]!r} (known: {', '.join(POLICIES)})")
    if not policies:
        raise UserError("--policies: name at least one policy")
    return list(dict.fromkeys(policies))


# ---------------------------------------------------------------------------------------------- oracle

def oracle_split(world: World, regime: int, bounds: Bounds) -> list[int]:
    """The integer split of B within ``bounds`` minimising the slowest worker's noise-free time."""
    sc = world.sc
    shares = world.line.shares[regime]
    lo, hi = bounds.min_batch, np.asarray(bounds.max_batch, float)
    p, k, unit = sc.exponent, world.fixed(regime), world.sample_s / world.b0 ** (sc.exponent - 1.0)

    def largest(t: float) -> np.ndarray:
        """Each worker's largest batch done by ``t``: (b + k)^p <= t s / unit."""
        x = (t * shares / unit) ** (1.0 / p) - k
        return np.clip(np.floor(x + 1e-9), lo, hi)

    low = float(world.fluid(regime, np.full(sc.workers, lo)).max())  # no split is faster than everyone at lo
    high = float(world.fluid(regime, hi).max())
    for _ in range(200):
        mid = 0.5 * (low + high)
        if largest(mid).sum() >= sc.global_batch:
            high = mid
        else:
            low = mid
        if high - low <= 1e-13 * high:
            break
    b = largest(high)
    excess = int(b.sum()) - sc.global_batch
    if excess > 0:  # take the excess from the slowest first: the max cannot grow
        t = world.fluid(regime, b)
        for i in np.argsort(-t, kind="stable"):
            take = int(min(excess, b[i] - lo))
            b[i] -= take
            excess -= take
            if excess == 0:
                break
    assert excess == 0 and int(b.sum()) == sc.global_batch
    return [int(x) for x in b]


# ---------------------------------------------------------------------------------------------- one run

@dataclass
class Run:
    """What one policy did on one seed."""

    total_s: float
    probe_s: float
    gaps: np.ndarray
    decisions: np.ndarray
    """Decisions taken before each step (cumulative), and after the last at index ``steps``."""


def run_policy(world: World, policy: str, oracle_step_s: np.ndarray, oracle_expected_s: Sequence[float],
               records: list[dict[str, Any]] | None = None) -> Run:
    """``policy`` on ``world`` through the trainers' loop (see the module); ``records``: a list to
    receive every record the loop writes (``{"kind": ..., **fields}``), to see why a policy did what it did."""
    sc, line = world.sc, world.line
    n, B = sc.workers, sc.global_batch
    assert B is not None
    cfg = ControlConfig(policy=policy, min_batch=sc.min_batch, max_batch=sc.max_batch)
    ctl = build_controller(cfg, B, n)
    count = [0]

    def write(kind: str, **fields: Any) -> None:
        if records is not None:
            records.append({"kind": kind, **fields})
        if kind == BATCH_CHANGE and fields.get("reason") == "compute-time":
            count[0] += 1

    loop = ControlLoop(ctl, write)
    regime = [0]

    def shares() -> list[float]:
        return line.shares[regime[0]].tolist()

    loop.start(shares, resumed=False, step=0)
    # The start-up pass every policy runs (the memory probe, BSPTrainer.start_up); dynamic times it.
    small, large = probe_sizes(B, n, ctl.bounds)
    wanted = loop.probe_sizes() is not None
    t_small, t_large, cost, cut = world.probe(small, large, max(cfg.probe_steps, 2) if wanted else 2, wanted)
    if wanted:
        loop.probe(small, large, t_small, t_large, cost, kinds=[[t, 0.0] for t in world.threads(0)], cut_short=cut,
                   step=0)
    total = probe = cost
    gaps = np.empty(sc.steps)
    decisions = np.empty(sc.steps + 1, int)
    sync = sc.sync_ms / 1e3
    for step in range(sc.steps):
        r = world.regimes[step]
        if r != regime[0]:
            regime[0] = r
            loop.level(shares, step=step)
        batch = np.asarray(loop.batch, float)
        times = world.times(step, batch, oracle_step_s[step])
        total += float(times.max()) + sync
        gaps[step] = world.expected(r, batch) / oracle_expected_s[r] - 1.0
        decisions[step] = count[0]
        done = step + 1
        loop.step(times.tolist(), due=ctl.due(done, done % sc.steps_per_epoch == 0 or done == sc.steps),
                  steps_left=sc.steps - done, shares=shares, threads=world.threads(r).tolist(), step=done)
    decisions[sc.steps] = count[0]
    return Run(total, probe, gaps, decisions)


def settling(run: Run, starts: Sequence[int], steps: int) -> tuple[float | None, float | None, float | None]:
    """(settle_steps, settle_decisions, worst_overshoot) of one run (see the module)."""
    settle, decided, worst = [], [], []
    ends = [*starts[1:], steps]
    for a, e in zip(starts, ends, strict=True):
        ok = np.flatnonzero(run.gaps[a:e] <= SETTLED)
        if ok.size == 0:
            settle.append(math.inf)
            continue
        j = a + int(ok[0])
        settle.append(j - a)
        decided.append(int(run.decisions[j] - run.decisions[a]))
        worst.append(float(run.gaps[j:e].max()))
    if math.isinf(max(settle)):
        return None, None, (max(worst) if worst else None)
    return statistics.fmean(settle), statistics.fmean(decided), max(worst)


def run_seeds(sc: Scenario, seeds: Sequence[int], policies: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of the CSV for ``seeds`` of ``sc`` (every policy; uniform always runs: the reference)."""
    line: Timeline = timeline(sc, "scenarios")
    rows = []
    for seed in seeds:
        world = World(sc, line, seed)
        bounds = Bounds.make(sc.workers, sc.min_batch, sc.max_batch, sc.global_batch or 0)
        splits = [np.asarray(oracle_split(world, r, bounds), float) for r in range(len(line.starts))]
        fluid = [float(world.fluid(r, splits[r]).max()) for r in range(len(line.starts))]
        oracle_step = np.asarray([fluid[r] for r in world.regimes])
        expected = [world.expected(r, splits[r]) for r in range(len(line.starts))]
        sync = sc.sync_ms / 1e3
        oracle_total = sum(float(world.times(s, splits[world.regimes[s]], oracle_step[s]).max()) + sync
                           for s in range(sc.steps))
        late_total = sum(float(world.times(s, splits[world.regimes[max(s - 1, 0)]], oracle_step[s]).max()) + sync
                         for s in range(sc.steps))
        uniform = run_policy(world, "uniform", oracle_step, expected)
        for policy in policies:
            run = uniform if policy == "uniform" else run_policy(world, policy, oracle_step, expected)
            steps, decisions, worst = settling(run, line.starts, sc.steps)
            rows.append({"scenario": sc.name, "policy": policy, "seed": seed,
                         "fraction_of_oracle": oracle_total / (run.total_s - run.probe_s), "settle_steps": steps,
                         "settle_decisions": decisions, "worst_overshoot": worst,
                         "slower_than_uniform": int(run.total_s > uniform.total_s * (1 + 1e-12)),
                         "of_late_oracle": late_total / (run.total_s - run.probe_s),
                         "probe_share": run.probe_s / run.total_s,
                         "with_start_up": oracle_total / run.total_s})
    return rows


def _task(args: tuple[Scenario, list[int], list[str]]) -> list[dict[str, Any]]:
    return run_seeds(*args)


# ---------------------------------------------------------------------------------------------- reports

def _fmt(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def write_csv(rows: list[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """``rows`` as CSV of ``columns``: floats to six digits, None empty."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{r[k]:.6g}" if isinstance(r[k], float) else "" if r[k] is None else r[k]) for k in columns})
    return out.getvalue()


def _median(values: list[float | None]) -> float | None:
    """Median with None as 'never' (infinity); None when the median itself is never."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def _within(row: dict[str, Any], decisions: int) -> bool:
    """Every change of the seed settled, after at most ``decisions`` decisions on average."""
    return row["settle_decisions"] is not None and row["settle_decisions"] <= decisions


def summarize(rows: list[dict[str, Any]], suite: list[Scenario], policies: list[str]) -> list[dict[str, Any]]:
    """One line per scenario x policy, then the suite-wide averages per policy."""
    lines = []
    for sc in suite:
        for policy in policies:
            mine = [r for r in rows if r["scenario"] == sc.name and r["policy"] == policy]
            if not mine:
                continue
            f = np.asarray([r["fraction_of_oracle"] for r in mine])
            lines.append({"scenario": sc.name, "policy": policy, "seeds": len(mine), "mean": float(f.mean()),
                          "min": float(f.min()), "p10": float(np.percentile(f, 10)),
                          "settle_steps": _median([r["settle_steps"] for r in mine]),
                          "settle_decisions": _median([r["settle_decisions"] for r in mine]),
                          "never": sum(r["settle_steps"] is None for r in mine) / len(mine),
                          "overshoot": _median([r["worst_overshoot"] for r in mine]),
                          "slower": sum(r["slower_than_uniform"] for r in mine) / len(mine),
                          "late": statistics.fmean(r["of_late_oracle"] for r in mine),
                          "settled2": sum(_within(r, 2) for r in mine) / len(mine),
                          "probe": statistics.fmean(r["probe_share"] for r in mine),
                          "with_start_up": statistics.fmean(r["with_start_up"] for r in mine)})
    for policy in policies:
        mine = [ln for ln in lines if ln["policy"] == policy]
        if mine:
            lines.append({"scenario": "**suite average**", "policy": policy, "seeds": sum(m["seeds"] for m in mine),
                          **{k: statistics.fmean(m[k] for m in mine)
                             for k in ("mean", "min", "p10", "never", "slower", "probe", "with_start_up", "late")},
                          "settled2": sum(m["settled2"] * m["seeds"] for m in mine) / sum(m["seeds"] for m in mine),
                          "settle_steps": None, "settle_decisions": None, "overshoot": None})
    return lines


def write_md(lines: list[dict[str, Any]], suite: list[Scenario], seconds: float, command: str) -> str:
    out = ["# Scenario benchmark", "",
           f"`{command}`: {len(suite)} scenarios, {seconds:.0f} s on {os.cpu_count()} CPUs.", "",
           "fraction: oracle's total time / the policy's over the training steps (common random numbers), its mean, "
           "minimum and 10th percentile over seeds. settle: medians over seeds of the steps and decisions a "
           f"policy needs after each change of the true speeds to come within {SETTLED:.0%} of the expected step "
           "time of the oracle's split, noise and CFS quantisation included ('never': some change never settled, counted as infinite); never: share of "
           "seeds with such a change. overshoot: median over seeds of the largest gap to the oracle after "
           "settling. slower: share of seeds slower than uniform (the start-up pass included). start-up: the share "
           "of the policy's time in the start-up pass every policy runs (the memory probe, which dynamic also times); "
           "with start-up: the mean fraction with that pass counted (the oracle runs none). of late oracle: the "
           "mean of the same ratio against an oracle that learns of every change one step late (the best a "
           "controller that measures can do). within 2: share of seeds whose every change settled after at most "
           "two decisions on average.", "",
           "| scenario | policy | seeds | fraction mean | min | p10 | of late oracle | settle steps | "
           "settle decisions | within 2 | never | overshoot | slower than uniform | start-up | with start-up |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    never = "never"
    for ln in lines:
        avg = ln["scenario"].startswith("**")
        out.append(f"| {ln['scenario']} | {ln['policy']} | {ln['seeds']} | {ln['mean']:.3f} | {ln['min']:.3f} | "
                   f"{ln['p10']:.3f} | {ln['late']:.3f} | {'' if avg else _fmt(ln['settle_steps']) or never} | "
                   f"{'' if avg else _fmt(ln['settle_decisions']) or never} | {ln['settled2']:.1%} | {ln['never']:.0%} | "
                   f"{'' if avg else _fmt(ln['overshoot']) or '-'} | {ln['slower']:.0%} | {ln['probe']:.1%} | "
                   f"{ln['with_start_up']:.3f} |")
    out += ["", "## Scenarios", "", "| scenario | speeds | workers | B | steps | seeds | what it tests |", "|---|---|---|---|---|---|---|"]
    for sc in suite:
        out.append(f"| {sc.name} | {describe(sc)} | {sc.workers} | {sc.global_batch} | {sc.steps} | {sc.seeds} | "
                   f"{sc.note} |")
    return "\n".join(out) + "\n"


def prepare(out: Path | str, suite: list[Any], seeds: int | None, jobs: int | None) -> tuple[Path, int]:
    """``--seeds`` (every scenario's, if given), the ``--out`` folder (made) and ``--jobs`` (default:
    the CPUs, at most 2), each checked: a bad one is a UserError naming it."""
    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds {seeds}: must be at least 1")
    for sc in suite:
        sc.seeds = seeds if seeds is not None else sc.seeds
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: not a folder")
    jobs = jobs if jobs is not None else min(2, os.cpu_count() or 1)
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    return out, jobs


def parallel(task: Any, tasks: list[Any], jobs: int) -> list[Any]:
    """``task`` of every one of ``tasks``, in order, on ``jobs`` forked processes (here when one)."""
    if jobs > 1 and len(tasks) > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(task, tasks, chunksize=1)
    return [task(t) for t in tasks]


def run_suite(out: Path, scenarios: str | Path | None = None, policies: Sequence[str] | None = None,
              seeds: int | None = None, jobs: int | None = None, command: str = "omnilearn simulate --scenarios"
              ) -> dict[str, Any]:
    """Run the suite (``scenarios``: a file, None for the default) into ``out``: ``scenarios.csv`` and
    ``scenarios.md``. ``jobs``: worker processes (default: the CPUs, at most 2; 1 runs here)."""
    t0 = time.perf_counter()
    chosen = check_policies(list(policies) if policies is not None else list(DEFAULT_POLICIES))
    suite = load_suite(scenarios)
    out, jobs = prepare(out, suite, seeds, jobs)
    # The slowest tasks (most workers x steps) first, so two processes finish together.
    tasks = [(sc, list(range(s, min(s + CHUNK, sc.seeds))), chosen) for sc in suite for s in range(0, sc.seeds, CHUNK)]
    tasks.sort(key=lambda t: -t[0].workers * t[0].steps * len(t[1]))
    parts = parallel(_task, tasks, jobs)
    order = {sc.name: i for i, sc in enumerate(suite)}
    rank = {p: i for i, p in enumerate(chosen)}
    rows = sorted((r for part in parts for r in part), key=lambda r: (order[r["scenario"]], rank[r["policy"]], r["seed"]))
    seconds = time.perf_counter() - t0
    lines = summarize(rows, suite, chosen)
    write_atomic(out / "scenarios.csv", write_csv(rows))
    write_atomic(out / "scenarios.md", write_md(lines, suite, seconds, command))
    return {"rows": rows, "lines": lines, "seconds": seconds, "scenarios": len(suite)}
