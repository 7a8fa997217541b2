"""Clusters of 8, 16 and 32 workers: the level tables, and the controller and sampler at 32 workers.

Pure units: no process is started (a 32-worker BSP job on a 2-core host would be all start-up).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from omnilearn.config import ControlConfig
from omnilearn.control.controller import build_controller
from omnilearn.emulator.spec.levels import load_tables, resolve_level
from omnilearn.train.sampler import GlobalBatchSampler

DOC = (Path(__file__).resolve().parents[2] / "cpus_allocation.md").read_text()
RATIO = {"HL1": 1, "HL2": 2, "HL4": 4, "HL8": 8}


@pytest.mark.parametrize("workers", [8, 16, 32])
def test_cluster_tables_keep_the_papers_ratios_within_the_servers(workers: int) -> None:
    table = load_tables()["bsp"]
    for level, k in RATIO.items():
        cores = table.cluster_cores(level, workers)
        assert cores is not None and len(cores) == workers
        assert max(cores) == k * min(cores)
        for s in range(workers // table.per_server):  # each 48-core server holds its workers
            assert sum(cores[s * table.per_server:(s + 1) * table.per_server]) <= table.server_cores
        quotas = [a.cpus for a in resolve_level(table, level, workers, "quota", host=[0, 1])[0]]
        assert sum(quotas) == pytest.approx(2.0, abs=0.01) and min(quotas) >= 0.01
        assert max(quotas) / min(quotas) == pytest.approx(k, rel=0.01)


def test_the_cluster_table_in_the_docs_is_the_configs() -> None:
    table = load_tables()["bsp"]
    body = DOC.split("## BSP clusters: 8, 16 and 32 workers", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines() if line.startswith("| HL") and line[4:5].isdigit()]
    assert {r[0]: [int(x) for x in r[1:9]] for r in rows} == table.clusters


def test_one_server_of_eight_gets_cpusets_on_a_48_core_host() -> None:
    table = load_tables()["bsp"]
    workers, _ = resolve_level(table, "HL8", 8, "cpuset", host=list(range(48)))
    assert [a.cpuset for a in workers] == ["0-2", "3-5", "6-8", "9-11", "12-14", "15-17", "18-23", "24-47"]


def test_the_controller_balances_32_workers_of_the_hl8_table() -> None:
    """Compute times from the 32-worker HL8 cores (t = c (b + k), a little noise): the reactive
    controller, from equal batches, brings the measured spread under 10% and keeps B and the bounds."""
    table = load_tables()["bsp"]
    cores = table.cluster_cores("HL8", 32)
    c = ControlConfig(policy="dynamic")
    B = 32 * 32
    ctl = build_controller(c, B, 32)
    rng = random.Random(3)
    spread = []
    for _ in range(80):
        true = [0.01 * (b + 4) / n for b, n in zip(ctl.batch, cores, strict=True)]
        ctl.observe_step([t * math.exp(rng.gauss(0, 0.02)) for t in true])
        spread.append(max(true) / min(true) - 1)  # the split's own imbalance, noise aside
        ctl.decide()
        assert sum(ctl.batch) == B and all(c.min_batch <= b <= B for b in ctl.batch)
    assert spread[0] > 5  # equal batches: the 24-core worker is 8x faster
    assert max(spread[-10:]) < 0.10
    fast = [b for b, n in zip(ctl.batch, cores, strict=True) if n == 24]
    slow = [b for b, n in zip(ctl.batch, cores, strict=True) if n == 3]
    assert min(fast) > 5 * max(slow)


def test_the_sampler_gives_32_workers_every_sample_once_per_epoch_whatever_the_split() -> None:
    sampler = GlobalBatchSampler(1000, 320, seed=5)
    rng = random.Random(0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen: list[int] = []
        for step in range(sampler.steps_per_epoch):
            cut = sorted(rng.sample(range(1, 320), 31))
            batch = [b - a for a, b in zip([0, *cut], [*cut, 320], strict=True)]
            sizes = sampler.step_sizes(step, batch)
            assert len(sizes) == 32 and sum(sizes) == sampler.step_size(step)
            for rank in range(32):
                seen += sampler.local_indices(step, batch, rank).tolist()
        assert sorted(seen) == list(range(1000))
