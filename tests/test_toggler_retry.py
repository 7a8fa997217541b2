"""The toggler retries a change the backend rejected, with backoff, and says meanwhile what is in force.

The backend is the cgroup v2 backend on a fake tree (no root, no kernel): it rejects the first
attempts as the kernel would (an OSError), and reads back from the tree's files what is in force.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from omnilearn.emulator.audit import read_audit
from omnilearn.emulator.backends.cgroup import CgroupV2Backend
from omnilearn.emulator.backends.docker import ForeignContainer
from omnilearn.emulator.client import AllocationClient, RequestWriter
from omnilearn.emulator.levels import Allocation
from omnilearn.emulator.retry import RETRY_FIRST_S, Backoff
from omnilearn.emulator.toggler import Toggler
from omnilearn.report.fidelity import change_outcomes
from omnilearn.report.summary import summarize
from test_backends import fake_v2
from test_requests import HOST, HOST_MEMORY, PLAN
from test_simulate import make_run

HL4 = PLAN.allocation("HL4", "worker0")  # cpuset 0, 1 CPU: in force before each test's change
HL2 = PLAN.allocation("HL2", "worker0")  # 0.5 CPU: the change asked for


class Rejecting(CgroupV2Backend):
    """Rejects ``reject`` attempts on ``worker0`` (then applies), timing each attempt; ``error`` makes
    the rejection; what is in force stays in the tree's files, untouched by a rejected attempt."""

    def __init__(self, root: Path, reject: int, error: Callable[[], Exception] | None = None) -> None:
        super().__init__("job", ["worker0", "worker1"], root=root)
        (self._dir() / "cpuset.cpus.effective").write_text("0-1\n")  # the kernel's: the job's CPUs
        super().apply("worker0", HL4)  # the level in force before the change
        self.reject, self.error = reject, error or (lambda: OSError(errno.EBUSY, "Device or resource busy"))
        self.attempts: list[float] = []  # time.monotonic() of each attempt on worker0
        self.applied: list[tuple[str, Allocation]] = []

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if target == "worker0":
            self.attempts.append(time.monotonic())
            if len(self.attempts) <= self.reject:
                raise self.error()
        self.applied.append((target, allocation))
        return super().apply(target, allocation)


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


def toggler(logs: Path, backend: Rejecting, retry: Backoff | None = None) -> Toggler:
    return Toggler(logs, backend, PLAN, host=HOST, host_memory=HOST_MEMORY, retry=retry)


def mine(logs: Path) -> list[dict]:
    return [r for r in read_audit(logs, status=None) if r["file"] == "cpu-0.log"]


def test_a_rejected_change_is_retried_with_backoff_and_applied_once(cgroup_root: Path, logs: Path, running) -> None:
    backend = Rejecting(cgroup_root, reject=3)
    running(toggler(logs, backend))  # the default backoff: 0.2 s, doubling
    client = AllocationClient(PLAN, logs, 0, "worker0", ack_timeout=10)

    event = client.ensure("HL2", 1.0)
    # The worker is answered at the first failure, with what the kernel's files hold: still HL4.
    assert event["status"] == "retrying" and event["retries"] == 0 and event["ack_s"] < 1.0
    assert event["requested"] == HL2.to_dict() and event["effective"] == HL4.to_dict()
    assert client.allocation == HL4 and client.threads == 1

    late = until(lambda: client.settle(1.5))
    assert late["status"] == "applied" and late["retries"] == 3 and late["level"] == "HL2"
    assert late["effective"] == HL2.to_dict() and client.allocation.share == 0.5

    gaps = [b - a for a, b in zip(backend.attempts, backend.attempts[1:], strict=False)]
    waits = [RETRY_FIRST_S * 2**k for k in range(3)]
    print(f"\nretry gaps {[round(g, 3) for g in gaps]} s after waits of {waits} s")
    assert len(gaps) == 3 and all(w <= g < w + 1.0 for g, w in zip(gaps, waits, strict=True)), gaps
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
    thread = threading.Thread(target=toggler(logs, backend).run, args=(stop, 0.01), daemon=True)
    thread.start()
    try:
        client0 = AllocationClient(PLAN, logs, 0, "worker0", ack_timeout=10)
        client1 = AllocationClient(PLAN, logs, 1, "worker1", ack_timeout=10)
        event0 = client0.ensure("HL2", 1.0)
        assert event0["status"] == "retrying" and event0["effective"] == HL4.to_dict() and event0["ack_s"] < 1.0
        event1 = client1.ensure("HL4", 1.0)  # the other ranks are served while worker0's change is retried
        assert event1["status"] == "applied" and event1["ack_s"] < 1.0
        until(lambda: len(backend.attempts) >= 3)
        assert client0.settle(2.0) is None  # no outcome yet: the worker goes on with what is in force
    finally:
        t0 = time.monotonic()
        stop.set()
        thread.join(timeout=10)
    stopped_s = time.monotonic() - t0
    assert not thread.is_alive() and stopped_s < 1.0  # the run ends with the change still pending
    outcomes = change_outcomes(logs)
    assert (outcomes["changes"], outcomes["never_held"]) == (2, 1)
    (entry,) = outcomes["listed"]
    assert entry["target"] == "worker0" and entry["status"] == "retrying" and not entry["held"]
    assert entry["nominal"] == HL2.to_dict() and entry["in_force"] == HL4.to_dict() and entry["retries"] >= 2
    print(f"\nanswer while rejected {event0['ack_s']} s, other rank {event1['ack_s']} s, "
          f"{len(backend.attempts)} attempts, toggler stopped in {stopped_s:.3f} s")


def test_a_change_is_given_up_after_the_last_retry(cgroup_root: Path, logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=10**9)
    tog = toggler(logs, backend, Backoff(first_s=0.0, cap_s=0.0, max_retries=2))
    writer = RequestWriter(logs, 0)
    req = writer.submit("worker0", "HL2", HL2, epoch=1.0)
    assert [r["status"] for r in tog.poll_once() + tog.poll_once() + tog.poll_once()] == [
        "retrying", "retrying", "rejected"]
    assert tog.poll_once() == [] and len(backend.attempts) == 3
    final = writer.wait_applied(req, timeout=0)
    assert final["reason"] == "backend-failed" and final["attempts"] == 3 and final["effective"] == HL4.to_dict()
    (entry,) = change_outcomes(logs)["listed"]
    assert (entry["status"], entry["held"], entry["retries"], entry["in_force"]) == ("rejected", False, 2,
                                                                                     HL4.to_dict())


def test_a_newer_request_replaces_a_change_being_retried(cgroup_root: Path, logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=1)
    tog = toggler(logs, backend, Backoff(first_s=60.0, cap_s=60.0))  # not due again within the test
    writer = RequestWriter(logs, 0)
    writer.submit("worker0", "HL2", HL2, epoch=1.0)
    assert [r["status"] for r in tog.poll_once()] == ["retrying"]
    writer.submit("worker0", "HL1", PLAN.allocation("HL1", "worker0"), epoch=2.0)
    superseded, applied = tog.poll_once()
    assert (superseded["seq"], superseded["status"], superseded["reason"]) == (0, "rejected", "superseded")
    assert superseded["effective"] == HL4.to_dict() and superseded["attempts"] == 1
    assert (applied["seq"], applied["status"], applied["attempts"]) == (1, "applied", 1)
    assert tog.poll_once() == [] and backend.applied == [("worker0", Allocation())]


def test_a_restarted_toggler_finishes_a_retried_change_once(cgroup_root: Path, logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=2)
    now = Backoff(first_s=0.0, cap_s=0.0)
    RequestWriter(logs, 0).submit("worker0", "HL2", HL2, epoch=1.0)
    first = toggler(logs, backend, now)
    assert [r["status"] for r in first.poll_once() + first.poll_once()] == ["retrying", "retrying"]
    first.close()  # the toggler dies; a new one resumes from the audit, counting the attempts made
    second = toggler(logs, backend, now)
    (done,) = second.poll_once()
    assert (done["status"], done["attempts"]) == ("applied", 3)
    assert second.poll_once() == [] and toggler(logs, backend, now).poll_once() == []
    assert backend.applied == [("worker0", HL2)]
    assert [r["status"] for r in mine(logs)].count("applying") == 1


def test_a_failure_that_cannot_pass_is_not_retried(cgroup_root: Path, logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=1, error=lambda: ForeignContainer("worker0 belongs to job other"))
    tog = toggler(logs, backend, Backoff(first_s=0.0, cap_s=0.0))
    RequestWriter(logs, 0).submit("worker0", "HL2", HL2, epoch=1.0)
    (rec,) = tog.poll_once()
    assert (rec["status"], rec["attempts"], rec["effective"]) == ("rejected", 1, HL4.to_dict())
    assert tog.poll_once() == [] and len(backend.attempts) == 1


def test_summary_json_says_which_nominal_allocation_never_held(cgroup_root: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")  # a finished run's folder; its toggler's audit is written here
    backend = Rejecting(cgroup_root, reject=10**9)
    tog = toggler(run / "logs", backend, Backoff(first_s=0.0, cap_s=0.0, max_retries=1))
    RequestWriter(run / "logs", 0).submit("worker0", "HL2", HL2, epoch=1.0)
    assert [r["status"] for r in tog.poll_once() + tog.poll_once()] == ["retrying", "rejected"]
    summarize(run)
    summary = json.loads((run / "summary.json").read_text())
    changes = summary["allocation_changes"]
    assert (changes["changes"], changes["retried"], changes["never_held"]) == (1, 1, 1)
    assert changes["listed"][0]["nominal"] == HL2.to_dict() and changes["listed"][0]["in_force"] == HL4.to_dict()
