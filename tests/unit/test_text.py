"""Text data and GPT-2: tokenizers round-trip, windows shift by one token, the tiny model learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnilearn import config
from omnilearn.errors import UserError
from omnilearn.train.text import ByteTokenizer, TokenWindows, load_text, make_tokenizer, stdlib_corpus
from omnilearn.train.workload import load_workload


@pytest.mark.parametrize("text", ["hello world", "naïve café — ünïcödé ✓", "", "line\nbreaks\ttabs"])
def test_byte_tokenizer_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_gpt2_tokenizer_needs_local_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="tokenizer_path"):
        make_tokenizer("gpt2", None)
    with pytest.raises(UserError, match="no GPT-2 tokenizer files"):
        make_tokenizer("gpt2", str(tmp_path))


def test_gpt2_tokenizer_from_local_files_round_trips(tmp_path: Path) -> None:
    # A tiny byte-level BPE in GPT-2's file format, trained here: no download.
    from tokenizers import ByteLevelBPETokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    bpe = ByteLevelBPETokenizer()
    bpe.train([str(corpus)], vocab_size=300, min_frequency=1)
    bpe.save_model(str(tmp_path))
    tok = make_tokenizer("gpt2", str(tmp_path))
    text = "the lazy fox, jumping over brown dogs!"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("the quick brown fox")) < len("the quick brown fox")  # merges happened


def test_windows_are_shifted_by_one_and_exact() -> None:
    tokens = torch.arange(0, 41)
    w = TokenWindows(tokens, seq_len=8)
    assert len(w) == 5
    x, y = w.batch(torch.tensor([0, 3]))
    assert x.shape == y.shape == (2, 8)
    assert x[1].tolist() == list(range(24, 32)) and y[1].tolist() == list(range(25, 33))


def test_stdlib_corpus_is_offline_and_deterministic() -> None:
    a, b = stdlib_corpus(200_000), stdlib_corpus(200_000)
    assert a == b and len(a) == 200_000
    data = load_text("stdlib", "byte", None, 64, 0.1, max_bytes=100_000)
    assert len(data.train) > 1000 and len(data.test) > 100 and data.vocab_size == 256


def test_missing_text_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_text(str(tmp_path / "shakespeare.txt"), "byte", None, 64, 0.1)


def test_tiny_gpt2_learns_the_corpus() -> None:
    cfg = config.build(None, [("model.name", "gpt2"), ("data.name", "text"), ("data.seq_len", 32),
                              ("data.max_bytes", 60_000)])
    work = load_workload(cfg)
    assert work.perplexity
    torch.manual_seed(0)
    model = work.model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        x, y = work.train.batch(torch.randint(0, len(work.train), (16,), generator=g))
        loss_sum, correct = work.terms(model(x), y)
        opt.zero_grad()
        (loss_sum / 16).backward()
        opt.step()
        losses.append(loss_sum.item() / 16)
    assert losses[0] > 5.0  # ~ln(256) at the start
    assert sum(losses[-5:]) / 5 < losses[0] - 2.0
