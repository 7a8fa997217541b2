"""The Docker daemons a job's containers run on: the launcher's, and one per other host the job places
targets on (``docker.hosts``); which of them answer."""

from __future__ import annotations

from typing import Any

from omnilearn.emulator.backends.dockerd import answering, daemon_client
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec


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
