"""An unmodified DDP loop for the timing module's tests (run by torchrun under omnilearn record).

    --accumulate K   K micro-batches a step, the first K-1 under no_sync
    --own-hook       the script's own communication hook (a sum, then a mean, counting its calls)
    --late-hook      the same, registered after the first step
    --amp            bfloat16 autocast and a GradScaler
    --no-ddp         no DistributedDataParallel at all (a plain all-reduce of the loss)
    --exit N         exit with status N at the end

Rank 0 writes what the loop saw to OUT/script.json (``--report OUT``): its hook's calls, and whether its
model was freed once the script dropped it (nothing else holding it, and through DDP's reducer its
process group, into the interpreter's teardown).
"""

import argparse
import gc
import json
import os
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

CALLS = [0]


def own_hook(state, bucket):
    CALLS[0] += 1
    world = dist.get_world_size()
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0] / world)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--own-hook", action="store_true")
    p.add_argument("--late-hook", action="store_true")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--report", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = net if args.no_ddp else DistributedDataParallel(net, bucket_cap_mb=0.001)  # several buckets
    if args.own_hook:
        model.register_comm_hook(None, own_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    for i in range(args.steps):
        if args.late_hook and i == 1:
            model.register_comm_hook(None, own_hook)
        for j in range(args.accumulate):
            x, y = torch.randn(args.micro, 16), torch.randint(0, 4, (args.micro,))
            sync = args.no_ddp or j == args.accumulate - 1
            ctx = model.no_sync() if not sync else torch.enable_grad()
            with ctx, torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
                loss = torch.nn.functional.cross_entropy(model(x), y) / args.accumulate
            scaler.scale(loss).backward()
        if args.no_ddp:
            dist.all_reduce(loss.detach())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    with torch.no_grad():  # an evaluation: no step's
        model.eval()
        model(torch.randn(32, 16))
    dist.destroy_process_group()
    kept = weakref.ref(model)
    del model, net, opt, loss
    gc.collect()
    if int(os.environ["RANK"]) == 0:
        Path(args.report).write_text(json.dumps({"hook_calls": CALLS[0], "model_freed": kept() is None}))
    return args.exit


if __name__ == "__main__":
    raise SystemExit(main())
