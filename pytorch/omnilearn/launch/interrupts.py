"""Ctrl-C and SIGTERM while a launcher watches its workers."""

from __future__ import annotations

import signal
import threading


class Interrupts:
    """Ctrl-C and SIGTERM while a job runs: noted by a handler, acted on at the monitor loop's pace.

    Raising KeyboardInterrupt from the handler could land anywhere, e.g. between a lock's acquire
    and its ``try`` inside ``subprocess.Popen.poll``, and leave the teardown waiting forever on that
    lock. The handler only sets an event; :meth:`check` raises at a point of our choosing.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, lambda signum, frame: self.event.set())
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def wait(self, seconds: float) -> None:
        """Sleep, waking at once on a signal, and raise KeyboardInterrupt if one came."""
        self.event.wait(seconds)
        self.check()

    def check(self) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
