"""The affinity backend against real processes: every thread pinned, a busy child throttled."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from test_cgroup_v1 import BUSY, two_cpus

from omnilearn.emulator.backends.affinity import AffinityBackend
from omnilearn.emulator.spec.levels import Allocation


def boost(pid: int) -> None:
    """Give a measured child a high CPU weight so that other load on this small host does not eat
    into its unlimited speed (a quota or throttle still caps it: that is what is measured)."""
    if os.geteuid() == 0:
        os.setpriority(os.PRIO_PROCESS, pid, -20)


@two_cpus
def test_affinity_pins_every_thread(spawn) -> None:
    code = ("import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
            "print('ready', flush=True); time.sleep(60)")
    child = spawn(code, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    b = AffinityBackend()
    try:
        b.add_process("w0", child.pid)
        eff = b.apply("w0", Allocation(cpuset="0"))
        assert eff == Allocation(cpuset="0")
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) == 2
        assert all(os.sched_getaffinity(int(t)) == {0} for t in tids)
        assert b.current("w0") == Allocation(cpuset="0") and b.current("w1") == Allocation()
        assert b.apply("w0", Allocation()) == Allocation()
        assert os.sched_getaffinity(child.pid) == set(os.sched_getaffinity(0))
    finally:
        b.close()


def test_affinity_throttle_stops_and_resumes_a_busy_child(spawn) -> None:
    """The throttle's mechanism: the child is stopped for part of each period and a stall holds it stopped;
    close() lets it run. How much slower it then runs on a shared host is a measurement (omnilearn
    calibrate), not a test."""
    child = spawn(BUSY)
    b = AffinityBackend()
    try:
        b.add_process("w0", child.pid)
        assert b.apply("w0", Allocation()) == Allocation()
        achieved = b.apply("w0", Allocation(cpus=0.25))  # the duty cycle the throttle achieved
        assert achieved.cpuset is None and 0 < achieved.cpus < 1, achieved
        seen = set()
        deadline = time.monotonic() + 30
        while seen != {"T", "R"} and time.monotonic() < deadline:  # a hang guard, not a timing
            seen.add(_state(child.pid) if _state(child.pid) == "T" else "R")
        assert seen == {"T", "R"}, seen  # stopped in some periods, running in others
        b.stall("w0", 60)  # a stall holds through the throttle's periods
        assert _state(child.pid) == "T"
    finally:
        b.close()
    b.close()
    assert _state(child.pid) != "T"  # close() let it run again


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
