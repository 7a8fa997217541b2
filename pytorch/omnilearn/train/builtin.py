"""The built-in workloads (``model.name`` x ``data.name``), as :class:`~omnilearn.train.workload.Workload`s.

Image classification (the vision datasets and models) and language modelling (GPT-2 on token
windows): their datasets gather a whole batch at once (``batch``), and their model's output is
class logits ``[n, classes]`` or next-token logits ``[n, seq_len, vocab]``, which the default
cross-entropy and accuracy both take.
"""

from __future__ import annotations

import torch
from torch import nn

from omnilearn.config import JobConfig
from omnilearn.errors import UserError
from omnilearn.train.data import load_dataset
from omnilearn.train.models import build_model
from omnilearn.train.workload import Workload

# GPT-2 sizes (n_layer, n_head, n_embd): "tiny" trains on 2 CPU cores; "small" is GPT-2's 124M model.
GPT2_SIZES = {"tiny": (2, 4, 128), "mini": (4, 4, 256), "small": (12, 12, 768)}


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


def builtin_workload(cfg: JobConfig) -> Workload:
    """The job's ``model`` on its ``data``; raises UserError for a model that cannot train on the data."""
    d, m = cfg.data, cfg.model
    if d.name == "text":
        from omnilearn.train.text import load_text

        text = load_text(d.path, d.tokenizer, d.tokenizer_path, d.seq_len, d.test_fraction, d.max_bytes)
        if m.name != "gpt2":
            raise UserError(f"{cfg.source}: model.name: text data needs model gpt2, not {m.name!r}")
        if m.size not in GPT2_SIZES:
            raise UserError(f"{cfg.source}: model.size: {m.size!r} is not one of {', '.join(GPT2_SIZES)}")
        n_layer, n_head, n_embd = GPT2_SIZES[m.size]
        n_layer, n_head, n_embd = m.n_layer or n_layer, m.n_head or n_head, m.n_embd or n_embd
        if n_embd % n_head:
            raise UserError(f"{cfg.source}: model.n_embd={n_embd} must be a multiple of model.n_head={n_head}")
        vocab = text.vocab_size
        return Workload(model=lambda: GPT2LM(vocab, d.seq_len, n_layer, n_head, n_embd),
                        train=text.train, test=text.test, perplexity=True)
    if m.name == "gpt2":
        raise UserError(f"{cfg.source}: model.name: gpt2 trains on data.name: text, not {d.name!r}")
    train, test, classes = load_dataset(d.name, d.root, d.image_size, d.download, d.test_fraction,
                                        cfg.train.seed, synthetic_size=d.synthetic_size)
    return Workload(model=lambda: build_model(m.name, classes, d.image_size, stem=m.stem), train=train, test=test)
