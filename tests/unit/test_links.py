"""Per-worker links: values, ``emulation.links`` validation, tc command building (netem against a
recorded tc), qdisc detection, and real HTB/TBF shaping on a veth pair between two namespaces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.network import shaping as links_mod
from omnilearn.emulator.network.shaping import (
    QdiscSupport,
    detect_qdiscs,
    egress_commands,
    ingress_commands,
)
from omnilearn.emulator.spec.links import (
    Link,
    parse_duration,
    parse_link,
    parse_links,
    parse_loss,
    parse_rate,
)
from omnilearn.emulator.spec.plan import EmulationPlan, build_plan
from omnilearn.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------- a recorded tc


# ---------------------------------------------------------------- real shaping (root)
