"""Checks the launcher runs before starting any worker: data present, model buildable, batch sane.

A missing dataset (or one that cannot be downloaded) is found once, here, with one clear message,
instead of N workers failing after the processes, cgroups and containers were set up. Downloads
also happen here, once, rather than by every worker at the same time.
"""

from __future__ import annotations

from typing import Any

from omnilearn.config import JobConfig
from omnilearn.train.data import GlobalBatchSampler, load_dataset
from omnilearn.train.models import build_model, count_parameters


def preflight(cfg: JobConfig) -> dict[str, Any]:
    d = cfg.data
    data = load_dataset(d.name, d.root, d.image_size, d.download, d.test_fraction, cfg.train.seed,
                        synthetic_size=d.synthetic_size)
    sampler = GlobalBatchSampler(len(data.train), cfg.train.global_batch, cfg.train.seed,
                                 drop_last=cfg.train.drop_last, min_local=cfg.control.min_batch)
    model = build_model(cfg.model.name, data.num_classes, d.image_size, stem=cfg.model.stem)
    return {"train_samples": len(data.train), "test_samples": len(data.test), "classes": data.num_classes,
            "steps_per_epoch": sampler.steps_per_epoch, "parameters": count_parameters(model)}
