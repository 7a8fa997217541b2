"""The launchers' one supervise loop: local processes and containers are watched alike.

Each round asks the workers' states; the first failure (:func:`~.failures.first_failure`: the earliest,
then by kind, then by rank) ends the job with the exception its launcher makes of it; every worker
ended well ends the loop. What a launcher checks on its own (a hung rank, a lost daemon) it raises from
its ``states``. Ctrl-C and SIGTERM are acted on between rounds (:class:`~.interrupts.Interrupts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from omnilearn.launch.failures import first_failure

States = dict[int, tuple[int | None, float]]
"""Per worker (its slot): its exit status (None while it runs) and when that was seen (monotonic seconds)."""


class Waiter(Protocol):
    def wait(self, seconds: float) -> None: ...


class Progress(Protocol):
    def update(self) -> None: ...


def supervise(states: Callable[[], States], failure: Callable[[int, int], BaseException], interrupts: Waiter,
              progress: Progress | None = None, interval: float = 0.25) -> None:
    """Return once every worker has exited 0; raise ``failure(slot, status)`` for the one whose failure
    started it all."""
    while True:
        now = states()
        failed = {slot: (when, code) for slot, (code, when) in now.items() if code not in (None, 0)}
        if failed:
            slot = first_failure(failed)
            raise failure(slot, failed[slot][1])
        if all(code == 0 for code, _ in now.values()):
            return
        if progress is not None:
            progress.update()
        interrupts.wait(interval)
