"""A Debian base image made locally with debootstrap, for hosts that reach a package mirror but no image registry.

The worker image's Dockerfile needs only python3 (>= 3.10) with venv and a CA store from its base.
Many clusters (and this project's CI machines) cannot pull ``python:3.11-slim``; :func:`build_base_image`
then debootstraps an equivalent Debian into a temporary folder and imports it as an image. The only
subprocesses are debootstrap and umount, with argument lists (never a shell string).
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from omnilearn.emulator.backends.dockerd import (
    LOG_TAIL_LINES,
    LogFn,
    daemon_client,
    emit_to,
    image_or_none,
    split_tag,
)
from omnilearn.errors import UserError

if TYPE_CHECKING:
    import docker

LOCAL_BASE_IMAGE = "omnilearn-base:bookworm"
"""The debootstrap'd Debian base :func:`~omnilearn.images.worker.ensure_images` makes when the
default base cannot be pulled."""
DEFAULT_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
"""What the Dockerfile needs from any base: python3 >= 3.10 with venv, and a CA store."""
LABEL_SUITE = "omnilearn.base.suite"


def _find_debootstrap() -> str:
    for candidate in (shutil.which("debootstrap"), "/usr/sbin/debootstrap"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise UserError("debootstrap not found: install it (apt-get install debootstrap, or run "
                    "./docker_install.sh, which installs it) to build the base image locally")


def _run_streaming(cmd: list[str], on_log: LogFn, env: Mapping[str, str] | None = None) -> tuple[int, list[str]]:
    """Run cmd (an argument list), passing each output line to on_log; return (status, last lines)."""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, errors="replace", env=dict(env) if env is not None else None) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            on_log(line)
        status = proc.wait()
    return status, list(tail)


def _unmount_below(root: Path) -> None:
    """Unmount whatever an interrupted debootstrap left mounted inside root (proc, sys), deepest first.

    Without this, removing the temp dir could walk into a live /proc or /sys mount.
    """
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(root.resolve())
    targets = []
    for line in mounts:
        fields = line.split()
        if len(fields) > 1:
            target = fields[1].replace("\\040", " ")
            if target == prefix or target.startswith(prefix + "/"):
                targets.append(target)
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def _tar_rootfs(rootfs: Path, out: Path) -> None:
    """A plain tar of rootfs for ``docker import``: numeric owners, devices and hard links preserved.

    Package caches and apt lists are left out: they only make the image bigger.
    """
    skip = {"var/cache/apt/archives", "var/lib/apt/lists"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name.removeprefix("./")
        for s in skip:
            if name.startswith(s + "/") and not info.isdir():
                return None
        info.uname = info.gname = ""  # docker import uses the numeric ids; host names would be misleading
        return info

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(rootfs), arcname=".", recursive=True, filter=keep)


def build_base_image(tag: str = LOCAL_BASE_IMAGE, suite: str = DEFAULT_SUITE, mirror: str | None = None, *,
                     force: bool = False, client: docker.DockerClient | None = None,
                     on_log: LogFn | None = None) -> str:
    """Make a minimal Debian image with python3/venv/pip by debootstrap, import it as ``tag``, return tag.

    For hosts without a reachable registry (``python:3.11-slim`` cannot be pulled). Skips all work when
    the tag exists, unless force. Needs root (debootstrap chroots and creates device nodes). The temp
    dir is removed whatever happens.
    """
    emit = emit_to(on_log)
    client = client or daemon_client()
    if not force and image_or_none(client, tag) is not None:
        emit(f"base image {tag} exists: kept (force=True rebuilds it)")
        return tag
    debootstrap = _find_debootstrap()
    if os.geteuid() != 0:
        raise UserError(f"building the base image {tag} runs debootstrap, which needs root: run as root "
                        f"(or sudo), or pass a base image that exists (--base)")
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="omnilearn-base-"))
    rootfs = tmp / "rootfs"
    try:
        cmd = [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(rootfs)]
        if mirror:
            cmd.append(mirror)
        emit(f"debootstrap {suite} into {rootfs} (about a minute)")
        env = dict(os.environ)
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        status, tail = _run_streaming(cmd, emit, env=env)
        if status != 0:
            last = "\n".join(tail[-15:])
            raise UserError(f"debootstrap {suite} failed (exit {status}); last lines:\n{last}")
        _unmount_below(rootfs)
        archive = tmp / "rootfs.tar"
        emit(f"packing {rootfs} for docker import")
        _tar_rootfs(rootfs, archive)
        repo, version = split_tag(tag)
        emit(f"importing {archive.stat().st_size / 1e6:.0f} MB as {tag}")
        changes = ["ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   f"LABEL {LABEL_SUITE}={suite}",
                   'CMD ["/bin/bash"]']
        client.api.import_image(src=str(archive), repository=repo, tag=version, changes=changes)
    finally:
        _unmount_below(rootfs)
        shutil.rmtree(tmp, ignore_errors=True)
    image = image_or_none(client, tag)
    assert image is not None, f"docker import reported success but {tag} is missing"
    emit(f"base image {tag} built in {time.monotonic() - start:.0f} s "
         f"({image.attrs.get('Size', 0) / 1e6:.0f} MB)")
    return tag
