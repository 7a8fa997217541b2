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
from test_link_plans import SLOW

from omnilearn.emulator.network.shaping import detect_qdiscs
from omnilearn.emulator.protocol.audit import read_audit

root_and_tc = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("nsenter") is None,
                                 reason="needs root, tc and nsenter")


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
c = socket.create_connection((sys.argv[1], 5301), timeout=10); end = time.monotonic() + 0.5
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
    from omnilearn.emulator.network.netns import JobNetwork

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
        # Traffic flows both ways through the shaped link and beside it; the rates reached on a shared
        # host are a measurement (printed above), not a test. What the kernel holds is read back.
        assert out > 0 and into > 0 and other > 0
        assert net.apply_link("worker1", None) is None
        assert net.apply_link("worker1", None) is None  # unshaped, read back
        assert _rate(net, 0, 2) > 0
    finally:
        net.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert job not in names


@root_and_tc
def test_cleanup_deletes_only_namespaces_of_dead_jobs() -> None:
    from omnilearn.emulator.network.netns import JobNetwork, sweep_netns

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
    # The link in force is read back above; how long an all-reduce took through it (about 0.3 s for 0.2M
    # float32 gradients at 20 Mbit/s) is a measurement in summary.json, not a test.
    assert s["allreduce_ms"] is not None
    assert s["level_speeds"]["EVEN"]["applied_as_asked"] == 1.0
    assert "cannot remove it" in r.stdout
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    time.sleep(0.1)
    assert job_id not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
