"""The toggler retries a change the backend rejected, with backoff, and says meanwhile what is in force.

The backend is the cgroup v2 backend on a fake tree (no root, no kernel): it rejects the first
attempts as the kernel would (an OSError), and reads back from the tree's files what is in force.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_backends import fake_v2
from test_requests import HOST, HOST_MEMORY, PLAN
from test_simulate import make_run

from fakes import FakeClock
from omnilearn.emulator.backends.cgroup import CgroupV2Backend
from omnilearn.emulator.backends.docker import ForeignContainer
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.retry import RETRY_FIRST_S, Backoff
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.report.fidelity import change_outcomes
from omnilearn.report.summary import summarize

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
        self.attempts: list[str] = []  # the target of each attempt on worker0
        self.applied: list[tuple[str, Allocation]] = []

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if target == "worker0":
            self.attempts.append(target)
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


def toggler(logs: Path, backend: Rejecting, retry: Backoff | None = None,
            clock: Callable[[], float] | None = None) -> Toggler:
    return Toggler(logs, backend, PLAN, host=HOST, host_memory=HOST_MEMORY, retry=retry, clock=clock or FakeClock())


def mine(logs: Path) -> list[dict]:
    return [r for r in read_audit(logs, status=None) if r["file"] == "cpu-0.log"]


def test_a_rejected_change_is_tried_again_when_its_backoff_is_over_and_applied_once(cgroup_root: Path,
                                                                                    logs: Path) -> None:
    backend = Rejecting(cgroup_root, reject=3)
    clock = FakeClock()
    tog = toggler(logs, backend, clock=clock)  # the default backoff: 0.2 s, doubling
    writer = RequestWriter(logs, 0)
    req = writer.submit("worker0", "HL2", HL2, epoch=1.0)
    assert [r["status"] for r in tog.poll_once()] == ["retrying"]
    # The worker is answered at the first failure, with what the kernel's files hold: still HL4.
    first = writer.wait_applied(req, timeout=0)
    assert first["status"] == "retrying" and first["effective"] == HL4.to_dict() and first["requested"] == HL2.to_dict()
    waits = [RETRY_FIRST_S * 2**k for k in range(3)]
    for k, wait in enumerate(waits):
        clock.advance(wait * 0.99)
        assert tog.poll_once() == [] and len(backend.attempts) == k + 1  # not due yet: not tried
        clock.advance(wait * 0.02)  # past it (not exactly at it: floating point)
        assert [r["status"] for r in tog.poll_once()] == ["retrying" if k < 2 else "applied"]
    assert len(backend.attempts) == 4 and backend.applied == [("worker0", HL2)]  # applied once
    assert tog.poll_once() == []
    records = mine(logs)
    assert [r["status"] for r in records] == ["applying", "retrying", "retrying", "retrying", "applied"]
    assert [r["retry_in_s"] for r in records[1:4]] == waits and records[-1]["attempts"] == 4


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
