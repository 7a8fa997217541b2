"""A Docker job's guard against a launcher killed outright (kill -9): its containers are stopped too.

A container does not die with the process that started it, and a worker inside one cannot see the
launcher, so a launcher that runs a Docker job also starts a small reaper process in its own session
that holds the read end of a pipe. The launcher says ``done`` on the pipe when it has taken the job
down itself; a pipe that closes without it means the launcher died, and the reaper stops every
container labelled with the job (SIGTERM, so BSP workers and the ASP server save at a step boundary,
then SIGKILL after ``docker.stop_timeout`` or :data:`GRACE_S`, whichever is shorter: no worker of a
killed launcher runs 10 s later). The stopped containers and the job's network stay for
``omnilearn cleanup`` (the job's record names them); the checkpoint stays for ``--resume``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

DONE = b"done\n"
GRACE_S = 5.0
"""The longest a container of a killed launcher's job is given to save before SIGKILL."""


class Reaper:
    """The reaper of one launch: started with the job, :meth:`release` d once the launcher tore it down."""

    def __init__(self, job_id: str, hosts: dict[str, str], stop_timeout: float, log_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omnilearn.launch.docker.reaper", job_id, json.dumps(hosts), str(stop_timeout),
             str(log_file)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def release(self) -> None:
        """The launcher took the job down itself: the reaper exits without touching anything."""
        stdin: IO[bytes] | None = self.proc.stdin
        with contextlib.suppress(OSError):
            if stdin is not None:
                stdin.write(DONE)
                stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_job(job_id: str, hosts: dict[str, str], stop_timeout: float) -> list[str]:
    """Stop every running container labelled with ``job_id`` on this daemon and on ``hosts``' daemons."""
    from omnilearn.emulator.backends.docker import LABEL_JOB, docker_sdk
    from omnilearn.launch.docker.faults import stop_gracefully

    dk = docker_sdk()
    clients: list[Any] = [dk.from_env()] + [dk.DockerClient(base_url=u) for u in sorted(set(hosts.values()))]
    containers = {}
    for client in clients:
        for c in client.containers.list(filters={"label": f"{LABEL_JOB}={job_id}"}):
            containers[c.name] = (client, c.id)
    return stop_gracefully(containers, stop_timeout)


def main(argv: list[str]) -> int:
    """``job_id hosts-json stop_timeout log_file``: wait on stdin; written to ``log_file`` only when it reaps."""
    job_id, hosts, stop_timeout, log_file = argv[0], json.loads(argv[1]), float(argv[2]), Path(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides
    if sys.stdin.buffer.read() == DONE:
        return 0
    t0 = time.time()
    try:
        stopped = stop_job(job_id, hosts, min(stop_timeout, GRACE_S))
        line = (f"the launcher of job {job_id} died: stopped {', '.join(stopped) or 'no container'} in "
                f"{time.time() - t0:.1f} s; `omnilearn cleanup` removes them")
    except Exception as e:  # noqa: BLE001 - said in the log; `omnilearn cleanup` remains
        line = f"the launcher of job {job_id} died; its containers could not be stopped: {e}"
    with contextlib.suppress(OSError), open(log_file, "a") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
