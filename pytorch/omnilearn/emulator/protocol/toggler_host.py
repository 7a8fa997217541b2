"""The one way a job's toggler is hosted: by the local launcher, the Docker launcher, ``omnilearn emulate``
and ``omnilearn toggle`` alike.

:class:`TogglerHost` holds the job's toggler lock (one toggler per job, or changes would be applied
twice), polls the request logs in a thread, restarts that thread when it dies (a watchdog), and stops
cleanly: a last poll after the stop so that a last request is not lost, the toggler closed, the lock
released. A restart is safe because the audit is the toggler's only state (:mod:`.audit`): the new
toggler completes a change the dead one wrote ahead but never finished, and resumes every request log
where the last one stopped, so a restart neither loses nor repeats a change.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from omnilearn.emulator.protocol.audit import toggler_lock
from omnilearn.emulator.protocol.toggler import Toggler

log = logging.getLogger("omnilearn.toggler")


class TogglerHost:
    """Hosts ``make()``'s toggler for the job whose request logs are in ``log_dir``.

    ``before_poll(final)`` runs before each poll in the toggler's thread (``final``: the last one, after
    the stop), e.g. to bring remote run folders in step. The watchdog checks every ``check_s`` seconds;
    :meth:`check` is one such check, and what tests call.
    """

    def __init__(self, make: Callable[[], Toggler], log_dir: Path, interval: float = 0.1, check_s: float = 0.5,
                 max_restarts: int = 100, before_poll: Callable[[bool], None] | None = None) -> None:
        assert interval > 0 and check_s > 0 and max_restarts >= 0
        self.make, self.log_dir, self.interval, self.check_s = make, Path(log_dir), interval, check_s
        self.max_restarts, self.before_poll = max_restarts, before_poll
        self.restarts = 0
        self.toggler: Toggler | None = None
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the watchdog's restart against stop()
        self._held: contextlib.ExitStack | None = None
        self._watchdog: threading.Thread | None = None

    # ------------------------------------------------------------ start and stop

    def start(self) -> TogglerHost:
        """Take the job's toggler lock (a UserError when another toggler holds it) and start polling."""
        assert self._held is None, "started twice"
        held = contextlib.ExitStack()
        held.enter_context(toggler_lock(self.log_dir))
        self._held = held
        try:
            self._start_toggler()
        except BaseException:
            self._held = None
            held.close()
            raise
        self._watchdog = threading.Thread(target=self._watch, name="toggler-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling (the toggler's thread makes a last poll), close the toggler, release the lock."""
        with self._lock:
            self._stop.set()
        for thread in (self._watchdog, self.thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        if self.toggler is not None:
            self.toggler.close()
        if self._held is not None:
            self._held.close()
            self._held = None

    def __enter__(self) -> TogglerHost:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` or until stopped; True when stopped."""
        return self._stop.wait(seconds)

    # ------------------------------------------------------------ the toggler's thread

    def _start_toggler(self) -> None:
        if self.toggler is not None:
            self.toggler.close()
        self.toggler = self.make()
        self.thread = threading.Thread(target=self._run, args=(self.toggler,), name="toggler", daemon=True)
        self.thread.start()

    def _run(self, toggler: Toggler) -> None:
        try:
            while not self._stop.is_set():
                self._poll(toggler, final=False)
                self._stop.wait(self.interval)
            self._poll(toggler, final=True)
        except BaseException:  # noqa: BLE001 - the watchdog restarts it; say why it died
            log.exception("toggler thread died")

    def _poll(self, toggler: Toggler, final: bool) -> None:
        if self.before_poll is not None:
            try:
                self.before_poll(final)
            except Exception:  # noqa: BLE001 - a failed sync must not stop the local polls
                log.exception("toggler: before its poll")
        toggler.poll_once()

    # ------------------------------------------------------------ the watchdog

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            self.check()

    def check(self) -> bool:
        """One watchdog check: a toggler thread that died (not stopped) is replaced; True when it was."""
        with self._lock:
            if self._stop.is_set() or self.thread is None or self.thread.is_alive():
                return False
            if self.restarts >= self.max_restarts:
                log.error("toggler died %d times: not restarted again", self.restarts)
                return False
            self.restarts += 1
            log.warning("toggler thread died: restarting it from its audit (restart %d)", self.restarts)
            try:
                self._start_toggler()
            except Exception:  # noqa: BLE001 - tried again at the next check
                log.exception("toggler restart failed")
                return False
            return True
