"""The one synchronous step's measurements: what every BSP path does around its all-reduce.

``omnilearn run``'s workers (:mod:`omnilearn.train.bsp`), :class:`~omnilearn.torch.HeteroDataParallel`
in a user's loop and DDP's weighting hook under the frameworks (:mod:`omnilearn.torch.ddp_hook`) all
run the same step: this rank's forward and backward on its ``b_i`` samples, its gradient weighted by
``b_i / B``, one sum all-reduce of the gradients with the step's measurements in spare slots after
them (:class:`Slots`), the update. :class:`StepClock` times it the one way all of them do:

- a step's **compute time** runs from :meth:`StepClock.open` (before its batch is gathered) to
  :meth:`StepClock.fill` (the end of its backward, just before the all-reduce);
- what the step does **after** its all-reduce (the optimizer's update, a user loop's bookkeeping
  before its next step) is known only once it is done, so it rides in the **next** step's time, where
  the controller times it (``times_update``);
- on a CPU under a quota, where the controller times the quota (``times_quota``), each part counts
  at the quota's rate where that is longer (:func:`~omnilearn.train.quota_clock.quota_seconds`): a
  short part may run at a core's speed and leave the quota's wait to the all-reduce;
- the first step after a (re)start carries a one-off after its all-reduce (the optimizer's state
  allocated, hooks set up) that says nothing of speeds: a stand-in rides in its place
  (:meth:`StepClock.stand_in`: the start-up pass's median update; without one, nothing).

The start-up pass's rounds (a worker's local steps at the probe's two sizes, before step 1) are timed by
:class:`ProbeRounds`, in the trainers' and ``omnilearn.torch``'s passes alike.

Each rank writes its own slots; the sum gives every rank every rank's numbers, so every rank's
controller takes the same decisions from the same times, and a step has one collective.
"""

from __future__ import annotations

import platform
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from omnilearn.control.loop import pass_end, probe_time
from omnilearn.train.quota_clock import QuotaClock, quota_seconds


@dataclass(frozen=True)
class Slots:
    """The spare floats after the gradients in a step's all-reduce (a sum over ranks).

    ``CLOCK``: rank 0's clock (the others write 0); ``STOP``: above 0 when some rank asks every rank to
    stop after this step; ``OOM``: above 0 when some rank ran out of memory (the step is retried); then
    one slot per rank for its time of the step, one for its controller's cost, one for its threads;
    then ``stats`` sums a caller rides along (``omnilearn run``: the step's loss and metric sums).
    """

    world: int
    stats: int = 0
    CLOCK = 0
    STOP = 1
    OOM = 2

    def time(self, rank: int) -> int:
        return 3 + rank

    def cost(self, rank: int) -> int:
        return 3 + self.world + rank

    def threads(self, rank: int) -> int:
        return 3 + 2 * self.world + rank

    def stat(self, j: int) -> int:
        return 3 + 3 * self.world + j

    @property
    def size(self) -> int:
        return 3 + 3 * self.world + self.stats

    def times(self, values: Sequence[float]) -> list[float]:
        return list(values[3:3 + self.world])

    def costs(self, values: Sequence[float]) -> list[float]:
        return list(values[3 + self.world:3 + 2 * self.world])

    def kinds(self, values: Sequence[float]) -> list[float]:
        return list(values[3 + 2 * self.world:3 + 3 * self.world])


class StepClock:
    """This rank's times of its synchronous steps (see the module): open, fill, read, close.

    ``on_cpu``: read the quota clock at every step (the record's ``held_ms``, whatever the policy);
    ``times_update`` and ``times_quota``: the controller's (what goes in this rank's time slot).
    """

    def __init__(self, slots: Slots, rank: int, *, on_cpu: bool, times_update: bool, times_quota: bool,
                 quota: QuotaClock | None = None) -> None:
        self.slots, self.rank, self.on_cpu = slots, rank, on_cpu
        self.times_update, self.times_quota = times_update, times_quota
        self.quota = quota or QuotaClock()
        self.reading: tuple[Path, float] | None = None  # the quota clock's reading of the last filled step
        self.t0 = self.c0 = 0.0  # the open step's start (perf_counter, process CPU)
        self.filled_at = self.filled_cpu = 0.0
        self.reduced_at: float | None = None  # the end of the last step's all-reduce (perf_counter)
        self.reduced_cpu = 0.0
        self.compute_wall = 0.0  # the last filled step's compute, wall seconds
        self.after_s = self.after_cpu_s = 0.0  # the work after the last all-reduce: rides in the next time
        self.update_wall = 0.0  # the last closed step's work after its all-reduce, wall seconds
        self.held_s = 0.0
        self.sync_s = 0.0  # the open step's seconds in its all-reduce(s)
        self.one_off = True  # the next close is a one-off: the after riding now rides again in its place

    # -------------------------------------------------------------------------- one step
    def open(self) -> None:
        """The step starts (before its batch is gathered)."""
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.sync_s = 0.0

    def carry(self, wall_s: float, cpu_s: float) -> None:
        """Work between the last step's close and this step's open that rides in this step's time too
        (a user loop's bookkeeping and the drawing of its next batch)."""
        self.after_s += wall_s
        self.after_cpu_s += cpu_s

    def work_done(self) -> float:
        """The step's backward is done: its times measured; returns this rank's time of the step (its
        compute, and the update riding from the step before where the controller times it)."""
        self.filled_at, self.filled_cpu = time.perf_counter(), time.process_time()
        self.reading = self.quota.read() if self.on_cpu else None
        cpus = self.quota.cpus(self.reading)  # a GPU's steps: wall time
        wall = self.compute_wall = self.filled_at - self.t0
        compute_q = quota_seconds(wall, self.filled_cpu - self.c0, cpus)
        after_q = quota_seconds(self.after_s, self.after_cpu_s, cpus)
        self.held_s = (compute_q - wall) + (after_q - self.after_s)
        compute, after = (compute_q, after_q) if self.times_quota else (wall, self.after_s)
        return compute + (after if self.times_update else 0.0)

    def fill(self, extra: torch.Tensor, *, clock: float, stop: bool, cost_s: float, oom: bool = False,
             stats: Sequence[float] = ()) -> None:
        """The step's backward is done (:meth:`work_done`): this rank's slots written into ``extra``
        (zeroed first)."""
        mine = self.work_done()
        s, r = self.slots, self.rank
        extra.zero_()
        extra[s.CLOCK] = clock if r == 0 else 0.0
        extra[s.STOP] = 1.0 if stop else 0.0
        extra[s.OOM] = 1.0 if oom else 0.0
        extra[s.time(r)] = mine
        extra[s.cost(r)] = cost_s  # the controller's cost rides too
        extra[s.threads(r)] = torch.get_num_threads()  # and its kind of worker
        for j, v in enumerate(stats):
            extra[s.stat(j)] = v

    def reduced(self) -> None:
        """The all-reduce ended: the time spent in it."""
        self.reduced_at, self.reduced_cpu = time.perf_counter(), time.process_time()
        self.sync_s += self.reduced_at - self.filled_at

    def read(self, extra: torch.Tensor) -> list[float]:
        """Just after the all-reduce (a sum over ranks, :meth:`reduced`): every rank's numbers."""
        self.reduced()
        return extra.tolist()

    def retry(self) -> None:
        """The step is tried again (a rank ran out of memory): it reopens, its after not yet spent."""
        self.open()

    def close(self) -> None:
        """The work after the all-reduce is done (the update): it rides in the next step's time."""
        assert self.reduced_at is not None, "close before read"
        wall, cpu = time.perf_counter() - self.reduced_at, time.process_time() - self.reduced_cpu
        self.update_wall = wall
        if self.one_off:  # the first after a (re)start: the stand-in rides again in its place
            self.one_off = False
            return
        self.after_s, self.after_cpu_s = wall, cpu

    def stand_in(self, seconds: float) -> None:
        """``seconds`` (the start-up pass's median update) ride in the next step's time as its update
        before it, and in the step after in place of the next close's one-off (the first update after
        the pass's restore allocates the optimizer's state again)."""
        self.after_s, self.after_cpu_s, self.one_off = seconds, 0.0, True

    # -------------------------------------------------------------------------- the record's
    @property
    def compute_s(self) -> float:
        """The last step's compute and update, wall seconds (the step record's ``compute_ms``)."""
        return self.compute_wall + self.update_wall

    @property
    def held_ms(self) -> float | None:
        """The last step's wait for its CPU beyond its wall time (its compute's and the update riding with
        it, at the quota's rate, less their wall time), read on a CPU whatever the policy (None: a GPU's)."""
        return None if self.reading is None else round(self.held_s * 1e3, 3)


def core_kind() -> int:
    """This machine's kind of core, as a number every rank can gather: a checksum of the processor's
    model name (``/proc/cpuinfo``; elsewhere the machine's architecture)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return zlib.crc32((names[0] if names else platform.machine()).encode())


@dataclass
class ProbeRounds:
    """The rounds of one worker's start-up pass, timed: each round's wall seconds and, on a CPU under
    a CFS quota (``quota``), its CPU seconds, from which :meth:`own` gives the worker's reading (see
    :func:`~omnilearn.control.loop.probe_times`). ``sync``: what makes a round's work done before its clock stops (a GPU's
    synchronize; nothing on a CPU); ``threads``: the threads a round runs on. The trainer's pass and a
    framework's (``omnilearn.torch``'s session) time their rounds through it, so both measure alike."""

    quota: bool
    sync: Callable[[], None] = lambda: None
    threads: int = 1
    wall: dict[int, list[float]] = field(default_factory=dict)
    cpu_s: dict[int, list[float]] = field(default_factory=dict)
    cut: bool = False
    """The pass was cut short: the whole of it would have cost more than balancing can win."""

    def __post_init__(self) -> None:
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def time(self, run: Callable[[int], None], batch: int) -> None:
        """One round: ``run(batch)`` (a local step on ``batch`` samples), timed."""
        t0, c0 = time.perf_counter(), time.process_time()
        run(batch)
        self.sync()
        self.wall.setdefault(batch, []).append(time.perf_counter() - t0)
        self.cpu_s.setdefault(batch, []).append(time.process_time() - c0)

    def run(self, step: Callable[[int], None], sizes: Sequence[int], at_least: int, share: float,
            steps: int | None) -> None:
        """Rounds of ``step`` at the two ``sizes`` in turn, timed, until :func:`~omnilearn.control.loop.pass_end`
        (rounds already timed, the memory probe's, count): the pass is done, or after ``at_least`` rounds it
        is cut short (:attr:`cut`) where the whole of it would cost more than balancing can win over the
        job's ``steps`` at the equal ``share``."""
        small, large = sizes
        while True:
            end = pass_end(small, large, self.wall.get(small, []), self.wall.get(large, []),
                           time.perf_counter() - self._t0, at_least, self.quota, share, steps)
            if end is not None:
                self.cut = end == "cut"
                return
            for b in sizes:
                self.time(step, b)

    def own(self, small: int, large: int) -> list[float]:
        """This worker's reading of its pass, the floats every rank gathers (:func:`~omnilearn.control.loop.probe_times` reads
        them): its rounds at ``small`` and ``large`` (:func:`~omnilearn.control.loop.probe_time`: CPU seconds under a quota, else
        wall seconds), the pass's own seconds so far, the CPU rate the whole pass got (0: wall seconds),
        its threads, its kind of core (:func:`core_kind`), and 1 where its pass was cut short (else 0)."""
        elapsed = time.perf_counter() - self._t0
        cut = float(self.cut)
        if self.quota:  # CPU seconds, and the rate the whole pass got them at
            ran = (time.process_time() - self._c0) / max(elapsed, 1e-9)
            return [probe_time(self.cpu_s[small]), probe_time(self.cpu_s[large]), elapsed, ran, float(self.threads),
                    float(core_kind()), cut]
        return [probe_time(self.wall[small]), probe_time(self.wall[large]), elapsed, 0.0, float(self.threads),
                float(core_kind()), cut]
