"""Per-worker links: values, ``emulation.links`` validation, tc command building (netem against a
recorded tc), qdisc detection, and real HTB/TBF shaping on a veth pair between two namespaces."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator import shaping as links_mod
from omnilearn.emulator.links import (
    Link,
    parse_duration,
    parse_link,
    parse_links,
    parse_loss,
    parse_rate,
)
from omnilearn.emulator.plan import EmulationPlan, build_plan
from omnilearn.emulator.shaping import (
    LinkShaper,
    QdiscSupport,
    detect_qdiscs,
    egress_commands,
    ingress_commands,
)
from omnilearn.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
BSP = ["worker1", "worker2", "worker3", "worker4"]
ASP = ["aspworker1", *[f"aspworker{i}" for i in range(2, 6)]]
ALL = QdiscSupport(htb=True, tbf=True, netem=True, ingress=True, how="assumed by the test")
NO_NETEM = QdiscSupport(htb=True, tbf=True, netem=False, ingress=True, how="assumed by the test")


# ---------------------------------------------------------------- values


def test_values_parse_strictly() -> None:
    assert parse_rate("100mbit") == 100_000_000 and parse_rate("1.5Gbit") == 1_500_000_000
    assert parse_rate("64kbit") == 64_000
    assert parse_duration("10ms") == pytest.approx(0.01) and parse_duration("250us") == pytest.approx(250e-6)
    assert parse_duration("1.5s") == 1.5
    assert parse_loss("0.5%") == 0.5 and parse_loss("100%") == 100


@pytest.mark.parametrize("parse, value, words", [
    (parse_rate, "100mbps", "bytes per second"),
    (parse_rate, "100MB/s", "bytes per second"),
    (parse_rate, 100_000_000, "with its unit"),
    (parse_rate, "100", "with its unit"),
    (parse_rate, "fast", "with its unit"),
    (parse_rate, "1bit", "outside"),
    (parse_rate, "1000gbit", "outside"),
    (parse_duration, "10", "unit"),
    (parse_duration, 0.01, "unit"),
    (parse_duration, "-1ms", "unit"),
    (parse_duration, "2min", "unit"),
    (parse_duration, "61s", "exceeds"),
    (parse_loss, "0.5", "percentage"),
    (parse_loss, 0.5, "percentage"),
    (parse_loss, "101%", "exceeds"),
])
def test_bad_values_say_why(parse, value, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse(value)


def test_parse_link_forms_and_errors_name_the_key() -> None:
    assert parse_link(None, "x") is None
    assert parse_link("100mbit", "x") == Link(rate=100_000_000)
    link = parse_link({"rate": "10mbit", "delay": "10ms", "jitter": "2ms", "loss": "0.5%"}, "x")
    assert link == Link(rate=10_000_000, delay=0.01, jitter=0.002, loss=0.5) and link.needs_netem
    assert parse_link({"rate": "10mbit", "delay": "0ms", "loss": "0%"}, "x") == Link(rate=10_000_000)
    assert link.describe() == "10mbit, delay 10ms ± 2ms, loss 0.5%"
    assert parse_link(link.to_dict(), "x") == link and Link.from_dict(link.to_dict()) == link
    where = "job.yaml: emulation.links.worker2"
    for value, key, words in [
        ({"rate": "10mbps"}, f"{where}.rate", "bits"),
        ({"rat": "10mbit"}, where, "unknown key(s) rat"),
        ({"jitter": "2ms"}, f"{where}.jitter", "needs a delay"),
        ({"delay": "10"}, f"{where}.delay", "unit"),
        ({"loss": "0%"}, where, "shapes nothing"),
        ({}, where, "shapes nothing"),
        (100, where, "expected null, a rate"),
        ("100", where, "rate in bits"),
    ]:
        with pytest.raises(UserError) as err:
            parse_link(value, where)
        assert str(err.value).startswith(f"{key}: ") and words in str(err.value), err.value


# ---------------------------------------------------------------- emulation.links


def test_links_per_worker_list_mapping_and_level() -> None:
    levels = ["HL2", "HL4"]
    w = "emulation.links"
    by_list = parse_links([None, "100mbit", None, None], BSP, BSP, levels, w)
    by_map = parse_links({"worker2": "100mbit"}, BSP, BSP, levels, w)
    assert by_list == by_map == {"HL2": {"worker2": Link(rate=100_000_000)},
                                 "HL4": {"worker2": Link(rate=100_000_000)}}
    per_level = parse_links({"HL4": {"worker1": "1gbit"}}, BSP, BSP, levels, w)
    assert per_level == {"HL2": {}, "HL4": {"worker1": Link(rate=10**9)}}
    per_level_list = parse_links({"HL2": ["10mbit", None, None, "20mbit"]}, BSP, BSP, levels, w)
    assert per_level_list["HL2"] == {"worker1": Link(rate=10**7), "worker4": Link(rate=2 * 10**7)}
    # ASP: one entry per worker, or one more with the parameter server's first.
    workers = ASP[1:]
    assert parse_links(["1mbit", None, None, None], ASP, workers, ["HL1"], w) == {
        "HL1": {"aspworker2": Link(rate=10**6)}}
    assert parse_links(["1mbit", None, None, None, None], ASP, workers, ["HL1"], w) == {
        "HL1": {"aspworker1": Link(rate=10**6)}}
    assert parse_links(None, BSP, BSP, levels, w) == {} and parse_links({}, BSP, BSP, levels, w) == {}


@pytest.mark.parametrize("spec, words", [
    ([None, None], "has 2 entries; expected 4"),
    ({"worker9": "1mbit"}, "worker9: neither a target"),
    ({"worker1": "1mbit", "HL2": {}}, "HL2 is not a target"),
    ({"HL3": {"worker1": "1mbit"}}, "HL3: neither a target of this job"),
    ({"HL2": "1mbit"}, "emulation.links.HL2: expected a list"),
    ({"HL2": {"worker7": "1mbit"}}, "emulation.links.HL2: worker7: not a target"),
    ({"HL2": [None, {"rate": "1mbyte"}, None, None]}, "emulation.links.HL2.worker2.rate: "),
    ("100mbit", "expected a list"),
])
def test_bad_links_are_one_clear_error(spec, words: str) -> None:
    with pytest.raises(UserError, match="^emulation.links") as err:
        parse_links(spec, BSP, BSP, ["HL2", "HL4"], "emulation.links")
    assert words in str(err.value), err.value


def test_config_and_plan_carry_links(tmp_path: Path) -> None:
    cfg = config.build(ROOT / "configs" / "link-demo.yaml", [])
    plan = build_plan(cfg, host=[0, 1])
    assert set(plan.links) == set(plan.levels)
    for level in plan.levels:
        assert plan.links[level] == {"worker1": Link(rate=100_000_000)}
        assert plan.link(level, "worker2") is None
    assert EmulationPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    off = config.build(ROOT / "configs" / "link-demo.yaml", [config.parse_assignment("emulation.links=null")])
    assert off.emulation.links is None and build_plan(off, host=[0, 1]).links == {}
    one = config.build(None, [config.parse_assignment("emulation.links.worker3=5mbit")])
    assert build_plan(one, host=[0, 1]).link("HL2", "worker3") == Link(rate=5_000_000)
    # A job file written before links existed still loads.
    old = plan.to_dict()
    del old["links"]
    assert EmulationPlan.from_dict(old).links == {}


def test_bad_link_in_config_names_file_and_key(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("emulation:\n  links:\n    worker2: {rate: 100mbit, delay: 10}\n")
    with pytest.raises(UserError) as err:
        build_plan(config.build(job, []), host=[0, 1])
    assert str(err.value).startswith(f"{job}: emulation.links.worker2.delay: "), err.value
    job.write_text("emulation:\n  links: 100mbit\n")
    with pytest.raises(UserError, match="emulation.links: expected list or dict"):  # the config's own typing
        config.build(job, [])
    out = tmp_path / "out"
    job.write_text("emulation:\n  links: {HL2: [1mbit, null, null]}\n")
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", str(job), "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "emulation.links.HL2: has 3 entries" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


# ---------------------------------------------------------------- tc commands


def test_rate_commands_htb_and_tbf() -> None:
    link = Link(rate=100_000_000)
    assert egress_commands("veth1", link, "htb") == [
        ["tc", "qdisc", "add", "dev", "veth1", "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "class", "add", "dev", "veth1", "parent", "1:", "classid", "1:1", "htb", "rate", "100000000bit",
         "ceil", "100000000bit", "burst", "125000", "cburst", "125000", "quantum", "60000"],
    ]
    assert egress_commands("veth1", Link(rate=1_000_000), "tbf") == [
        ["tc", "qdisc", "add", "dev", "veth1", "root", "handle", "1:", "tbf", "rate", "1000000bit",
         "burst", "16384", "latency", "50ms"],
    ]
    assert ingress_commands("veth1", "olifb9", link, "tbf") == [
        ["ip", "link", "set", "dev", "olifb9", "up"],
        *egress_commands("olifb9", link, "tbf"),
        ["tc", "qdisc", "add", "dev", "veth1", "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", "veth1", "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
         "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "olifb9"],
    ]


def test_netem_commands() -> None:
    """netem's arguments (untested against a kernel here: this one has no sch_netem)."""
    delay_only = Link(delay=0.01, jitter=0.002, loss=0.5)
    assert egress_commands("eth9", delay_only) == [
        ["tc", "qdisc", "add", "dev", "eth9", "root", "handle", "1:", "netem", "limit", "10000",
         "delay", "10000us", "2000us", "loss", "0.5%"]]
    # Under a rate, netem is the rate class's child and its queue holds twice the bandwidth-delay product.
    cmds = egress_commands("eth9", Link(rate=10**9, delay=0.05, loss=0.01), "htb")
    assert cmds[-1] == ["tc", "qdisc", "add", "dev", "eth9", "parent", "1:1", "handle", "10:", "netem",
                        "limit", "8334", "delay", "50000us", "loss", "0.01%"]
    assert egress_commands("eth9", Link(loss=1e-5))[0][-2:] == ["loss", "0.00001%"]


def test_support_refusals_name_the_missing_qdisc() -> None:
    netem = Link(rate=10**6, delay=0.01)
    reason = NO_NETEM.refusal(netem)
    assert reason is not None and "sch_netem" in reason and "delay" in reason
    assert NO_NETEM.refusal(Link(rate=10**6)) is None and ALL.refusal(netem) is None
    no_htb = QdiscSupport(htb=False, tbf=True, netem=False, ingress=True, how="")
    assert "sch_htb" in no_htb.refusal(Link(rate=10**6), "htb") and "use tbf" in no_htb.refusal(Link(rate=10**6))
    assert no_htb.refusal(Link(rate=10**6), "tbf") is None
    no_ifb = QdiscSupport(htb=True, tbf=True, netem=False, ingress=False, how="")
    assert "IFB" in no_ifb.refusal(Link(rate=10**6))
    unknown = QdiscSupport(htb=None, tbf=None, netem=None, ingress=None, how="")
    assert unknown.refusal(netem) is None  # not known: tc will say


def _config_gz(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def test_detect_qdiscs_from_kernel_config_when_probing_cannot_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(links_mod.shutil, "which", lambda name: None)
    cfg = _config_gz(tmp_path / "config.gz", ["CONFIG_NET_SCH_HTB=y", "CONFIG_NET_SCH_TBF=m",
                                              "# CONFIG_NET_SCH_NETEM is not set", "CONFIG_NET_SCH_INGRESS=y",
                                              "CONFIG_NET_CLS_U32=y", "CONFIG_NET_ACT_MIRRED=y", "CONFIG_IFB=y"])
    s = detect_qdiscs(cfg)
    assert (s.htb, s.tbf, s.netem, s.ingress) == (True, True, False, True) and "config.gz" in s.how
    s = detect_qdiscs(tmp_path / "missing.gz")
    assert (s.htb, s.netem) == (None, None)


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("tc") is None, reason="needs unshare and tc")
def test_detect_qdiscs_probes_this_kernel() -> None:
    """Probing agrees with the kernel's build config (on the development host: htb, tbf yes; netem no)."""
    probed = detect_qdiscs()
    if probed.how != "probed in a private network namespace":
        pytest.skip(f"namespaces unavailable here ({probed.how})")
    config_path = Path("/proc/config.gz")
    if config_path.exists():
        config = links_mod._read_kernel_config(config_path)
        assert config is not None
        for name, keys in links_mod._CONFIG_KEYS.items():
            # A module (=m) that is not built at all reads as missing; =y and =m load on demand as root.
            expected = all(config.get(f"CONFIG_{k}") in ("y", "m") for k in keys)
            assert getattr(probed, name) == expected, (name, probed)
    assert probed.htb and probed.tbf


# ---------------------------------------------------------------- a recorded tc

FAKE = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    name = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    with open(os.path.join(here, "calls.jsonl"), "a") as f:
        f.write(json.dumps([name, *args]) + "\\n")
    path = os.path.join(here, "responses.json")
    responses = json.load(open(path))
    key = " ".join([name, *args])
    replies = responses.get(key) or [[0, ""]]
    rc, out = replies[0]
    if len(replies) > 1:
        responses[key] = replies[1:]
        json.dump(responses, open(path, "w"))
    sys.stdout.write(out)
    sys.exit(rc)
    """)


@pytest.fixture
def recorded_tc(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """``tc`` and ``ip`` on PATH that record their argv and answer from responses.json (a list of
    [status, stdout] per command line, consumed in order, the last one repeating)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("tc", "ip"):
        exe = bin_dir / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
    (bin_dir / "responses.json").write_text("{}")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield bin_dir


def _calls(bin_dir: Path) -> list[list[str]]:
    path = bin_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_netem_link_against_a_recorded_tc(recorded_tc: Path) -> None:
    """The whole apply path for delay, jitter and loss: what tc is told, and how its JSON is read back."""
    netem_json = {"kind": "netem", "handle": "10:", "parent": "1:1",
                  "options": {"limit": 1000, "delay": {"delay": 0.01, "jitter": 0.002},
                              "loss-random": {"loss": 0.005}}}
    htb_root = {"kind": "htb", "handle": "1:", "root": True, "options": {"r2q": 10, "default": "0x1"}}
    ingress = {"kind": "ingress", "handle": "ffff:", "parent": "ffff:fff1", "options": {}}
    htb_class = "class htb 1:1 root prio 0 rate 100Mbit ceil 100Mbit burst 125000b cburst 125000b \n"
    (recorded_tc / "responses.json").write_text(json.dumps({
        "ip -j link show dev veth0": [[0, json.dumps([{"ifindex": 7, "ifname": "veth0"}])]],
        "ip link show dev olifb7": [[1, ""], [1, ""], [0, "7: olifb7: <BROADCAST,NOARP,UP>"]],
        "tc -j qdisc show dev veth0": [[0, "[]"], [0, json.dumps([htb_root, netem_json, ingress])]],
        "tc -j qdisc show dev olifb7": [[0, json.dumps([htb_root, netem_json])]],
        "tc class show dev veth0 classid 1:1": [[0, htb_class]],
        "tc class show dev olifb7 classid 1:1": [[0, htb_class]],
    }))
    shaper = LinkShaper(ALL, needs_root=False)
    link = Link(rate=100_000_000, delay=0.01, jitter=0.002, loss=0.5)
    assert shaper.apply("veth0", link) == link
    changes = [c for c in _calls(recorded_tc) if "add" in c or "set" in c]
    expected = [["ip", "link", "add", "olifb7", "txqueuelen", "1000", "type", "ifb"],
                *egress_commands("veth0", link), *ingress_commands("veth0", "olifb7", link)]
    assert changes == expected
    netem = [c for c in changes if "netem" in c]
    assert netem == [["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem", "limit", "1000",
                      "delay", "10000us", "2000us", "loss", "0.5%"] for dev in ("veth0", "olifb7")]


def test_refusals_change_nothing(recorded_tc: Path, monkeypatch) -> None:
    shaper = LinkShaper(NO_NETEM, needs_root=False)
    with pytest.raises(UserError, match="sch_netem") as err:
        shaper.apply("veth0", Link(rate=10**8, delay=0.01))
    assert str(err.value).startswith("emulation.links: 100mbit, delay 10ms: delay needs the sch_netem")
    with pytest.raises(UserError, match="sch_netem"):
        shaper.check(Link(loss=1.0), "emulation.links.worker3")
    plan_links = {"HL2": {"worker1": Link(rate=10**8)}, "HL4": {"worker1": Link(rate=10**8), "worker3": Link(loss=1.0)}}
    with pytest.raises(UserError, match="^emulation.links: worker3 at HL4: loss 1%: loss needs the sch_netem"):
        shaper.check_all(plan_links)
    LinkShaper(ALL, needs_root=False).check_all(plan_links)
    assert _calls(recorded_tc) == []
    with pytest.raises(links_mod.ShapingError, match="not an interface name"):
        shaper.apply("veth0; reboot", Link(rate=10**8))
    monkeypatch.setattr(links_mod.os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root .* --set emulation.links=null"):
        LinkShaper(ALL)
    assert _calls(recorded_tc) == []


def test_a_failing_tc_is_a_shaping_error_with_its_words(recorded_tc: Path) -> None:
    (recorded_tc / "responses.json").write_text(json.dumps({
        "ip -j link show dev veth0": [[0, json.dumps([{"ifindex": 3}])]],
        "ip link show dev olifb3": [[1, ""]],
        "tc -j qdisc show dev veth0": [[0, "[]"]],
        "tc qdisc add dev veth0 root handle 1: htb default 1": [[2, "Error: Exclusivity flag on.\n"]],
    }))
    with pytest.raises(links_mod.ShapingError, match="htb default 1: Error: Exclusivity flag on"):
        LinkShaper(ALL, needs_root=False).apply("veth0", Link(rate=10**6))


# ---------------------------------------------------------------- real shaping (root)

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


def test_rate_limits_hold_both_ways_on_a_veth(veth_pair: tuple[str, str]) -> None:
    a, b = veth_pair
    support = detect_qdiscs()
    if not (support.htb and support.tbf and support.ingress):
        pytest.skip(f"this kernel lacks htb, tbf or ingress redirection ({support})")
    rate = 20_000_000
    unshaped = _transfer(a, b, "10.213.0.2", 0.3)
    assert unshaped > 3 * rate, unshaped  # the veth itself is no bottleneck: what follows is the qdisc's doing

    htb = LinkShaper(support, netns=a, rate_qdisc="htb")
    assert htb.apply("va", Link(rate=rate)) == Link(rate=rate)
    assert htb.read("va") == (Link(rate=rate), Link(rate=rate))
    out = _transfer(a, b, "10.213.0.2", 1.0)  # leaves va: its root HTB
    into = _transfer(b, a, "10.213.0.1", 1.0)  # enters va: redirected to the IFB's HTB
    print(f"HTB {rate / 1e6:g} Mbit/s: out {out / 1e6:.2f}, in {into / 1e6:.2f} Mbit/s "
          f"(unshaped {unshaped / 1e9:.1f} Gbit/s)")
    assert 0.8 * rate < out < 1.05 * rate and 0.8 * rate < into < 1.05 * rate, (out, into)
    counters = htb.counters("va")
    assert counters["out"]["bytes"] > 1_000_000 and counters["in"]["bytes"] > 1_000_000

    tbf = LinkShaper(support, netns=a, rate_qdisc="tbf")
    assert tbf.apply("va", Link(rate=rate // 2)) == Link(rate=rate // 2)  # replaces HTB
    out = _transfer(a, b, "10.213.0.2", 1.0)
    print(f"TBF {rate / 2e6:g} Mbit/s: out {out / 1e6:.2f} Mbit/s")
    assert 0.4 * rate < out < 0.525 * rate, out

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
