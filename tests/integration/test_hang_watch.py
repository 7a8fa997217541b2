"""The hang watch names the stopped worker, not the peer that timed out waiting for it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from omnilearn.launch.watch import HangWatch
from omnilearn.metrics import metrics_path


def test_a_stopped_rank_is_named_before_the_peer_waiting_for_it(tmp_path: Path) -> None:
    """Rank 1 stopped just after its last step; rank 0's last step is older, so rank 0 is the one past
    the timeout (blocked in the all-reduce), and rank 1 is the cause."""
    waiting, stopped = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        os.waitpid(stopped.pid, os.WUNTRACED)  # returns once it is stopped
        now = time.time()
        for rank, age in ((0, 30.0), (1, 5.0)):
            path = metrics_path(tmp_path, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}\n")
            os.utime(path, (now - age, now - age))
        watch = HangWatch(tmp_path, {0: waiting.pid, 1: stopped.pid}, timeout_s=10, started=now - 60)
        assert set(watch.silent()) == {0}
        message = watch.check(lambda r: f"rank {r}")
        assert message is not None and message.startswith("rank 1 made no step") and "stopped (SIGSTOP?)" in message
        assert watch.culprit == 1
        os.kill(stopped.pid, signal.SIGCONT)
        message = watch.check(lambda r: f"rank {r}")  # nothing stopped: the silent rank itself is named
        assert message is not None and message.startswith("rank 0 made no step for 30 s")
        assert watch.culprit == 0
    finally:
        for p in (waiting, stopped):
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
