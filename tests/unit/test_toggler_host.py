"""The one way a toggler is hosted (:class:`~omnilearn.emulator.protocol.toggler_host.TogglerHost`): a dead toggler
thread is restarted from the audit, losing and repeating nothing; one toggler per job (the lock); a stop
polls once more. The watchdog's check is called by the test, not waited for."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_requests import HOST, HOST_MEMORY, PLAN, RecordingBackend

from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.protocol.toggler_host import TogglerHost
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.errors import UserError

WAIT_S = 60.0  # a hang guard for the toggler's thread to answer: a test fails only past it


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


def host_for(log_dir: Path, backend: RecordingBackend, interval: float = 0.01) -> TogglerHost:
    # The watchdog's own thread would check once an hour: the test calls check() itself.
    return TogglerHost(lambda: Toggler(log_dir, backend, PLAN, host=HOST, host_memory=HOST_MEMORY), log_dir,
                       interval=interval, check_s=3600)


def test_a_dead_toggler_is_restarted_and_no_change_is_lost_or_repeated(tmp_path: Path) -> None:
    backend = DiesOnce()
    host = host_for(tmp_path, backend).start()
    try:
        assert not host.check()  # alive: nothing to restart
        writer = RequestWriter(tmp_path, 1)
        first = writer.submit("worker1", "HL4", Allocation(cpuset="1", cpus=0.25), epoch=1)
        dead = host.thread
        dead.join(WAIT_S)  # the toggler's thread dies in its first apply
        assert not dead.is_alive() and backend.died and backend.applied == []
        assert host.check() and host.restarts == 1 and host.thread is not dead
        assert writer.wait_applied(first, timeout=WAIT_S)["status"] == "applied"  # completed by its successor
        second = writer.submit("worker1", "HL2", Allocation(cpus=0.5), epoch=2)
        assert writer.wait_applied(second, timeout=WAIT_S)["status"] == "applied"
        assert not host.check() and host.restarts == 1
    finally:
        host.stop()
    assert not host.thread.is_alive()
    # The change the dead thread announced was completed by its successor, once; the next one once too.
    assert backend.applied == [("worker1", Allocation(cpuset="1", cpus=0.25)), ("worker1", Allocation(cpus=0.5))]
    applied = read_audit(tmp_path)
    assert [(r["seq"], r["level"]) for r in applied] == [(first.seq, "HL4"), (second.seq, "HL2")]
    assert [r["status"] for r in read_audit(tmp_path, status=None)].count("applying") == 2


def test_a_stopped_host_is_not_restarted_and_gives_up_after_its_restarts(tmp_path: Path) -> None:
    host = TogglerHost(lambda: Toggler(tmp_path, DiesOnce(), PLAN, host=HOST, host_memory=HOST_MEMORY), tmp_path,
                       interval=0.01, check_s=3600, max_restarts=0).start()
    try:
        RequestWriter(tmp_path, 1).submit("worker1", "HL4", Allocation(cpuset="1", cpus=0.25), epoch=1)
        host.thread.join(WAIT_S)
        assert not host.check() and host.restarts == 0  # max_restarts=0: not restarted
    finally:
        host.stop()
    assert not host.check()  # stopped: never restarted


def test_one_toggler_per_job_and_a_stop_polls_once_more(tmp_path: Path) -> None:
    backend = RecordingBackend()
    host = host_for(tmp_path, backend, interval=3600).start()  # one poll at the start, then one at the stop
    try:
        with pytest.raises(UserError, match="another toggler is already running"):
            host_for(tmp_path, RecordingBackend()).start()
        RequestWriter(tmp_path, 1).submit("worker1", "HL2", Allocation(cpus=0.5), epoch=1)
    finally:
        host.stop()
    assert backend.applied == [("worker1", Allocation(cpus=0.5))]  # the last request is not lost
    with host_for(tmp_path, RecordingBackend()):  # the lock was released
        pass
