"""Docker faults as the launcher tells them: a graceful stop, a vanished container, a daemon that went away.

Stopping a job sends each container SIGTERM (its worker ends at a step boundary and saves) and waits
``docker.stop_timeout`` seconds before Docker kills it. A daemon that stops answering while the job
runs, or a container removed behind the launcher's back, ends the job with one message naming it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.launch.docker.daemon import DEFAULT_DOCKER_HOST
from omnilearn.launch.failures import WorkerFailed

log = logging.getLogger("omnilearn.docker")


def daemon_address() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def daemon_errors() -> tuple[type[BaseException], ...]:
    """What the SDK raises when the daemon is gone or restarting (NotFound is a container's matter)."""
    import requests

    dk = docker_sdk()
    return (dk.errors.APIError, dk.errors.DockerException, requests.exceptions.RequestException, ConnectionError)


def daemon_lost(error: BaseException) -> WorkerFailed:
    return WorkerFailed(f"the Docker daemon at {daemon_address()} stopped answering while the job ran "
                        f"({type(error).__name__}: {str(error)[:200]}); a daemon restart stops the job's containers. "
                        f"Run `omnilearn cleanup` once it is back to remove what is left")


def vanished(target: str, rank: int) -> WorkerFailed:
    return WorkerFailed(f"container {target} (rank {rank}) vanished: it was removed outside omnilearn "
                        f"(docker rm?) while the job ran")


def stop_gracefully(containers: dict[str, tuple[Any, str]], timeout: float) -> list[str]:
    """``docker stop`` every container at once: SIGTERM, then SIGKILL after ``timeout`` seconds.
    ``containers``: target -> (client, container id). Returns the targets stopped (running before)."""
    dk = docker_sdk()

    def stop(item: tuple[str, tuple[Any, str]]) -> str | None:
        target, (client, cid) = item
        with contextlib.suppress(dk.errors.NotFound):
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
