"""A worker's life: stop on request (SIGTERM) at a step boundary, and never outlive its launcher.

``stop_requested()`` is the one place the trainers ask whether to stop: SIGTERM (``docker stop``, the
launcher's teardown) sets it; the BSP trainers share it through the step's all-reduce so every rank
stops after the same step, saves what it keeps (the place for a checkpoint), and exits with
:data:`STOPPED_STATUS`. A second SIGTERM ends the process at once.

A local launcher starts each worker with a parent-death signal (:func:`die_with_parent`, run in the
child before exec) and tells it its pid (:data:`LAUNCHER_PID_ENV`); :func:`watch_launcher` also polls
that pid from a thread, for a worker started through a wrapper (``ip netns exec``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

STOPPED_STATUS = 3
"""A worker's exit status after a requested stop (SIGTERM) that it honoured at a step boundary."""
LAUNCHER_PID_ENV = "OMNILEARN_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_stop = threading.Event()


def stop_requested() -> bool:
    return _stop.is_set()


def _on_term(signum: int, frame: object) -> None:
    if _stop.is_set():  # the second request: no more waiting for the step to end
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    _stop.set()


def arm() -> None:
    """From now on SIGTERM asks for a stop at the end of the current step (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)


def disarm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def die_with_parent() -> None:
    """``preexec_fn`` for a worker: the kernel sends it SIGKILL when the launcher dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def watch_launcher(poll_s: float = 0.5) -> threading.Thread | None:
    """A daemon thread that ends this process when the launcher named in the environment is gone."""
    value = os.environ.get(LAUNCHER_PID_ENV)
    if not value or not value.isdigit():
        return None
    pid = int(value)
    child = os.getppid() == pid  # started by the launcher itself, not through a wrapper

    def gone() -> bool:
        if child:
            return os.getppid() != pid  # reparented: immune to the launcher's pid being reused
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def loop() -> None:
        while not gone():
            time.sleep(poll_s)
        os._exit(STOPPED_STATUS)

    thread = threading.Thread(target=loop, name="launcher-watch", daemon=True)
    thread.start()
    return thread
