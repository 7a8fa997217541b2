"""A launcher's Ctrl-C handler never hangs the loop it interrupts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Many Ctrl-Cs, each landing at a random point of a loop that does nothing but wait on the
# interrupts: a handler that takes a lock the wait holds hangs here within a few hundred
# (faulthandler then ends the process with its stack).
LOOP = """
import faulthandler, os, random, signal, threading
from omnilearn.launch.interrupts import Interrupts
faulthandler.dump_traceback_later(60, exit=True)
for k in range(500):
    with Interrupts() as interrupts:
        threading.Timer(random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            while True:
                interrupts.wait(0.0)
        except KeyboardInterrupt:
            pass
print("interrupted", k + 1)
"""


def test_a_signal_anywhere_in_the_wait_ends_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["interrupted", "500"]
