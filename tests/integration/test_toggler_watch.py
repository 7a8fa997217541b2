"""The toggler's watchdog: a toggler thread that dies mid-change is restarted; the audit loses and repeats nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from test_requests import HOST, HOST_MEMORY, PLAN, RecordingBackend

from omnilearn.emulator.audit import read_audit
from omnilearn.emulator.client import RequestWriter
from omnilearn.emulator.levels import Allocation
from omnilearn.emulator.toggler import Toggler
from omnilearn.emulator.toggler_watch import TogglerWatchdog


class DiesOnce(RecordingBackend):
    """Ends the toggler's thread in its first apply (after the write-ahead record): a crash mid-change."""

    def __init__(self) -> None:
        super().__init__()
        self.died = False

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if not self.died:
            self.died = True
            raise SystemExit("toggler thread killed")
        return super().apply(target, allocation)


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.02)
    assert cond()


def test_a_dead_toggler_is_restarted_and_no_change_is_lost_or_repeated(tmp_path: Path) -> None:
    backend = DiesOnce()
    stop = threading.Event()
    dog = TogglerWatchdog(lambda: Toggler(tmp_path, backend, PLAN, host=HOST, host_memory=HOST_MEMORY), stop,
                          check_s=0.05).start()
    try:
        writer = RequestWriter(tmp_path, 1)
        first = writer.submit("worker1", "HL4", Allocation(cpuset="1", cpus=0.25), epoch=1)
        _wait(lambda: dog.restarts == 1 and len(backend.applied) == 1)
        second = writer.submit("worker1", "HL2", Allocation(cpus=0.5), epoch=2)
        _wait(lambda: len(backend.applied) == 2)
    finally:
        stop.set()
        dog.join(timeout=5)
    assert backend.died and dog.restarts == 1
    # The change the dead thread announced was completed by its successor, once; the next one once too.
    assert backend.applied == [("worker1", Allocation(cpuset="1", cpus=0.25)), ("worker1", Allocation(cpus=0.5))]
    applied = read_audit(tmp_path)
    assert [(r["seq"], r["level"]) for r in applied] == [(first.seq, "HL4"), (second.seq, "HL2")]
    assert [r["status"] for r in read_audit(tmp_path, status=None)].count("applying") == 2
