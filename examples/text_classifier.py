"""A small text classifier on generated sentences (no download), as an omnilearn workload.

Each sentence mixes topic words of its class with common words; the model is an embedding bag
(mean of word vectors) and a linear layer.

    omnilearn run --set workload=examples/text_classifier.py:workload --hl HL8 --compare
"""

import random

import torch
from omnilearn import Workload
from torch import nn
from torch.utils.data import Dataset

TOPICS = {
    "sport": "match goal team player coach score league season win referee",
    "weather": "rain sun cloud storm wind forecast snow cold warm temperature",
    "finance": "market stock price bank loan interest profit trade budget invest",
    "cooking": "recipe oven bake flour sugar salt pan boil dinner taste",
}
COMMON = "the a of and to in is was on for with it this that at by from very today".split()
LENGTH, SENTENCES = 24, 4000


class Sentences(Dataset):
    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.ids[i], self.labels[i]


class BagOfWords(nn.Module):
    def __init__(self, vocab: int, classes: int, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="sum")  # summed, then scaled: gradients reach every word
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(dim, classes))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids) / ids.shape[1] ** 0.5)


def workload(config) -> Workload:
    rng = random.Random(config.train.seed)
    names = list(TOPICS)
    vocab = {w: i for i, w in enumerate(sorted({*COMMON, *" ".join(TOPICS.values()).split()}))}
    rows, labels = [], []
    for _ in range(SENTENCES):
        label = rng.randrange(len(names))
        topic = TOPICS[names[label]].split()
        other = TOPICS[names[rng.randrange(len(names))]].split()  # noise: words of a random topic
        words = [rng.choice(topic if r < 0.3 else other if r < 0.45 else COMMON)
                 for r in (rng.random() for _ in range(LENGTH))]
        rows.append([vocab[w] for w in words])
        labels.append(label)
    ids, y = torch.tensor(rows), torch.tensor(labels)
    cut = SENTENCES * 4 // 5
    return Workload(model=lambda: BagOfWords(len(vocab), len(names)),
                    train=Sentences(ids[:cut], y[:cut]), test=Sentences(ids[cut:], y[cut:]))
