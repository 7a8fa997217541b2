"""``ruff check`` passes on the package, the tests and the examples, the complexity rules included (as ``make lint`` runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_passes_with_the_complexity_rules() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "pytorch", "tests", "examples"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
