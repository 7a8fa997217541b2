"""How the toggler retries a change the kernel or Docker rejected, and what it records meanwhile.

A backend's failure may pass: a cgroup file busy for a moment, a daemon restarting, a container
being recreated. Such a failure is an ``OSError`` (a cgroup write, or the Docker SDK, whose errors
derive from it) or a ``RuntimeError`` (Docker read back something other than what was asked). The
toggler tries the change again after :data:`RETRY_FIRST_S` seconds, doubling the wait up to
:data:`RETRY_CAP_S`, at most :data:`MAX_RETRIES` times, without blocking the other ranks' logs; a newer
request of the same rank replaces a change still being retried. Other failures (a container of
another job, a target outside the job, a controller the host lacks) would fail again: not retried.

While a change fails, every outcome in the audit carries the allocation *in force*, read back from
the kernel or Docker (:func:`in_force`), not the one asked for, and ``attempts`` (the backend calls
made for the change so far): a ``retrying`` record after each failed attempt that will be tried
again, then ``applied``, or ``rejected`` (given up, or superseded). The worker takes the first
``retrying`` record as its answer, so its metrics show the allocation it really has.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omnilearn.emulator.backends import Backend

log = logging.getLogger("omnilearn.toggler")

RETRY_FIRST_S = 0.2  # the wait after a change's first failed attempt
RETRY_CAP_S = 5.0  # the longest wait between two attempts
MAX_RETRIES = 20  # attempts after the first; then the change is rejected (about 80 s of retrying)
RETRIED: tuple[type[BaseException], ...] = (OSError, RuntimeError)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between the attempts at one change."""

    first_s: float = RETRY_FIRST_S
    cap_s: float = RETRY_CAP_S
    max_retries: int = MAX_RETRIES

    def __post_init__(self) -> None:
        assert 0 <= self.first_s <= self.cap_s and self.max_retries >= 0, self

    def delay(self, attempts: int) -> float | None:
        """Seconds to wait after the ``attempts``-th attempt failed (1 is the first), None: give up."""
        if attempts > self.max_retries:
            return None
        return min(self.cap_s, self.first_s * 2.0 ** min(attempts - 1, 64))


def retriable(error: BaseException) -> bool:
    """A failure that may pass (see the module's docstring)."""
    return isinstance(error, RETRIED)


def in_force(backend: Backend, target: str) -> dict[str, Any] | None:
    """The allocation in force on ``target`` read back from the backend, as the audit holds it; None
    when the backend has nothing to read or cannot read it (the toggler's log says why)."""
    try:
        current = backend.current(target)
    except Exception as e:  # noqa: BLE001 - a vanished container, an unreadable file: unknown, not fatal
        log.warning("toggler: cannot read back %s's allocation from the %s backend: %s: %s",
                    target, getattr(backend, "name", "?"), type(e).__name__, e)
        return None
    return current.to_dict() if current is not None else None
