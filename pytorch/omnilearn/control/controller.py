"""What a trainer may ask of a batch controller (:class:`Controller`), and the one builder every
trainer, ``omnilearn.torch``, the frameworks and the simulators call (:func:`build_controller`).

A controller is picked by its policy here and nowhere else:

- ``dynamic``: :class:`~omnilearn.control.dynamic.DynamicController` (BSP: a stated model, a start-up
  probe, one decision rule), or in ASP :class:`~omnilearn.control.asp.AsyncController` (effective
  samples a second, driven by :class:`~omnilearn.control.asp.AsyncLoop`);
- ``uniform``, ``static``, ``paper``, ``dynamic+prior``: :mod:`omnilearn.control.baselines`.

A caller never tests a policy's name: what differs between controllers is in their attributes
(:class:`Controller`'s capabilities).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from omnilearn.config import RETIRED, ControlConfig
from omnilearn.control.asp import AsyncController
from omnilearn.control.baselines import Paper, Prior, Static, Uniform
from omnilearn.control.dynamic import DynamicController
from omnilearn.control.policies import Bounds, effective
from omnilearn.errors import UserError

Shares = Sequence[float | None]


class Controller(Protocol):
    """The calls and capabilities of a step-driven controller (every policy's in BSP, the baselines' in
    ASP; the ControlLoop drives it). Identical inputs give identical decisions on every rank."""

    batch: list[int]
    global_batch: int
    bounds: Bounds

    # capabilities
    knows_allocation: bool
    """It is given the emulator's allocated CPU shares (only the policies named for them)."""
    measures: bool
    """It decides from measured compute times (false: the trainer need not send them)."""
    times_update: bool
    """A worker's compute time includes the optimizer step (false: forward and backward only)."""
    times_quota: bool
    """A worker's time counts the waits its CPU quota put into the all-reduce (the trainer reads its quota)."""
    skips_steps: bool
    """The control loop may leave steps out to keep its cost within budget."""
    wants_step: bool
    """The next step must be measured whatever the budget."""
    bounded_by_memory: bool
    """It keeps every batch within the worker's memory bound (false: only once a worker ran out)."""
    per_epoch: bool
    """It decides once an epoch (ASP: the parameter server asks it at each epoch's first push)."""
    at_stake: float
    """Seconds a step would save that a held decision is waiting on evidence for (the loop then measures)."""
    overhead: float
    """The fixed cost per step it works with, in samples (k of ``t = c (b + k)``; 0 where it has none)."""
    overheads: list[float] | None
    """Each worker's k, where it tells workers' kinds apart (else None)."""
    decision: dict[str, Any] | None
    """What its last decision weighed (recorded with the batch change), or None."""

    @property
    def policy(self) -> str: ...

    @property
    def workers(self) -> int: ...

    @property
    def holds(self) -> dict[str, int]: ...

    def allocations(self, read: Callable[[], Shares]) -> Shares | None: ...

    def initial(self, cpu_shares: Shares | None) -> list[int]: ...

    def reallocate(self, cpu_shares: Shares | None) -> list[int] | None: ...

    def probe_sizes(self) -> tuple[int, int] | None: ...

    def observe_probe(self, small: int, large: int, t_small: Sequence[float], t_large: Sequence[float],
                      warm: bool = True, kinds: Sequence[Sequence[float]] | None = None) -> list[int] | None: ...

    def set_threads(self, threads: Sequence[float]) -> None: ...

    def observe_step(self, seconds: Sequence[float], steps: int = 1) -> list[int]: ...

    def observe(self, worker: int, batch: int, seconds: float) -> bool: ...

    def estimates(self) -> tuple[list[float] | None, list[int]]: ...

    def regimes(self) -> list[int]: ...

    def due(self, step_in_run: int, end_of_epoch: bool) -> bool: ...

    def decide(self, cpu_shares: Shares | None = None, steps_left: int | None = None) -> list[int] | None: ...

    def set_bounds(self, bounds: Bounds) -> list[int] | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, d: dict[str, Any], keep: list[int] | None = None) -> None: ...


STEP_DRIVEN: dict[str, type] = {"uniform": Uniform, "static": Static, "paper": Paper, "dynamic": DynamicController,
                                "dynamic+prior": Prior}


def controller_class(policy: str, asynchronous: bool = False) -> type:
    """The class of ``policy``'s controller (its capabilities are class attributes): a worker that only
    needs to know how it is timed asks this, without building one."""
    if policy in RETIRED:
        raise UserError(f"policy {policy!r} is retired; its figures are in {RETIRED[policy]}")
    if policy not in STEP_DRIVEN:
        raise UserError(f"policy {policy!r} is not a batch controller's (known: {', '.join(STEP_DRIVEN)})")
    if asynchronous and policy == "dynamic":
        return AsyncController
    return STEP_DRIVEN[policy]


def build_controller(control: ControlConfig, global_batch: int, workers: int, *, asynchronous: bool = False,
                     delay_tolerance: float = 1.0, batch_tolerance: float | None = None, parameters: bool = False,
                     min_batch: int = 1, reference_batch: float | None = None) -> Any:
    """``control``'s controller for ``workers`` workers sharing ``global_batch``, within
    :func:`configured_bounds` (and at least ``min_batch`` a worker: a loop's micro-batches need one
    sample each). ``asynchronous``: the parameter server's (ASP); there ``dynamic`` is the progress
    controller, told the server rule's ``delay_tolerance``, ``batch_tolerance`` and ``reference_batch``
    (``b_ref``) and whether workers push ``parameters``."""
    cls = controller_class(control.policy, asynchronous)
    c = effective(control, global_batch, workers)
    if min_batch > c.min_batch:
        c = dataclasses.replace(c, min_batch=min_batch)
    bounds = Bounds.make(workers, c.min_batch, c.max_batch, global_batch)
    if cls is AsyncController:
        return AsyncController(global_batch, bounds, delay_tolerance, parameters=parameters,
                               batch_tolerance=batch_tolerance, reference_batch=reference_batch)
    return cls(c, global_batch, bounds, synchronous=not asynchronous)


def configured_bounds(control: ControlConfig, global_batch: int, workers: int) -> Bounds:
    """The bounds ``control``'s policy runs within, before any memory bound."""
    c = effective(control, global_batch, workers)
    return Bounds.make(workers, c.min_batch, c.max_batch, global_batch)
