"""A live progress line for a running job, fed by rank 0's metrics file (works for any launcher)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class JsonlTail:
    """Reads the complete lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


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
            if kind == "start":
                self.progress.update(self.task, total=rec["steps_per_epoch"] * self.epochs)
            elif kind == "step":
                self.progress.update(self.task, completed=rec["step"])
                self.level, self.loss, self.epoch = rec.get("level") or "-", rec["loss"], rec["epoch"]
            elif kind in ("batch_change",):
                self.batch = rec["batch"]
            elif kind == "hl_change":
                self.level = rec["level"]
        batch = "/".join(map(str, self.batch)) if self.batch else "initial"
        desc = f"epoch {self.epoch + 1}/{self.epochs} · {self.level} · batch {batch} · loss {self.loss:.3f}"
        self.progress.update(self.task, description=desc)
