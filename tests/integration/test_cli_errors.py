"""The command line on bad input: exit status 2, one line naming the culprit, nothing started (a real process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_config import write

from omnilearn import config
from omnilearn.errors import UserError
from omnilearn.train.preflight import preflight


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnilearn", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_cli_bad_input_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path, "train:\n  global_batch: -1\n")
    out = tmp_path / "out"
    r = run_cli("run", "--config", str(bad), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2
    assert "train.global_batch" in r.stderr and str(bad) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    r = run_cli("run", "--hl", "HL5", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "HL5" in r.stderr and not out.exists()
    r = run_cli("run", "--set", "control.memory_margin=2", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "control.memory_margin" in r.stderr
    r = run_cli("run", "--workers", "many", cwd=tmp_path)  # argparse's own error, also status 2
    assert r.returncode == 2


def test_cli_refuses_to_overwrite_a_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    r = run_cli("run", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "--force" in r.stderr
    assert (out / "summary.json").read_text() == "{}"


def test_cli_missing_data_exits_2_before_starting(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli("run", "--dataset", "cifar10", "--set", f"data.root={tmp_path / 'nodata'}", "--out", str(out),
                cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "cifar10" in r.stderr and "nodata" in r.stderr
    assert not out.exists()
    # An unknown model stops the same check (the launcher's preflight, whose UserError the command above
    # turned into status 2 and one line), in this process: no second start of the command for it.
    with pytest.raises(UserError, match="resnet9000"):
        preflight(config.build(None, [("model.name", "resnet9000")]))
