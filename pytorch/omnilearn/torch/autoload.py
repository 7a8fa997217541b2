"""The timing module's way into an unmodified DDP script: DDP wrapped when torch imports it.

``omnilearn record`` and ``omnilearn emulate`` put :mod:`omnilearn.torch.bootstrap` first on
``PYTHONPATH`` and set ``OMNILEARN_HOOK``; its ``sitecustomize`` runs at every interpreter's start and,
in a process with a ``RANK`` (a torchrun worker), watches for torch. Nothing is imported then: torch
keeps its place in the script's own import order (a script may set its threads before it imports
torch). Once ``import torch`` has run (the script's), :func:`install` has :func:`patch` wrap
``DistributedDataParallel``:

- ``__init__``: the first model a rank wraps starts the rank's recording
  (:func:`~omnilearn.torch.hook_timing.recording`), and a forward pre-hook counts each forward's samples;
  at the model's first forward, where the script registered no communication hook, DDP's own
  (``allreduce_hook``: the sum over ranks, divided by the world size) is registered, wrapped;
- ``register_comm_hook``: the script's own hook is kept, wrapped (omnilearn's weighting hook is left
  alone: :mod:`omnilearn.torch` records those steps itself); one registered after the first forward
  takes the place of DDP's own inside the wrapped hook already registered;
- ``_register_builtin_comm_hook``: a C++ hook runs no Python, so it cannot be wrapped: that rank then
  records no steps and says why.

The wrapped hook calls the script's (or DDP's) on every bucket; at the last bucket of a step it marks
the end of the rank's work, and the end of that bucket's all-reduce ends the step
(:class:`~omnilearn.torch.hook_timing.StepTimes`). That callback runs on one of the process group's own
threads, and is dropped there once it has run: it must hold no reference to the hook's state (DDP's own
hook's state is the process group), or a script that drops its model and process group meanwhile leaves
it the last one, and the group's teardown then joins the thread it runs on ("Resource deadlock
avoided": the rank aborts at its exit).
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from omnilearn.torch.hook_timing import BY_OMNILEARN, Recording, StepTimes, first_batch_size, recording

MODULE = "torch.nn.parallel.distributed"
PATCHED = "_omnilearn_timed"


@dataclass
class Timed:
    """The state of the wrapped hook: the hook it wraps, that hook's state, and the rank's step times."""

    hook: Any
    state: Any
    times: StepTimes


def timed_hook(timed, bucket):  # noqa: ANN001, ANN201 - DDP checks a hook's annotations against its own types
    """The wrapped hook on one bucket (see the module)."""
    last = bucket.is_last()
    if last:
        timed.times.last_bucket()
    future = timed.hook(timed.state, bucket)
    if not last:
        return future
    times = timed.times  # the callback holds the step times only, never the hook's state (see the module)

    def reduced(done):  # noqa: ANN001, ANN202
        times.reduced()
        return done.value()

    return future.then(reduced)


def _record_of(model: Any) -> Recording | None:  # noqa: ANN401
    return getattr(model, "_omnilearn_recording", None)


def patch(module: ModuleType) -> None:
    """Wrap ``module.DistributedDataParallel`` (once) as the module's docstring says."""
    ddp = module.DistributedDataParallel
    if getattr(ddp, PATCHED, False):
        return
    init, register, builtin = ddp.__init__, ddp.register_comm_hook, ddp._register_builtin_comm_hook

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401, N807
        init(self, *args, **kwargs)
        rec = recording(self)
        if rec is None:
            return
        self._omnilearn_recording = rec
        self._omnilearn_hook: Timed | None = None  # the wrapped hook registered with DDP, once

        def counted(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:  # noqa: ANN401
            if rec.off is not None:
                return
            if model._omnilearn_hook is None:  # the script registered none: DDP's own, wrapped
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                model._omnilearn_hook = Timed(allreduce_hook, model.process_group, rec.times)
                register(model, model._omnilearn_hook, timed_hook)
            rec.begin()
            # a training forward: with gradients, and the model in training mode (a framework may set it
            # on the module it wraps only, not on the wrapper)
            training = torch.is_grad_enabled() and (model.training or model.module.training)
            rec.times.forward(first_batch_size(args, kwargs), training)

        self.register_forward_pre_hook(counted, with_kwargs=True)

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: Any, hook: Any) -> None:  # noqa: ANN401
        rec = _record_of(self)
        if rec is None or rec.off is not None:
            return register(self, state, hook)
        if getattr(hook, "__module__", "").startswith("omnilearn.torch"):
            rec.off = f"{BY_OMNILEARN}: omnilearn.torch records its steps"
            return register(self, state, hook)
        if self._omnilearn_hook is not None:  # registered after the first forward: it takes DDP's own's place
            self._omnilearn_hook.hook, self._omnilearn_hook.state = hook, state
            return None
        self._omnilearn_hook = Timed(hook, state, rec.times)
        return register(self, self._omnilearn_hook, timed_hook)

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:  # noqa: ANN401
        rec = _record_of(self)
        if rec is not None and rec.off is None:
            rec.off = (f"the script registers a built-in communication hook ({comm_hook_type}), which runs no "
                       "Python and cannot be timed")
        return builtin(self, comm_hook_type)

    ddp.__init__ = __init__
    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = _register_builtin_comm_hook
    setattr(ddp, PATCHED, True)


def install() -> None:
    """Patch DDP (torch fully imported: :mod:`omnilearn.torch.bootstrap`'s ``sitecustomize`` calls this
    once ``import torch`` has run)."""
    patch(sys.modules.get(MODULE) or importlib.import_module(MODULE))
