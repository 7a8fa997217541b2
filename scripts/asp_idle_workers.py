"""What idling the slowest ASP workers would give, on the ASP benchmark's simulated workers.

The ASP benchmark's ``best-fixed`` family (``omnilearn.simulate.asp_scenarios.fixed_family``) gives
every worker at least the smallest batch. This script widens it: the workers below a share of the
fastest worker's are idle (they never push), the others push ``f b_ref (s_i / max s) ** p``. For each
scenario named it runs, on the benchmark's own seeds and target, ``uniform``, ``dynamic`` and every
split of the wider family, and prints each split's time to target over ``uniform``'s (paired by seed)
beside what the controller's model (``AsyncController.worth`` at the true speeds, fixed cost and cycle
overhead) predicts of it, in effective samples a second.

    python scripts/asp_idle_workers.py hl8 hl8-16 hl8-64 [--seeds 40]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from omnilearn.control.asp import AsyncController
from omnilearn.control.policies import Bounds
from omnilearn.simulate.asp_problems import make_problem
from omnilearn.simulate.asp_scenarios import _time_to, load_suite, rule_maker, target_loss
from omnilearn.simulate.asp_world import AsyncRun, run_async, run_reference
from omnilearn.simulate.truth import World, timeline

FAST = (0.25, 0.5, 0.75, 1.0, 1.5)
"""The fastest active worker's batch, in units of ``b_ref``."""
POWERS = (0.0, 1.0)
"""The power of each active worker's share over the fastest's that scales its batch."""


def run_split(world: World, sc, problem, make, seed: int, row: np.ndarray):  # noqa: ANN001, ANN201
    """``row`` fixed for the run on every seed; a worker at 0 never pushes."""
    first = np.tile(np.maximum(row, 1), (sc.seeds, 1))
    run = AsyncRun(world, sc.seeds, problem, make, sc.lr, seed, "uniform", sc.push, sc.server_ms, None, first)
    run.arrive[:, row == 0] = np.inf
    while run.event():
        pass
    return run.trace()


def model_worth(world: World, sc, row: np.ndarray) -> float:
    """The controller's ``P`` for ``row`` at the scenario's true speeds, fixed cost and overhead."""
    shares = np.asarray(world.line.shares[0], float)
    bounds = Bounds.make(sc.workers, sc.min_batch, sc.max_batch, sc.global_batch)
    ctl = AsyncController(sc.global_batch, bounds, sc.delay_tolerance, server_s=sc.server_ms / 1e3,
                          batch_tolerance=sc.batch_tolerance)
    ctl.k = float(np.mean(world.fixed(0)))
    c = world.sample_s / shares
    o = np.full(sc.workers, sc.sync_ms / 1e3 + sc.server_ms / 1e3)
    return float(ctl.worth(np.asarray([row], float), c, o)[0][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    suite = {sc.name: sc for sc in load_suite()}
    for name in args.scenarios:
        sc = suite[name]
        sc.seeds = args.seeds
        scenario(sc)


def scenario(sc) -> None:  # noqa: ANN001 - an AspScenario
    """Every split of the wider family on ``sc``, printed beside ``uniform`` and ``dynamic``."""
    world = World(sc, timeline(sc, "idle workers"), 0)
    problem, make = make_problem(sc.problem, sc.gradient_noise), rule_maker(sc)
    seed = 1 + sum(map(ord, sc.name))  # the benchmark's
    ref = run_reference(world, sc.seeds, problem, make, sc.lr, seed)
    target = target_loss(ref, sc)
    shares = np.asarray(world.line.shares[0], float)
    b_ref = sc.global_batch / sc.workers
    uniform = _time_to(run_async(world, sc.seeds, problem, make, sc.lr, seed, "uniform", sc.push, sc.server_ms),
                       target)
    p_uniform = model_worth(world, sc, np.full(sc.workers, round(b_ref)))
    delay_cost = np.nanmean(uniform) / np.nanmean(_time_to(ref, target)) - 1
    print(f"{sc.name}: {sc.workers} workers, shares {sorted(set(np.round(shares, 3).tolist()))}, uniform's delay "
          f"cost {delay_cost:.0%}, never {np.isnan(uniform).mean():.0%}")

    def report(label: str, times: np.ndarray, worth: float | None) -> None:
        both = ~np.isnan(times) & ~np.isnan(uniform)
        ratio = times[both] / uniform[both]
        se = ratio.std(ddof=1) / np.sqrt(both.sum()) if both.sum() > 1 else float("nan")
        model = "" if worth is None else f"   model P {worth / p_uniform:.2f}x uniform's"
        print(f"  {label:44s} never {np.isnan(times).mean():4.0%}  vs uniform {ratio.mean():.3f} ± {se:.3f}{model}")

    def controller() -> AsyncController:
        bounds = Bounds.make(sc.workers, sc.min_batch, sc.max_batch, sc.global_batch)
        return AsyncController(sc.global_batch, bounds, sc.delay_tolerance, server_s=sc.server_ms / 1e3,
                               batch_tolerance=sc.batch_tolerance)

    report("dynamic", _time_to(run_async(world, sc.seeds, problem, make, sc.lr, seed, "dynamic", sc.push,
                                          sc.server_ms, controller), target), None)
    seen: list[list[int]] = []
    for cut in [0.0, *sorted(set(shares))[:-1]]:
        active = shares > cut
        for f in FAST:
            for p in POWERS:
                row = np.where(active, np.maximum(np.rint(f * b_ref * (shares / shares.max()) ** p),
                                                  sc.min_batch), 0).astype(int)
                if row.tolist() in seen:
                    continue
                seen.append(row.tolist())
                label = f"{int((~active).sum())} idle, active {sorted(set(row[active].tolist()))}"
                report(label, _time_to(run_split(world, sc, problem, make, seed, row), target),
                       model_worth(world, sc, row))


if __name__ == "__main__":
    main()
