"""The three framework examples' models and data as omnilearn workloads, for ``omnilearn run``.

``omnilearn run --set workload=examples/framework_workloads.py:<name>`` trains the same model on the
same data as the example (docs/guide/frameworks.md compares the two speed-ups):

- ``lightning_backbone``: lightning_backbone.py's ``Backbone`` (hidden width ``HIDDEN``, as the
  measurement's ``--model.backbone.hidden_dim``) on its digits training split, tested on its test split;
- ``accelerate_bert``: accelerate_nlp.py's BERT classifier on its generated sentence pairs;
- ``hf_qwen3``: hf_trainer_lm.py's two-layer Qwen3 on its standard-library pieces (next-token loss).
"""

import random

import torch
from omnilearn import Workload
from torch import nn
from torch.utils.data import Dataset

HIDDEN = 2048


def lightning_backbone(config) -> Workload:
    from lightning_backbone import Backbone, MyDataModule

    data = MyDataModule()
    return Workload(model=lambda: Backbone(HIDDEN), train=data.digits_train, test=data.digits_test)


class _Pairs(Dataset):
    """accelerate_nlp.py's pairs as (input_ids, label)."""

    def __init__(self, pairs) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int):
        return self.pairs.input_ids[i], self.pairs.labels[i]


class _PairClassifier(nn.Module):
    """accelerate_nlp.py's BertForSequenceClassification, called with its token types and mask."""

    def __init__(self) -> None:
        super().__init__()
        from accelerate_nlp import VOCAB, WORDS
        from transformers import BertConfig, BertForSequenceClassification

        self.types = torch.cat([torch.zeros(WORDS + 2, dtype=torch.long), torch.ones(WORDS + 1, dtype=torch.long)])
        self.bert = BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2,
                                                             num_attention_heads=2, intermediate_size=512,
                                                             max_position_embeddings=64))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        types = self.types.expand(len(input_ids), -1)
        return self.bert(input_ids=input_ids, token_type_ids=types, attention_mask=torch.ones_like(input_ids)).logits


def accelerate_bert(config) -> Workload:
    from accelerate_nlp import SentencePairs

    return Workload(model=_PairClassifier, train=_Pairs(SentencePairs(2048, seed=1)),
                    test=_Pairs(SentencePairs(512, seed=2)))


class _Windows(Dataset):
    """hf_trainer_lm.py's tokenized pieces as (tokens, next tokens)."""

    def __init__(self, ids: list[list[int]]) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        t = torch.tensor(self.ids[i])
        return t[:-1], t[1:]


class _CausalLM(nn.Module):
    """hf_trainer_lm.py's Qwen3, returning next-token logits ``[n, T, vocab]``."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, ByT5Tokenizer, Qwen3Config

        tokenizer = ByT5Tokenizer()
        self.lm = AutoModelForCausalLM.from_config(Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, intermediate_size=384, max_position_embeddings=64,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def hf_qwen3(config) -> Workload:
    from hf_trainer_lm import corpus_pieces
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    ids = tokenizer([r["text"] for r in corpus_pieces(150_000)], truncation=True, max_length=64)["input_ids"]
    ids = [i for i in ids if len(i) == 64]  # every piece is 63 bytes and the end token but a rare multi-byte one
    random.Random(0).shuffle(ids)
    split = len(ids) * 9 // 10
    return Workload(model=_CausalLM, train=_Windows(ids[:split]), test=_Windows(ids[split:]), perplexity=True)
