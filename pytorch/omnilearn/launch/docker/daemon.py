"""The Docker daemons as the container launcher sees them: clients that answered (the local one, and one
per other host a job places targets on), and small image lookups."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec

if TYPE_CHECKING:
    import docker

log = logging.getLogger("omnilearn.docker")

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
LogFn = Callable[[str], None]
LOG_TAIL_LINES = 40  # lines of build/debootstrap output kept for an error message


def daemon_client(timeout: int = 60) -> docker.DockerClient:
    """A client for the daemon named by DOCKER_HOST (default: the local socket) that has answered a ping.

    Raises UserError with one line naming the address, so a missing daemon is a user-facing condition
    with a remedy rather than a traceback from deep inside requests.
    """
    import requests

    dk = docker_sdk()
    host = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    try:
        client = dk.from_env(timeout=timeout)
        client.ping()
    except (dk.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
        if "permission denied" in str(e).lower():
            raise UserError(f"no access to the Docker daemon at {host}: permission denied (run as root, or "
                            f"add your user to the docker group)") from e
        raise UserError(f"no Docker daemon at {host}: start it with ./docker_install.sh") from e
    return client


def image_or_none(client: docker.DockerClient, ref: str) -> Any | None:
    dk = docker_sdk()
    try:
        return client.images.get(ref)
    except dk.errors.ImageNotFound:
        return None


def split_tag(ref: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag); a registry port (``host:5000/name``) is not mistaken for a tag."""
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return repo, tag


def emit_to(on_log: LogFn | None) -> LogFn:
    """Where build and debootstrap output goes: ``on_log``, else this module's logger."""
    return on_log if on_log is not None else log.info


def answering(url: str) -> Any:
    """A client for the daemon at ``url`` that has answered a ping (else whatever the SDK raised)."""
    client = url_client(url)
    client.ping()
    return client


def unanswering(job: JobSpec) -> list[int]:
    """The slots of the running targets placed on another host whose daemon does not answer now: after a
    failure, workers that cannot come back (a stopping daemon stops its containers a moment before its
    API goes, so the first failure seen may be a worker's)."""
    placed: dict[str, list[int]] = {}
    for slot in job.slots:
        url = job.config.docker.hosts.get(job.plan.targets[slot])
        if url is not None:
            placed.setdefault(url, []).append(slot)
    silent: list[int] = []
    for url, slots in placed.items():
        try:
            answering(url)
        except Exception:  # noqa: BLE001 - whatever stops it answering
            silent += slots
    return sorted(silent)


def clients_for(job: JobSpec) -> tuple[Any, dict[str, Any]]:
    """The local (manager) daemon and one client per remotely placed target that runs (a daemon that ran
    only workers the job went on without is not asked)."""
    first = job.plan.targets[job.slots[0]]
    if first in job.config.docker.hosts:
        raise UserError(f"{job.config.source}: docker.hosts.{first}: rank 0 ({first}) runs on the launcher's "
                        f"daemon (it holds the rendezvous, the checkpoints and the server's snapshots); "
                        f"place only other targets on other hosts")
    if job.plan.links and job.config.docker.hosts:
        raise UserError(f"{job.config.source}: links are shaped from the launcher's host, in the overlay's "
                        f"namespace there: a job with links runs on one daemon (no docker.hosts)")
    default = daemon_client()
    remote: dict[str, Any] = {}
    by_url: dict[str, Any] = {}
    running = {job.plan.targets[s] for s in job.slots}
    for target, url in job.config.docker.hosts.items():
        if target not in job.plan.targets:
            raise UserError(f"{job.config.source}: docker.hosts.{target}: not a target of this job "
                            f"({', '.join(job.plan.targets)})")
        if target not in running:
            continue
        if url not in by_url:
            try:
                by_url[url] = answering(url)
            except Exception as e:  # noqa: BLE001 - any failure to reach a daemon is the same user error
                raise UserError(f"docker.hosts.{target}: no Docker daemon answers at {url} ({e})") from e
        remote[target] = by_url[url]
    return default, remote


def url_client(url: str) -> Any:
    """A client for the daemon at ``url``; ``ssh://`` through the ssh client (the user's keys and config)."""
    return docker_sdk().DockerClient(base_url=url, use_ssh_client=url.startswith("ssh://"))
