"""The folder ``omnilearn record`` and ``omnilearn emulate`` put first on ``PYTHONPATH``: its
``sitecustomize`` loads the timing module into every rank of an unmodified DDP script
(:mod:`omnilearn.torch.autoload`)."""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
