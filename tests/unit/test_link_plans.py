"""Links and stalls in a plan: through the toggler and its audit (a recording backend), refused clearly before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.network.shaping import QdiscSupport
from omnilearn.emulator.protocol.client import RequestWriter
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.links import Link
from omnilearn.emulator.spec.plan import EmulationPlan, build_plan
from omnilearn.emulator.spec.schedule import Schedule
from omnilearn.errors import UserError
from omnilearn.launch.job import check_launcher
from omnilearn.report.fidelity import as_asked, level_fidelity

ROOT = Path(__file__).resolve().parents[2]


SLOW = Link(rate=20_000_000)
PLAN = EmulationPlan(
    mode="quota", targets=("worker1", "worker2"),
    levels={"A": {"worker1": Allocation(cpus=0.5), "worker2": Allocation(cpus=0.5)},
            "B": {"worker1": Allocation(cpus=0.25), "worker2": Allocation(cpus=1.0)}},
    schedule=Schedule("s", "epoch", (0, 1), ("A", "B")),
    links={"A": {"worker1": SLOW}},
    stalls={"B": {"worker2": 1.5}},
)


class Recorder:
    """A backend and a link applier that apply nothing and remember every call."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def add_process(self, target: str, pid: int) -> None:
        pass

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        self.calls.append(("apply", target, allocation))
        return allocation

    def stall(self, target: str, seconds: float) -> None:
        self.calls.append(("stall", target, seconds))

    def apply_link(self, target: str, link: Link | None) -> Link | None:
        self.calls.append(("link", target, link))
        return link

    def close(self) -> None:
        pass


def test_the_toggler_applies_the_plans_link_and_stall_and_audits_them(tmp_path: Path) -> None:
    rec = Recorder()
    logs = tmp_path / "logs"  # a run folder's
    toggler = Toggler(logs, rec, PLAN, host=[0, 1], host_memory=2**34, links=rec)
    w1, w2 = RequestWriter(logs, 0), RequestWriter(logs, 1)
    reqs = [w1.submit("worker1", "A", Allocation(cpus=0.5), 0), w2.submit("worker2", "A", Allocation(cpus=0.5), 0),
            w1.submit("worker1", "B", Allocation(cpus=0.25), 1), w2.submit("worker2", "B", Allocation(cpus=1.0), 1)]
    toggler.poll_once()
    assert [c for c in rec.calls if c[0] != "apply"] == [
        ("link", "worker1", SLOW), ("link", "worker1", None),  # every level sets the link: B unshapes it
        ("link", "worker2", None), ("link", "worker2", None), ("stall", "worker2", 1.5)]
    got = [w.wait_applied(r, 1) for w, r in zip((w1, w2, w1, w2), reqs, strict=True)]
    assert got[0]["link"] == {"rate": "20mbit"} and got[0]["effective_link"] == {"rate": "20mbit"}
    assert got[2]["link"] is None and got[2]["effective_link"] is None
    assert got[3]["stall_s"] == 1.5 and "stall_s" not in got[1]
    assert all(as_asked(r) for r in got)
    # A link read back as something else is not "as asked", and shows in the level's fidelity.
    assert not as_asked({**got[0], "effective_link": {"rate": "10mbit"}})
    assert not as_asked({**got[1], "effective": {"cpus": 0.4, "cpuset": None, "memory": None}})
    fid = level_fidelity({"A": {"samples_per_s": [1.0, 1.0], "measured_ratio": 1.0}}, tmp_path, PLAN)
    assert fid["A"]["changes"] == 2 and fid["A"]["applied_as_asked"] == 1.0 and fid["A"]["apply_ms"] >= 0
    assert fid["B"]["nominal_ratio"] == 4.0 and fid["B"]["effective_ratio"] == 4.0
    assert fid["B"]["measured_ratio"] is None  # no worker measured there


def test_a_plan_with_links_needs_an_applier(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="link applier"):
        Toggler(tmp_path, Recorder(), PLAN)


def test_links_are_refused_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.build(str(ROOT / "configs" / "link-demo.yaml"), [])
    plan = build_plan(cfg, host=[0, 1])
    assert plan.link("HL2", "worker1") == Link(rate=100_000_000) and plan.link("HL2", "worker2") is None
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root .* --set emulation.links=null"):
        check_launcher(cfg, plan)
    off = config.build(str(ROOT / "configs" / "link-demo.yaml"), [("emulation.links", None)])
    check_launcher(off, build_plan(off, host=[0, 1]))  # links off: nothing to refuse


def test_a_delay_is_refused_naming_sch_netem_where_the_kernel_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator.network import shaping

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shaping, "detect_qdiscs", lambda: QdiscSupport(True, True, False, True, "assumed"))
    cfg = config.build(str(ROOT / "configs" / "link-demo.yaml"),
                       [("emulation.links", {"worker2": {"rate": "100mbit", "delay": "10ms"}})])
    with pytest.raises(UserError, match="worker2 at HL2: 100mbit, delay 10ms: delay needs the sch_netem qdisc"):
        check_launcher(cfg, build_plan(cfg, host=[0, 1]))


def test_docker_links_only_for_targets_on_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator.backends import dockerd
    from omnilearn.emulator.network import shaping

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shaping, "detect_qdiscs", lambda: QdiscSupport(True, True, True, True, "assumed"))
    monkeypatch.setattr(dockerd, "daemon_client", lambda: None)
    cfg = config.build(str(ROOT / "configs" / "link-demo.yaml"),
                       [("emulation.backend", "docker"), ("docker.hosts", {"worker1": "ssh://other"})])
    with pytest.raises(UserError, match="worker1 run on another daemon"):
        check_launcher(cfg, build_plan(cfg, host=[0, 1]))
