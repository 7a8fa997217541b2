"""Shared fixtures: a Docker daemon for the integration suite, started through docker_install.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_DOCKER = os.environ.get("OMNILEARN_REQUIRE_DOCKER") == "1"  # set by `make test-docker`


def _skip_or_fail(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"Docker suite required but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A client for a daemon that answers: started with ./docker_install.sh when this host allows it
    (root on Debian/Ubuntu), else a skip that says why (a failure under `make test-docker`)."""
    from omnilearn.errors import UserError
    from omnilearn.launch.docker import daemon

    try:
        client = daemon.daemon_client(timeout=30)
    except UserError as first:
        if os.environ.get("OMNILEARN_NO_DOCKER_INSTALL") == "1":
            _skip_or_fail(f"{first} (OMNILEARN_NO_DOCKER_INSTALL=1)")
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            _skip_or_fail(f"{first}; cannot start one here (needs root on Debian/Ubuntu)")
        r = subprocess.run(["bash", str(ROOT / "docker_install.sh"), "--swarm"], capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            _skip_or_fail(f"docker_install.sh failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}")
        client = daemon.daemon_client(timeout=30)
    yield client
    client.close()


@pytest.fixture(scope="session")
def worker_image(docker_client: object) -> str:
    """The worker image for this checkout (built from the Dockerfile when missing or stale)."""
    from omnilearn.launch.docker import images

    return images.ensure_images(client=docker_client, on_log=lambda line: None).worker_image


@pytest.fixture
def cleanup(docker_client: object) -> Iterator[list[str]]:
    """Job ids a test starts; whatever happens, their containers and networks are removed after."""
    from omnilearn.launch.docker import swarm

    jobs: list[str] = []
    yield jobs
    for job_id in jobs:
        swarm.down(job_id)


def pytest_report_header(config: pytest.Config) -> str:  # noqa: ARG001
    return "Docker suite: " + ("required (make test-docker)" if REQUIRE_DOCKER else
                               "runs when a daemon answers or can be started (root + apt), else skipped")
