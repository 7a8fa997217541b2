"""Images against a daemon: the base image reused, the worker image runs the project, a failed build's log tail, the CA bundle, docker update in the cgroup."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from test_image import _fake_context
from test_scripts import INSTALL, ROOT

from omnilearn.emulator.backends import dockerd as daemon
from omnilearn.errors import UserError
from omnilearn.images import base as base_image
from omnilearn.images import worker as image


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


# ------------------------------------------------------------------------------------ with a daemon
@pytest.mark.docker
def test_base_image_is_not_rebuilt_when_present(client: object, worker: image.ImageSet) -> None:
    lines: list[str] = []
    before = client.images.get(worker.base_image).id
    assert base_image.build_base_image(worker.base_image, client=client, on_log=lines.append) == worker.base_image
    assert any("exists" in line for line in lines)
    assert client.images.get(worker.base_image).id == before  # the same image, not a new build


@pytest.mark.docker
def test_install_script_second_run_only_checks(client: object) -> None:
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip("needs root or sudo")
    result = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert "already answers" in result.stdout
    assert "installing" not in result.stdout, "packages were installed on a host that had them: not idempotent"


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
    # Every pin but the test and lint tools at its version, and the bytecode compiled at build time: the
    # workers never write it (PYTHONDONTWRITEBYTECODE), so without it every start compiles torch again.
    listing = ("import importlib.metadata as m, importlib.util as u, json, os, torch; "
               "print(json.dumps([{d.metadata['Name']: d.version for d in m.distributions()}, "
               "os.path.exists(u.cache_from_source(torch.__file__))]))")
    installed, compiled = json.loads(_run(client, ref, ["python", "-c", listing]))
    have = {canonicalize_name(name): version.split("+")[0] for name, version in installed.items()}
    dev_pins = re.search(r'ARG DEV_PINS="([^"]*)"', (ROOT / "Dockerfile").read_text()).group(1).split()
    dev = {canonicalize_name(name) for name in dev_pins}
    wrong = {name: (version, have.get(canonicalize_name(name))) for name, version in pins.items()
             if canonicalize_name(name) not in dev and have.get(canonicalize_name(name)) != version}
    assert not wrong, wrong  # pin: (locked, in the image)
    assert compiled


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
