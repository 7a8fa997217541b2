"""Held-out evaluation: of the replicas during a BSP job, and of the ASP server's snapshots after one.

BSP evaluates every ``train.eval_every`` epochs with the test set split among the ranks; before it,
BatchNorm statistics are re-estimated with the current weights ("precise BN"). ASP evaluation must
not take CPU from the emulated training: the server saves snapshots, and :func:`evaluate_snapshots`
scores each one after the job, outside the emulated allocations.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from omnilearn.files import open_in
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import MetricsWriter, eval_path
from omnilearn.train import distributed
from omnilearn.train.distributed import flat_state
from omnilearn.train.sampler import eval_indices
from omnilearn.train.workload import Workload, gather, load_workload, perplexity

log = logging.getLogger("omnilearn.evaluate")

SNAPSHOT_DIR = "snapshots"
"""Where the parameter server saves its model during training (``snapshot-NNN.pt``)."""


@dataclass
class EvalResult:
    accuracy: float
    loss: float
    samples: int


@torch.no_grad()
def recalibrate_batchnorm(model: torch.nn.Module, train, shares: list[int], rank: int, device: torch.device,
                          samples: int = 512, chunk: int = 128) -> None:
    """Re-estimate BatchNorm statistics with the current weights before evaluating ("precise BN").

    The running averages mix statistics of many past weights (after a short run, mostly of the
    initial ones) and each replica saw only its own batches. Here every rank runs forward passes on
    its share of one fixed set of training samples, and the ranks pool their averages weighted by
    samples, so every replica evaluates with the same statistics of the model as it is now.
    """
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
           and m.track_running_stats]
    if not bns:
        return
    n = min(samples, len(train))
    subset = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:n]
    idx = eval_indices(n, shares, rank)
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batches
    was_training = model.training
    model.train()
    seen = 0
    for start in range(idx.start, idx.stop, chunk):
        sel = subset[start:min(start + chunk, idx.stop)]
        if len(sel) < 2:  # BatchNorm cannot normalise a single sample
            continue
        x, _ = gather(train, sel)
        model(x.to(device))
        seen += len(sel)
    stats = torch.cat([torch.cat([m.running_mean, m.running_var]) for m in bns]).double() * seen
    stats = torch.cat([stats, torch.tensor([float(seen)], dtype=torch.float64, device=stats.device)])
    dist.all_reduce(stats)
    pooled = stats[:-1] / stats[-1].clamp(min=1)
    offset = 0
    for m, momentum in zip(bns, momenta, strict=True):
        c = m.running_mean.numel()
        m.running_mean.copy_(pooled[offset:offset + c])
        m.running_var.copy_(pooled[offset + c:offset + 2 * c])
        offset += 2 * c
        m.momentum = momentum
    model.train(was_training)


@torch.no_grad()
def evaluate(model: torch.nn.Module, work: Workload, shares: list[int], rank: int, device: torch.device,
             chunk: int = 256, recalibrate: bool = True) -> EvalResult:
    """The held-out metric (``accuracy`` of the result), the test set split among ranks in proportion to ``shares``.

    With ``recalibrate``, BatchNorm statistics are first re-estimated on training samples (see
    :func:`recalibrate_batchnorm`); otherwise the replicas' running statistics are averaged.
    """
    test = work.test
    if recalibrate:
        recalibrate_batchnorm(model, work.train, shares, rank, device)
    else:
        distributed.average_buffers(model)
    model.eval()
    idx = eval_indices(len(test), shares, rank)
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for start in range(idx.start, idx.stop, chunk):
        sel = torch.arange(start, min(start + chunk, idx.stop))
        x, y = gather(test, sel)
        loss_sum, correct = work.terms(model(x.to(device)), y.to(device))
        stats += torch.tensor([float(loss_sum), float(correct), len(sel)], dtype=torch.float64, device=device)
    dist.all_reduce(stats)
    model.train()
    n = int(stats[2].item())
    return EvalResult(accuracy=float(stats[1] / n), loss=float(stats[0] / n), samples=n)


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, work: Workload, chunk: int = 256) -> tuple[float, float]:
    """(metric, mean loss) of ``model`` on the whole held-out split."""
    model.eval()
    test = work.test
    correct, loss, n = 0.0, 0.0, len(test)
    for start in range(0, n, chunk):
        x, y = gather(test, torch.arange(start, min(start + chunk, n)))
        loss_sum, right = work.terms(model(x), y)
        loss += float(loss_sum)
        correct += float(right)
    model.train()
    return correct / n, loss / n


def evaluate_snapshots(job: JobSpec) -> list[dict[str, Any]]:
    """Score every snapshot the server saved; writes and returns the ``eval`` records, in order."""
    work = load_workload(job.config)
    test = work.test
    model = work.model()
    state, _ = flat_state(model)
    path = eval_path(job.out_dir)
    path.unlink(missing_ok=True)
    writer = MetricsWriter(path)
    records = []
    folder = job.out_dir / SNAPSHOT_DIR
    for snap_file in sorted(folder.glob("snapshot-*.pt")):
        try:  # the server's container can write this folder: a plain file only, never through a link
            fd = open_in(folder, snap_file.name, os.O_RDONLY)
        except OSError as e:
            log.warning("skipping snapshot %s: %s", snap_file, e.strerror)
            continue
        with os.fdopen(fd, "rb") as f:
            snap = torch.load(f, weights_only=True)
        state.copy_(snap["state"])
        accuracy, loss = evaluate_model(model, work)
        rec = {"kind": "eval", "snapshot": snap_file.name, "epoch": snap["epoch"], "version": snap["version"],
               "samples": snap["samples"], "elapsed_s": snap["elapsed_s"], "final": snap["final"],
               "accuracy": accuracy, "loss": loss, "test_samples": len(test),
               "perplexity": perplexity(loss) if work.perplexity else None, "metric": work.metric.name,
               "lower_is_better": work.metric.lower_is_better}
        writer.write(**rec)
        records.append(rec)
    writer.close()
    return records
