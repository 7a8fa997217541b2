"""``omnilearn cleanup``: what a job left when its launcher is gone (its records in :mod:`.pidfile`).

Processes, cgroups, and for a Docker job its containers and networks; a job whose launcher still runs is
never touched. Here, above both :mod:`.pidfile` and :mod:`.docker.swarm`, so that neither imports the other.
"""

from __future__ import annotations

import contextlib

from omnilearn.emulator.backends.cgroupfs import sweep_stale
from omnilearn.errors import UserError
from omnilearn.launch.pidfile import kill_workers, launcher_alive, records


def cleanup_dead() -> list[str]:
    """Remove the processes, cgroups, namespaces and Docker resources of every job whose launcher is gone."""
    removed: list[str] = []
    for path, record in records():
        if launcher_alive(record):
            continue
        job_id = str(record.get("job_id", ""))
        removed += kill_workers(record)
        removed += sweep_stale(jobs=[job_id], min_age=0.0)
        if record.get("backend") == "docker":
            done, complete = _docker_down(job_id, record.get("hosts") or {})
            removed += done
            if not complete:  # another host's daemon did not answer: kept for the next cleanup
                continue
        with contextlib.suppress(OSError):
            path.unlink()
    return removed


def _docker_down(job_id: str, hosts: dict[str, str]) -> tuple[list[str], bool]:
    """What was removed of the job's Docker resources, and whether every daemon answered."""
    try:
        from omnilearn.emulator.backends.dockerd import daemon_client
        from omnilearn.launch.docker.swarm import down
        daemon_client()
    except UserError as e:  # no daemon here: nothing of the job can be running in it now
        return [f"(docker resources of job {job_id} not checked: {e})"], True
    try:
        return down(job_id, hosts), True
    except UserError as e:  # another host's daemon does not answer (or a lost host's tasks hold the network)
        return [f"(docker resources of job {job_id} not all removed: {e})"], False
