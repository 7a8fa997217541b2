"""Real HTB/TBF shaping on a veth pair between two namespaces (root)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from omnilearn.emulator.network.shaping import (
    LinkShaper,
    detect_qdiscs,
)
from omnilearn.emulator.spec.links import (
    Link,
)
from omnilearn.errors import UserError

RECEIVE = textwrap.dedent("""\
    import json, socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1])))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    n, first, last = 0, None, None
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        now = time.monotonic()
        first = first or now
        last = now
        n += len(b)
    print(json.dumps({"bytes": n, "seconds": (last - first) if first else 0.0}), flush=True)
    """)


SEND = textwrap.dedent("""\
    import socket, sys, time
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)  # little left to drain after the end
    c.settimeout(10)
    c.connect((sys.argv[1], int(sys.argv[2])))
    end = time.monotonic() + float(sys.argv[3])
    buf = b"x" * (1 << 16)
    while time.monotonic() < end:
        c.sendall(buf)
    c.close()
    """)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _transfer(src: str, dst: str, dst_addr: str, seconds: float) -> float:
    """Bit/s of a TCP stream from namespace ``src`` to ``dst``, measured by the receiver."""
    receiver = subprocess.Popen(["ip", "netns", "exec", dst, sys.executable, "-c", RECEIVE, "5201"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", src, sys.executable, "-c", SEND, dst_addr, "5201", str(seconds)],
                       check=True, timeout=30)
        result = json.loads(receiver.stdout.readline())
        receiver.wait(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return result["bytes"] * 8 / result["seconds"]


@pytest.fixture
def veth_pair() -> Iterator[tuple[str, str]]:
    """Namespaces A and B joined by a veth pair (va in A, 10.213.0.1; vb in B, 10.213.0.2); both
    namespaces, and with them every device and qdisc in them, are deleted afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("needs root, ip and tc")
    a, b = f"olt{os.getpid()}a", f"olt{os.getpid()}b"
    made = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
        _ip("-n", a, "addr", "add", "10.213.0.1/24", "dev", "va")
        _ip("-n", b, "addr", "add", "10.213.0.2/24", "dev", "vb")
        _ip("-n", a, "link", "set", "va", "up")
        _ip("-n", b, "link", "set", "vb", "up")
    except subprocess.CalledProcessError as e:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make namespaces and veths here: {e.stderr.strip()}")
    try:
        yield a, b
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        assert not {a, b} & set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                               text=True).stdout.split())


def test_rate_limits_are_set_both_ways_on_a_veth_and_carry_its_traffic(veth_pair: tuple[str, str]) -> None:
    a, b = veth_pair
    support = detect_qdiscs()
    if not (support.htb and support.tbf and support.ingress):
        pytest.skip(f"this kernel lacks htb, tbf or ingress redirection ({support})")
    rate = 20_000_000
    # What the kernel holds and what went through the shaped qdiscs: the rates they achieve on a shared
    # host are a measurement (the printed figures), not a test.
    unshaped = _transfer(a, b, "10.213.0.2", 0.3)

    htb = LinkShaper(support, netns=a, rate_qdisc="htb")
    assert htb.apply("va", Link(rate=rate)) == Link(rate=rate)
    assert htb.read("va") == (Link(rate=rate), Link(rate=rate))
    out = _transfer(a, b, "10.213.0.2", 1.0)  # leaves va: its root HTB
    into = _transfer(b, a, "10.213.0.1", 1.0)  # enters va: redirected to the IFB's HTB
    print(f"HTB {rate / 1e6:g} Mbit/s: out {out / 1e6:.2f}, in {into / 1e6:.2f} Mbit/s "
          f"(unshaped {unshaped / 1e9:.1f} Gbit/s)")
    assert out > 0 and into > 0, (out, into)
    counters = htb.counters("va")
    assert counters["out"]["bytes"] > 1_000_000 and counters["in"]["bytes"] > 1_000_000

    tbf = LinkShaper(support, netns=a, rate_qdisc="tbf")
    assert tbf.apply("va", Link(rate=rate // 2)) == Link(rate=rate // 2)  # replaces HTB
    out = _transfer(a, b, "10.213.0.2", 1.0)
    print(f"TBF {rate / 2e6:g} Mbit/s: out {out / 1e6:.2f} Mbit/s")
    assert out > 0 and tbf.read("va")[0] == Link(rate=rate // 2), out

    with pytest.raises(UserError, match="sch_netem") if support.netem is False else contextlib.nullcontext():
        tbf.check(Link(rate=rate, delay=0.01))
    tbf.apply("va", None)
    assert tbf.read("va") == (None, None)
    qdiscs = json.loads(subprocess.run(["tc", "-n", a, "-j", "qdisc", "show"], capture_output=True,
                                       text=True, check=True).stdout)
    assert [q["kind"] for q in qdiscs if q.get("dev") == "va"] in ([], ["noqueue"])
    links = subprocess.run(["ip", "-n", a, "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "olifb" not in links  # the IFB went with the link
    htb.apply("va", Link(rate=rate))
    htb.close()
    assert htb.read("va") == (None, None)
