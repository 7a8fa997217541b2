"""The worker image for the container launcher (``Dockerfile`` at the project root), built on a base image.

Why this module exists: workers of a Docker-backed job run in containers, so the image must hold exactly
the pinned environment of ``requirements.lock`` and the project's current code. Many clusters (and this
project's CI machines) reach PyPI and a Debian mirror but no image registry, so ``python:3.11-slim``
cannot be pulled; :func:`~omnilearn.images.base.build_base_image` then makes an equivalent
Debian base with debootstrap. :func:`ensure_images` is what a launcher calls: it builds only what is missing or stale, judged
by labels that hold hashes of the lock file and of the project's sources.

Everything talks to the daemon through the Docker SDK for Python. ``docker`` is imported lazily: importing
it costs ~0.2 s, which ``omnilearn --help`` and every worker would otherwise pay.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from omnilearn.emulator.backends.docker import docker_sdk
from omnilearn.emulator.backends.dockerd import (
    LOG_TAIL_LINES,
    LogFn,
    daemon_client,
    emit_to,
    image_or_none,
    split_tag,
)
from omnilearn.errors import UserError
from omnilearn.images.base import LOCAL_BASE_IMAGE, build_base_image

if TYPE_CHECKING:
    import docker

log = logging.getLogger(__name__)

DEFAULT_BASE_IMAGE = "python:3.11-slim"
"""The Dockerfile's default base: the official slim Python image, for hosts that reach Docker Hub."""
WORKER_IMAGE = "omnilearn-worker:latest"

LABEL_LOCK = "omnilearn.lock-sha256"
LABEL_SOURCE = "omnilearn.source-sha256"
LABEL_BASE = "omnilearn.base-image"
LABEL_CA = "omnilearn.ca-sha256"

CA_DIR = Path("docker") / "ca"
CA_BUILD_NAME = "omnilearn-build-ca.crt"
"""Reserved file name in ``docker/ca/``: ``--ca-bundle`` is copied there for one build, then removed."""



@dataclasses.dataclass(frozen=True)
class BuildResult:
    """One worker image build: what a user wants to know afterwards (how long, how big)."""

    tag: str
    seconds: float
    size_bytes: int
    image_id: str = ""


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """What :func:`ensure_images` settled on, and what it had to build to get there."""

    base_image: str
    worker_image: str
    base_built: bool
    worker_build: BuildResult | None  # None: the existing worker image was up to date
    reason: str  # why the worker image was (or was not) rebuilt


def project_root() -> Path:
    """The source checkout this package runs from (pytorch/omnilearn/images/worker.py -> 3 levels up)."""
    return Path(__file__).resolve().parents[3]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def lock_digest(context: Path | None = None) -> str:
    """sha256 of requirements.lock: when it changes the image's environment must be rebuilt."""
    lock = (context or project_root()) / "requirements.lock"
    if not lock.is_file():
        raise UserError(f"{lock}: not found (the worker image installs its pins)")
    return _sha256_file(lock)


def _source_files(context: Path) -> Iterator[Path]:
    """Files whose content ends up in the worker image (what the Dockerfile copies, and itself)."""
    for name in ("Dockerfile", ".dockerignore", "requirements.lock", "pyproject.toml", "README.md"):
        if (context / name).is_file():
            yield context / name
    for folder in ("pytorch", "configs", str(CA_DIR)):
        root = context / folder
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            parts = path.relative_to(context).parts
            if (not path.is_file() or "__pycache__" in parts or path.suffix == ".pyc"
                    or any(p.endswith(".egg-info") for p in parts) or path.name == CA_BUILD_NAME):
                continue
            yield path


def source_digest(context: Path | None = None) -> str:
    """sha256 over the names and contents of everything the image is built from.

    A worker image whose label differs runs other code than the checkout: rebuilding is cheap then,
    since only the last layer (the project itself) changes unless the lock did too.
    """
    context = context or project_root()
    h = hashlib.sha256()
    for path in _source_files(context):
        h.update(str(path.relative_to(context)).encode() + b"\0")
        h.update(_sha256_file(path).encode() + b"\n")
    return h.hexdigest()


def _check_ca_bundle(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"--ca-bundle {path}: cannot read it ({e.strerror})") from e
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise UserError(f"--ca-bundle {path}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)")
    if b"PRIVATE KEY-----" in data:
        raise UserError(f"--ca-bundle {path}: holds a private key; it would end up inside the image")
    return data


def _worker_labels(context: Path, base_ref: str, base_id: str, ca_data: bytes | None) -> dict[str, str]:
    return {
        LABEL_LOCK: lock_digest(context),
        LABEL_SOURCE: source_digest(context),
        LABEL_BASE: f"{base_ref}@{base_id}" if base_id else base_ref,
        LABEL_CA: hashlib.sha256(ca_data).hexdigest() if ca_data else "",
    }


def build_worker_image(tag: str = WORKER_IMAGE, base_image: str | None = None, ca_bundle: Path | None = None,
                       context: Path | None = None, *, client: docker.DockerClient | None = None,
                       on_log: LogFn | None = None, nocache: bool = False,
                       buildargs: Mapping[str, str] | None = None) -> BuildResult:
    """Build the Dockerfile of context (default: this checkout) as tag, streaming the log to on_log.

    base_image (None: the Dockerfile's default, python:3.11-slim) must exist locally or be pullable.
    ca_bundle is a PEM file the image must trust (a TLS-inspecting proxy between the build and PyPI); it
    is copied to docker/ca/ for this build only. The image is labelled with the hashes that
    :func:`ensure_images` compares. A failed build raises UserError with the tail of the log.
    """
    emit = emit_to(on_log)
    dk = docker_sdk()
    client = client or daemon_client()
    context = (context or project_root()).resolve()
    if not (context / "Dockerfile").is_file():
        raise UserError(f"{context}: no Dockerfile there (the worker image is built from a source checkout; "
                        f"pass the checkout as the build context)")
    ca_data = _check_ca_bundle(Path(ca_bundle)) if ca_bundle is not None else None
    base_ref = base_image or DEFAULT_BASE_IMAGE
    base = image_or_none(client, base_ref)
    args = dict(buildargs or {})
    if base_image:
        args["BASE_IMAGE"] = base_image
    labels = _worker_labels(context, base_ref, base.id if base is not None else "", ca_data)
    previous = image_or_none(client, tag)

    ca_copy = context / CA_DIR / CA_BUILD_NAME
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    error: str | None = None
    start = time.monotonic()
    emit(f"building {tag} from {context} on {base_ref}" + (f" with extra CAs from {ca_bundle}" if ca_data else ""))
    try:
        if ca_data is not None:
            ca_copy.parent.mkdir(parents=True, exist_ok=True)
            ca_copy.write_bytes(ca_data)
        stream = client.api.build(path=str(context), tag=tag, buildargs=args, labels=labels, rm=True,
                                  forcerm=True, nocache=nocache, pull=False, decode=True)
        for chunk in stream:
            if "error" in chunk:
                error = str(chunk["error"]).strip()
                tail.append(error)
                continue
            text = chunk.get("stream") or chunk.get("status")
            if text:
                for line in str(text).splitlines():
                    if line.strip():
                        tail.append(line)
                        emit(line)
    except dk.errors.APIError as e:
        error = str(e.explanation or e)
    finally:
        ca_copy.unlink(missing_ok=True)
    if error is not None:
        hint = ""
        if base is None and ("pull" in error or "no such host" in error or "not found" in error):
            hint = (f"\n(the base image {base_ref} is not on this host and could not be pulled: build a local "
                    f"one with `omnilearn image base`, or let `omnilearn image build` do it)")
        last = "\n".join(tail)
        raise UserError(f"docker build of {tag} failed: {error}{hint}\n--- last lines of the build log ---\n{last}")
    image = image_or_none(client, tag)
    if image is None:
        raise UserError(f"docker build of {tag} ended without an image; last lines:\n" + "\n".join(tail))
    seconds = time.monotonic() - start
    size = int(image.attrs.get("Size", 0))
    emit(f"built {tag} in {seconds:.0f} s: {size / 1e9:.2f} GB")
    if previous is not None and previous.id != image.id:
        _remove_if_dangling(client, previous.id, emit)
    return BuildResult(tag=tag, seconds=seconds, size_bytes=size, image_id=image.id)


def _remove_if_dangling(client: docker.DockerClient, image_id: str, emit: LogFn) -> None:
    """Drop the image a rebuild replaced, if nothing else names or runs it.

    Why: each lock change leaves a multi-GB untagged image behind, and a few of those fill a disk.
    """
    dk = docker_sdk()
    old = image_or_none(client, image_id)
    if old is None or old.tags:
        return
    try:
        client.images.remove(image_id)
        emit(f"removed the replaced image {old.short_id}")
    except dk.errors.APIError as e:  # still used by a container: leave it to the user
        emit(f"kept the replaced image {old.short_id}: {e.explanation or e}")


def resolve_base_image(base_image: str | None = None, *, client: docker.DockerClient | None = None,
                       on_log: LogFn | None = None) -> tuple[str, bool]:
    """The base to build on, and whether it had to be built: (tag, built).

    An explicit base_image must be here or pullable. Without one: python:3.11-slim if present or
    pullable, else the local debootstrap base (made once, then reused without trying the registry again).
    """
    dk = docker_sdk()
    emit = emit_to(on_log)
    client = client or daemon_client()
    if base_image:
        if image_or_none(client, base_image) is None:
            try:
                emit(f"pulling {base_image}")
                client.images.pull(*split_tag(base_image))
            except dk.errors.DockerException as e:
                raise UserError(f"--base {base_image}: not on this host and cannot be pulled ({e})") from e
        return base_image, False
    if image_or_none(client, DEFAULT_BASE_IMAGE) is not None:
        return DEFAULT_BASE_IMAGE, False
    if image_or_none(client, LOCAL_BASE_IMAGE) is not None:
        return LOCAL_BASE_IMAGE, False
    try:
        emit(f"pulling {DEFAULT_BASE_IMAGE}")
        client.images.pull(*split_tag(DEFAULT_BASE_IMAGE))
        return DEFAULT_BASE_IMAGE, False
    except dk.errors.DockerException as e:
        emit(f"cannot pull {DEFAULT_BASE_IMAGE} ({str(e).splitlines()[0][:160]}): "
             f"building {LOCAL_BASE_IMAGE} with debootstrap instead")
    return build_base_image(LOCAL_BASE_IMAGE, client=client, on_log=on_log), True


def default_ca_bundle() -> Path | None:
    """The CA bundle this host's own clients trust, if one is configured: the image should trust it too.

    OMNILEARN_CA_BUNDLE first, then PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE: behind a TLS-inspecting
    proxy these name the bundle that holds the proxy's CA, without which pip in the build cannot reach
    PyPI. On an ordinary host none is set and the image keeps its base's trust store.
    """
    for var in ("OMNILEARN_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def ensure_images(worker_tag: str = WORKER_IMAGE, base_image: str | None = None,
                  ca_bundle: Path | Literal["auto"] | None = "auto", context: Path | None = None, *,
                  client: docker.DockerClient | None = None, on_log: LogFn | None = None,
                  force: bool = False) -> ImageSet:
    """Make sure a worker image matching this checkout exists; build only what is missing or stale.

    Stale means a label differs: the lock hash (a full dependency reinstall), the source hash (only the
    project layer is rebuilt, from cache otherwise), the base image id, or (when ca_bundle is given
    explicitly, a file or None for none) the extra CA bundle. ca_bundle="auto" builds with
    :func:`default_ca_bundle` and does not count a different bundle as staleness: a trust store is not
    a reason to rebuild 5 GB, and a host whose variables differ must not trigger a build it cannot finish.
    """
    emit = emit_to(on_log)
    client = client or daemon_client()
    context = (context or project_root()).resolve()
    compare_ca = ca_bundle != "auto"
    if ca_bundle == "auto":
        ca_bundle = default_ca_bundle()
    ca_data = _check_ca_bundle(Path(ca_bundle)) if ca_bundle is not None else None
    base_ref, base_built = resolve_base_image(base_image, client=client, on_log=on_log)
    base = image_or_none(client, base_ref)
    wanted = _worker_labels(context, base_ref, base.id if base is not None else "", ca_data)
    current = image_or_none(client, worker_tag)
    if current is None:
        reason = f"{worker_tag} does not exist"
    elif force:
        reason = "rebuild forced"
    else:
        have = current.labels or {}
        names = {LABEL_LOCK: "requirements.lock", LABEL_BASE: "base image", LABEL_CA: "CA bundle",
                 LABEL_SOURCE: "project sources"}
        if not compare_ca:
            del names[LABEL_CA]
        changed = [what for key, what in names.items() if have.get(key, "") != wanted[key]]
        if not changed:
            emit(f"{worker_tag} is up to date (lock {wanted[LABEL_LOCK][:12]}, sources {wanted[LABEL_SOURCE][:12]})")
            return ImageSet(base_ref, worker_tag, base_built, None, "up to date")
        reason = "changed since the last build: " + ", ".join(changed)
    emit(f"building {worker_tag}: {reason}")
    if not compare_ca and ca_bundle is not None:
        emit(f"extra CAs for the build: {ca_bundle} (this host's clients trust it; OMNILEARN_CA_BUNDLE overrides)")
    result = build_worker_image(worker_tag, base_image=None if base_ref == DEFAULT_BASE_IMAGE else base_ref,
                                ca_bundle=Path(ca_bundle) if ca_bundle is not None else None,
                                context=context, client=client, on_log=on_log)
    return ImageSet(base_ref, worker_tag, base_built, result, reason)


def image_status(tag: str = WORKER_IMAGE) -> list[str]:
    """One line per image (the bases and ``tag``), and whether ``tag`` matches this checkout."""
    client = daemon_client()
    lines = []
    for ref in (DEFAULT_BASE_IMAGE, LOCAL_BASE_IMAGE, tag):
        image = image_or_none(client, ref)
        lines.append(f"{ref:28} " + (f"{image.short_id}  {image.attrs.get('Size', 0) / 1e9:.2f} GB"
                                     if image else "absent"))
    image = image_or_none(client, tag)
    if image is not None:
        have = image.labels or {}
        lock_ok = have.get(LABEL_LOCK) == lock_digest()
        src_ok = have.get(LABEL_SOURCE) == source_digest()
        lines.append(f"{tag}: requirements.lock {'matches' if lock_ok else 'CHANGED'}, "
                     f"sources {'match' if src_ok else 'CHANGED'} (omnilearn image build brings it up to date)")
    return lines
