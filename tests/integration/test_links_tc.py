"""Links against a recorded tc and this kernel's qdiscs (processes), and a bad link through the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_links import ALL, NO_NETEM

from omnilearn import config
from omnilearn.emulator.network import shaping as links_mod
from omnilearn.emulator.network.shaping import (
    LinkShaper,
    detect_qdiscs,
    egress_commands,
    ingress_commands,
)
from omnilearn.emulator.spec.links import (
    Link,
)
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError


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
