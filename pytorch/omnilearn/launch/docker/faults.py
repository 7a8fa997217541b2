"""Docker faults as the launcher tells them: a graceful stop, a vanished container, a daemon that went away.

Stopping a job sends each container SIGTERM (its worker ends at a step boundary and saves) and waits
``docker.stop_timeout`` seconds before Docker kills it. A daemon that stops answering while the job
runs, or a container removed behind the launcher's back, ends the job with one message naming it.

A daemon that stops (or restarts: without ``live-restore`` it stops every container as it goes) is seen
through :class:`DaemonWatch`, a follower of the daemon's event stream: the stream ends only when the
daemon closes its API. A stopping daemon first sends every container SIGTERM and closes its API a moment
later, so a worker that ended on a SIGTERM the launcher did not send is blamed on the daemon when the
daemon stops answering within :data:`STOP_VERDICT_S` (else it was a ``docker stop``). Such a job is not restarted at once (the daemon
may be away for long): it ends with exit status 1, its record left for ``omnilearn cleanup``, and its
last checkpoint kept for ``omnilearn run --resume``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.emulator.backends.dockerd import DEFAULT_DOCKER_HOST
from omnilearn.launch.failures import WorkerFailed

log = logging.getLogger("omnilearn.docker")


def daemon_address() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def daemon_errors() -> tuple[type[BaseException], ...]:
    """What the SDK raises when the daemon is gone or restarting (NotFound is a container's matter)."""
    import requests

    dk = docker_sdk()
    return (dk.errors.APIError, dk.errors.DockerException, requests.exceptions.RequestException, ConnectionError)


STOP_VERDICT_S = 5.0
"""How long a container stopped from outside waits for the daemon to go away before the worker is blamed
(a daemon's shutdown closes its API about a second after it stopped the containers)."""


class DaemonLost(WorkerFailed):
    """A Docker daemon went away while the job ran. The launcher's own: no restart until it is back.
    Another host's (``gone``: the workers it ran): they cannot come back, and a restart may go on
    with the others (``fault.max_restarts``, ``fault.min_workers``)."""

    @property
    def restartable(self) -> bool:  # type: ignore[override]
        return bool(self.gone)


def daemon_lost(error: BaseException, out_dir: Path | None = None, address: str | None = None,
                targets: list[str] | None = None, gone: list[int] | None = None) -> DaemonLost:
    """The message of a lost daemon: the launcher's own (no ``address``), or another host's, with the
    ``targets`` it ran (their slots ``gone``)."""
    resume = f", then `omnilearn run --resume {out_dir}` to go on from the last checkpoint" if out_dir else ""
    ran = f" (running {', '.join(targets)})" if targets else ""
    return DaemonLost(f"the Docker daemon at {address or daemon_address()}{ran} stopped answering while the job "
                      f"ran ({type(error).__name__}: {' '.join(str(error).split())[:200]}); a daemon restart stops "
                      f"the job's containers. Run `omnilearn cleanup` once it is back to remove what is "
                      f"left{resume}", gone=gone)


class DaemonWatch:
    """Follows each daemon's event stream (the job's containers only) while a job runs; :meth:`check`
    raises :class:`DaemonLost` once a stream has ended without :meth:`close`: that daemon stopped."""

    def __init__(self, clients: list[Any], job_id: str, out_dir: Path,
                 blame: Callable[[BaseException, Any], DaemonLost] | None = None) -> None:
        from omnilearn.emulator.backends.docker import LABEL_JOB

        self.out_dir = out_dir
        self.blame = blame or (lambda error, _client: daemon_lost(error, out_dir))
        """``blame(error, client)``: the DaemonLost naming the daemon behind ``client``."""
        self.lost: BaseException | None = None
        self.lost_client: Any = None
        self.lost_at: float | None = None
        self._closing = threading.Event()
        self._streams = [c.events(decode=True, filters={"label": f"{LABEL_JOB}={job_id}"}) for c in clients]
        self._threads = [threading.Thread(target=self._follow, args=(s, c), name="docker-events", daemon=True)
                         for s, c in zip(self._streams, clients, strict=True)]
        for t in self._threads:
            t.start()

    def _follow(self, stream: Any, client: Any) -> None:
        try:
            for _ in stream:
                pass
            error: BaseException = ConnectionError("the daemon closed its event stream")
        except Exception as e:  # noqa: BLE001 - however the stream breaks, the daemon is gone
            error = e
        if not self._closing.is_set() and self.lost is None:
            self.lost, self.lost_client, self.lost_at = error, client, time.time()

    def check(self) -> None:
        if self.lost is not None:
            raise self.blame(self.lost, self.lost_client)

    def check_daemon(self, client: Any, stopped: bool) -> None:
        """Raise DaemonLost when the daemon no longer answers or its event stream ended; a container
        ``stopped`` by a SIGTERM (maybe a stopping daemon's) waits up to STOP_VERDICT_S for the verdict."""
        deadline = time.time() + (STOP_VERDICT_S if stopped else 0.0)
        while True:
            try:
                client.ping()
            except daemon_errors() as e:
                raise self.blame(e, client) from None
            self.check()
            if time.time() >= deadline:
                return
            self._closing.wait(0.2)

    def close(self) -> None:
        self._closing.set()
        for s in self._streams:
            with contextlib.suppress(Exception):
                s.close()


def vanished(target: str, rank: int) -> WorkerFailed:
    return WorkerFailed(f"container {target} (rank {rank}) vanished: it was removed outside omnilearn "
                        f"(docker rm?) while the job ran", slot=rank)


def stop_gracefully(containers: dict[str, tuple[Any, str]], timeout: float) -> list[str]:
    """``docker stop`` every container at once: SIGTERM, then SIGKILL after ``timeout`` seconds.
    ``containers``: target -> (client, container id). Returns the targets stopped (running before)."""
    dk = docker_sdk()

    def stop(item: tuple[str, tuple[Any, str]]) -> str | None:
        target, (client, cid) = item
        with contextlib.suppress(dk.errors.NotFound, *daemon_errors()):  # a daemon gone took its containers
            c = client.containers.get(cid)
            if c.status in ("running", "paused", "restarting"):
                if c.status == "paused":
                    c.unpause()
                c.stop(timeout=max(1, round(timeout)))
                return target
        return None

    if not containers:
        return []
    with ThreadPoolExecutor(max_workers=len(containers)) as pool:
        results = list(pool.map(stop, containers.items()))
    return [t for t in results if t]
