"""``omnilearn simulate --asp-scenarios [FILE] --out DIR``: ASP's policies against ground truth.

Every scenario trains a problem whose optimum is known (:mod:`.asp_problems`) on simulated workers
(:mod:`.asp_world`: the true speeds of :mod:`.truth`, the BSP scenarios' levels, schedules and
traces), through the real server update rule (:mod:`omnilearn.train.asp_update`) and, for
``dynamic``, the real controller (:mod:`omnilearn.control.asp`), for every seed and policy. Beside
them runs the **delay-free reference**: one sequential learner at the equal split's samples a
second, with the same rule and batch ``B / n``; what it cannot show is the cost of delay.

Per scenario, seed and policy (``DIR/asp_scenarios.csv``):

- ``loss_at_equal_time``: the excess loss ``L − L*`` at the time the first of the seed's runs (the
  policies' and the reference's) ended; ``reference_loss`` the reference's then.
- ``time_to_target_s``: the first time the excess loss reached the scenario's target, the
  reference's median excess loss at ``target`` of its run (empty: never); ``reference_time_to_target_s``.

**best-fixed** (asked for by name: ``--policies uniform dynamic best-fixed``) is a yardstick, not a
controller: it knows the true shares. It tries every split of a family
(:func:`fixed_family`: the fast worker's batch times each worker's share over the fastest's to a
power, uniform among them, and ``static``'s split) on :data:`SELECTION_SEEDS` seeds of their own,
keeps the one quickest to the target, and runs it on the benchmark's seeds. What it reaches is the
most any fixed split of the family gives; where ``dynamic`` is near it, no re-splitting of that kind
can gain more.

``DIR/asp_scenarios.md`` gives, per scenario and policy, the mean time to target over the seeds that
reached it, the paired ratio of each policy's time to ``uniform``'s (mean and standard error), the
cost of delay (uniform's time over the reference's, less one) and the mean loss at equal time.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnilearn.config.sections import ADAMW_BETA2, ASP_PUSHES, ASP_SECOND_MOMENTS, AspConfig
from omnilearn.control.asp import AsyncController
from omnilearn.control.policies import Bounds, from_fastest, split
from omnilearn.errors import UserError
from omnilearn.files import CONFIG_DIR, write_atomic
from omnilearn.simulate.asp_problems import PROBLEMS, make_problem
from omnilearn.simulate.asp_world import Trace, run_async, run_reference
from omnilearn.simulate.scenarios import parallel, prepare, read_suite, write_csv
from omnilearn.simulate.truth import Scenario, World, describe, timeline
from omnilearn.train.asp_update import UPDATES, Hyper, SampleTime, ScaledGradient, UpdateRule

SUITE_FILE = CONFIG_DIR / "asp_scenarios.yaml"
POLICIES = ("uniform", "dynamic", "static", "best-fixed")
DEFAULT_POLICIES = ("uniform", "dynamic", "static")
SELECTION_SEEDS = 20
"""best-fixed's seeds to choose its split on (apart from the benchmark's)."""
FAST_BATCHES = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
"""best-fixed's family: the fastest worker's batch, in units of ``b_ref = B / n``."""
SHARE_POWERS = (0.0, 0.5, 1.0, 1.5, 2.0)
"""... and the power of each worker's share over the fastest's that scales the others' (0: equal
batches; 1: equal compute times, equal update rates)."""
COLUMNS = ("scenario", "policy", "update", "push", "seed", "loss_at_equal_time", "reference_loss",
           "time_to_target_s", "reference_time_to_target_s")


@dataclass
class AspScenario(Scenario):
    """One scenario of the ASP suite: the BSP scenario's speeds, and the problem and server it trains."""

    problem: str = "nqm"
    """nqm (the noisy quadratic model) | logistic (logistic regression on fixed synthetic data)."""
    gradient_noise: float = 1.0
    """nqm: ν, the noise covariance ν H / b (1: Zhang et al.'s)."""
    optimizer: str = "sgd"
    """sgd (with ``momentum``) | adamw."""
    lr: float = 0.05
    momentum: float = 0.9
    update: str = "sample-time"
    """The server's update rule: sample-time | scaled-gradient."""
    push: str = "gradients"
    """gradients | parameters (each worker steps its own optimiser; the server keeps the last writer's)."""
    batch_tolerance: float | None = None
    """The step's cap in units (``asp.batch_tolerance``; None: ``delay_tolerance``)."""
    delay_correction: float = 0.0
    """λ₀ of a late gradient's first-order correction (``asp.delay_correction``; 0: none)."""
    second_moment: str = AspConfig.second_moment
    """adamw: what a push brings to the second moment (``asp.second_moment``, and its default): push |
    reference."""
    delay_tolerance: float = 1.0
    """ρ of the staleness factor a(τ) = ρ / (ρ + τ) (.inf: none)."""
    server_ms: float = 0.0
    """The server's milliseconds per update applied (pushes queue behind it)."""
    target: float = 0.3
    """The target loss: the reference's median excess loss at this share of its run (at least 1.5
    times its median at the end)."""

    def check(self, where: str) -> None:
        super().check(where)
        key = f"{where}.{self.name}"
        choices = (("problem", PROBLEMS), ("optimizer", ("sgd", "adamw")), ("update", UPDATES), ("push", ASP_PUSHES),
                   ("second_moment", ASP_SECOND_MOMENTS))
        for attr, allowed in choices:
            if getattr(self, attr) not in allowed:
                raise UserError(f"{key}.{attr}: must be one of {', '.join(allowed)}, not {getattr(self, attr)!r}")
        if self.batch_tolerance is not None and not self.batch_tolerance > 0:
            raise UserError(f"{key}.batch_tolerance: must be positive (or null), not {self.batch_tolerance}")
        if not self.delay_correction >= 0:
            raise UserError(f"{key}.delay_correction: must be at least 0, not {self.delay_correction}")
        if not self.lr > 0 or not 0 <= self.momentum < 1 or not self.delay_tolerance > 0:
            raise UserError(f"{key}: needs lr > 0, 0 <= momentum < 1 and delay_tolerance > 0")
        if not 0 < self.target < 1 or self.server_ms < 0:
            raise UserError(f"{key}: needs 0 < target < 1 and server_ms >= 0")
        if self.push == "parameters" and self.update != "sample-time":
            raise UserError(f"{key}: push parameters steps each worker's own optimiser with update sample-time")


def load_suite(path: str | Path | None = None) -> list[AspScenario]:
    """The scenarios of ``path`` (default ``configs/asp_scenarios.yaml``): ``scenarios`` (name ->
    fields) and optional ``defaults``."""
    return read_suite(Path(path) if path is not None else SUITE_FILE, AspScenario, "ASP scenario file")


def rule_maker(sc: AspScenario):  # noqa: ANN201 - a MakeRule
    """The update rule of ``sc`` for a tensor of parameters (its rows the seeds); under parameter
    pushes, the workers' own (no staleness, no cap: :func:`~omnilearn.train.asp_update.local_rule`)."""
    tolerance = math.inf if sc.push == "parameters" else sc.delay_tolerance
    batch = math.inf if sc.push == "parameters" else sc.batch_tolerance
    hyper = Hyper(sc.optimizer, sc.momentum, 0.0, betas=(sc.momentum, ADAMW_BETA2), delay_tolerance=tolerance,
                  batch_tolerance=batch, correction=sc.delay_correction, second_moment=sc.second_moment)

    def make(theta: torch.Tensor) -> UpdateRule:
        if sc.update == "sample-time":
            return SampleTime(hyper, tuple(theta.shape), theta.dtype)
        param = torch.nn.Parameter(theta)  # the same storage: the optimiser moves theta
        param.grad = torch.zeros_like(theta)
        opt = (torch.optim.AdamW([param], lr=sc.lr, betas=hyper.betas, weight_decay=0.0) if sc.optimizer == "adamw"
               else torch.optim.SGD([param], lr=sc.lr, momentum=sc.momentum))
        return ScaledGradient(opt, param.grad, 1.0, False)

    return make


def _time_to(trace: Trace, target: float) -> np.ndarray:
    """Each seed's first time at or under ``target`` (NaN: never)."""
    hit = trace.loss <= target
    first = np.where(hit.any(axis=0), hit.argmax(axis=0), -1)
    return np.asarray([trace.time[i, s] if i >= 0 else math.nan for s, i in enumerate(first)])


def _loss_at(trace: Trace, when: np.ndarray) -> np.ndarray:
    """Each seed's excess loss at time ``when[s]`` (the last update at or before it)."""
    out = np.empty(len(when))
    for s in range(len(when)):
        t = trace.time[:, s]
        i = np.searchsorted(t[~np.isnan(t)], when[s], side="right") - 1
        out[s] = trace.loss[max(i, 0), s]
    return out


def target_loss(ref: Trace, sc: AspScenario) -> float:
    """The scenario's target: the delay-free reference's median excess loss at ``sc.target`` of its run,
    and above its floor (1.5 times its median at the end): a target its noise reaches by chance would time
    luck, not progress."""
    return max(float(np.median(_loss_at(ref, ref.end * sc.target))), 1.5 * float(np.median(ref.loss[-1])))


def fixed_family(shares: Sequence[float], b_ref: float, bounds: Bounds, total: int) -> list[list[int]]:
    """best-fixed's candidates: ``b_i = f (s_i / max s) ** p`` for every ``f`` of :data:`FAST_BATCHES`
    (times ``b_ref``) and ``p`` of :data:`SHARE_POWERS`, rounded into the bounds, summing to at most
    ``total``; each split once."""
    raw = np.rint(from_fastest(np.asarray(shares, float), [f * b_ref for f in FAST_BATCHES], SHARE_POWERS))
    out: list[list[int]] = []
    for row in np.clip(raw, bounds.min_batch, np.asarray(bounds.max_batch)).astype(int).tolist():
        if sum(row) <= total and row not in out:
            out.append(row)
    return out


def best_fixed(world: World, problem: object, make: Any, sc: AspScenario, target: float, seed: int,
               bounds: Bounds) -> tuple[list[int], int]:
    """The split of :func:`fixed_family` and ``static``'s (on the first regime's true shares) whose seeds of its own reach
    ``target`` the soonest (the fewest that never do first), all tried in one run; and how many were tried."""
    assert sc.global_batch is not None
    family = fixed_family(world.line.shares[0], sc.global_batch / sc.workers, bounds, sc.global_batch)
    static = split(list(world.line.shares[0]), sc.global_batch, bounds)  # equal update rates at the sum B
    family += [static] if static not in family else []
    k = SELECTION_SEEDS
    first = np.repeat(np.asarray(family, int), k, axis=0)
    trace = run_async(world, len(first), problem, make, sc.lr, seed + 7919, "uniform", sc.push, sc.server_ms,
                      first=first)
    reached = _time_to(trace, target).reshape(len(family), k)
    never = np.isnan(reached).mean(axis=1)
    mean = np.where(np.isnan(reached), trace.end.reshape(len(family), k), reached).mean(axis=1)
    best = min(range(len(family)), key=lambda i: (never[i], mean[i]))
    return family[best], len(family)


def run_scenario(sc: AspScenario, policies: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every policy on every seed of ``sc`` (the seeds at once); the rows, and what the runs did."""
    torch.set_num_threads(1)
    line = timeline(sc, "asp scenarios")
    world = World(sc, line, 0)
    problem = make_problem(sc.problem, sc.gradient_noise)
    make = rule_maker(sc)
    seeds, seed = sc.seeds, 1 + sum(map(ord, sc.name))
    assert sc.global_batch is not None
    ref = run_reference(world, seeds, problem, make, sc.lr, seed)
    target = target_loss(ref, sc)
    if not target < float(np.median(ref.loss[0])):
        raise UserError(f"ASP scenario {sc.name}: its target ({target:.3g}) is not below the delay-free reference's "
                        f"loss after its first update ({float(np.median(ref.loss[0])):.3g}): the step makes no "
                        f"progress over the run (lower its lr)")
    bounds = Bounds.make(sc.workers, sc.min_batch, sc.max_batch, sc.global_batch)

    def controller() -> AsyncController:
        return AsyncController(sc.global_batch, bounds, sc.delay_tolerance, server_s=sc.server_ms / 1e3,
                               parameters=sc.push == "parameters", batch_tolerance=sc.batch_tolerance)

    chosen: dict[str, Any] = {}
    if "best-fixed" in policies:
        fixed, tried = best_fixed(world, problem, make, sc, target, seed, bounds)
        chosen = {"first": np.tile(np.asarray(fixed, int), (seeds, 1))}
        fixed_info = {"tried": tried}
    traces = {p: run_async(world, seeds, problem, make, sc.lr, seed, p, sc.push, sc.server_ms,
                           controller if p == "dynamic" else None, **(chosen if p == "best-fixed" else {}))
              for p in policies}
    equal = np.minimum.reduce([ref.end, *[t.end for t in traces.values()]])
    ref_loss, ref_time = _loss_at(ref, equal), _time_to(ref, target)
    rows = []
    for p, tr in traces.items():
        loss, ttt = _loss_at(tr, equal), _time_to(tr, target)
        for s in range(seeds):
            rows.append({"scenario": sc.name, "policy": p, "update": sc.update, "push": sc.push, "seed": s,
                         "loss_at_equal_time": float(loss[s]), "reference_loss": float(ref_loss[s]),
                         "time_to_target_s": None if math.isnan(ttt[s]) else float(ttt[s]),
                         "reference_time_to_target_s": None if math.isnan(ref_time[s]) else float(ref_time[s])})
    info = {p: {"batch": tr.batches[0], "staleness": float(np.mean(tr.staleness)), "holds": tr.holds}
            for p, tr in traces.items()}
    if chosen:
        info["best-fixed"]["holds"] = {"splits tried": fixed_info["tried"]}
    return rows, {"target": target, "runs": info}


def _task(args: tuple[AspScenario, list[str]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return run_scenario(*args)


# ---------------------------------------------------------------------------------------------- reports

def _mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def summarize(rows: list[dict[str, Any]], suite: list[AspScenario], policies: list[str]) -> list[dict[str, Any]]:
    """One line per scenario and policy: time to target (mean over the seeds that reached it, the
    share that never did), its paired ratio to ``uniform``'s (mean and standard error over the seeds
    both reached), the cost of delay (the policy's time over the reference's, less one) and the
    median loss at equal time beside the reference's."""
    lines = []
    for sc in suite:
        mine = {p: [r for r in rows if r["scenario"] == sc.name and r["policy"] == p] for p in policies}
        base = {r["seed"]: r["time_to_target_s"] for r in mine.get("uniform", [])}
        for p in policies:
            runs = mine[p]
            if not runs:
                continue
            reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
            ratios = [r["time_to_target_s"] / base[r["seed"]] for r in runs
                      if r["time_to_target_s"] is not None and base.get(r["seed"])]
            costs = [r["time_to_target_s"] / r["reference_time_to_target_s"] - 1 for r in runs
                     if r["time_to_target_s"] is not None and r["reference_time_to_target_s"]]
            ratio, se = _mean_se(ratios)
            lines.append({"scenario": sc.name, "policy": p, "seeds": len(runs),
                          "time_to_target_s": statistics.fmean(reached) if reached else None,
                          "never": 1 - len(reached) / len(runs), "ratio": ratio, "ratio_se": se,
                          "delay_cost": statistics.fmean(costs) if costs else None,
                          "loss": statistics.median(r["loss_at_equal_time"] for r in runs),
                          "reference_loss": statistics.median(r["reference_loss"] for r in runs)})
    return lines


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def write_md(lines: list[dict[str, Any]], suite: list[AspScenario], info: dict[str, Any], seconds: float,
             command: str) -> str:
    out = ["# ASP scenario benchmark", "",
           f"`{command}`: {len(suite)} scenarios, {seconds:.0f} s on {os.cpu_count()} CPUs.", "",
           "time to target: seconds of the simulated clock until the excess loss first reached the scenario's "
           "target (mean over the seeds that reached it); never: the share of seeds that did not. vs uniform: "
           "the paired ratio of the policy's time to uniform's, mean ± standard error over the seeds both reached. "
           "delay cost: the policy's time over the delay-free reference's, less one. loss: the median excess loss "
           "at equal time (when the first of a seed's runs ended), beside the reference's. Final split: seed 0's.",
           "", "| scenario | policy | time to target (s) | never | vs uniform | delay cost | loss | reference loss "
           "| final split | holds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ln in lines:
        run = info[ln["scenario"]]["runs"][ln["policy"]]
        split = run["batch"] if len(run["batch"]) <= 8 else f"{len(run['batch'])} workers, {min(run['batch'])}-{max(run['batch'])}"
        holds = ", ".join(f"{k} {v}" for k, v in sorted(run["holds"].items())) or "-"
        vs = "-" if ln["ratio"] is None else f"{ln['ratio']:.3f} ± {ln['ratio_se']:.3f}"
        out.append(f"| {ln['scenario']} | {ln['policy']} | {_f(ln['time_to_target_s'], '.3f')} | {ln['never']:.0%} | "
                   f"{vs} | {_f(ln['delay_cost'], '.1%')} | {ln['loss']:.3g} | {ln['reference_loss']:.3g} | {split} | "
                   f"{holds} |")
    out += ["", "## Scenarios", "", "| scenario | speeds | workers | B | problem | optimizer | lr | update | push | "
            "delay tolerance | target | what it tests |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sc in suite:
        out.append(f"| {sc.name} | {describe(sc)} | {sc.workers} | {sc.global_batch} | {sc.problem} | {sc.optimizer}"
                   f"{f' (momentum {sc.momentum:g})' if sc.optimizer == 'sgd' else ''} | {sc.lr:g} | {sc.update} | "
                   f"{sc.push} | {sc.delay_tolerance:g} | {info[sc.name]['target']:.3g} | {sc.note} |")
    return "\n".join(out) + "\n"


def run_suite(out: Path, scenarios: str | Path | None = None, policies: Sequence[str] | None = None,
              seeds: int | None = None, jobs: int | None = None,
              command: str = "omnilearn simulate --asp-scenarios") -> dict[str, Any]:
    """Run the suite (``scenarios``: a file, None for the default) into ``out``: ``asp_scenarios.csv``
    and ``asp_scenarios.md``. ``jobs``: processes (default: the CPUs, at most 2)."""
    t0 = time.perf_counter()
    chosen = list(dict.fromkeys(policies)) if policies is not None else list(DEFAULT_POLICIES)
    bad = [p for p in chosen if p not in POLICIES]
    if bad or not chosen:
        raise UserError(f"--policies: {'unknown policy ' + repr(bad[0]) if bad else 'name at least one'} "
                        f"(known: {', '.join(POLICIES)})")
    if "uniform" not in chosen:
        chosen.insert(0, "uniform")  # every ratio is to it
    suite = load_suite(scenarios)
    out, jobs = prepare(out, suite, seeds, jobs)
    order = sorted(suite, key=lambda sc: -sc.workers * sc.steps * sc.global_batch)  # the longest first
    parts = dict(zip([sc.name for sc in order], parallel(_task, [(sc, chosen) for sc in order], jobs), strict=True))
    rows = [r for sc in suite for r in parts[sc.name][0]]
    info = {name: part[1] for name, part in parts.items()}
    seconds = time.perf_counter() - t0
    lines = summarize(rows, suite, chosen)
    write_atomic(out / "asp_scenarios.csv", write_csv(rows, COLUMNS))
    write_atomic(out / "asp_scenarios.md", write_md(lines, suite, info, seconds, command))
    return {"rows": rows, "lines": lines, "seconds": seconds, "scenarios": len(suite)}
