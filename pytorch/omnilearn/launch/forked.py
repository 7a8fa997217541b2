"""Worker processes forked from a server that imported PyTorch once, instead of N fresh interpreters.

A fresh worker spends about 6 CPU-seconds importing torch, torchvision and the trainers before its
first step; four of them on a 2-core host start in about 15 s, and the slowest-allocated one gates
the process group. Python's fork server (``multiprocessing``'s ``forkserver`` context) imports them
once per launcher, then forks each worker from that warm, single-threaded process: a worker starts
in well under a second, and the modules' pages are shared. Every worker is still a process of its
own, in its own session, with its own environment and log, placed in its cgroup by the launcher as
before; it dies with the fork server (parent-death signal), which dies with the launcher, and it
also watches the launcher's pid (:func:`omnilearn.train.lifecycle.watch_launcher`).

Not used where a worker must start through a wrapper (``ip netns exec`` for links) or where memory is
emulated: pages shared with the fork server would be charged to the launcher's cgroup, not the
worker's, and a memory limit would then bound less than the worker uses.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from multiprocessing.context import BaseContext
from pathlib import Path

import setproctitle

from omnilearn.emulator.spec.plan import EmulationPlan
from omnilearn.train.lifecycle import die_with_parent

PRELOAD = ["torch", "torch._dynamo", "omnilearn.cli", "omnilearn.cli.run", "omnilearn.train.bsp", "omnilearn.train.asp",
           "omnilearn.train.ddp"]
"""What the fork server imports once: what every worker imports before its first step (``torch._dynamo``:
the first optimizer's, 1.1 CPU-seconds)."""
TORCHVISION_MODELS = ("resnet18", "resnet50", "vgg11", "alexnet")
"""The models whose definitions are torchvision's (:mod:`omnilearn.train.models` imports it for these only)."""
TORCHVISION_FREE_DATA = ("digits", "synthetic", "text")
"""The datasets loaded and transformed without torchvision (CIFAR and the image folders use it)."""
_ENV_AT_IMPORT = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
"""Read by OpenMP when torch loads it, so they must hold in the fork server (as in every worker's environment)."""


def forks(plan: EmulationPlan) -> bool:
    """Whether the local launcher forks this job's workers (no links, no memory limits: see above)."""
    limits_memory = any(a.memory is not None for allocs in plan.levels.values() for a in allocs.values())
    return not plan.links and not limits_memory


def preload(model: str, dataset: str) -> list[str]:
    """What the fork server imports for a job of ``model`` on ``dataset``: :data:`PRELOAD`, and torchvision
    (1.5 CPU-seconds) where the model or the data need it."""
    wants = model in TORCHVISION_MODELS or dataset not in TORCHVISION_FREE_DATA
    return [*PRELOAD, "torchvision"] if wants else list(PRELOAD)


_preload = list(PRELOAD)  # what a fork server started by this process imports


def context() -> BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_preload)
    return ctx


def warm(modules: list[str] | None = None) -> None:
    """Start the fork server unless it runs (early: its imports then overlap the launcher's own work).
    ``modules``: what it imports when it starts (:func:`preload`); else what the first call said, or
    :data:`PRELOAD`."""
    from multiprocessing import forkserver

    global _preload
    if modules is not None:
        _preload = list(modules)
    context()
    added = {k: v for k, v in _ENV_AT_IMPORT.items() if k not in os.environ}
    os.environ.update(added)  # the server's environment is the launcher's when it starts
    try:
        forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key, None)


def _child(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked worker: own session, death with its parent, the launcher's environment, its log
    as stdout and stderr, then ``omnilearn <argv>`` (run as ``python -m omnilearn`` runs it)."""
    os.setsid()
    die_with_parent()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # What `ps` shows, as for a started worker; set while the environment is still the one the process
    # started with, which setproctitle moves aside to make room.
    setproctitle.setproctitle(" ".join(["omnilearn", *argv]))
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["omnilearn", *argv]
    try:
        runpy.run_module("omnilearn", run_name="__main__", alter_sys=True)  # as `python -m omnilearn`
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedWorker:
    """A worker forked from the fork server, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        warm()
        self._proc = context().Process(target=_child, args=(argv, env, str(log_path)), daemon=False)
        self._proc.start()
        self.pid: int = self._proc.pid  # type: ignore[assignment]
        self.args = argv

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        code = self._proc.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
