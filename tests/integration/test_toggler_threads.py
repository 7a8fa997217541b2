"""The toggler's poll loop in a thread, as the launchers run it, against a backend that rejects: the worker
is answered at once with what is in force, other ranks are served meanwhile, and a stop ends the loop with
a change still pending. (When each retry is due is the unit tier's, on a fake clock.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_backends import fake_v2
from test_requests import PLAN
from test_toggler_retry import HL2, HL4, Rejecting, mine, toggler

from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.emulator.protocol.retry import RETRY_FIRST_S
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.report.fidelity import change_outcomes


@pytest.fixture
def cgroup_root(tmp_path: Path) -> Path:
    return fake_v2(tmp_path)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def running() -> Iterator[Callable[[Toggler], threading.Thread]]:
    """Runs a toggler's poll loop in a thread, as the launchers do; stopped at the end."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(toggler: Toggler) -> threading.Thread:
        t = threading.Thread(target=toggler.run, args=(stop,), kwargs={"interval": 0.01}, daemon=True)
        t.start()
        threads.append(t)
        return t

    yield start
    stop.set()
    for t in threads:
        t.join(timeout=10)


def until(cond: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while not (value := cond()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert value, "condition not met in time"
    return value


def test_a_rejected_change_is_retried_with_backoff_and_applied_once(cgroup_root: Path, logs: Path, running) -> None:
    backend = Rejecting(cgroup_root, reject=3)
    running(toggler(logs, backend, clock=time.monotonic))  # the default backoff: 0.2 s, doubling
    client = AllocationClient(PLAN, logs, 0, "worker0", ack_timeout=10)

    event = client.ensure("HL2", 1.0)
    # The worker is answered at the first failure, with what the kernel's files hold: still HL4.
    assert event["status"] == "retrying" and event["retries"] == 0
    assert event["requested"] == HL2.to_dict() and event["effective"] == HL4.to_dict()
    assert client.allocation == HL4 and client.threads == 1

    late = until(lambda: client.settle(1.5))
    assert late["status"] == "applied" and late["retries"] == 3 and late["level"] == "HL2"
    assert late["effective"] == HL2.to_dict() and client.allocation.share == 0.5

    waits = [RETRY_FIRST_S * 2**k for k in range(3)]  # when each attempt is due: the unit tier's fake clock
    assert len(backend.attempts) == 4
    assert backend.applied == [("worker0", HL2)]  # applied once

    records = mine(logs)
    assert [r["status"] for r in records] == ["applying", "retrying", "retrying", "retrying", "applied"]
    retrying = records[1:4]
    assert [r["attempts"] for r in retrying] == [1, 2, 3] and [r["retry_in_s"] for r in retrying] == waits
    assert all(r["effective"] == HL4.to_dict() and r["requested"] == HL2.to_dict() for r in retrying)
    assert "Device or resource busy" in retrying[0]["detail"]
    assert records[-1]["attempts"] == 4 and records[-1]["effective"] == HL2.to_dict()
    assert change_outcomes(logs) == {"changes": 1, "retried": 1, "never_held": 0, "listed": [{
        "target": "worker0", "level": "HL2", "epoch": 1.0, "seq": 0, "status": "applied", "reason": None,
        "held": True, "retries": 3, "nominal": HL2.to_dict(), "in_force": HL2.to_dict()}]}


def test_a_permanently_rejected_change_hangs_nothing(cgroup_root: Path, logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=10**9)
    stop = threading.Event()
    thread = threading.Thread(target=toggler(logs, backend, clock=time.monotonic).run, args=(stop, 0.01), daemon=True)
    thread.start()
    try:
        client0 = AllocationClient(PLAN, logs, 0, "worker0", ack_timeout=10)
        client1 = AllocationClient(PLAN, logs, 1, "worker1", ack_timeout=10)
        event0 = client0.ensure("HL2", 1.0)
        assert event0["status"] == "retrying" and event0["effective"] == HL4.to_dict()
        event1 = client1.ensure("HL4", 1.0)  # the other ranks are served while worker0's change is retried
        assert event1["status"] == "applied"
        until(lambda: len(backend.attempts) >= 3)
        assert client0.settle(2.0) is None  # no outcome yet: the worker goes on with what is in force
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()  # the run ends with the change still pending
    outcomes = change_outcomes(logs)
    assert (outcomes["changes"], outcomes["never_held"]) == (2, 1)
    (entry,) = outcomes["listed"]
    assert entry["target"] == "worker0" and entry["status"] == "retrying" and not entry["held"]
    assert entry["nominal"] == HL2.to_dict() and entry["in_force"] == HL4.to_dict() and entry["retries"] >= 2
