"""Links and stalls in a job: through the toggler and its audit, refused clearly before anything starts,
the local workers' network namespaces (a real transfer through them), their cleanup, and a whole local
job whose worker1 has a slow link."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.audit import read_audit
from omnilearn.emulator.client import RequestWriter
from omnilearn.emulator.levels import Allocation
from omnilearn.emulator.links import Link
from omnilearn.emulator.plan import EmulationPlan, build_plan
from omnilearn.emulator.schedule import Schedule
from omnilearn.emulator.shaping import QdiscSupport, detect_qdiscs
from omnilearn.emulator.toggler import Toggler
from omnilearn.errors import UserError
from omnilearn.launch.job import check_launcher
from omnilearn.report.fidelity import as_asked, level_fidelity

ROOT = Path(__file__).resolve().parents[1]
SLOW = Link(rate=20_000_000)
PLAN = EmulationPlan(
    mode="quota", targets=("worker1", "worker2"),
    levels={"A": {"worker1": Allocation(cpus=0.5), "worker2": Allocation(cpus=0.5)},
            "B": {"worker1": Allocation(cpus=0.25), "worker2": Allocation(cpus=1.0)}},
    schedule=Schedule("s", "epoch", (0, 1), ("A", "B")),
    links={"A": {"worker1": SLOW}},
    stalls={"B": {"worker2": 1.5}},
)
root_and_tc = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("nsenter") is None,
                                 reason="needs root, tc and nsenter")


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
    from omnilearn.emulator import shaping

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shaping, "detect_qdiscs", lambda: QdiscSupport(True, True, False, True, "assumed"))
    cfg = config.build(str(ROOT / "configs" / "link-demo.yaml"),
                       [("emulation.links", {"worker2": {"rate": "100mbit", "delay": "10ms"}})])
    with pytest.raises(UserError, match="worker2 at HL2: 100mbit, delay 10ms: delay needs the sch_netem qdisc"):
        check_launcher(cfg, build_plan(cfg, host=[0, 1]))


def test_docker_links_only_for_targets_on_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator import shaping
    from omnilearn.launch.docker import daemon

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shaping, "detect_qdiscs", lambda: QdiscSupport(True, True, True, True, "assumed"))
    monkeypatch.setattr(daemon, "daemon_client", lambda: None)
    cfg = config.build(str(ROOT / "configs" / "link-demo.yaml"),
                       [("emulation.backend", "docker"), ("docker.hosts", {"worker1": "ssh://other"})])
    with pytest.raises(UserError, match="worker1 run on another daemon"):
        check_launcher(cfg, build_plan(cfg, host=[0, 1]))


# ---------------------------------------------------------------- the workers' network namespaces (real)


def _in(ns: str, code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", "--", sys.executable, "-c", code, *args], **kw)


RECEIVE = """\
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5301)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    t0 = t0 or time.monotonic(); n += len(b); t1 = time.monotonic()
print(json.dumps({"bits_per_s": n * 8 / (t1 - t0)}), flush=True)
"""
SEND = """\
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5301), timeout=10); end = time.monotonic() + 1.0
while time.monotonic() < end: c.sendall(b"x" * 65536)
c.close()
"""


def _rate(net, src: int, dst: int) -> float:
    receiver = _in(net.spaces[dst], RECEIVE, stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        _in(net.spaces[src], SEND, net.address(dst)).wait(timeout=30)
        return json.loads(receiver.stdout.readline())["bits_per_s"]
    finally:
        receiver.kill()
        receiver.wait()


@root_and_tc
def test_job_network_shapes_one_workers_link_both_ways_and_leaves_nothing() -> None:
    from omnilearn.emulator.netns import JobNetwork

    support = detect_qdiscs()
    if not (support.htb and support.ingress):
        pytest.skip(f"this kernel lacks htb or ingress redirection ({support})")
    job = f"test{os.getpid()}"
    net = JobNetwork(job, ["worker1", "worker2", "worker3"], support).up()
    try:
        assert net.env(2) == {"MASTER_ADDR": "10.47.0.1", "GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0"}
        free = _rate(net, 1, 2)
        assert net.apply_link("worker1", SLOW) == SLOW
        assert net.apply_link("worker1", SLOW) == SLOW  # unchanged: read back only
        out, into = _rate(net, 0, 2), _rate(net, 2, 0)
        other = _rate(net, 1, 2)
        print(f"worker1 at 20 Mbit/s: out {out / 1e6:.1f}, in {into / 1e6:.1f}; worker2 -> worker3 "
              f"{other / 1e6:.0f} Mbit/s (unshaped {free / 1e6:.0f})")
        assert 0.8 * SLOW.rate < out < 1.05 * SLOW.rate and 0.8 * SLOW.rate < into < 1.05 * SLOW.rate
        assert other > 3 * SLOW.rate  # the others keep their links
        assert net.apply_link("worker1", None) is None
        assert _rate(net, 0, 2) > 3 * SLOW.rate
    finally:
        net.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert job not in names


@root_and_tc
def test_cleanup_deletes_only_namespaces_of_dead_jobs() -> None:
    from omnilearn.emulator.netns import JobNetwork, sweep_netns

    dead, alive = f"dead{os.getpid()}", f"alive{os.getpid()}"
    nets = [JobNetwork(dead, ["worker1"]).up(), JobNetwork(alive, ["worker1"]).up()]
    sleeper = _in(nets[1].spaces[0], "import time; print('in', flush=True); time.sleep(60)", stdout=subprocess.PIPE,
                  text=True)
    try:
        assert sleeper.stdout.readline().strip() == "in"  # inside the alive job's namespace by now
        assert sweep_netns(jobs=[dead, alive]) == []  # younger than a minute: a launcher may be starting
        removed = sweep_netns(jobs=[dead, alive], min_age=0)
        assert removed == [f"network namespace omnilearn-{dead}-0", f"network namespace omnilearn-{dead}-hub"]
        assert f"omnilearn-{alive}-hub" in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                          text=True).stdout
    finally:
        sleeper.kill()
        sleeper.wait()
        for n in nets:
            n._made = [s for s in n._made if Path(f"/run/netns/{s}").exists()]
            n.close()


@pytest.mark.slow
@root_and_tc
def test_a_local_job_with_a_slow_link(tmp_path: Path) -> None:
    """Two workers, worker1 at 20 Mbit/s: the link is applied through the toggler and read back, the
    all-reduce carries its cost, and nothing of the job's network is left."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text("""
mode: bsp
workers: 2
model: {name: smallcnn}
data: {name: synthetic, image_size: 32, synthetic_size: 512}
train: {epochs: 1, global_batch: 64}
emulation: {allocation: quota, hl: EVEN, levels: {EVEN: [0.5, 0.5]}, links: {worker1: 20mbit}}
""")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    applied = {rec["target"]: rec for rec in read_audit(out / "logs")}
    assert applied["worker1"]["effective_link"] == {"rate": "20mbit"} and applied["worker2"]["effective_link"] is None
    s = json.loads((out / "summary.json").read_text())
    assert s["links"] == {"worker1": "20mbit"}
    # 0.2M float32 gradients through a 20 Mbit/s link both ways: about 0.3 s per all-reduce.
    assert s["allreduce_ms"] > 150, s["allreduce_ms"]
    assert s["level_speeds"]["EVEN"]["applied_as_asked"] == 1.0
    assert "cannot remove it" in r.stdout
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    time.sleep(0.1)
    assert job_id not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
