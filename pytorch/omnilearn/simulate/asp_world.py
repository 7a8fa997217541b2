"""An asynchronous cluster on a simulated clock: simulated workers, the real server update and controller.

One :func:`run_async` call trains ``S`` seeds of one scenario under one policy at once, a row of
every tensor per seed. Each worker of each seed:

1. pulls the server's parameters (and their version) when its last push has been applied;
2. computes a gradient of its batch ``b`` at them, for as long as the scenario's true model of its
   speed says (:class:`~omnilearn.simulate.truth.World`'s work over its share, with its noise and,
   under a CFS quota, the period's phase), plus ``sync_ms`` of pull and push;
3. pushes it. The server takes pushes in the order they arrive, one at a time, each for
   ``server_ms``; the push is applied with its staleness (updates applied since its pull) by the
   real update rule (:mod:`omnilearn.train.asp_update`), or, under ``push: parameters``, the worker
   steps its own optimiser (the same rule, at staleness 0) and the server keeps its parameters.

The controller (``dynamic``: :class:`~omnilearn.control.asp.AsyncController`, one per seed) sees
what the real server sees of every push: the worker, its batch, its compute time, the time since
its last push was applied, and the staleness; its new split applies to each worker's next step.
``static`` splits by the true shares (update rates made equal, the paper's aim); ``uniform`` splits
equally; a run given ``first`` holds that split, one per row (the benchmark's ``best-fixed``
searches fixed splits in one run this way). A split may sum to less than the global batch, as the
controller's may; the global batch is the most the workers hold.

The level (or trace segment) in force follows the samples applied, as the real server's schedule
follows its epochs: a scenario of ``steps`` steps of ``B`` samples, epochs of ``steps_per_epoch``.

:func:`run_reference` is the delay-free reference: one sequential learner of batch ``B / n`` at the
samples per second of the equal split (the fluid model of the level in force, each worker's cycle its
compute and ``sync_ms``), with the same rule: it processes the samples the equal split's workers do,
and what it lacks is their delay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from omnilearn.control.asp import AsyncController
from omnilearn.control.policies import Bounds, split, uniform
from omnilearn.simulate.truth import World, cfs_time
from omnilearn.train.asp_update import SampleTime, UpdateRule

MakeRule = Callable[[torch.Tensor], UpdateRule]
"""Builds the update rule for the parameters it is given (rows of seeds, or of seeds x workers)."""


@dataclass
class Trace:
    """Every seed's excess loss after each of its updates, and when (seconds of its clock)."""

    time: np.ndarray  # (updates, S); NaN after a seed's last update
    loss: np.ndarray
    end: np.ndarray  # (S,): each seed's end of training
    batches: list[list[int]]  # each seed's final split
    staleness: np.ndarray  # (S,): mean staleness of the updates
    holds: dict[str, int]


def run_reference(world: World, seeds: int, problem: object, make_rule: MakeRule, lr: float, seed: int) -> Trace:
    """The delay-free reference (see the module)."""
    sc, line = world.sc, world.line
    n, B = sc.workers, sc.global_batch
    assert B is not None
    b = B / n
    gen = torch.Generator().manual_seed(seed)
    theta = problem.start(seeds, gen)
    rule = make_rule(theta)
    # the equal split's samples per second of each regime: every worker's b samples over its own cycle
    # (compute, pull and push), so that the reference differs from the cluster by the delay alone
    sync = sc.sync_ms / 1e3
    rates = [float(sum(b / (world.fluid(r, np.full(n, b)) + sync))) for r in range(len(line.starts))]
    updates = int(np.ceil(sc.steps * B / b))
    times, losses, clock = np.empty((updates, seeds)), np.empty((updates, seeds)), 0.0
    batch = torch.full((seeds, 1), b, dtype=theta.dtype)
    for u in range(updates):
        regime = line.regime(int(u * b // B))
        clock += b / rates[regime]
        rule.apply(theta, problem.gradient(theta, batch, gen), 1.0, 0.0, lr)
        times[u], losses[u] = clock, problem.excess(theta).numpy()
    return Trace(times, losses, np.full(seeds, clock), [[int(b)] * n] * seeds, np.zeros(seeds), {})


def _initial(policy: str, world: World, bounds: Bounds) -> list[int]:
    sc = world.sc
    assert sc.global_batch is not None
    if policy == "static":  # the true shares: equal compute times, equal update rates
        return split(list(world.line.shares[0]), sc.global_batch, bounds)
    return uniform(sc.workers, sc.global_batch, bounds)


class AsyncRun:
    """One policy's run of ``seeds`` seeds of ``world``'s scenario (see the module): the server's state
    and every worker's, a row per seed. :meth:`event` takes one push on every seed still training."""

    def __init__(self, world: World, seeds: int, problem: object, make_rule: MakeRule, lr: float, seed: int,
                 policy: str, push: str, server_ms: float, controller: Callable[[], AsyncController] | None,
                 first: np.ndarray | None = None) -> None:
        sc = world.sc
        n, B = sc.workers, sc.global_batch
        assert B is not None
        self.world, self.problem, self.lr, self.seeds, self.n = world, problem, lr, seeds, n
        self.b_ref, self.total, self.sync, self.server_s = B / n, sc.steps * B, sc.sync_ms / 1e3, server_ms / 1e3
        self.rng = np.random.default_rng([seed, n, 7])
        self.gen = torch.Generator().manual_seed(seed)
        self.theta = problem.start(seeds, self.gen)
        d = self.theta.shape[1]
        self.server_rule = make_rule(self.theta) if push == "gradients" else None
        self.local_rule = make_rule(torch.zeros(seeds * n, d, dtype=self.theta.dtype)) if push == "parameters" else None
        assert self.local_rule is None or isinstance(self.local_rule, SampleTime), "parameter pushes step with sample-time"
        self.pulled = self.theta[:, None, :].repeat(1, n, 1)  # (S, n, d): what each worker pulled
        self.pulled_version = np.zeros((seeds, n), int)
        self.clock = np.zeros(seeds)  # the optimiser's time: the step of every update applied, in units
        self.pulled_clock = np.zeros((seeds, n))
        if first is None:
            first = np.tile(np.asarray(_initial(policy, world, Bounds.make(n, sc.min_batch, sc.max_batch, B)), int),
                            (seeds, 1))
        assert first.shape == (seeds, n), "a split per row"
        self.batch = np.array(first, dtype=int)  # (S, n): each worker's current batch
        self.ctls = [controller() for _ in range(seeds)] if controller is not None else None
        self.samples = np.zeros(seeds, int)
        self.server_free = np.zeros(seeds)
        self.applied_at = np.zeros((seeds, n))  # when each worker's last push was applied (its pull)
        self.compute = np.zeros((seeds, n))
        self.taken = np.zeros((seeds, n), int)
        self.stalls = _stalls(world)
        starts = world.line.starts
        self.regimes = Regimes(np.asarray(starts), np.asarray([world.fixed(r) for r in range(len(starts))]))
        for i in range(n):
            self.compute[:, i] = self._times(i, np.arange(seeds))
        self.arrive = self.compute + self.sync
        cap = int(np.ceil(self.total / max(min(sc.min_batch, int(self.batch.min())), 1))) + n
        self.times, self.losses = np.full((cap, seeds), np.nan), np.full((cap, seeds), np.nan)
        self.stale_sum = np.zeros(seeds)
        self.version = self.events = 0

    def _times(self, worker: int, rows: np.ndarray) -> np.ndarray:
        return _step_times(self.world, self.regimes, self.rng, self.batch, self.samples, worker, rows, self.stalls,
                           self.taken)

    def event(self) -> bool:
        """The next push of every seed still training, applied; False when every seed is done."""
        act = np.flatnonzero(self.samples < self.total)
        if not len(act):
            return False
        w = np.argmin(self.arrive[act], axis=1)
        idle = self.batch[act, w] == 0
        if idle.any():  # computed before the controller idled its worker: dropped; the worker waits to be woken
            self.arrive[act[idle], w[idle]] = np.inf
            return True
        t_app = np.maximum(self.arrive[act, w], self.server_free[act]) + self.server_s
        self.server_free[act] = t_app
        b = self.batch[act, w]
        index, who = torch.from_numpy(act), torch.from_numpy(w)
        bt = torch.from_numpy(b.astype(np.float64))[:, None]
        grad = self.problem.gradient(self.pulled[index, who], bt, self.gen)
        late = self.clock[act] - self.pulled_clock[act, w]  # staleness in the optimiser's time (b_ref units)
        self._apply(act, w, grad, bt / self.b_ref, late)
        self.version += 1
        self.samples[act] += b
        self.clock[act] += self._elapsed(b / self.b_ref)
        self.stale_sum[act] += self.version - 1 - self.pulled_version[act, w]
        self.times[self.events, act], self.losses[self.events, act] = t_app, self.problem.excess(self.theta[index]).numpy()
        self.events += 1
        self.pulled[index, who] = self.theta[index]
        self.pulled_version[act, w] = self.version
        self.pulled_clock[act, w] = self.clock[act]
        self._control(act, w, b, t_app - self.applied_at[act, w], t_app)
        self.applied_at[act, w] = t_app
        times = np.empty(len(act))
        for i in np.unique(w):  # worker by worker: the draws in the order they have always been taken
            times[w == i] = self._times(i, act[w == i])
        self.compute[act, w] = times
        self.arrive[act, w] = self.applied_at[act, w] + times + self.sync
        return True

    def _elapsed(self, kappa: np.ndarray) -> np.ndarray:
        """The optimiser's time the updates of ``kappa`` units add (the server rule's step; parameter
        pushes have no server rule and count their samples)."""
        if self.server_rule is None:
            return kappa
        return self.server_rule.elapsed(torch.from_numpy(kappa)).numpy()

    def _apply(self, act: np.ndarray, w: np.ndarray, grad: torch.Tensor, kappa: torch.Tensor, late: np.ndarray) -> None:
        index = torch.from_numpy(act)
        if self.server_rule is not None:  # every row: a seed that is done gets kappa 0, which moves nothing
            rows = self.seeds, 1
            full_grad, full_kappa = torch.zeros_like(self.theta), torch.zeros(rows, dtype=self.theta.dtype)
            full_tau = torch.zeros(rows, dtype=self.theta.dtype)
            full_grad[index], full_kappa[index], full_tau[index] = grad, kappa, torch.from_numpy(late)[:, None]
            pulled = None
            if self.server_rule.corrects:  # the rows that push nothing: their own parameters, no correction
                pulled = self.theta.clone()
                pulled[index] = self.pulled[index, torch.from_numpy(w)]
            self.server_rule.apply(self.theta, full_grad, full_kappa, full_tau, self.lr, pulled=pulled)
            return
        assert self.local_rule is not None
        local = self.pulled[index, torch.from_numpy(w)].clone()
        self.local_rule.apply(local, grad, kappa, 0.0, self.lr, rows=torch.from_numpy(act * self.n + w))
        self.theta[index] = local  # the last writer's parameters

    def _control(self, act: np.ndarray, w: np.ndarray, b: np.ndarray, cycle: np.ndarray, now: np.ndarray) -> None:
        """Each seed's push to its controller; a move that wakes an idle worker starts its compute now."""
        if self.ctls is None:
            return
        for j, s in enumerate(act):
            new = self.ctls[s].push(int(w[j]), int(b[j]), float(self.compute[s, w[j]]), float(cycle[j]))
            if new is None:
                continue
            woken = [i for i in range(self.n) if self.batch[s, i] == 0 and new[i] > 0]
            self.batch[s] = new
            for i in woken:
                self.compute[s, i] = self._times(i, np.asarray([s]))[0]
                self.applied_at[s, i] = now[j]
                self.arrive[s, i] = now[j] + self.compute[s, i] + self.sync

    def trace(self) -> Trace:
        holds: dict[str, int] = {}
        for c in self.ctls or []:
            for k, v in c.holds.items():
                holds[k] = holds.get(k, 0) + v
        times, losses = self.times[:self.events], self.losses[:self.events]
        updates = np.maximum(np.sum(~np.isnan(times), axis=0), 1)
        return Trace(times, losses, np.nanmax(times, axis=0), [list(map(int, r)) for r in self.batch],
                     self.stale_sum / updates, holds)


def run_async(world: World, seeds: int, problem: object, make_rule: MakeRule, lr: float, seed: int,
              policy: str, push: str, server_ms: float, controller: Callable[[], AsyncController] | None = None,
              first: np.ndarray | None = None) -> Trace:
    """``policy`` on ``seeds`` seeds of ``world``'s scenario (see the module); ``first``: each row's fixed
    split, ``(seeds, workers)``, in place of the policy's."""
    run = AsyncRun(world, seeds, problem, make_rule, lr, seed, policy, push, server_ms, controller, first)
    while run.event():
        pass
    return run.trace()


def _stalls(world: World) -> dict[int, list[tuple[float, float]]]:
    """Each worker's stalls in order: (where, in samples applied; seconds), a trace's share of the
    run in seconds of the equal split's fluid pace."""
    sc = world.sc
    assert sc.global_batch is not None
    b = np.full(sc.workers, sc.global_batch / sc.workers)
    pace = float(world.fluid(0, b).max()) * sc.steps  # seconds of the run at the equal split
    out: dict[int, list[tuple[float, float]]] = {}
    for step, worker, share in sorted(world.line.stalls):
        out.setdefault(worker, []).append((step * sc.global_batch, share * pace))
    return out


@dataclass(frozen=True)
class Regimes:
    """The steps each regime of the level's timeline starts at, and each regime's fixed cost per worker
    (:meth:`~omnilearn.simulate.truth.World.fixed`): read once a run, not once a step."""

    starts: np.ndarray
    fixed: np.ndarray  # (regimes, workers)


def _step_times(world: World, regimes: Regimes, rng: np.random.Generator, batch: np.ndarray, samples: np.ndarray,
                worker: int, rows: np.ndarray, stalls: dict[int, list[tuple[float, float]]], taken: np.ndarray
                ) -> np.ndarray:
    """Worker ``worker``'s compute time of its next step on ``rows`` (seeds): its true time at the
    level in force, with noise and the CFS phase, and a stall it reaches (``taken``: stalls taken so
    far, per seed and worker)."""
    sc, line = world.sc, world.line
    assert sc.global_batch is not None
    groups: list[tuple[int, slice | np.ndarray]] = [(0, slice(None))]  # a pinned level: one regime, every row
    if len(regimes.starts) > 1:
        regime = np.searchsorted(regimes.starts, samples[rows] // sc.global_batch, side="right") - 1
        groups = [(r, regime == r) for r in np.unique(regime)]
    out = np.empty(len(rows))
    for r, here in groups:
        b = batch[rows[here], worker].astype(float)
        x = b + float(regimes.fixed[r, worker])
        work = world.sample_s * x * (x / world.b0) ** (sc.exponent - 1.0)
        noise = np.exp(sc.noise * rng.standard_normal(len(b)) + sc.host_noise * rng.standard_normal(len(b)))
        share = float(line.shares[r][worker])
        if sc.cfs_period_ms is None:
            out[here] = work * noise / share
        else:
            out[here] = cfs_time(work * noise, np.full(len(b), share), sc.cfs_period_ms / 1e3, rng.random(len(b)))
    mine = stalls.get(worker, [])
    for j, (at, seconds) in enumerate(mine):
        hit = (taken[rows, worker] == j) & (samples[rows] >= at)
        out[hit] += seconds
        taken[rows[hit], worker] += 1
    return out
