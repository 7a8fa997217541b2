"""Run folders through the command line: --force and an unwritable --out exit 2 with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.launch.runfolder import MARKER

FAST = ("--model", "smallcnn", "--dataset", "synthetic", "--set", "data.synthetic_size=256",
        "--set", "data.image_size=16", "--workers", "2", "--global-batch", "32")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnilearn", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omnilearn: error: "), r.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.docker
def test_cli_force_and_unwritable_out_exit_2_with_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious").write_text("x")
    one_line_error(run_cli("run", *FAST, "--out", str(other), "--force", cwd=tmp_path), MARKER)
    assert (other / "precious").read_text() == "x"
    # An unwritable --out is found after the launcher's preflight (torch, the data): the command's own
    # function in this process, its status and its one line as the process above gives them.
    from omnilearn.cli import main

    status = main(["run", *FAST, "--out", "/proc/omnilearn-run"])
    one_line_error(subprocess.CompletedProcess([], status, "", capfd.readouterr().err), "--out /proc/omnilearn-run")
