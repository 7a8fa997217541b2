"""omnilearn emulate as a process: no command is a user error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_emulate_without_a_command_is_a_user_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "emulate", "--hl", "HL8", "--out", str(tmp_path / "x")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give a command" in proc.stderr
