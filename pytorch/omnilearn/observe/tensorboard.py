"""TensorBoard scalars of a running job, written by the launcher from the workers' metrics files.

A thread in the launcher tails every rank's ``metrics/rank-<r>.jsonl`` (and, for ASP, the scores of
the server's snapshots) and writes ``OUT/tensorboard/``; the workers write nothing more and their
timing is untouched. Watch with ``tensorboard --logdir OUT/tensorboard``.

Scalars, each at the step (BSP) or server version (ASP) and the wall time it was recorded:
``batch``, ``compute_ms``, ``sync_ms`` and ``cpus`` per worker (one chart each, a line per worker),
``emulation/level`` (HLk as k), ``train/loss``, ``eval/accuracy`` and ``eval/perplexity`` (the
held-out metric), and for ASP ``staleness`` and ``update_rate`` (updates/s over a worker's last 5
updates at the server) per worker. Given straggler scores to keep (``stragglers``: the report's
``StragglerScores``, handed in by the launcher), ``straggler/relative`` and ``straggler/individual``
per worker at the end of each of its windows of full steps; under ``omnilearn emulate``,
``straggler_busy/relative`` and ``straggler_busy/individual`` per rank from busy time (:meth:`busy_scores`).
"""

from __future__ import annotations

import re
import threading
from collections import deque
from typing import Any, Protocol

from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import eval_path, metrics_path
from omnilearn.observe.progress import JsonlTail
from omnilearn.records import EVAL, HL_CHANGE, STEP, UPDATE

TB_DIR = "tensorboard"
RATE_WINDOW = 5  # updates per worker behind one update_rate point


class Scores(Protocol):
    """Straggler scores kept over windows of steps (:class:`omnilearn.report.stragglers.StragglerScores`)."""

    def add(self, rank: int, work: float, seconds: float) -> bool: ...

    def scores(self) -> list[dict[str, float | None]]: ...


def level_number(level: str, order: list[str]) -> float:
    """HL8 -> 8; a level of another name -> its position in the plan's table (1-based)."""
    m = re.fullmatch(r"HL(\d+(?:\.\d+)?)", level)
    if m:
        return float(m.group(1))
    return float(order.index(level) + 1) if level in order else float("nan")


class LiveTensorBoard:
    """``with LiveTensorBoard(job):`` writes scalars every ``interval`` s while the job runs, and at the end."""

    def __init__(self, job: JobSpec, interval: float = 2.0, stragglers: Scores | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise UserError(f"report.tensorboard needs the tensorboard package ({e}); pip install "
                            f"tensorboard, or run without --tensorboard") from None
        self.job = job
        self.asp = job.config.mode == "asp"
        self.levels = list(job.plan.levels)
        self.writer = SummaryWriter(log_dir=str(job.out_dir / TB_DIR))
        ranks = range(len(job.plan.targets))
        self.tails = {r: JsonlTail(metrics_path(job.out_dir, r)) for r in ranks}
        self.eval_tail = JsonlTail(eval_path(job.out_dir))
        self.recent: dict[int, deque[float]] = {}
        self.stragglers = stragglers
        self.full_batch = 0
        self.interval = interval
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="tensorboard", daemon=True)

    def __enter__(self) -> LiveTensorBoard:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.update()
        self.writer.close()

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.update()

    def _name(self, rank: int) -> str:
        return self.job.plan.target(rank)

    def update(self) -> None:
        """Write what the files gained since the last call."""
        with self.lock:
            for rank, tail in self.tails.items():
                for rec in tail.read():
                    self._record(rank, rec)
            for rec in self.eval_tail.read():  # ASP: written after the job, when the snapshots are scored
                self._eval(rec, int(rec.get("version", 0)))
            self.writer.flush()

    def _scalars(self, tag: str, name: str, value: Any, step: int, when: float | None) -> None:
        if value is not None:
            self.writer.add_scalars(tag, {name: float(value)}, step, walltime=when)

    def _eval(self, rec: dict[str, Any], step: int) -> None:
        for key in ("accuracy", "perplexity", "loss"):
            if rec.get(key) is not None:
                self.writer.add_scalar(f"eval/{key}", float(rec[key]), step, walltime=rec.get("time"))

    def _straggler(self, worker: int, rec: dict[str, Any], step: int, when: float | None) -> None:
        """A full step's samples per compute-second into its worker's window; the scores when one closes."""
        # a step below the largest global batch yet is an epoch's partial last one (ASP: no global batch)
        self.full_batch = max(self.full_batch, rec.get("global_batch", 0))
        if self.stragglers is None or rec.get("global_batch", 0) < self.full_batch:
            return
        if not 0 <= worker < len(self.tails) - self.asp:
            return
        if not self.stragglers.add(worker, float(rec["batch"]), float(rec["compute_ms"]) / 1e3):
            return
        for w, score in enumerate(self.stragglers.scores()):
            name = self._name(w + 1 if self.asp else w)
            for key in ("relative", "individual"):
                self._scalars(f"straggler/{key}", name, score[key], step, when)

    def busy_scores(self, scores: list[dict[str, float | None]], elapsed_s: float) -> None:
        """``omnilearn emulate``'s straggler scores from busy time (``straggler_busy/*``, at whole seconds
        since the command started): no steps are known, so they have their own charts."""
        with self.lock:
            for rank, score in enumerate(scores):
                for key in ("relative", "individual"):
                    self._scalars(f"straggler_busy/{key}", self._name(rank), score[key], round(elapsed_s), None)
            self.writer.flush()

    def _record(self, rank: int, rec: dict[str, Any]) -> None:
        kind, when = rec.get("kind"), rec.get("time")
        if kind == STEP:
            step = int(rec["version"] if self.asp else rec["step"])
            name = self._name(rank)
            for tag in ("batch", "compute_ms", "sync_ms", "cpus"):
                self._scalars(tag, name, rec.get(tag), step, when)
            self._straggler(rank - 1 if self.asp else rank, rec, step, when)
            if rank == 0 and not self.asp:
                if rec.get("loss") is not None:  # omnilearn.torch's steps do not know the loss
                    self.writer.add_scalar("train/loss", float(rec["loss"]), step, walltime=when)
                if rec.get("level"):
                    self.writer.add_scalar("emulation/level", level_number(rec["level"], self.levels), step,
                                           walltime=when)
        elif kind == UPDATE:  # ASP server: one applied gradient
            step, worker = int(rec["version"]), int(rec["worker"])
            name = self._name(worker)
            self._scalars("staleness", name, rec["staleness"], step, when)
            self.writer.add_scalar("train/loss", float(rec["loss"]), step, walltime=when)
            times = self.recent.setdefault(worker, deque(maxlen=RATE_WINDOW + 1))
            times.append(float(when or 0.0))
            if len(times) == times.maxlen and times[-1] > times[0]:
                self._scalars("update_rate", name, RATE_WINDOW / (times[-1] - times[0]), step, when)
        elif kind == HL_CHANGE and rank == 0:
            step = int(rec.get("version", rec.get("step", 0)))
            self.writer.add_scalar("emulation/level", level_number(rec["level"], self.levels), step, walltime=when)
        elif kind == EVAL and rank == 0:  # BSP's evaluations during training
            self._eval(rec, int(rec["step"]))
