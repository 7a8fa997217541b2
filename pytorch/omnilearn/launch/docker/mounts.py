"""What a container of a job sees of the run folder, what it may write, and who it runs as.

The run folder is the host's: the job file and its plan, the toggler's audit and lock, the saved container
logs and the reports live there, and no container can write it. Each container gets bind mounts of single
files, each as wide as its rank needs, at the paths they have in the run folder (so a worker runs the same
code under every launcher, and under torchrun):

    in the container (RUN_MOUNT = /run/omnilearn)    on the host (OUT = the run folder)      mode
    RUN_MOUNT/job.json                               OUT/job.json                            ro
    RUN_MOUNT/logs/cpu-<rank>.log                    OUT/logs/cpu-<rank>.log                 rw, its own only
    RUN_MOUNT/logs/toggler-audit.jsonl               OUT/logs/toggler-audit.jsonl            ro
    RUN_MOUNT/metrics/rank-<rank>.jsonl              OUT/metrics/rank-<rank>.jsonl           rw, its own only
    RUN_MOUNT/snapshots/                             OUT/snapshots/                          rw, ASP server only
    RUN_MOUNT/checkpoints/                           OUT/checkpoints/                        BSP: rw rank 0, ro others
    /data                                            data.root                               ro
    the folder of the user's workload code           the same folder                          ro

A file mount gives a container the contents of one file and no folder to create names in: it cannot
plant a symlink, a hard link or a FIFO where the host reads or writes, cannot replace a file by another,
and cannot even open another rank's log. The parameter server's snapshot folder and a BSP job's checkpoint
folder (written by rank 0, read by every rank when the job resumes) are the folders a container writes;
the host only reads them, each file opened without following links (a checkpoint: tensors only). The host creates
every mounted file before the container starts (a bind mount needs its source), with the request log and
the metrics file owned by the container's user.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.emulator.protocol.requests import AUDIT_NAME, audit_path, request_log, request_name
from omnilearn.errors import UserError
from omnilearn.files import open_in
from omnilearn.jobfile import JOB_FILE, JobSpec
from omnilearn.metrics import metrics_path
from omnilearn.train.checkpoint import BSP_CHECKPOINT
from omnilearn.train.evaluate import SNAPSHOT_DIR
from omnilearn.train.workload import code_folder

RUN_MOUNT = "/run/omnilearn"  # the run folder's paths inside every container
DATA_MOUNT = "/data"
CHECKPOINT_DIR = BSP_CHECKPOINT.parent.as_posix()
CONTAINER_UID = 10001
"""The image's unprivileged ``omnilearn`` user and group (Dockerfile)."""


def container_user() -> tuple[int, int]:
    """Who workers run as: the image's unprivileged user when the launcher is root; otherwise the
    launcher's own user, who owns the run folder already (and could not give files away)."""
    uid = os.geteuid()
    return (CONTAINER_UID, CONTAINER_UID) if uid == 0 else (uid, os.getegid())


def is_parameter_server(job: JobSpec, rank: int) -> bool:
    return job.config.mode == "asp" and rank == 0


def prepare_run_folder(job: JobSpec, user: tuple[int, int]) -> None:
    """Create every file the job's containers mount, the rank's own ones given to ``user``."""
    _create(job.log_dir, AUDIT_NAME, None)  # the host's; every container reads the toggler's answers here
    for rank in job.slots:
        _create(job.log_dir, request_name(rank), user)
        metrics = metrics_path(job.out_dir, rank)
        _create(metrics.parent, metrics.name, user)
        if is_parameter_server(job, rank):
            _create(job.out_dir, SNAPSHOT_DIR, user, folder=True)
    if job.config.mode == "bsp":
        _create(job.out_dir, CHECKPOINT_DIR, user, folder=True)


def _create(parent: Path, name: str, user: tuple[int, int] | None, folder: bool = False) -> None:
    """Make ``parent/name`` (a file, or a folder) unless it exists, never through a link, and give it to ``user``."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / name
    try:
        if folder:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o755)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        else:
            fd = open_in(parent, name, os.O_RDONLY | os.O_CREAT)
    except OSError as e:
        raise UserError(f"cannot create {path} for the containers: {e.strerror}") from None
    try:
        if user is not None:
            os.fchown(fd, *user)
    except OSError as e:  # e.g. a shared file system that maps root to nobody
        raise UserError(f"cannot give {path} to the containers' user {user[0]}:{user[1]}: {e.strerror}") from None
    finally:
        os.close(fd)


def container_mounts(job: JobSpec, rank: int, data_root: Path | None) -> list[Any]:
    """The bind mounts of the container of ``rank`` (the index of its target in the plan: its files keep
    their names when survivors are re-ranked) (see the table above); ``data_root``: the host's data
    folder, when there is one. Read-only data: the launcher downloads a dataset before any worker starts."""
    mount = docker_sdk().types.Mount
    out = job.out_dir
    paths = [(out / JOB_FILE, True), (request_log(job.log_dir, rank), False), (audit_path(job.log_dir), True),
             (metrics_path(out, rank), False)]
    if is_parameter_server(job, rank):
        paths.append((out / SNAPSHOT_DIR, False))
    if job.config.mode == "bsp":  # rank 0 saves the checkpoint; every rank loads it when the job resumes
        paths.append((out / CHECKPOINT_DIR, rank != job.slots[0]))
    mounts = [mount(f"{RUN_MOUNT}/{host.relative_to(out).as_posix()}", str(host), type="bind", read_only=ro)
              for host, ro in paths]
    return mounts + _shared_mounts(job, data_root)


def remote_mounts(job: JobSpec, volume: str, data_root: Path | None) -> list[Any]:
    """The mounts of a container on another daemon: its run-folder volume (:mod:`.remote`) in place of
    the run folder's files; the data folder and the workload's code at the same paths on its own host."""
    mount = docker_sdk().types.Mount
    return [mount(RUN_MOUNT, volume, type="volume"), *_shared_mounts(job, data_root)]


def _shared_mounts(job: JobSpec, data_root: Path | None) -> list[Any]:
    mount = docker_sdk().types.Mount
    mounts = []
    if data_root is not None:
        mounts.append(mount(DATA_MOUNT, str(data_root), type="bind", read_only=True))
    if job.config.workload:
        folder = str(code_folder(job.config.workload))
        mounts.append(mount(folder, folder, type="bind", read_only=True))
    return mounts


def workload_env(job: JobSpec) -> dict[str, str]:
    """The folder of the user's workload code on the workers' Python path (mounted at the same path)."""
    return {"PYTHONPATH": str(code_folder(job.config.workload))} if job.config.workload else {}
