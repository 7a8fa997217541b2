"""What the framework scripts (tests/integration/frameworks_*_script.py) share: data, model, and the checks.

Each script trains a tiny classifier on 2 gloo ranks, with rank 1 slower per sample so that the
controller moves the shares, and records per step: the weights before the step, the gradient the
optimizer got (after the all-reduce) and the dataset indices of this rank's batch. The checks
(:func:`report`, every rank calls it): the gradient equals one process's gradient of the union of
the ranks' batches (the global batch), every epoch uses every sample exactly once, and the shares
moved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

SAMPLES, GLOBAL_BATCH, EPOCHS = 203, 32, 3  # 203: not a multiple of the global batch, a partial last step
SLOW_S_PER_SAMPLE = 0.004  # rank 1's extra time per sample: the controller should give it less


class Indexed(Dataset):
    """Random features and classes; each sample also carries its own index, so a step's samples are known."""

    def __init__(self, n: int = SAMPLES, as_dict: bool = False) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.as_dict = as_dict

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.as_dict:
            return {"x": self.x[i], "labels": self.y[i], "idx": torch.tensor(i)}
        return self.x[i], self.y[i], torch.tensor(i)


def tiny_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def wide_net() -> nn.Module:
    """Over 1 MB of parameters: DDP puts them in several buckets."""
    return nn.Sequential(nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 3))


def slow_down(n: int, rank: int = 1) -> None:
    """``rank`` (rank 1 unless given) is slower: its step takes longer the more samples it has."""
    if dist.get_rank() == rank:
        time.sleep(SLOW_S_PER_SAMPLE * n)


class Recorder:
    """Per step: the weights before it, the gradient after the all-reduce, this rank's indices."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.steps: list[tuple[dict[str, torch.Tensor], list[torch.Tensor], list[int]]] = []
        self._before: dict[str, torch.Tensor] | None = None
        self._indices: list[int] = []

    def before(self, indices: torch.Tensor) -> None:
        self._before = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        self._indices = [int(i) for i in indices]

    def grads(self, weight: float) -> None:
        """After the all-reduce; ``weight``: this rank's b_i / B (0: a stand-in batch for an empty share)."""
        assert self._before is not None
        grads = [p.grad.detach().clone() for p in self.net.parameters()]
        self.steps.append((self._before, grads, self._indices if weight > 0 else []))
        self._before = None


def report(recorder: Recorder, data: Indexed, steps_per_epoch: int, extra: dict | None = None,
           net: Callable[[], nn.Module] = tiny_net) -> None:
    """Every rank calls it; rank 0 prints one JSON line with the checks' results."""
    world = dist.get_world_size()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, [s[2] for s in recorder.steps])
    worst = 0.0
    for (before, grads, _), *per_rank in zip(recorder.steps, *gathered, strict=True):
        union = [i for indices in per_rank for i in indices]
        ref = net()
        ref.load_state_dict(before, strict=False)  # parameters; a test's own buffers aside
        F.cross_entropy(ref(data.x[union]), data.y[union]).backward()
        worst = max(worst, max(float((g - q.grad).abs().max()) for g, q in zip(grads, ref.parameters(), strict=True)))
    once, shares = [], set()
    for epoch in range(len(recorder.steps) // steps_per_epoch):
        span = slice(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        used = [i for rank_steps in gathered for step in rank_steps[span] for i in step]
        once.append(sorted(used) == list(range(len(data))))
        shares |= {tuple(len(rank_steps[s]) for rank_steps in gathered)
                   for s in range(span.start, span.stop)}
    flat = torch.cat([p.detach().reshape(-1) for p in recorder.net.parameters()])
    weights: list = [None] * world
    dist.all_gather_object(weights, flat.tolist())
    if dist.get_rank() == 0:
        print(json.dumps({"grad_error": worst, "every_sample_once": once, "shares": sorted(shares),
                          "steps": len(recorder.steps), "identical": all(w == weights[0] for w in weights),
                          **(extra or {})}), flush=True)
