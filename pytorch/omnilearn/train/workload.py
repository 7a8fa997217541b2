"""What a job trains, as one interface: :class:`Workload` (model, data, loss, metric).

A user's own workload (config key ``workload: "module:function"``) and the built-in ones
(:mod:`omnilearn.train.builtin`) are the same object, and the trainers know nothing else:

- ``model``: a zero-argument callable returning the ``nn.Module`` (called once per rank, after
  seeding, so every rank starts from the same weights);
- ``train`` / ``test``: map-style ``torch.utils.data.Dataset``s of ``(input, target)`` pairs;
- ``loss``: ``(output, target) -> one loss per sample`` (default :func:`cross_entropy`);
- ``metric``: a :class:`Metric`, a name and ``(output, target) -> one score per sample`` (default
  accuracy), which says whether lower is better.

A batch is gathered by :func:`gather`: ``dataset[i]`` for every index, stacked by torch's default
collate. A dataset may offer a faster way, ``batch(indices, augment=False, generator=None) ->
(inputs, targets)``, gathering a whole batch at once; the built-in datasets do. Because the loss is
per sample, the trainers sum it and divide by the global batch size, so the gradient is weighted by
``b_i / B`` whatever the workload.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from omnilearn.config import JobConfig

PerSample = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(out: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of each sample: logits ``[n, classes]``, or ``[n, T, vocab]`` for a sequence,
    whose loss is the mean over its T positions (a sequence counts as one sample)."""
    if out.dim() == 3:
        return F.cross_entropy(out.transpose(1, 2), target, reduction="none").mean(1)
    return F.cross_entropy(out, target, reduction="none")


def correct(out: Tensor, target: Tensor) -> Tensor:
    """1.0 where the arg-max class is the target (a sequence: the share of its positions that are)."""
    hit = (out.argmax(-1) == target).float()
    return hit.mean(1) if hit.dim() == 2 else hit


@dataclass(frozen=True)
class Metric:
    """The held-out score of a workload: its name, one score per sample, and its direction."""

    name: str
    fn: PerSample
    lower_is_better: bool = False


ACCURACY = Metric("accuracy", correct)


@dataclass
class Workload:
    """A model, its data, its per-sample loss and its held-out metric (see the module's doc)."""

    model: Callable[[], nn.Module]
    train: Dataset
    test: Dataset
    loss: PerSample = cross_entropy
    metric: Metric | tuple[str, PerSample] | tuple[str, PerSample, bool] = ACCURACY
    perplexity: bool = False
    """The loss is a mean cross-entropy per token (nats): also report ``exp(loss)`` as perplexity."""

    def __post_init__(self) -> None:
        if isinstance(self.metric, tuple):
            self.metric = Metric(*self.metric)

    def terms(self, out: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """(sum over samples of the loss, sum over samples of the metric): what a step adds up."""
        metric = self.metric
        assert isinstance(metric, Metric)
        with torch.no_grad():
            score = metric.fn(out.detach(), target).float().sum()
        return self.loss(out, target).sum(), score


def gather(dataset: Any, indices: Tensor, augment: bool = False, generator: torch.Generator | None = None
           ) -> tuple[Tensor, Tensor]:
    """The samples ``indices`` of ``dataset`` as one ``(inputs, targets)`` batch.

    Through the dataset's own ``batch`` when it has one (one gather, with its augmentation), else
    sample by sample and torch's default collate (the dataset applies its own transforms).
    """
    batch = getattr(dataset, "batch", None)
    if callable(batch):
        return batch(indices, augment=augment, generator=generator)
    idx = torch.as_tensor(indices, dtype=torch.long).tolist()
    if not idx:  # an empty share (a partial last step): empty tensors of the samples' shapes
        x, y = default_collate([dataset[0]])
        return x[:0], y[:0]
    x, y = default_collate([dataset[i] for i in idx])
    return x, y


def make_optimizer(cfg: JobConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


def perplexity(loss: float | None) -> float | None:
    """exp of the mean per-token loss (nats); None when there is no loss."""
    if loss is None:
        return None
    return math.exp(min(loss, 50.0))
