"""Per-rank metrics: one JSON object per line (steps and events), flushed as it goes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def metrics_path(out_dir: Path, rank: int | str) -> Path:
    return Path(out_dir) / "metrics" / f"rank-{rank}.jsonl"


class MetricsWriter:
    """Appends records of ``kind`` step | hl_change | batch_change | eval | start | end."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("a", buffering=1)

    def write(self, kind: str, **fields: Any) -> None:
        fields.setdefault("time", time.time())
        self._f.write(json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records of a JSONL file (a partial last line, still being written, is skipped)."""
    if not path.exists():
        return []
    out = []
    with path.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
