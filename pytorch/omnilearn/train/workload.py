"""What a job trains: its data, its model, and the loss both trainers use.

Image classification (the vision datasets and models) and language modelling (GPT-2 on token
windows) share one interface: a dataset with ``batch(indices) -> (x, y)``, a model whose output is
class logits ``[n, classes]`` or next-token logits ``[n, seq_len, vocab]``, and :func:`loss_terms`,
which turns either into a per-sample loss sum, so gradient weighting by ``b_i / B`` and the
controller need not know which it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnilearn.config import JobConfig
from omnilearn.errors import UserError
from omnilearn.train.data import load_dataset
from omnilearn.train.models import build_model

# GPT-2 sizes (n_layer, n_head, n_embd): "tiny" trains on 2 CPU cores; "small" is GPT-2's 124M model.
GPT2_SIZES = {"tiny": (2, 4, 128), "mini": (4, 4, 256), "small": (12, 12, 768)}


@dataclass
class Workload:
    train: Any
    test: Any
    classes: int  # classes, or the vocabulary size for text
    language: bool


def load_data(cfg: JobConfig) -> Workload:
    d = cfg.data
    if d.name == "text":
        from omnilearn.train.text import load_text

        text = load_text(d.path, d.tokenizer, d.tokenizer_path, d.seq_len, d.test_fraction, d.max_bytes)
        return Workload(text.train, text.test, text.vocab_size, language=True)
    if cfg.model.name == "gpt2":
        raise UserError(f"{cfg.source}: model.name: gpt2 trains on data.name: text, not {d.name!r}")
    train, test, classes = load_dataset(d.name, d.root, d.image_size, d.download, d.test_fraction,
                                        cfg.train.seed, synthetic_size=d.synthetic_size)
    return Workload(train, test, classes, language=False)


class GPT2LM(nn.Module):
    """transformers' GPT2LMHeadModel returning plain next-token logits ``[n, T, vocab]``."""

    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=vocab_size, n_positions=seq_len, n_layer=n_layer, n_head=n_head,
                            n_embd=n_embd, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=None, eos_token_id=None)
        self.model = GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build(cfg: JobConfig, work: Workload) -> nn.Module:
    m = cfg.model
    if work.language:
        if m.name != "gpt2":
            raise UserError(f"{cfg.source}: model.name: text data needs model gpt2, not {m.name!r}")
        if m.size not in GPT2_SIZES:
            raise UserError(f"{cfg.source}: model.size: {m.size!r} is not one of {', '.join(GPT2_SIZES)}")
        n_layer, n_head, n_embd = GPT2_SIZES[m.size]
        n_layer, n_head, n_embd = m.n_layer or n_layer, m.n_head or n_head, m.n_embd or n_embd
        if n_embd % n_head:
            raise UserError(f"{cfg.source}: model.n_embd={n_embd} must be a multiple of model.n_head={n_head}")
        return GPT2LM(work.classes, cfg.data.seq_len, n_layer, n_head, n_embd)
    return build_model(m.name, work.classes, cfg.data.image_size, stem=m.stem)


def make_optimizer(cfg: JobConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


def loss_terms(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over samples of each sample's loss, sum over samples of each sample's accuracy).

    A language-model sample is a window of T tokens: its loss is the mean over its tokens, so a
    window counts as one sample like an image does.
    """
    if out.dim() == 3:
        t = out.shape[1]
        loss_sum = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum") / t
        correct = (out.detach().argmax(-1) == y).float().mean(1).sum()
        return loss_sum, correct
    return F.cross_entropy(out, y, reduction="sum"), (out.detach().argmax(1) == y).sum().float()


def perplexity(loss: float | None) -> float | None:
    """exp of the mean per-token loss (nats); None when there is no loss."""
    if loss is None:
        return None
    return math.exp(min(loss, 50.0))
