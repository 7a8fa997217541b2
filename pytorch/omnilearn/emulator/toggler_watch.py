"""A watchdog for the toggler thread: a toggler that died is replaced by a new one, resumed from its audit.

The audit is the toggler's only state (:mod:`.audit`): a new toggler completes a change the dead one
wrote ahead but never finished, and resumes every request log where the last one stopped, so a
restart neither loses nor repeats a change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from omnilearn.emulator.toggler import Toggler

log = logging.getLogger("omnilearn.toggler")


class TogglerWatchdog:
    """Runs ``make()``'s toggler in a thread until ``stop`` is set, restarting it whenever it dies."""

    def __init__(self, make: Callable[[], Toggler], stop: threading.Event, check_s: float = 0.5,
                 max_restarts: int = 100) -> None:
        self.make, self.stop, self.check_s, self.max_restarts = make, stop, check_s, max_restarts
        self.restarts = 0
        self.toggler: Toggler | None = None
        self._thread: threading.Thread | None = None
        self._watch = threading.Thread(target=self._loop, name="toggler-watchdog", daemon=True)

    def start(self) -> TogglerWatchdog:
        self._start_toggler()
        self._watch.start()
        return self

    def _start_toggler(self) -> None:
        if self.toggler is not None:
            self.toggler.close()
        self.toggler = self.make()
        self._thread = threading.Thread(target=self._run, args=(self.toggler,), name="toggler", daemon=True)
        self._thread.start()

    def _run(self, toggler: Toggler) -> None:
        try:
            toggler.run(self.stop)
        except BaseException:  # noqa: BLE001 - the watchdog restarts it; say why it died
            log.exception("toggler thread died")

    def _loop(self) -> None:
        while not self.stop.wait(self.check_s):
            if self._thread is not None and not self._thread.is_alive() and not self.stop.is_set():
                if self.restarts >= self.max_restarts:
                    log.error("toggler died %d times: not restarted again", self.restarts)
                    return
                self.restarts += 1
                log.warning("toggler thread died: restarting it from its audit (restart %d)", self.restarts)
                try:
                    self._start_toggler()
                except Exception:  # noqa: BLE001 - tried again at the next check
                    log.exception("toggler restart failed")

    def is_alive(self) -> bool:
        return self._watch.is_alive() or (self._thread is not None and self._thread.is_alive())

    def join(self, timeout: float | None = None) -> None:
        self._watch.join(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
