"""Run by tests/integration/test_frameworks.py under torchrun: the DDP hook with several buckets, both ways.

Plain DDP (no framework) over a model of several buckets, its steps from a ShareBatchSampler: once
with every bucket in the last one's all-reduce (gloo's default), once with a collective per bucket.
Each rank's buffer starts different, must start the same after DDP wraps the model, and must not be
synced again at each forward.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from framework_checks import EPOCHS, GLOBAL_BATCH, Indexed, Recorder, report, slow_down, wide_net
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from omnilearn.torch.ddp_hook import register_weighted_sum
from omnilearn.torch.session import StepSession
from omnilearn.torch.shares import ShareBatchSampler

COUNT = [0]
_all_reduce = dist.all_reduce


def counted_all_reduce(*args, **kwargs):
    COUNT[0] += 1
    return _all_reduce(*args, **kwargs)


def train(out: Path, one_collective: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    data = Indexed()
    session = StepSession(world, rank, policy="dynamic", out=str(out))
    torch.manual_seed(rank)  # different starts: DDP must make them equal
    net = wide_net()
    net.register_buffer("mark", torch.tensor([float(rank)]))
    model = DistributedDataParallel(net, bucket_cap_mb=0.25)
    register_weighted_sum(model, session, one_collective=one_collective)
    start = float(net.mark)
    shares = ShareBatchSampler(session, data, GLOBAL_BATCH, seed=3)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    recorder = Recorder(net)
    COUNT[0] = 0
    for _ in range(EPOCHS):
        for x, y, idx in DataLoader(data, batch_sampler=shares):
            shares.begin_step()
            recorder.before(idx)
            slow_down(len(y))
            net.mark += rank + 1  # each rank's own: DDP must not sync it again at the forward
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            recorder.grads(session.weight)
            optimizer.step()
            shares.end_step()
    reduces = COUNT[0]
    marks: list = [None] * world
    dist.all_gather_object(marks, (start, float(net.mark)))
    buckets = int(model._get_ddp_logging_data()["num_buckets_reduced"])
    report(recorder, data, len(shares), {"one_collective": one_collective, "all_reduces": reduces,
                                          "buckets": buckets, "marks": marks}, net=wide_net)


def main() -> None:
    dist.init_process_group("gloo")
    dist.all_reduce = counted_all_reduce
    for one in (True, False):
        train(Path(sys.argv[1]) / f"one-{one}", one)
    dist.destroy_process_group()
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main()
