"""omnilearn cluster up and run folders it did not make (a daemon)."""

from __future__ import annotations

from pathlib import Path

from test_runfolder_cli import FAST, one_line_error, run_cli

from omnilearn.launch.runfolder import MARKER


def test_cluster_up_refuses_a_folder_it_did_not_make(tmp_path: Path, docker_client: object) -> None:  # noqa: ARG001
    # `cluster up` asks for a daemon first (nothing is made without one), then checks --out like `run`.
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious").write_text("x")
    one_line_error(run_cli("cluster", "up", *FAST, "--out", str(other), "--force", cwd=tmp_path), MARKER)
    assert (other / "precious").read_text() == "x"
