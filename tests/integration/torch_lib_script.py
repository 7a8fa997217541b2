"""Run by tests/test_torch_lib.py under torchrun: omnilearn.torch's guarantees, checked on every rank.

Rank 1 does extra work every step (a slower rank) so that the controller moves the shares; the
checks: the all-reduced gradient equals one process's gradient of the whole global batch, weights
stay identical on every rank, and each epoch uses every sample exactly once.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from omnilearn.torch import HeteroDataLoader, HeteroDataParallel


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    out, epochs = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different starts: the wrapper must make them equal
    data = Indexed(403)  # not a multiple of the global batch: a partial last step
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    model = HeteroDataParallel(net, policy="dynamic", out=out)
    loader = HeteroDataLoader(data, 32, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shares, seen, record = set(), [], []
    counting, count = [False], [0]
    for name in ("all_reduce", "all_gather", "broadcast", "barrier", "all_gather_object", "broadcast_object_list"):
        original = getattr(dist, name)

        def wrapped(*a, _f=original, **k):
            count[0] += counting[0]
            return _f(*a, **k)

        setattr(dist, name, wrapped)
    for _ in range(epochs):
        used = []
        for x, y in loader:
            counting[0] = True  # from the first step on: the steps' collectives, and each epoch's end
            before = {k: v.clone() for k, v in net.state_dict().items()}
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if rank == 1:
                time.sleep(0.004 * len(y))  # a slower rank: time grows with its share
            record.append((before, [p.grad.clone() for p in net.parameters()], list(loader.last_indices)))
            opt.step()
        counting[0] = False
        gathered = [None, None]
        dist.all_gather_object(gathered, [r[2] for r in record[len(record) - len(loader):]])
        for a, b in zip(*gathered, strict=True):
            used += a + b
            shares.add((len(a), len(b)))
        seen.append(sorted(used) == list(range(len(data))))
    steps = [None, None]
    dist.all_gather_object(steps, [r[2] for r in record])
    worst = 0.0
    for (before, grads, _), a, b in zip(record, *steps, strict=True):
        ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        ref.load_state_dict(before)
        F.cross_entropy(ref(data.x[a + b]), data.y[a + b]).backward()
        worst = max(worst, max(float((g - q.grad).abs().max()) for g, q in zip(grads, ref.parameters(), strict=True)))
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    sums = [None, None]
    dist.all_gather_object(sums, flat.tolist())
    dist.destroy_process_group()
    # what is left of the group: gloo threads alive past destroy_process_group end in finalization,
    # where tearing them down can abort a finished run
    threads = sorted({Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")})
    if rank == 0:
        print(json.dumps({"grad_error": worst, "identical": sums[0] == sums[1], "every_sample_once": seen,
                          "shares": sorted(shares), "threads_after_destroy": threads, "steps": len(record),
                          "collectives": count[0]}), flush=True)


if __name__ == "__main__":
    main()
