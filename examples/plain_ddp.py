"""A plain DistributedDataParallel script (no omnilearn): a small CNN on scikit-learn's digits.

    torchrun --nproc-per-node 4 examples/plain_ddp.py --epochs 2
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits(size: int = 32) -> TensorDataset:
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    return TensorDataset(x, torch.tensor(bunch.target))


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(), nn.Linear(128, 10))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per device")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = digits()
    model = DistributedDataParallel(small_cnn())
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        times = []
        for x, y in loader:
            t0 = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if len(y):  # a batch with samples (a share of a partial last step may have none: no loss)
                last = loss.item()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        print(f"rank {rank} epoch {epoch} steps {len(times)} median step {1e3 * sorted(times)[len(times) // 2]:.1f} ms "
              f"loss {last:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
