"""The run folder of a container on another daemon: a volume on its host, kept in step over the Docker API.

A bind mount names a path on the daemon's own host, so a container placed on another daemon
(``docker.hosts``) cannot see the launcher's run folder. It gets a named volume on its own daemon
instead (:func:`volume_name`, labelled with the job), mounted at the run folder's path, holding the
same files at the same places as the bind mounts of :mod:`.mounts`::

    RUN_MOUNT/job.json                   root, 0644     the launcher's copy, put there before the start
    RUN_MOUNT/logs/cpu-<rank>.log        worker, 0644   the request log, pulled as it grows
    RUN_MOUNT/logs/toggler-audit.jsonl   root, 0644     the toggler's answers, pushed as they grow
    RUN_MOUNT/metrics/rank-<rank>.jsonl  worker, 0644   the metrics, pulled every few seconds and at the end
    RUN_MOUNT/checkpoints/checkpoint.pt  root, 0644     BSP, when the job resumes: the checkpoint it loads

Every folder is root's (0755) and the worker runs unprivileged with no capabilities, so it writes its
own two files and nothing else: it can create no name, plant no link, replace no file. What comes
back is read as untrusted (:func:`read_member`): a tar stream bounded in size, of which only one
regular file of the expected name is taken; it is written into the local run folder through
:func:`omnilearn.files.open_in` (never through a link), where the toggler and the reports read it as
they read a local worker's files. A file only grows (its new tail is appended, so offsets in the
toggler's audit match the worker's own); one that shrank is copied whole.

The pushed audit replaces the container's copy (Docker unpacks an archive by removing and creating
each file): the worker reads the audit from an offset, complete lines only, and a missing file as an
empty one, so it only ever sees the audit's content or a prefix of it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.docker import LABEL_JOB, LABEL_TARGET
from omnilearn.emulator.protocol.requests import AUDIT_NAME, MAX_LOG_BYTES, audit_path, request_name
from omnilearn.files import open_in, write_in
from omnilearn.jobfile import JOB_FILE, JobSpec
from omnilearn.metrics import METRICS_DIR, metrics_path
from omnilearn.train.checkpoint import BSP_CHECKPOINT

log = logging.getLogger("omnilearn.remote")

MAX_METRICS_BYTES = 256 * 2**20
"""A remote metrics file past this size is not copied back (a worker writes well under 1 MB an epoch)."""
TAR_OVERHEAD = 64 * 2**10
"""What a one-file tar stream may hold besides the file's bytes (headers, padding, end blocks)."""
METRICS_EVERY_S = 5.0


def volume_name(job_id: str, target: str) -> str:
    return f"omnilearn-{job_id}-{target}"


def make_volume(client: Any, job_id: str, target: str) -> str:
    """Create the run-folder volume of ``target`` on its daemon; returns its name."""
    name = volume_name(job_id, target)
    client.volumes.create(name=name, labels={LABEL_JOB: job_id, LABEL_TARGET: target})
    return name


def _read_local(path: Path) -> bytes:
    try:
        fd = open_in(path.parent, path.name, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, uid: int, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = uid
    info.mtime = int(time.time())
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))


def _tar(entries: Iterable[tuple[str, bytes | None, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, uid in entries:
            _add(tar, name, data, uid, 0o644)
    return buf.getvalue()


def seed(container: Any, job: JobSpec, rank: int, user: tuple[int, int], run_mount: str) -> None:
    """Fill a created (not yet started) container's volume with the launcher's copies of its files."""
    out = job.out_dir
    files = [("logs", None, 0), ("metrics", None, 0),
             (JOB_FILE, _read_local(out / JOB_FILE), 0),
             (f"logs/{AUDIT_NAME}", _read_local(audit_path(job.log_dir)), 0),
             (f"logs/{request_name(rank)}", _read_local(job.log_dir / request_name(rank)), user[0]),
             (f"{METRICS_DIR}/{metrics_path(out, rank).name}", _read_local(metrics_path(out, rank)), user[0])]
    checkpoint = out / BSP_CHECKPOINT
    if job.resume and job.config.mode == "bsp" and checkpoint.is_file():  # rank 0 writes it; every rank loads it
        files += [(BSP_CHECKPOINT.parent.as_posix(), None, 0), (BSP_CHECKPOINT.as_posix(), checkpoint.read_bytes(), 0)]
    if not container.put_archive(run_mount, _tar(files)):
        raise OSError(f"could not fill the run folder of container {container.name}")


class TarTooLarge(ValueError):
    pass


def read_member(chunks: Iterable[bytes], name: str, limit: int) -> bytes:
    """The bytes of the one regular file ``name`` in a tar stream from a daemon, which a worker may
    have shaped: the stream is read to ``limit`` + TAR_OVERHEAD bytes at most, and anything but one
    regular file of that name (a link, a device, a folder, another name, a bigger file) is refused."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        if len(buf) > limit + TAR_OVERHEAD:
            raise TarTooLarge(f"{name}: archive over {limit + TAR_OVERHEAD} bytes")
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(buf)), mode="r:") as tar:
            members = tar.getmembers()
            if len(members) != 1:
                raise ValueError(f"{name}: {len(members)} entries in the archive, not one")
            (m,) = members
            if m.name != name or not m.isreg():
                raise ValueError(f"{name}: the archive holds {m.name!r}, not a regular file of that name")
            if m.size > limit:
                raise TarTooLarge(f"{name}: {m.size} bytes, more than {limit}")
            f = tar.extractfile(m)
            assert f is not None
            return f.read(limit + 1)
    except tarfile.TarError as e:
        raise ValueError(f"{name}: not a tar archive ({e})") from None


def mirror(folder: Path, name: str, data: bytes) -> int:
    """Make the local ``folder/name`` hold ``data``: its new tail appended when it grew (readers that go
    by offset stay valid), the whole written when it shrank or changed size otherwise. Returns its size."""
    fd = open_in(folder, name, os.O_RDWR | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if len(data) > size:
            os.lseek(fd, size, os.SEEK_SET)
            view = memoryview(data)[size:]
            while view:
                view = view[os.write(fd, view):]
            return len(data)
    finally:
        os.close(fd)
    if len(data) < size:
        write_in(folder, name, data)
    return len(data)


class RemoteRunFolders:
    """Keeps the run folders of a job's containers on other daemons in step with the local one.

    ``containers``: rank -> the container object (from its own daemon's client). :meth:`poll` pulls each
    request log, pushes the audit where it grew, and pulls the metrics every METRICS_EVERY_S seconds;
    :meth:`start` polls in a thread; :meth:`finish` stops it and makes a last full pass (after the
    workers ended).
    """

    def __init__(self, job: JobSpec, containers: dict[int, Any], run_mount: str) -> None:
        self.job = job
        self.containers = containers
        self.run_mount = run_mount
        self.pushed_audit: dict[int, int] = {}  # rank -> audit size last pushed
        self.refused: set[tuple[int, str]] = set()  # files no longer pulled (a worker shaped them)
        self._last_metrics = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _pull(self, rank: int, folder: Path, name: str, rel: str, limit: int) -> None:
        if (rank, name) in self.refused:
            return
        container = self.containers[rank]
        chunks, _ = container.get_archive(f"{self.run_mount}/{rel}")
        try:
            data = read_member(chunks, name, limit)
        except ValueError as e:
            self.refused.add((rank, name))
            log.warning("rank %d: %s; no longer copied from %s", rank, e, container.name)
            return
        mirror(folder, name, data)

    def _push_audit(self, rank: int, audit: bytes) -> None:
        if self.pushed_audit.get(rank, -1) >= len(audit):
            return
        if self.containers[rank].put_archive(f"{self.run_mount}/logs", _tar([(AUDIT_NAME, audit, 0)])):
            self.pushed_audit[rank] = len(audit)

    def poll(self, metrics: bool | None = None) -> None:
        """One pass over every remote container; a daemon that does not answer is tried next time."""
        now = time.monotonic()
        if metrics is None:
            metrics = now - self._last_metrics >= METRICS_EVERY_S
        if metrics:
            self._last_metrics = now
        audit = _read_local(audit_path(self.job.log_dir))
        for rank in self.containers:
            try:
                self._pull(rank, self.job.log_dir, request_name(rank), f"logs/{request_name(rank)}", MAX_LOG_BYTES)
                self._push_audit(rank, audit)
                if metrics:
                    path = metrics_path(self.job.out_dir, rank)
                    self._pull(rank, path.parent, path.name, f"{METRICS_DIR}/{path.name}", MAX_METRICS_BYTES)
            except Exception as e:  # noqa: BLE001 - a daemon briefly away must not stop the job's sync
                log.debug("rank %d: sync failed (%s); tried again", rank, e)

    def start(self, interval: float = 0.2) -> None:
        """Poll in a thread until :meth:`finish`."""
        def loop() -> None:
            while not self._stop.is_set():
                self.poll()
                self._stop.wait(interval)
        self._thread = threading.Thread(target=loop, name="remote-run-folders", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Stop polling and make the last pass, once the workers ended: every file pulled."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self.poll(metrics=True)


def remote_containers(job: JobSpec, containers: dict[str, str], remote: dict[str, Any]) -> dict[int, Any]:
    """rank -> container object, for the job's targets placed on another daemon."""
    out = {}
    for rank, target in ((s, job.plan.targets[s]) for s in job.slots):
        if target in remote and target in containers:
            out[rank] = remote[target].containers.get(containers[target])
    return out


def run_remote(client: Any, job: JobSpec, rank: int, owner: tuple[int, int], run_mount: str,
               mounts: list[Any], **run_args: Any) -> Any:
    """``containers.run`` on another daemon: create the container, fill its volume (the worker's own
    files given to ``owner``), then start it."""
    container = client.containers.create(mounts=mounts, **run_args)
    seed(container, job, rank, owner, run_mount)
    container.start()
    return container
