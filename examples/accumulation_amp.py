"""A loop with gradient accumulation, AMP (autocast + GradScaler), clipping and evaluation, on
omnilearn.torch: an MLP on scikit-learn's digits.

    torchrun --nproc-per-node 2 examples/accumulation_amp.py --batch-size 16 --accumulate 4

Each optimizer step takes ``--accumulate`` micro-batches of ``--batch-size`` samples per device (the
global batch is their product with the world size); the controller moves each rank's share of it.
"""

import argparse
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omnilearn.torch import HeteroDataLoader, HeteroDataParallel
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset


def digits() -> tuple[TensorDataset, TensorDataset]:
    bunch = load_digits()
    x, y = torch.tensor(bunch.data, dtype=torch.float32) / 16.0, torch.tensor(bunch.target)
    return TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="per device, per micro-batch")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--clip", type=float, default=1.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    train, test = digits()
    model = HeteroDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    loader = HeteroDataLoader(train, batch_size=args.batch_size, accumulate=args.accumulate, seed=0)
    evaluation = HeteroDataLoader(test, batch_size=64, train=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    for epoch in range(args.epochs):
        model.train()
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % args.accumulate == 0
            with nullcontext() if last else model.no_sync():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y) / args.accumulate
                scaler.scale(loss).backward()
            if last:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        model.eval()  # closes the step in progress: evaluation is not timed as training
        correct = torch.zeros(2)
        with torch.no_grad():
            for x, y in evaluation:
                correct += torch.tensor([float((model(x).argmax(1) == y).sum()), float(len(y))])
        dist.all_reduce(correct)
        if rank == 0:
            print(f"epoch {epoch} test accuracy {correct[0] / correct[1]:.3f} shares {model.batch_sizes}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
