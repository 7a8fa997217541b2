"""Ctrl-C and SIGTERM while a launcher watches its workers."""

from __future__ import annotations

import os
import select
import signal
import threading


class Interrupts:
    """Ctrl-C and SIGTERM while a job runs: noted by a handler, acted on at the monitor loop's pace.

    Raising KeyboardInterrupt from the handler could land anywhere, e.g. between a lock's acquire
    and its ``try`` inside ``subprocess.Popen.poll``, and leave the teardown waiting forever on that
    lock. The handler takes no lock either: a ``threading.Event``'s ``set`` would take the lock its
    ``wait`` holds when the signal lands there, and hang the launcher. It stores a flag and writes a
    byte to a pipe that :meth:`wait` selects on; :meth:`check` raises at a point of our choosing.
    """

    def __init__(self) -> None:
        self.seen = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous: dict[int, object] = {}

    def _note(self, signum: int, frame: object) -> None:
        self.seen = True
        try:
            os.write(self._write, b"\0")
        except OSError:  # the pipe is full: a byte is already waiting
            pass

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self._read)
        os.close(self._write)

    def wait(self, seconds: float) -> None:
        """Sleep, waking at once on a signal, and raise KeyboardInterrupt if one came."""
        if not self.seen:
            select.select([self._read], [], [], seconds)
        self.check()

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt
