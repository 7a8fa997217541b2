"""The shell scripts: valid bash, shellcheck-clean, their options."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


INSTALL = ROOT / "docker_install.sh"


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
