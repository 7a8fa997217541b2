"""Run at every interpreter's start where this folder is on ``PYTHONPATH`` (see the package): in a
process with a ``RANK`` and ``OMNILEARN_HOOK`` set, once ``import torch`` has run (the script's own, in
its own order), :func:`omnilearn.torch.autoload.install`; then the ``sitecustomize`` this one shadows,
if there is one. Nothing here imports torch or omnilearn before the script does."""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)


class _AfterTorch(importlib.abc.Loader):
    """torch's own loader; then the timing module's patch, torch fully imported."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _WatchTorch)]
        try:
            from omnilearn.torch.autoload import install
        except ImportError as e:  # omnilearn is not importable by this interpreter
            print(f"omnilearn: the timing module is not loaded ({e}): no step records", file=sys.stderr)
            return
        install()

    def __getattr__(self, name):  # get_source, get_code, ... of torch's loader
        return getattr(self.inner, name)


class _WatchTorch(importlib.abc.MetaPathFinder):
    """Finds ``torch`` as the path finder does, with :class:`_AfterTorch` as its loader. It stays on the
    path until torch is imported: a library may only look for torch first (``importlib.util.find_spec``,
    as ``transformers`` does), and the import that follows must find it again."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterTorch(spec.loader)
        return spec


def _chain():
    """Import the next ``sitecustomize`` on the path (the environment's own), as if this one were not there."""
    path = sys.path[:]
    sys.path[:] = [p for p in path if os.path.abspath(p or ".") != _HERE]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = path
        if mine is not None:
            sys.modules["sitecustomize"] = mine


if os.environ.get("OMNILEARN_HOOK") == "1" and "RANK" in os.environ and "torch" not in sys.modules:
    sys.meta_path.insert(0, _WatchTorch())
_chain()
