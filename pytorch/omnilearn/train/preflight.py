"""Checks the launcher runs before starting any worker: data present, model buildable, batch sane.

A missing dataset (or one that cannot be downloaded), or a user's workload that cannot be imported
or returns the wrong thing, is found once, here, with one clear message, instead of N workers failing
after the processes, cgroups and containers were set up. Downloads also happen here, once, rather
than by every worker at the same time.
"""

from __future__ import annotations

from typing import Any

from omnilearn.config import JobConfig
from omnilearn.train.models import count_parameters
from omnilearn.train.sampler import GlobalBatchSampler
from omnilearn.train.workload import check_workload, load_workload, workload_name


def preflight(cfg: JobConfig) -> dict[str, Any]:
    work = load_workload(cfg)
    model = check_workload(cfg, work)
    sampler = GlobalBatchSampler(len(work.train), cfg.train.global_batch, cfg.train.seed,
                                 drop_last=cfg.train.drop_last, min_local=cfg.control.min_batch)
    return {"name": workload_name(cfg), "train_samples": len(work.train), "test_samples": len(work.test),
            "steps_per_epoch": sampler.steps_per_epoch, "parameters": count_parameters(model)}
