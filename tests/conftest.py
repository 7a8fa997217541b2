"""Shared fixtures: the machine's state kept out of reach, and a client for the Docker suite's daemon.

The tiers are folders: ``tests/unit`` (``make check``), ``tests/integration`` (root-only tests in
``tests/integration/root``) and ``tests/docker``. Installing and starting Docker is ``make docker``'s job
(``make test`` runs it first); a fixture here only connects, and skips with the reason when no daemon answers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests scale their examples from the loaded profile (hypothesis's default: 100). `make check`, the
# quick loop, loads `quick` (a fifth of them: pytest --hypothesis-profile=quick); `make test` the default.
settings.register_profile("quick", max_examples=20)

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_DOCKER = os.environ.get("OMNILEARN_REQUIRE_DOCKER") == "1"  # set by `make test-docker`


def _skip_or_fail(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"Docker suite required but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Job records go to this session's own folder, never to the machine's (/run/omnilearn or
    /tmp/omnilearn-UID): a record a test leaves behind is never reported by a later ``omnilearn cleanup``.
    Set in the environment, so the processes a test starts inherit it."""
    from omnilearn.launch import pidfile

    path = tmp_path_factory.mktemp("omnilearn-state")
    old = os.environ.get(pidfile.STATE_ENV)
    os.environ[pidfile.STATE_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(pidfile.STATE_ENV, None)
    else:
        os.environ[pidfile.STATE_ENV] = old


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A client for a daemon that answers; else a skip that says why (a failure under ``make test-docker``).
    ``make test`` and ``make test-docker`` start one first with ``make docker``, which fails where it
    could install one and did not."""
    from omnilearn.emulator.backends import dockerd as daemon
    from omnilearn.errors import UserError

    try:
        client = daemon.daemon_client(timeout=30)
    except UserError as e:
        _skip_or_fail(f"{e} (`make docker` installs and starts one: root on Debian/Ubuntu)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def worker_image(docker_client: object) -> str:
    """The worker image for this checkout (built from the Dockerfile when missing or stale)."""
    from omnilearn.images import worker as images

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
                               "runs when a daemon answers (make docker starts one), else skipped")
