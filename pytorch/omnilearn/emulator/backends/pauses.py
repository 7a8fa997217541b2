"""Stalls: a target paused for a while (a trace's ``stall`` event), then resumed by a timer.

:class:`Pauses` holds the timers for a backend; whatever happens, :meth:`Pauses.close` resumes every
target still paused, so a worker is never left stopped (the launchers close their backend in ``finally``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

Timer: Callable[..., Any] = threading.Timer
"""What runs a resume later: a ``threading.Timer``-like class (``start``, ``cancel``); tests put a manual one here."""


class Pauses:
    """Pause a target now and resume it ``seconds`` later; one pause per target at a time (a second one
    extends the first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timers: dict[str, Any] = {}
        self._resume: dict[str, Callable[[], None]] = {}

    def pause(self, target: str, seconds: float, stop: Callable[[], None], resume: Callable[[], None]) -> None:
        assert seconds > 0, seconds
        with self._lock:
            old = self._timers.pop(target, None)
            if old is not None:
                old.cancel()
            else:
                stop()
            self._resume[target] = resume
            timer = Timer(seconds, self._end, args=(target,))
            timer.daemon = True
            timer.name = f"omnilearn-stall-{target}"
            self._timers[target] = timer
            timer.start()

    def paused(self, target: str) -> bool:
        with self._lock:
            return target in self._timers

    def _end(self, target: str) -> None:
        with self._lock:
            self._timers.pop(target, None)
            resume = self._resume.pop(target, None)
        if resume is not None:
            resume()

    def close(self) -> None:
        """Resume every target still paused, now."""
        with self._lock:
            timers, self._timers = self._timers, {}
            resumes, self._resume = self._resume, {}
        for timer in timers.values():
            timer.cancel()
        for resume in resumes.values():
            resume()


def signal_all(pids: Iterable[int], sig: int) -> Callable[[], None]:
    """A callable sending ``sig`` to every process of ``pids`` that still exists."""
    def send() -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    return send


STOP, CONT = signal.SIGSTOP, signal.SIGCONT
