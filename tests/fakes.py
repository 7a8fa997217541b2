"""Fake time for the unit tier: a clock the test moves, and timers that fire when the clock passes them.

A unit test never sleeps: what would wait (a retry's backoff, a stall's resume) is driven by
:class:`FakeClock` instead, so the test asserts behaviour, not how fast a loaded host ran it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FakeClock:
    """``clock()`` reads the time; ``advance(s)`` moves it and fires the timers now due, in order."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.timers: list[ManualTimer] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.now += seconds
        for timer in sorted(self.timers, key=lambda t: t.due):
            if timer.due <= self.now and timer.started and not timer.cancelled and not timer.fired:
                timer.fire()

    def timer(self, seconds: float, function: Callable[..., Any], args: tuple = (), kwargs: dict | None = None
              ) -> ManualTimer:
        """A ``threading.Timer`` look-alike on this clock (monkeypatch it where a module makes its timers)."""
        timer = ManualTimer(self.now + seconds, function, args, kwargs or {})
        self.timers.append(timer)
        return timer


class ManualTimer:
    """Fires ``function(*args)`` when its clock passes ``due`` (see :meth:`FakeClock.advance`)."""

    def __init__(self, due: float, function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.due, self.function, self.args, self.kwargs = due, function, args, kwargs
        self.started = self.cancelled = self.fired = False
        self.daemon, self.name = True, "manual-timer"

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.fired = True
        self.function(*self.args, **self.kwargs)
