"""A bare DistributedDataParallel loop, written apart from omnilearn, on the workload of ``omnilearn run``'s
default job: the yardstick for what ``omnilearn run`` adds around a BSP step.

The default job's model and data (a torchvision ResNet-18 with a 3x3 stride-1 stem, scikit-learn's
digits at 32x32 in three channels; ``--image-size 24`` for ``configs/demo.yaml``), a global batch of 256
split equally, SGD at 0.1 with momentum 0.9 and weight decay 5e-4, one ``DistributedDataParallel`` step a
batch and nothing else: no evaluation, no records but one line of figures. Run it under the same
quotas (the same cgroups and CFS period) with

    omnilearn emulate --hl HL8 --workers 4 --out DIR -- \\
        torchrun --nproc-per-node 4 scripts/bare_ddp.py --epochs 3

Rank 0 prints ``steady_samples_per_s``: the global batch over the median step time of the steps after
the first epoch's first ``--warm`` (wall time of the step, the all-reduce included, as rank 0 sees it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchvision.models import resnet18


def digits(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x.repeat(1, 3, 1, 1), torch.tensor(bunch.target)


def model() -> nn.Module:
    net = resnet18(weights=None, num_classes=10)
    net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    return net


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--warm", type=int, default=3, help="steps left out at the start")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = digits(args.image_size)
    net = DistributedDataParallel(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    share = args.global_batch // world
    steps = len(x) // args.global_batch
    times: list[float] = []
    began = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for s in range(steps):
            idx = order[s * args.global_batch + rank * share:s * args.global_batch + (rank + 1) * share]
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    total = time.perf_counter() - began
    if rank == 0:
        steady = statistics.median(times[args.warm:])
        print(json.dumps({"steady_samples_per_s": round(args.global_batch / steady, 2),
                          "median_step_ms": round(steady * 1e3, 2), "steps": len(times),
                          "samples_per_s": round(len(times) * args.global_batch / total, 2),
                          "threads": torch.get_num_threads()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
