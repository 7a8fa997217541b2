"""The Docker side: docker_install.sh, the images, and what a container sees of `docker update`.

Tests marked ``docker`` need a daemon and skip (with the reason in pytest's summary) when none answers;
the image test reuses the worker image when its labels match this checkout, so only the first run on a
machine pays the multi-minute build.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from omnilearn import cli
from omnilearn.emulator.backends import dockerd as daemon
from omnilearn.errors import UserError
from omnilearn.images import base as base_image
from omnilearn.images import worker as image


@pytest.mark.parametrize("bound", [False, True], ids=["no-socket-file", "socket-not-listening"])
def test_daemon_client_without_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: bool) -> None:
    path = tmp_path / "nobody.sock"
    sock = None
    if bound:  # a socket file exists but nobody accepts: connection refused
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        with pytest.raises(UserError) as info:
            daemon.daemon_client(timeout=5)
    finally:
        if sock is not None:
            sock.close()
    message = str(info.value)
    assert message == f"no Docker daemon at unix://{path}: start it with ./docker_install.sh"
    assert "\n" not in message


def test_split_tag() -> None:
    assert daemon.split_tag("omnilearn-base:bookworm") == ("omnilearn-base", "bookworm")
    assert daemon.split_tag("omnilearn-worker") == ("omnilearn-worker", "latest")
    assert daemon.split_tag("registry:5000/team/worker") == ("registry:5000/team/worker", "latest")
    assert daemon.split_tag("registry:5000/team/worker:v1") == ("registry:5000/team/worker", "v1")


def _fake_context(root: Path) -> Path:
    (root / "pytorch" / "omnilearn").mkdir(parents=True)
    (root / "pytorch" / "omnilearn" / "__init__.py").write_text("x = 1\n")
    (root / "configs").mkdir()
    (root / "configs" / "demo.yaml").write_text("mode: bsp\n")
    (root / "requirements.lock").write_text("rich==15.0.0\n")
    (root / "Dockerfile").write_text("FROM scratch\n")
    return root


def test_source_digest_follows_code_not_caches(tmp_path: Path) -> None:
    ctx = _fake_context(tmp_path)
    before, lock_before = image.source_digest(ctx), image.lock_digest(ctx)
    cache = ctx / "pytorch" / "omnilearn" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    (ctx / "docker" / "ca").mkdir(parents=True)
    (ctx / "docker" / "ca" / image.CA_BUILD_NAME).write_text("temporary, removed after the build")
    assert image.source_digest(ctx) == before, "caches and the build-time CA copy must not count"
    (ctx / "pytorch" / "omnilearn" / "__init__.py").write_text("x = 2\n")
    assert image.source_digest(ctx) != before
    assert image.lock_digest(ctx) == lock_before, "a code change is not a lock change"
    (ctx / "requirements.lock").write_text("rich==15.0.1\n")
    assert image.lock_digest(ctx) != lock_before


def test_ca_bundle_checks(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-cert.crt"
    bad.write_text("hello\n")
    with pytest.raises(UserError, match="no PEM certificate"):
        image._check_ca_bundle(bad)
    key = tmp_path / "with-key.pem"
    key.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(UserError, match="private key"):
        image._check_ca_bundle(key)
    with pytest.raises(UserError, match="cannot read"):
        image._check_ca_bundle(tmp_path / "missing.crt")


def test_default_ca_bundle_prefers_explicit_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "proxy.crt"
    mine.write_text("-----BEGIN CERTIFICATE-----\n")
    for var in ("OMNILEARN_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    assert image.default_ca_bundle() is None
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "does-not-exist.crt"))
    assert image.default_ca_bundle() is None
    monkeypatch.setenv("OMNILEARN_CA_BUNDLE", str(mine))
    assert image.default_ca_bundle() == mine


def test_cli_parses_image_commands() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["image", "build", "--base", "debian-py:12", "--ca-bundle", "proxy.crt"])
    assert (args.func, args.image_command) == (cli.cmd_image, "build")
    assert (args.base, args.ca_bundle, args.tag, args.force) == ("debian-py:12", Path("proxy.crt"), image.WORKER_IMAGE, False)
    assert parser.parse_args(["image", "build"]).ca_bundle is None  # None: the "auto" CA policy
    args = parser.parse_args(["image", "base", "--suite", "trixie", "--force"])
    assert (args.image_command, args.tag, args.suite, args.mirror, args.force) == (
        "base", base_image.LOCAL_BASE_IMAGE, "trixie", None, True)
    assert parser.parse_args(["image", "status"]).image_command == "status"


def test_missing_debootstrap_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_image.shutil, "which", lambda name: None)
    monkeypatch.setattr(base_image.os, "access", lambda path, mode: False)
    with pytest.raises(UserError, match="debootstrap not found"):
        base_image._find_debootstrap()
