"""Probes for ``omnilearn calibrate``: the speed of one training step of a job's model, and the cost of
an all-reduce, each in a process of its own (started by :mod:`omnilearn.experiments.calibrate`).

``python -m omnilearn.train.probe speed JOB_FILE``: builds the job's data and model as a worker does,
prints ``ready``, then answers each line ``{"threads": t, "batch": b, "seconds": s, "min_steps": k}``
on stdin with ``{"step_s": [...]}``: one untimed step, then steps (forward, backward and optimizer
step on ``b`` samples: what a worker's ``compute_ms`` times) until ``s`` seconds and ``k`` steps have
passed. Its CPU share is whatever cgroup the launcher put it in. An empty line ends it.

``python -m omnilearn.train.probe allreduce FLOATS...`` (under torchrun's variables): a gloo
all-reduce of a float32 tensor of each size, timed over :data:`REPEATS` repeats after one warm-up; rank
0 prints one line ``{"workers", "floats", "bytes", "seconds"}`` per size (the median).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPEATS = 5


def speed(job_file: Path) -> None:
    from omnilearn.jobfile import JobSpec
    from omnilearn.train.bsp import share_loss
    from omnilearn.train.workload import gather, load_workload, make_optimizer

    cfg = JobSpec.load(job_file).config
    torch.manual_seed(cfg.train.seed)
    work = load_workload(cfg)
    model = work.model()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    order = torch.randperm(len(work.train))
    cursor = 0

    def step(batch: int) -> float:
        nonlocal cursor
        if cursor + batch > len(order):
            cursor = 0
        idx = order[cursor:cursor + batch]
        cursor += batch
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        x, y = gather(work.train, idx)
        share_loss(work, model, x, y)[0].backward()
        optimizer.step()
        return time.perf_counter() - t0

    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        cmd = json.loads(line)
        torch.set_num_threads(int(cmd["threads"]))
        batch = min(int(cmd["batch"]), len(order))
        step(batch)  # the first step at a new share or thread count carries the change
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < int(cmd.get("min_steps", 2)) or time.perf_counter() - start < float(cmd.get("seconds", 0)):
            times.append(step(batch))
        print(json.dumps({"step_s": [round(t, 5) for t in times]}), flush=True)


def allreduce(sizes: list[int]) -> None:
    import torch.distributed as dist

    from omnilearn.train import distributed

    env = distributed.init("gloo")
    for floats in sizes:
        t = torch.ones(floats, dtype=torch.float32)
        dist.all_reduce(t)  # warm-up: connections and buffers
        times = []
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        # The slowest rank's time is the collective's: every rank waits for it.
        worst = [distributed.all_gather_floats([s], env.device) for s in times]
        if env.rank == 0:
            seconds = statistics.median(max(g[0] for g in row) for row in worst)
            print(json.dumps({"workers": env.world_size, "floats": floats, "bytes": 4 * floats,
                              "seconds": round(seconds, 6)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "speed":
        speed(Path(sys.argv[2]))
    else:
        allreduce([int(a) for a in sys.argv[2:]])
