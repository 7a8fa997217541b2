"""Text data for language modelling: tokenizers, a corpus, fixed-length token windows.

The windows are an indexable dataset with the same ``batch(indices)`` interface as the image
datasets, so the global-batch sampler, the controller and both trainers work unchanged: one
sample is one window of ``seq_len + 1`` tokens (inputs and next-token targets).

- Tokenizers: ``byte`` (UTF-8 bytes, 256 ids: needs no download) or ``gpt2`` (GPT-2's BPE, from
  local files only: a folder with ``vocab.json`` and ``merges.txt``, or ``tokenizer.json``).
- Corpus: a text file of the user's (e.g. Tiny Shakespeare), or ``stdlib``: the Python standard
  library's own source, which lies on every machine where the project is installed.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from omnilearn.errors import UserError

TOKENIZERS = ("byte", "gpt2")
STDLIB_CORPUS = "stdlib"
# Standard-library packages whose source is mostly prose-like code and docstrings; sorted files
# under them make a deterministic corpus of a few MB on every Python 3.10+.
_STDLIB_PARTS = ("email", "json", "http", "logging", "unittest", "asyncio", "concurrent", "xml", "urllib",
                 "argparse.py", "collections", "dataclasses.py", "functools.py", "textwrap.py", "pathlib.py")


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: lossless, no vocabulary file, 256 ids."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """GPT-2's byte-level BPE through transformers, from local files only (no hub access)."""

    def __init__(self, folder: Path) -> None:
        from transformers import GPT2TokenizerFast

        if not ((folder / "tokenizer.json").is_file() or
                ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())):
            raise UserError(f"data.tokenizer_path: {folder} holds no GPT-2 tokenizer files (vocab.json + "
                            f"merges.txt, or tokenizer.json); use data.tokenizer: byte to need none")
        self._tok = GPT2TokenizerFast.from_pretrained(str(folder), local_files_only=True)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def make_tokenizer(name: str, path: str | None = None) -> Tokenizer:
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        if not path:
            raise UserError("data.tokenizer: gpt2 needs data.tokenizer_path, a local folder with GPT-2's "
                            "tokenizer files (nothing is downloaded)")
        return HFTokenizer(Path(path).expanduser())
    raise UserError(f"data.tokenizer: unknown tokenizer {name!r} (known: {', '.join(TOKENIZERS)})")


def stdlib_corpus(max_bytes: int) -> str:
    """The offline default corpus: source files of the Python standard library, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for name in _STDLIB_PARTS:
        target = root / name
        files = [target] if target.is_file() else sorted(target.rglob("*.py")) if target.is_dir() else []
        for f in files:
            if "test" in f.parts[len(root.parts):-1]:
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            parts.append(text)
            size += len(text)
            if size >= max_bytes:
                return "".join(parts)[:max_bytes]
    if not parts:
        raise UserError(f"data.path: stdlib: no Python sources under {root} (a stripped Python?); give a text file")
    return "".join(parts)[:max_bytes]


def read_corpus(path: str, max_bytes: int) -> str:
    if path == STDLIB_CORPUS:
        return stdlib_corpus(max_bytes)
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"data.path: text file {p} not found (download e.g. Tiny Shakespeare there, or use "
                        f"data.path: stdlib for the offline corpus)")
    with p.open(encoding="utf-8", errors="replace") as f:
        return f.read(max_bytes)


@dataclass
class TokenWindows:
    """Non-overlapping windows of ``seq_len + 1`` tokens over one token stream.

    ``batch(indices)`` returns (inputs ``[n, seq_len]``, targets ``[n, seq_len]``) gathered with one
    index operation; targets are the inputs shifted by one token.
    """

    tokens: Tensor  # 1-D int64
    seq_len: int

    def __post_init__(self) -> None:
        assert self.tokens.dim() == 1
        self._offsets = torch.arange(self.seq_len + 1)

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.batch(torch.tensor([index]))
        return x[0], y[0]

    def batch(self, indices: Tensor, augment: bool = False, generator: torch.Generator | None = None
              ) -> tuple[Tensor, Tensor]:  # noqa: ARG002 - text has no augmentation
        idx = torch.as_tensor(indices, dtype=torch.long)
        windows = self.tokens[idx[:, None] * self.seq_len + self._offsets[None, :]]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    @property
    def targets(self) -> Tensor:
        return self.batch(torch.arange(len(self)))[1][:, 0]

    @property
    def sample_shape(self) -> tuple[int]:
        return (self.seq_len,)


@dataclass
class TextData:
    train: TokenWindows
    test: TokenWindows
    vocab_size: int
    tokenizer: Tokenizer

    def __iter__(self):  # unpacks like load_dataset's (train, test, classes)
        return iter((self.train, self.test, self.vocab_size))


def load_text(path: str, tokenizer: str, tokenizer_path: str | None, seq_len: int, test_fraction: float,
              max_bytes: int = 2_000_000) -> TextData:
    """Tokenize a corpus and cut it into windows; the held-out split is the corpus's last part."""
    tok = make_tokenizer(tokenizer, tokenizer_path)
    text = read_corpus(path, max_bytes)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    cut = int(len(ids) * (1 - test_fraction))
    train, test = TokenWindows(ids[:cut], seq_len), TokenWindows(ids[cut:], seq_len)
    if len(train) < 2 or len(test) < 1:
        raise UserError(f"data.path: {path}: {len(ids)} tokens make too few windows of data.seq_len={seq_len} "
                        f"(train {len(train)}, held-out {len(test)}); use a longer text or a shorter seq_len")
    return TextData(train=train, test=test, vocab_size=tok.vocab_size, tokenizer=tok)
