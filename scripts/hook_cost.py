"""What the timing module costs a DDP step, measured step by step in one job.

    omnilearn emulate --hl HL8 --workers 4 --out OUT -- torchrun --nproc-per-node 4 scripts/hook_cost.py

Every rank wraps ``examples/plain_ddp.py``'s model twice, from the same weights: the first model a rank wraps
is the one the timing module (loaded by ``emulate``) times, through its communication hook; the second runs
DDP's built-in all-reduce, as every model does without the module. The two then take turns on the same
batches (A B B A, so that a drift of the host's load falls on both alike) and each step is timed from
``zero_grad`` to the end of ``optimizer.step()``: the same quotas, the same host, the same slowest rank. Separate
runs with and without the module differ by 7% and more on a shared host; pairs of steps a few hundred
milliseconds apart do not. Rank 0 prints one JSON line: the median step of each model, and the mean of the
steps' paired log ratios with its standard error (``cost``: the timed model's samples a second fewer, as a
share). Under ``OMNILEARN_HOOK=0`` neither model is timed: the same figures then read what the order of
two equal models costs, the measurement's own zero.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from plain_ddp import digits, small_cnn  # noqa: E402 - the example's own model and data


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One training step of ``model``, as ``plain_ddp.py`` takes it; its seconds."""
    t0 = time.perf_counter()
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="per device")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = digits()
    net = small_cnn()
    timed = DistributedDataParallel(net)  # the first wrap: the timing module's, where it is loaded
    plain_net = small_cnn()
    plain_net.load_state_dict(net.state_dict())
    plain = DistributedDataParallel(plain_net)
    models = {"timed": (timed, torch.optim.SGD(timed.parameters(), lr=0.1, momentum=0.9)),
              "plain": (plain, torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9))}
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    times: dict[str, list[float]] = {"timed": [], "plain": []}
    turn = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            order = ("timed", "plain") if turn % 2 == 0 else ("plain", "timed")
            for name in order:
                times[name].append(step(*models[name], x, y))
            turn += 1
    skip = len(loader)  # the first epoch: warm-up, allocator and caches
    a, b = times["timed"][skip:], times["plain"][skip:]
    logs = [math.log(t / u) for t, u in zip(a, b, strict=True)]
    mean = statistics.fmean(logs)
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    if dist.get_rank() == 0:
        print(json.dumps({"pairs": len(logs), "timed_median_ms": round(1e3 * statistics.median(a), 2),
                          "plain_median_ms": round(1e3 * statistics.median(b), 2),
                          "cost": round(1 - math.exp(-mean), 4), "cost_se": round(se, 4)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
