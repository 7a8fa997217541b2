"""omnilearn: heterogeneity emulation and dynamic batching for distributed PyTorch training."""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"Workload": "omnilearn.train.workload", "Metric": "omnilearn.train.workload"}


def __getattr__(name: str) -> Any:
    """``from omnilearn import Workload`` imports torch only when asked (the CLI starts without it)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'omnilearn' has no attribute {name!r}")
