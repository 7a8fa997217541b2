"""A job's workload from its config: the user's function (``workload: "module:function"`` or
``"path/to/file.py:function"``), or the built-in model and data; and the launcher's check of it.

:func:`load_workload` is what every rank calls. :func:`check_workload` is what the launcher runs once
before anything starts: a workload that fails to import, to build, or returns the wrong thing is one
:class:`UserError` naming the function and the cause.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

from omnilearn.config import JobConfig
from omnilearn.errors import UserError
from omnilearn.train.workload import Metric, Workload, gather


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
    from omnilearn.train.builtin import builtin_workload

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
