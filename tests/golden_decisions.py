"""The decisions every policy's controller takes on the scenario benchmark's simulated times (the
golden file ``tests/golden/decisions.json``): ``python tests/golden_decisions.py`` writes it,
``tests/unit/test_golden_decisions.py`` checks the controllers still take them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from omnilearn.config import ControlConfig
from omnilearn.control.controller import build_controller
from omnilearn.control.loop import ControlLoop
from omnilearn.control.policies import Bounds
from omnilearn.simulate.scenarios import World, load_suite, oracle_split, run_policy, timeline

GOLDEN = Path(__file__).parent / "golden" / "decisions.json"
POLICIES = ("uniform", "static", "paper", "dynamic", "dynamic+prior")
SEEDS = (0, 1)
SCENARIOS = ("equal", "hl4", "hl8", "demo", "staircase", "bursty", "cfs-jitter", "threads-k", "workers-32")


def decisions() -> dict[str, list[dict[str, Any]]]:
    """``scenario/policy/seed`` -> the run's ``batch_change`` records (step, reason, batch)."""
    out: dict[str, list[dict[str, Any]]] = {}
    suite = {sc.name: sc for sc in load_suite()}
    for name in SCENARIOS:
        sc = suite[name]
        line = timeline(sc, "scenarios")
        for seed in SEEDS:
            world = World(sc, line, seed)
            bounds = Bounds.make(sc.workers, sc.min_batch, sc.max_batch, sc.global_batch or 0)
            splits = [np.asarray(oracle_split(world, r, bounds), float) for r in range(len(line.starts))]
            oracle_step = np.asarray([float(world.fluid(world.regimes[s], splits[world.regimes[s]]).max())
                                      for s in range(sc.steps)])
            expected = [world.expected(r, splits[r]) for r in range(len(line.starts))]
            for policy in POLICIES:
                records: list[dict[str, Any]] = []
                run_policy(world, policy, oracle_step, expected, records)
                out[f"{name}/{policy}/{seed}"] = [{"step": r["step"], "reason": r["reason"], "batch": r["batch"]}
                                                   for r in records if r["kind"] == "batch_change"]
    return out


def asp_decisions(policy: str = "paper", seed: int = 0) -> list[dict[str, Any]]:
    """The parameter server's use of ``policy``'s controller on a stream of pushes from four workers of
    speeds 1, 1, 0.5 and 4 (times ``c_i (b + 4)`` with 5% log-normal noise), 100 pushes an epoch:
    the ``batch_change`` records it writes."""
    rng = np.random.default_rng(seed)
    n, B, speed = 4, 64, (1.0, 1.0, 0.5, 4.0)
    ctl = build_controller(ControlConfig(policy=policy), B, n, asynchronous=True)
    out: list[dict[str, Any]] = []
    loop = ControlLoop(ctl, lambda kind, **f: out.append({"kind": kind, **f}))
    loop.start(lambda: [None] * n, False, version=0, epoch=0.0)
    decided = 0
    for event in range(600):
        i, epoch = event % n, event // 100
        b = ctl.batch[i]
        t = 0.002 * (b + 4) / speed[i] * float(rng.lognormal(0.0, 0.05))
        due = epoch > decided
        if due:
            decided = epoch
        loop.push(i, b, t, due, lambda: [None] * n, i, version=event, epoch=float(epoch))
    return [{"version": r["version"], "reason": r["reason"], "batch": r["batch"]} for r in out
            if r["kind"] == "batch_change"]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({**decisions(), "asp/paper/0": asp_decisions()}, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
