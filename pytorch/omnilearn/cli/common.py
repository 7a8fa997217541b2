"""Helpers the commands share: the console, and named flags as config overrides."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from omnilearn import config


def make_console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 130)  # logs and CI get whole tables


def flag_overrides(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """Named flags are shorthands for config keys; ``--set`` reaches any key."""
    out = [config.parse_assignment(s) for s in args.set or []]
    named = {
        "mode": args.mode, "workers": args.workers, "train.epochs": args.epochs,
        "train.global_batch": args.global_batch, "control.policy": args.policy,
        "emulation.backend": args.backend, "emulation.hl": args.hl, "emulation.schedule": args.schedule,
        "model.name": args.model, "data.name": args.dataset,
    }
    out += [(k, v) for k, v in named.items() if v is not None]
    if getattr(args, "tensorboard", False):
        out.append(("report.tensorboard", True))
    return out


def bench_overrides(args: argparse.Namespace) -> list[tuple[str, Any]]:
    out = [config.parse_assignment(s) for s in args.set or []]
    return out + ([("report.tensorboard", True)] if args.tensorboard else [])
