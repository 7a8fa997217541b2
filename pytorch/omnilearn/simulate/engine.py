"""The replay: a BSP job stepped on a simulated clock, its controller the trainers' own.

Each step follows :class:`omnilearn.train.bsp.BSPTrainer`: the schedule's level at the step's epoch
position (or clock), the step's sizes from :class:`~omnilearn.train.sampler.GlobalBatchSampler`,
every worker's compute time from its measured model (with its measured noise, seeded), the step
lasting as long as the slowest worker plus the all-reduce and the per-step overhead, every worker's
time handed to the one control loop the trainers use (:class:`~omnilearn.control.loop.ControlLoop`),
with the controller built from the job's ``control`` section as the trainers build it: it decides
exactly as they do on the same times. ``dynamic``'s start-up probe is replayed from the models too
(its cost added to the clock). Records are written in the trainers' format
(:mod:`omnilearn.metrics`), so the run's report code summarizes and draws them; the batch changes,
which every rank of a real run writes alike, only in rank 0's file (all the report reads: with a
thousand workers, a thousand copies of every split would be gigabytes).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilearn.config import ControlConfig, JobConfig
from omnilearn.control import policies
from omnilearn.control.controller import build_controller
from omnilearn.control.loop import ControlLoop, pass_end, probe_time
from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.metrics import METRICS_DIR, metrics_path
from omnilearn.simulate.models import RunModels
from omnilearn.train.sampler import GlobalBatchSampler


@dataclass
class Replay:
    """What one simulation produced besides its records."""

    decision_ms: list[float] = field(default_factory=list)
    observe_ms: list[float] = field(default_factory=list)
    train_time_s: float = 0.0
    wall_time_s: float = 0.0
    steps: int = 0
    samples: int = 0


class Recorder:
    """Per-rank metrics lines, kept in memory and written once (a thousand ranks need no open files)."""

    def __init__(self, workers: int) -> None:
        self.lines: list[list[str]] = [[] for _ in range(workers)]

    def write(self, who: int, kind: str, **fields: Any) -> None:
        self.lines[who].append(json.dumps({"kind": kind, **fields}, separators=(",", ":")))

    def save(self, out: Path) -> None:
        (out / METRICS_DIR).mkdir(parents=True, exist_ok=True)
        for rank, lines in enumerate(self.lines):
            metrics_path(out, rank).write_text("\n".join(lines) + "\n")


def run_replay(models: RunModels, cfg: JobConfig, plan: EmulationPlan, rec: Recorder, seed: int,
               noise: float, accuracy: dict[int, dict[str, Any]] | None) -> Replay:
    """Step the job ``cfg`` (``plan``) through its epochs; ``accuracy``: the run's evaluations by epoch
    (replayed when the global batch is the run's: BSP's update does not depend on the split)."""
    t, n, measured = cfg.train, cfg.workers, models.workers
    c = policies.effective(cfg.control, t.global_batch, n)
    ctl = build_controller(cfg.control, t.global_batch, n)
    size = models.train_samples * t.global_batch // models.job.config.train.global_batch
    sampler = GlobalBatchSampler(size, t.global_batch, t.seed, drop_last=t.drop_last, min_local=c.min_batch)
    targets = plan.targets
    rng = random.Random(seed)
    out = Replay()
    state: dict[str, Any] = {"level": None, "eval": 0.0}
    clock = 0.0
    loop = ControlLoop(ctl, lambda kind, **f: rec.write(0, kind, **f), inputs=True)

    def shares(level: str) -> list[float | None]:
        return [plan.allocation(level, tg).share for tg in targets]

    def change_level(level: str, epoch: float, step: int) -> float:
        """The level's entry, as the trainer takes it; returns the seconds a stall pauses the step."""
        if level == state["level"]:
            return 0.0
        stall = 0.0
        for r, tg in enumerate(targets):
            a = plan.allocation(level, tg)
            stall = max(stall, plan.stall(level, tg) or 0.0)
            rec.write(r, "hl_change", step=step, from_level=state["level"], level=level, epoch=epoch, target=tg,
                      requested=a.to_dict(), effective=a.to_dict(), status="applied", threads=a.threads(1),
                      time=clock + state["eval"])
        state["level"] = level
        if step > 0:
            loop.level(lambda: shares(level), step=step, time=clock)
        return stall

    def timed(r: int, level: str, batch: int) -> float:
        m = models.model(r % measured, level)
        jitter = rng.lognormvariate(0.0, m.sigma * noise) if noise > 0 and m.sigma > 0 else 1.0
        return max(m.at(batch), 1e-6) * jitter

    for r, tg in enumerate(targets):
        rec.write(r, "start", rank=r, world=n, target=tg, steps_per_epoch=sampler.steps_per_epoch,
                  train_samples=size, policy=c.policy, simulated=True, time=0.0)
    change_level(plan.schedule.level_at(0), 0.0, 0)
    loop.start(lambda: shares(state["level"]), False, step=0, time=0.0)
    start_up(loop, c, t.global_batch, n, lambda r, b: timed(r, state["level"], b),
             lambda r: plan.allocation(state["level"], targets[r]).cpus is not None,
             t.epochs * sampler.steps_per_epoch)
    position, eval_time = 0.0, 0.0
    per_level: dict[str, list[tuple[str, int]]] = {}
    for epoch in range(t.epochs):
        steps = sampler.steps_per_epoch
        for step in range(steps):
            last, position = position, epoch + step / steps
            stall = sum(change_level(lv, position, out.steps) for lv in plan.stalls_passed(last, position))
            stall += change_level(plan.schedule.level_at(clock if plan.schedule.unit == "seconds" else position),
                                  position, out.steps)
            level = state["level"]
            sizes = sampler.step_sizes(step, ctl.batch)
            times = compute_draws(models, level, sizes, timed, rng, noise)
            slowest = max(times) + stall
            reduce_s = models.allreduce.seconds(n)
            clock += slowest + reduce_s + models.overhead_s
            out.steps += 1
            out.samples += sum(sizes)
            if level not in per_level:  # each rank's allocation fields at this level, as JSON text
                per_level[level] = [(json.dumps(a.share), a.threads(1))
                                    for a in (plan.allocation(level, tg) for tg in targets)]
            write_steps(rec, per_level[level], level, epoch, out.steps, sizes, times, slowest + reduce_s,
                        clock + eval_time)
            full = sum(sizes) == t.global_batch
            due = ctl.due(out.steps, step == steps - 1)
            t0 = time.perf_counter()
            loop.step(times if full and ctl.measures else None, due, t.epochs * steps - out.steps,
                      lambda: shares(state["level"]), step=out.steps, time=clock + eval_time)
            (out.decision_ms if due else out.observe_ms).append((time.perf_counter() - t0) * 1e3)
        last_epoch = epoch == t.epochs - 1
        if (epoch + 1) % t.eval_every == 0 or last_epoch:
            eval_time += models.eval_s
            state["eval"] = eval_time
            got = (accuracy or {}).get(epoch, {})
            rec.write(0, "eval", epoch=epoch, step=out.steps, accuracy=got.get("accuracy"), loss=got.get("loss"),
                      perplexity=got.get("perplexity"), elapsed_s=clock + eval_time, time=clock + eval_time)
    out.train_time_s, out.wall_time_s = clock, clock + eval_time
    for r in range(n):
        rec.write(r, "end", wall_time_s=out.wall_time_s, train_time_s=out.train_time_s, samples=out.samples,
                  steps=out.steps, batch=list(ctl.batch), level=state["level"], epochs=out.steps / sampler.steps_per_epoch,
                  out_of_time=False, time=out.wall_time_s, **loop.summary())
    return out


def compute_draws(models: RunModels, level: str, sizes: list[int], timed: Callable[[int, str, int], float],
                  rng: random.Random, noise: float) -> list[float]:
    """Every worker's compute seconds in one step: its own draw (``timed``) times the step's one draw,
    which all its workers share (:meth:`~omnilearn.simulate.models.RunModels.step_draw`)."""
    shared = models.step_draw(level, rng, noise)
    return [timed(r, level, b) * shared for r, b in enumerate(sizes)]


def start_up(loop: ControlLoop, c: ControlConfig, global_batch: int, n: int, timed: Callable[[int, int], float],
             quota: Callable[[int], bool], steps: int) -> None:
    """The start-up pass every policy runs (BSPTrainer.start_up), before the training clock: its
    steps at the two sizes, timed from the models; ``dynamic`` takes the times (its probe).
    ``quota(r)``: whether worker ``r``'s first allocation is a CPU quota; ``steps``: the job's."""
    wanted = loop.probe_sizes() is not None
    if not (c.memory_bounds or wanted):
        return
    small, large = policies.probe_sizes(global_batch, n, loop.controller.bounds)
    rounds = max(c.probe_steps, 2) if wanted else 2
    probe = [_pass(lambda b, r=r: timed(r, b), small, large, rounds, wanted, quota(r), global_batch / n, steps)
             for r in range(n)]
    if wanted:
        loop.probe(small, large, [probe_time(a) for a, _, _ in probe], [probe_time(b) for _, b, _ in probe],
                   max(sum(a) + sum(b) for a, b, _ in probe), cut_short=any(cut for _, _, cut in probe), step=0,
                   time=0.0)


def _pass(timed: Callable[[int], float], small: int, large: int, rounds: int, probe: bool, quota: bool,
          share: float, steps: int) -> tuple[list[float], list[float], bool]:
    """One worker's start-up pass as the trainers run it: ``rounds`` at each size and, where ``dynamic``
    times it (``probe``), more until :func:`~omnilearn.control.loop.pass_end` (``quota``: the worker
    is under a CPU quota; ``share``, ``steps``: the equal share and the job's steps); its round times,
    and whether it was cut short."""
    a: list[float] = []
    b: list[float] = []
    while True:
        end = pass_end(small, large, a, b, sum(a) + sum(b), rounds, quota, share, steps) if probe and a else None
        if len(a) >= rounds and (not probe or end is not None):
            return a, b, end == "cut"
        a.append(timed(small))
        b.append(timed(large))


def write_steps(rec: Recorder, fields: list[tuple[str, int]], level: str, epoch: int, step: int, sizes: list[int],
                times: list[float], step_s: float, stamp: float) -> None:
    """Every rank's step record in the trainers' format (``fields``: each rank's allocation share and
    threads as JSON text; ``step_s``: the step's compute and all-reduce, so a rank's sync time is what
    it waited). Written as text: ``json.dumps`` per record is most of a large replay."""
    head = f'{{"kind":"step","step":{step},"epoch":{epoch},"batch":'
    middle = f',"global_batch":{sum(sizes)},"compute_ms":'
    tail = f',"level":{json.dumps(level)},"cpus":'
    when = repr(round(stamp, 6))
    for r, (b, t) in enumerate(zip(sizes, times, strict=True)):
        rec.lines[r].append(f'{head}{b}{middle}{round(t * 1e3, 3)!r},"sync_ms":{round((step_s - t) * 1e3, 3)!r}'
                            f'{tail}{fields[r][0]},"threads":{fields[r][1]},"time":{when}}}')


def mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None
