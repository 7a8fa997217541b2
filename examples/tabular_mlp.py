"""A tabular classifier: an MLP on generated data (no download), as an omnilearn workload.

    omnilearn run --set workload=examples/tabular_mlp.py:workload --hl HL8 --compare
"""

import torch
from omnilearn import Workload
from torch import nn
from torch.utils.data import Dataset

FEATURES, CLASSES, SAMPLES = 32, 4, 4096


class Table(Dataset):
    """Rows of features and a label; each row is one (input, target) pair."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def workload(config) -> Workload:
    gen = torch.Generator().manual_seed(config.train.seed)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, CLASSES, generator=gen)
    y = (x @ w + 0.5 * torch.randn(SAMPLES, CLASSES, generator=gen)).argmax(1)  # a noisy linear rule
    cut = SAMPLES * 4 // 5

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, CLASSES))

    return Workload(model=model, train=Table(x[:cut], y[:cut]), test=Table(x[cut:], y[cut:]))
