"""omnilearn emulate around a command: its rank processes in the level's cgroups, status passed through."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(("args", "culprit"), [
    (["--workers", "3", "--containers", "c1,c2"], "--containers names 2 containers but --workers is 3"),
    (["--containers", "c1,,c2"], "an empty name"),
    (["--containers", "c1,c2,c1"], "'c1' is named twice"),
])
def test_emulate_containers_bad_input_is_one_user_error(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                        args: list[str], culprit: str) -> None:
    from omnilearn.cli import main

    out = tmp_path / "x"
    assert main(["emulate", "--hl", "HL8", *args, "--out", str(out), "--", sys.executable, "-c", "pass"]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omnilearn: error: ") and culprit in lines[0]
    assert not out.exists()


def test_emulate_containers_without_a_daemon_names_it(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.cli import main

    sock = tmp_path / "no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    out = tmp_path / "x"
    assert main(["emulate", "--hl", "HL8", "--containers", "c1,c2", "--out", str(out), "--", "true"]) == 2
    assert capfd.readouterr().err.strip() == (f"omnilearn: error: --containers: no Docker daemon at unix://{sock}: "
                                               f"start it with ./docker_install.sh")
    assert not out.exists()
