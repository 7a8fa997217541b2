"""Any omnilearn workload (``FILE.py:FUNCTION``, as ``omnilearn run --set workload=...`` takes it) trained
in an ordinary torchrun loop through omnilearn.torch: the same model, data, loss, global batch, optimizer
and epochs as ``omnilearn run`` gives it, so the two forms can be compared on one host.

    omnilearn emulate --hl HL8 --workers 4 -- torchrun --nproc-per-node 4 \\
        examples/workload_torchrun.py examples/tabular_mlp.py:workload --policy dynamic
"""

import argparse

import torch
import torch.distributed as dist
from omnilearn import config
from omnilearn.torch import HeteroDataLoader, HeteroDataParallel
from omnilearn.train.workload import load_workload, make_optimizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workload", help="FILE.py:FUNCTION")
    p.add_argument("--policy", default="dynamic")
    p.add_argument("--no-probe", dest="probe", action="store_false", help="no start-up probe: the equal split first")
    p.add_argument("--epochs", type=int, default=None, help="default: the job config's")
    p.add_argument("--global-batch", type=int, default=None, help="default: the job config's")
    args = p.parse_args()
    overrides = [("workload", args.workload)]
    overrides += [("train.epochs", args.epochs)] if args.epochs else []
    overrides += [("train.global_batch", args.global_batch)] if args.global_batch else []
    cfg = config.build(None, overrides)
    dist.init_process_group("gloo")
    torch.manual_seed(cfg.train.seed)
    work = load_workload(cfg)
    model = HeteroDataParallel(work.model(), policy=args.policy)
    loader = HeteroDataLoader(work.train, global_batch=cfg.train.global_batch, seed=cfg.train.seed)
    optimizer = make_optimizer(cfg, list(model.parameters()))

    def step(batch: tuple) -> None:
        x, y = batch
        optimizer.zero_grad()
        work.loss(model(x), y).mean().backward()
        optimizer.step()

    if args.probe:
        loader.start_up(step, optimizer)  # the start-up probe: the first split balanced before step 1
    for _ in range(cfg.train.epochs):
        for batch in loader:
            step(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
