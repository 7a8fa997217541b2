"""cpus_allocation.md and configs/levels.yaml describe the same allocations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omnilearn.config.sections import EmulationConfig
from omnilearn.emulator.spec.levels import load_tables, parse_cpuset, resolve_level

DOC = (Path(__file__).resolve().parents[2] / "cpus_allocation.md").read_text()
SHARE = EmulationConfig().host_share


def section(title: str) -> list[list[str]]:
    """Rows (cells) of the first table after the heading ``title``."""
    body = DOC.split(f"## {title}", 1)[1]
    rows = []
    for line in body.splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("|") and not set(line) <= set("|- "):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]  # without the header


def test_bsp_table_matches_config() -> None:
    table = load_tables()["bsp"]
    rows = section("BSP, 4 workers on a 48-core server")
    assert [r[0] for r in rows] == list(table.levels)
    for r in rows:
        assert r[1:5] == table.levels[r[0]]
        assert r[5] == "/".join(str(len(parse_cpuset(s))) for s in table.levels[r[0]])


def test_asp_table_matches_config() -> None:
    table = load_tables()["asp"]
    rows = section("ASP, parameter server + 4 workers on a 48-core server")
    assert [r[0] for r in rows] == list(table.levels)
    for r in rows:
        assert r[1] == table.server
        assert r[2:6] == table.levels[r[0]]
        assert r[6] == "/".join(str(len(parse_cpuset(s))) for s in table.levels[r[0]])


def level_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"\| HL\d", line)]


@pytest.mark.parametrize("mode", ["bsp", "asp"])
def test_quota_tables_match_scaling(mode: str) -> None:
    table = load_tables()[mode]
    body = DOC.split("## On a smaller host: CPU quotas", 1)[1].split("\n## ", 1)[0]
    bsp_part, asp_part = body.split("ASP on 2 CPUs", 1)
    rows = level_rows(bsp_part if mode == "bsp" else asp_part)
    if mode == "asp":
        _, server = resolve_level(table, "HL1", 4, "quota", host=[0, 1], share=SHARE)
        stated = re.search(r"server ([0-9.]+) CPU", asp_part)
        assert float(stated.group(1)) == pytest.approx(server.cpus, abs=1e-4)
    assert [r[0] for r in rows] == list(table.levels)
    for r in rows:
        workers, _ = resolve_level(table, r[0], 4, "quota", host=[0, 1], share=SHARE)
        assert [float(c) for c in r[1:5]] == pytest.approx([a.cpus for a in workers], abs=1e-4)


def test_32_worker_layout_is_hl8_and_fits_its_servers() -> None:
    rows = section("HL8 over 32 containers on four 48-core servers")
    assert len(rows) == 32
    used: dict[str, set[int]] = {}
    for name, server, cores, cpuset in rows:
        cpus = parse_cpuset(cpuset)
        assert len(cpus) == int(cores), name
        assert max(cpus) < 48
        taken = used.setdefault(server, set())
        assert not taken & set(cpus), f"{name} overlaps on server {server}"
        taken.update(cpus)
