"""The batch controller a job runs: :func:`make_controller` picks it by policy.

``dynamic`` is :class:`~omnilearn.control.dynamic.DynamicController` (a stated model, a start-up probe,
one decision rule); every other policy (``uniform``, ``static``, ``dynamic-v1``, ``dynamic+prior``,
``paper``) is :class:`~omnilearn.control.v1.BatchController`. Both take the same calls: ``observe_step``
(BSP) or ``observe`` (ASP), ``due``, ``decide``, ``initial`` / ``reallocate`` (the allocation-aware
policies), ``set_bounds``, ``probe_sizes``, ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

from omnilearn.config import ControlConfig
from omnilearn.control.dynamic import DynamicController
from omnilearn.control.policies import Bounds
from omnilearn.control.v1 import BatchController

Controller = BatchController | DynamicController


def make_controller(config: ControlConfig, global_batch: int, bounds: Bounds, synchronous: bool = True
                    ) -> Controller:
    """The controller of ``config.policy`` (``config`` already :func:`~omnilearn.control.policies.effective`)."""
    if config.policy == "dynamic":
        return DynamicController(config, global_batch, bounds, synchronous=synchronous)
    return BatchController(config, global_batch, bounds, synchronous=synchronous)
