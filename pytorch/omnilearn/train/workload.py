"""What a job trains, as one interface: :class:`Workload` (model, data, loss, metric).

A user's own workload (config key ``workload: "module:function"``) and the built-in ones
(:func:`builtin_workload`) are the same object, and the trainers know nothing else:

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

A job's workload comes from its config: the user's function (``workload: "module:function"`` or
``"path/to/file.py:function"``), or the built-in model and data. :func:`load_workload` is what every rank calls. :func:`check_workload` is what the launcher runs once
before anything starts: a workload that fails to import, to build, or returns the wrong thing is one
:class:`UserError` naming the function and the cause.

The built-in workloads (``model.name`` x ``data.name``): image classification (the vision datasets and models) and language modelling (GPT-2 on token
windows): their datasets gather a whole batch at once (``batch``), and their model's output is
class logits ``[n, classes]`` or next-token logits ``[n, seq_len, vocab]``, which the default
cross-entropy and accuracy both take.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, IterableDataset, default_collate

from omnilearn.config import JobConfig
from omnilearn.errors import UserError

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
        return torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


def perplexity(loss: float | None) -> float | None:
    """exp of the mean per-token loss (nats); None when there is no loss."""
    if loss is None:
        return None
    return math.exp(min(loss, 50.0))


def split_spec(spec: str) -> tuple[str, str]:
    """``"target:function"`` -> (target, function); target is a module path or a ``.py`` file."""
    target, _, function = spec.rpartition(":")
    if not target or not function.isidentifier():
        raise UserError(f"workload: {spec!r} must be \"package.module:function\" or \"path/to/file.py:function\"")
    return target, function


def is_file_spec(spec: str) -> bool:
    return split_spec(spec)[0].endswith(".py")


def code_folder(spec: str) -> Path:
    """The folder that holds the workload's code: the file's own, or the one its top package is found in."""
    target, _ = split_spec(spec)
    if target.endswith(".py"):
        return Path(target).expanduser().resolve().parent
    top = target.split(".")[0]
    _on_path(os.getcwd(), last=True)
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError) as e:
        raise UserError(f"workload {spec}: cannot find module {top}: {_cause(e)}") from None
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        raise UserError(f"workload {spec}: no module {top} on the Python path (nor in {os.getcwd()})")
    origin = Path(found.origin).resolve()
    return origin.parent.parent if found.submodule_search_locations else origin.parent


def _on_path(folder: str, last: bool = False) -> None:
    if folder not in sys.path:
        sys.path.append(folder) if last else sys.path.insert(0, folder)


def _cause(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _import(spec: str) -> Any:
    target, _ = split_spec(spec)
    try:
        if not target.endswith(".py"):
            _on_path(os.getcwd(), last=True)  # like `python -m`: the current folder's modules
            return importlib.import_module(target)
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"workload {spec}: no file {path}")
        _on_path(str(path.parent))  # its neighbours import as they would when it runs as a script
        name = f"omnilearn_workload_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    except UserError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the user's code raises is the cause
        raise UserError(f"workload {spec}: cannot import {target}: {_cause(e)}") from None


def user_workload(cfg: JobConfig) -> Workload:
    spec = cfg.workload
    assert spec
    _, function = split_spec(spec)
    module = _import(spec)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise UserError(f"workload {spec}: {split_spec(spec)[0]} has no function {function}")
    try:
        work = fn(cfg)
    except UserError as e:
        raise UserError(f"workload {spec}: {e}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise UserError(f"workload {spec}: {function}(config) raised {_cause(e)}") from None
    if not isinstance(work, Workload):
        raise UserError(f"workload {spec}: {function}(config) returned {type(work).__name__}, "
                        f"not an omnilearn.Workload")
    return work


def load_workload(cfg: JobConfig) -> Workload:
    """The job's workload: the user's function when ``workload`` is set, else the built-in one."""
    if cfg.workload:
        return user_workload(cfg)
    return builtin_workload(cfg)


def workload_name(cfg: JobConfig) -> str:
    return cfg.workload or f"{cfg.model.name}/{cfg.data.name}"


def check_workload(cfg: JobConfig, work: Workload) -> nn.Module:
    """Build the model and run it once on two samples of each split; returns the model.

    Raises UserError naming the workload and what is wrong: a dataset that is not map-style or
    raises on indexing, a model factory that fails or returns no ``nn.Module``, a loss or metric
    that does not give one value per sample.
    """
    where = f"workload {workload_name(cfg)}"
    if not isinstance(work.metric, Metric) or not callable(work.metric.fn):
        raise UserError(f"{where}: metric must be a Metric or a (name, function) pair, not {work.metric!r}")
    if not callable(work.loss):
        raise UserError(f"{where}: loss must be a function (output, target) -> one loss per sample")
    if not callable(work.model):
        raise UserError(f"{where}: model must be a function that returns the nn.Module, not {type(work.model).__name__}")
    try:
        model = work.model()
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{where}: model() raised {_cause(e)}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"{where}: model() returned {type(model).__name__}, not a torch.nn.Module")
    for split in ("train", "test"):
        _check_split(where, split, getattr(work, split), model, work)
    return model


def _check_split(where: str, split: str, data: Any, model: nn.Module, work: Workload) -> None:
    if isinstance(data, IterableDataset) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise UserError(f"{where}: {split} must be a map-style Dataset (with __getitem__ and __len__), "
                        f"not {type(data).__name__}")
    try:
        n = len(data)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{where}: len({split}) raised {_cause(e)}") from None
    if n < 1:
        raise UserError(f"{where}: {split} is empty")
    idx = torch.arange(min(2, n))
    try:
        if not callable(getattr(data, "batch", None)):
            sample = data[0]
            if not isinstance(sample, (tuple, list)) or len(sample) != 2:
                raise UserError(f"{where}: {split}[0] is a {type(sample).__name__}, not an (input, target) pair")
        x, y = gather(data, idx)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{where}: {split}[{idx.tolist()}] raised {_cause(e)}") from None
    try:
        with torch.no_grad():
            out = model.eval()(x)
            loss, score = work.loss(out, y), work.metric.fn(out, y)  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{where}: the model, loss or metric failed on {split} samples: {_cause(e)}") from None
    for what, value in (("loss", loss), ("metric", score)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (len(idx),):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise UserError(f"{where}: {what} must give one value per sample (shape ({len(idx)},) for "
                            f"{len(idx)} samples), got {shape}")


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
    from omnilearn.train.data import load_dataset  # here: a user's workload never imports the vision stack
    from omnilearn.train.models import build_model

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
