"""Packed placement of quota workers (``emulation.placement: packed``): a worker of more than one CPU on
CPUs of its own, the others on as few shared CPUs as their quotas allow, one scale for every level."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnilearn import config
from omnilearn.emulator.spec.levels import Allocation, load_tables, pack_levels, parse_cpuset, resolve_level
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError

BSP = load_tables()["bsp"]


def quota_levels(host: list[int], levels: tuple[str, ...] = ("HL1", "HL2", "HL4", "HL8")
                 ) -> dict[str, dict[str, Allocation]]:
    return {lv: {f"worker{i + 1}": a for i, a in enumerate(resolve_level(BSP, lv, 4, "quota", host, 0.85)[0])}
            for lv in levels}


def loads(allocs: dict[str, Allocation]) -> dict[int, float]:
    """Each CPU's quota load, a worker's quota spread evenly over its cpuset."""
    out: dict[int, float] = {}
    for a in allocs.values():
        cpus = parse_cpuset(a.cpuset)
        for c in cpus:
            out[c] = out.get(c, 0.0) + a.cpus / len(cpus)
    return out


def test_hl8_on_two_cpus_gives_the_fast_worker_a_cpu_of_its_own_and_keeps_the_ratios() -> None:
    nominal = quota_levels([0, 1], ("HL8",))["HL8"]
    packed = pack_levels({"HL8": nominal}, [0, 1])["HL8"]
    fast = packed["worker4"]
    assert fast.cpus == pytest.approx(1.0) and fast.cpuset in ("0", "1")
    others = {a.cpuset for t, a in packed.items() if t != "worker4"}
    assert others == {"1" if fast.cpuset == "0" else "0"}  # the three slow workers share the other CPU
    scale = {t: packed[t].cpus / nominal[t].cpus for t in nominal}
    assert max(scale.values()) == pytest.approx(min(scale.values()), rel=1e-3)  # one factor: the ratios kept
    assert scale["worker1"] == pytest.approx(1 / nominal["worker4"].cpus, rel=1e-3)


def test_one_scale_for_every_level_of_a_run() -> None:
    nominal = quota_levels([0, 1])
    packed = pack_levels(nominal, [0, 1])
    factors = {packed[lv][t].cpus / nominal[lv][t].cpus for lv in nominal for t in nominal[lv]}
    assert max(factors) == pytest.approx(min(factors), rel=1e-3)
    assert packed["HL1"]["worker1"].cpus == pytest.approx(0.375, abs=1e-3)  # 0.425 scaled as HL8 needs
    for allocs in packed.values():
        assert max(loads(allocs).values()) <= 1 + 1e-3


def test_shares_that_fit_are_not_scaled() -> None:
    host = list(range(8))
    nominal = quota_levels(host, ("HL8",))
    packed = pack_levels(nominal, host)["HL8"]
    assert [a.cpus for a in packed.values()] == [a.cpus for a in nominal["HL8"].values()]
    assert len(parse_cpuset(packed["worker4"].cpuset)) == 5  # 4.53 CPUs on five of its own
    sets = [set(parse_cpuset(a.cpuset)) for a in packed.values()]
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])  # 0.85 + 0.57 > 1: none shared


def test_unlimited_and_cpuset_allocations_are_left_alone() -> None:
    levels = {"L": {"server": Allocation(), "pinned": Allocation(cpuset="1"), "w": Allocation(cpus=0.5)}}
    packed = pack_levels(levels, [0, 1])["L"]
    assert packed["server"] == Allocation() and packed["pinned"] == Allocation(cpuset="1")
    assert packed["w"].cpus == 0.5 and packed["w"].cpuset is not None


@given(st.lists(st.floats(0.05, 6.0), min_size=1, max_size=12), st.integers(1, 16))
def test_every_placement_fits_its_cpus(shares: list[float], n: int) -> None:
    host = list(range(10, 10 + n))  # CPU numbers need not start at 0
    levels = {"L": {f"w{i}": Allocation(cpus=round(s, 4)) for i, s in enumerate(shares)}}
    packed = pack_levels(levels, host)["L"]
    factors = [packed[t].cpus / levels["L"][t].cpus for t in levels["L"]]
    assert max(factors) <= 1 + 1e-3
    assert max(factors) - min(factors) <= 2e-4 / min(shares) + 1e-3  # one factor, up to rounding to 1e-4
    cpu_load = loads(packed)
    assert set(cpu_load) <= set(host)
    assert max(cpu_load.values()) <= 1 + 1e-3
    for a in packed.values():  # a worker of several CPUs shares none of them
        cpus = parse_cpuset(a.cpuset)
        if len(cpus) > 1:
            assert not any(c in parse_cpuset(b.cpuset) for b in packed.values() if b is not a for c in cpus)
    if min(factors) < 1 - 1e-3:  # scaled down only as far as the placement needs: some CPU is full
        assert max(cpu_load.values()) == pytest.approx(1, abs=2e-3 * len(shares))


def test_the_plan_packs_quota_levels_only_when_asked() -> None:
    spread = build_plan(config.build(None, [("emulation.hl", "HL8")]), host=[0, 1])
    assert spread.mode == "quota" and spread.allocation("HL8", "worker4").cpuset is None
    packed = build_plan(config.build(None, [("emulation.hl", "HL8"), ("emulation.placement", "packed")]),
                        host=[0, 1])
    assert packed.allocation("HL8", "worker4").cpus == pytest.approx(1.0)
    assert {packed.allocation("HL8", f"worker{i}").cpuset for i in (1, 2, 3)} == {"0", "1"} - {
        packed.allocation("HL8", "worker4").cpuset}


def test_an_unknown_placement_is_one_error_naming_the_key() -> None:
    with pytest.raises(UserError, match="emulation.placement.*spread, packed"):
        config.build(None, [("emulation.placement", "tight")])
