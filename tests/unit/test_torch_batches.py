"""omnilearn.torch's pure parts: the global batch from a per-device batch, micro-batches, and threads
left as the launcher set them unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_requests import PLAN

from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.errors import UserError
from omnilearn.torch.loader import global_batch_of
from omnilearn.train.sampler import micro_sizes


@pytest.mark.parametrize(("local", "k"), [(11, 3), (12, 3), (2, 3), (0, 4), (7, 1)])
def test_micro_batches_cut_a_local_batch_evenly(local: int, k: int) -> None:
    sizes = micro_sizes(local, k)
    assert len(sizes) == k and sum(sizes) == local
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_the_global_batch_follows_from_a_per_device_batch() -> None:
    assert global_batch_of(None, 8, 4, 1, "L") == 32
    assert global_batch_of(None, 8, 4, 3, "L") == 96  # per device, per micro-batch
    assert global_batch_of(96, 8, 4, 3, "L") == 96
    assert global_batch_of(100, None, 4, 3, "L") == 100


@pytest.mark.parametrize(("args", "named"), [((None, None, 2, 1), "batch_size="), ((64, 8, 2, 1), "global_batch=64"),
                                             ((None, 0, 2, 1), "batch_size"), ((None, 8, 2, 0), "accumulate")])
def test_a_batch_that_does_not_add_up_is_named(args: tuple, named: str) -> None:
    with pytest.raises(UserError, match=named):
        global_batch_of(*args, "HeteroDataLoader")


@pytest.mark.parametrize("per_level", [False, True])
def test_threads_follow_a_level_only_when_asked(tmp_path: Path, per_level: bool) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # the launcher's OMP_NUM_THREADS
    try:
        client = AllocationClient(PLAN, tmp_path / "logs", 0, "worker0", ack_timeout=0.01, set_threads=per_level)
        event = client.ensure("HL2", 1.0)  # 0.5 CPU: one thread; no toggler answers (unconfirmed)
        want = PLAN.allocation("HL2", "worker0").threads() if per_level else 3
        assert torch.get_num_threads() == want and event["threads"] == want and client.threads == want
    finally:
        torch.set_num_threads(before)
