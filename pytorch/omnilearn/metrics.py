"""Per-rank metrics files: one JSON object per line (steps and events), flushed as it goes.

Written by the trainers, read by the launchers' progress lines and by the reports; a shared object
at the package root so that neither side depends on the other.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omnilearn import records
from omnilearn.files import read_records

METRICS_DIR = "metrics"
EVAL_FILE = "eval.jsonl"
"""ASP: the scores of the server's snapshots, written after the job (in the metrics folder)."""


RESTARTS_FILE = "restarts.jsonl"
"""One line per restart of the job or ``--resume`` (written by the launcher, listed by the summary)."""


def restarts_path(out_dir: Path) -> Path:
    return Path(out_dir) / RESTARTS_FILE


def metrics_path(out_dir: Path, rank: int | str) -> Path:
    return Path(out_dir) / METRICS_DIR / f"rank-{rank}.jsonl"


def eval_path(out_dir: Path) -> Path:
    return Path(out_dir) / METRICS_DIR / EVAL_FILE


def read_rank(out_dir: Path, rank: int | str) -> list[dict[str, Any]]:
    """Every complete record rank ``rank`` wrote (a partial last line, still being written, is skipped)."""
    return read_records(metrics_path(out_dir, rank))


class MetricsWriter:
    """Appends records of the kinds of :mod:`omnilearn.records`, each checked against its kind."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("a", buffering=1)

    def write(self, kind: str, **fields: Any) -> None:
        records.check(kind, fields)
        fields.setdefault("time", time.time())
        self._f.write(json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._f.close()
