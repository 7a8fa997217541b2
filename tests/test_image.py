"""The Docker side: docker_install.sh, the images, and what a container sees of `docker update`.

Tests marked ``docker`` need a daemon and skip (with the reason in pytest's summary) when none answers;
the image test reuses the worker image when its labels match this checkout, so only the first run on a
machine pays the multi-minute build.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from omnilearn import cli
from omnilearn.errors import UserError
from omnilearn.launch.docker import base_image, daemon
from omnilearn.launch.docker import images as image

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "docker_install.sh"


@pytest.fixture(scope="module")
def client(docker_client: object) -> object:
    """The session's daemon (started through docker_install.sh when possible; see conftest.py)."""
    return docker_client


@pytest.fixture(scope="module")
def worker(client: object) -> image.ImageSet:
    """The worker image for this checkout: reused when up to date, else built (minutes, the first time)."""
    if (shutil.which("debootstrap") is None and not os.path.exists("/usr/sbin/debootstrap")
            and not any(_has_image(client, ref) for ref in (image.DEFAULT_BASE_IMAGE, base_image.LOCAL_BASE_IMAGE))):
        pytest.skip("no base image here and no debootstrap to make one (./docker_install.sh installs it)")
    return image.ensure_images(client=client, on_log=lambda line: None)


def _has_image(client: object, ref: str) -> bool:
    return daemon.image_or_none(client, ref) is not None


def _run(client: object, ref: str, command: list[str], **kwargs: object) -> str:
    out = client.containers.run(ref, command, remove=True, stdout=True, stderr=True, **kwargs)
    return out.decode()


# ------------------------------------------------------------------------------ no daemon needed
def test_install_script_is_valid_bash() -> None:
    assert os.access(INSTALL, os.X_OK), "docker_install.sh must be executable"
    subprocess.run(["bash", "-n", str(INSTALL)], check=True)


def test_shell_scripts_are_shellcheck_clean() -> None:
    assert shutil.which("shellcheck"), "shellcheck missing: scripts/install_test_tools.sh installs it (make test runs it)"
    scripts = [INSTALL, *sorted((INSTALL.parent / "scripts").glob("*.sh"))]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_install_script_options() -> None:
    ok = subprocess.run([str(INSTALL), "--help"], capture_output=True, text=True, timeout=10)
    assert ok.returncode == 0 and "--upstream" in ok.stdout
    bad = subprocess.run([str(INSTALL), "--bogus"], capture_output=True, text=True, timeout=10)
    assert bad.returncode != 0 and "unknown option: --bogus" in bad.stderr


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


def test_install_script_upstream_refuses_next_to_docker_io() -> None:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "docker.io"], capture_output=True, text=True)
    if status.stdout != "install ok installed":
        pytest.skip("docker.io is not installed here")
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip("needs root or sudo")
    result = subprocess.run([str(INSTALL), "--upstream"], capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "conflicts with docker-ce" in result.stderr


# ------------------------------------------------------------------------------------ with a daemon
@pytest.mark.docker
def test_base_image_is_not_rebuilt_when_present(client: object, worker: image.ImageSet) -> None:
    lines: list[str] = []
    start = time.monotonic()
    assert base_image.build_base_image(worker.base_image, client=client, on_log=lines.append) == worker.base_image
    assert time.monotonic() - start < 5
    assert any("exists" in line for line in lines)


@pytest.mark.docker
def test_install_script_second_run_is_quick(client: object) -> None:
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip("needs root or sudo")
    start = time.monotonic()
    result = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert "already answers" in result.stdout
    assert "installing" not in result.stdout, "packages were installed on a host that had them: not idempotent"
    assert elapsed < 15, f"a second run took {elapsed:.1f} s"


@pytest.mark.docker
def test_worker_image_runs_the_project(client: object, worker: image.ImageSet) -> None:
    ref = worker.worker_image
    labels = client.images.get(ref).labels
    assert labels[image.LABEL_LOCK] == image.lock_digest()
    assert labels[image.LABEL_SOURCE] == image.source_digest()
    help_text = _run(client, ref, ["omnilearn", "--help"])
    assert "worker" in help_text
    probe = ("import os, torch, torchvision, omnilearn; "
             "print(torch.__version__, torchvision.__version__, os.environ['OMP_WAIT_POLICY'], "
             "os.environ['PYTHONUNBUFFERED'])")
    out = _run(client, ref, ["python", "-c", probe]).split()
    pins = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().split() if "==" in line)
    assert out[0].split("+")[0] == pins["torch"]
    assert out[1].split("+")[0] == pins["torchvision"]
    assert out[2:] == ["PASSIVE", "1"]


@pytest.mark.docker
def test_failed_build_reports_the_log_tail(client: object, worker: image.ImageSet, tmp_path: Path) -> None:
    ctx = _fake_context(tmp_path)
    (ctx / "Dockerfile").write_text(f"FROM {worker.base_image}\nRUN echo marker-before-failure && false\n")
    with pytest.raises(UserError) as info:
        image.build_worker_image("omnilearn-test-fails:latest", base_image=worker.base_image, context=ctx,
                                 client=client, on_log=lambda line: None)
    assert "marker-before-failure" in str(info.value)


@pytest.mark.docker
def test_ca_bundle_is_in_the_build_and_removed_after(client: object, worker: image.ImageSet,
                                                     tmp_path: Path) -> None:
    ctx = _fake_context(tmp_path)
    (ctx / "Dockerfile").write_text(f"FROM {worker.base_image}\nCOPY docker/ca/ /ca/\n"
                                    f"RUN grep -q 'BEGIN CERTIFICATE' /ca/{image.CA_BUILD_NAME}\n")
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    tag = "omnilearn-test-ca:latest"
    try:
        result = image.build_worker_image(tag, base_image=worker.base_image, ca_bundle=bundle, context=ctx,
                                          client=client, on_log=lambda line: None)
        assert result.size_bytes > 0
        assert not (ctx / "docker" / "ca" / image.CA_BUILD_NAME).exists()
    finally:
        client.images.remove(tag, force=True)


@pytest.mark.docker
def test_docker_update_shows_in_the_containers_cgroup(client: object, worker: image.ImageSet) -> None:
    """The emulator's premise: `docker update` of a running container lands in the kernel's files."""
    container = client.containers.run(worker.base_image, ["sleep", "60"], detach=True, cpuset_cpus="0",
                                      init=True)
    try:
        container.update(cpuset_cpus="0-1" if (os.cpu_count() or 1) > 1 else "0", cpu_quota=50000,
                         cpu_period=100000)

        def read(*paths: str) -> str:
            script = "for f in " + " ".join(paths) + "; do [ -r $f ] && { cat $f; exit 0; }; done; exit 1"
            code, out = container.exec_run(["sh", "-c", script])
            assert code == 0, f"none of {paths} is readable in the container"
            return out.decode().strip()

        cpus = read("/sys/fs/cgroup/cpuset/cpuset.cpus", "/sys/fs/cgroup/cpuset.cpus.effective")
        assert cpus == ("0-1" if (os.cpu_count() or 1) > 1 else "0")
        quota = read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us",
                     "/sys/fs/cgroup/cpu.max")
        assert quota in ("50000", "50000 100000")
    finally:
        container.remove(force=True)
