"""A live progress line for a running job, fed by rank 0's metrics file (works for any launcher)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from omnilearn.files import read_jsonl
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import metrics_path
from omnilearn.records import BATCH_CHANGE, HL_CHANGE, START, STEP, UPDATE


class JsonlTail:
    """Reads the complete records appended to a JSONL file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        records, self.offset = read_jsonl(self.path, self.offset)
        return records


class JobProgress:
    """``epoch 2/4 · HL8 · batch 20/20/12/76 · loss 0.41`` with a bar over all steps."""

    def __init__(self, metrics_file: Path, label: str, console: Console | None = None) -> None:
        self.tail = JsonlTail(metrics_file)
        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]{task.fields[label]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, transient=False)
        self.task = self.progress.add_task("starting workers", total=None, label=label)
        self.epochs = 0
        self.batch: list[int] | None = None
        self.level = "-"
        self.loss = float("nan")
        self.epoch = 0

    def __enter__(self) -> JobProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.update()
        self.progress.stop()

    def set_epochs(self, epochs: int) -> None:
        self.epochs = epochs

    def update(self) -> None:
        for rec in self.tail.read():
            kind = rec.get("kind")
            if kind == START:
                self.progress.update(self.task, total=rec["steps_per_epoch"] * self.epochs)
            elif kind == STEP:
                self.progress.update(self.task, completed=rec["step"])
                self.level, self.loss, self.epoch = rec.get("level") or "-", rec["loss"], rec["epoch"]
            elif kind in ("batch_change",):
                self.batch = rec["batch"]
            elif kind == HL_CHANGE:
                self.level = rec["level"]
        batch = "/".join(map(str, self.batch)) if self.batch else "initial"
        desc = f"epoch {self.epoch + 1}/{self.epochs} · {self.level} · batch {batch} · loss {self.loss:.3f}"
        self.progress.update(self.task, description=desc)


class AspProgress(JobProgress):
    """``epoch 1.4/3 · HL8 · batch 13/13/13/89 · loss 0.41 · staleness 2.1`` over the applied samples."""

    def __init__(self, out_dir: Path, label: str, console: Console | None = None) -> None:
        super().__init__(metrics_path(out_dir, 0), label, console)
        self.epoch_f = 0.0
        self.staleness = 0.0

    def update(self) -> None:
        for rec in self.tail.read():
            kind = rec.get("kind")
            if kind == START:
                self.progress.update(self.task, total=rec["target_samples"])
            elif kind == UPDATE:
                self.progress.update(self.task, completed=rec["samples"])
                self.epoch_f = rec["epoch"]
                self.loss = rec["loss"] if self.loss != self.loss else 0.9 * self.loss + 0.1 * rec["loss"]
                self.staleness = 0.9 * self.staleness + 0.1 * rec["staleness"]
            elif kind == BATCH_CHANGE:
                self.batch = rec["batch"]
            elif kind == HL_CHANGE:
                self.level = rec["level"]
        batch = "/".join(map(str, self.batch)) if self.batch else "initial"
        desc = (f"epoch {self.epoch_f:.2f}/{self.epochs} · {self.level} · batch {batch} · loss {self.loss:.3f} · "
                f"staleness {self.staleness:.1f}")
        self.progress.update(self.task, description=desc)


def progress_for(job: JobSpec, label: str, console: Console | None = None) -> JobProgress:
    """The progress line of a job: over steps (BSP, rank 0's file) or applied samples (ASP, the server's)."""
    if job.config.mode == "asp":
        return AspProgress(job.out_dir, label, console)
    return JobProgress(metrics_path(job.out_dir, 0), label, console)
