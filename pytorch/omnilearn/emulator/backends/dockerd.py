"""A Docker client, as every part of omnilearn that talks to a daemon opens one: the local daemon's (or
``DOCKER_HOST``'s) once it has answered, one for any URL, and small image lookups. The image builder
(:mod:`omnilearn.images`) and the container launcher (:mod:`omnilearn.launch.docker`) both use it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.errors import UserError

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


def url_client(url: str) -> Any:
    """A client for the daemon at ``url``; ``ssh://`` through the ssh client (the user's keys and config)."""
    return docker_sdk().DockerClient(base_url=url, use_ssh_client=url.startswith("ssh://"))
