"""Run folders: unique by default, marked, replaced by --force only when omnilearn's, clear errors otherwise."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from omnilearn.errors import UserError
from omnilearn.files import create_in, open_in, write_in
from omnilearn.launch import runfolder
from omnilearn.launch.runfolder import MARKER, PROJECT_ROOT, check_out, default_out, prepare_out


def test_default_out_is_new_and_marked_even_for_runs_started_together(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runfolder.time, "strftime", lambda fmt: "20250101-000000")  # the same second
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(default_out())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 16
    for path in got:
        assert path.parent == Path("runs") and path.name.startswith("20250101-000000-")
        assert json.loads((path / MARKER).read_text())["omnilearn"] == "run folder"


def test_default_out_never_reuses_a_taken_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runfolder.time, "strftime", lambda fmt: "T")
    tokens = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(runfolder.secrets, "token_hex", lambda n: next(tokens))
    assert default_out() == Path("runs/T-aaaaaa")
    assert default_out() == Path("runs/T-bbbbbb")  # T-aaaaaa exists: another name, not the same folder


def test_force_replaces_only_a_marked_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert prepare_out(str(out), force=False) == out and (out / MARKER).is_file()
    (out / "summary.json").write_text("{}")
    with pytest.raises(UserError, match="not empty"):
        prepare_out(str(out), force=False)
    prepare_out(str(out), force=True)
    assert sorted(p.name for p in out.iterdir()) == [MARKER]
    # A folder omnilearn did not make (no marker, or a marker that is a link) is never removed.
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious").write_text("x")
    with pytest.raises(UserError, match=f"has no {MARKER}"):
        prepare_out(str(other), force=True)
    (other / MARKER).symlink_to(out / MARKER)
    with pytest.raises(UserError, match=f"has no {MARKER}"):
        prepare_out(str(other), force=True)
    assert (other / "precious").read_text() == "x"


def test_force_never_replaces_root_home_project_or_current_folder(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    cwd = home / "work" / "here"
    cwd.mkdir(parents=True)
    for folder in (home, cwd):
        (folder / MARKER).write_text("{}")
        (folder / "keep").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    link = tmp_path / "link-to-home"
    link.symlink_to(home)
    for out in ("/", str(home), str(link), str(cwd), ".", str(home / "work"), str(PROJECT_ROOT)):
        with pytest.raises(UserError, match="never replaces"):
            prepare_out(out, force=True)
    assert (home / "keep").exists() and (cwd / "keep").exists()


def test_unusable_out_is_one_clear_error(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UserError, match="exists and is not a folder"):
        prepare_out(str(a_file), force=True)
    with pytest.raises(UserError, match="cannot use it as the run folder"):
        prepare_out(str(a_file / "sub"), force=False)  # a file in the way
    with pytest.raises(UserError, match="cannot use it as the run folder"):
        prepare_out("/proc/omnilearn-run", force=False)  # a file system nobody can write
    with pytest.raises(UserError, match="cannot use it as the run folder"):
        prepare_out("bad\0name", force=False)


def test_check_out_refuses_as_prepare_out_does_and_makes_or_removes_nothing(tmp_path: Path) -> None:
    check_out(str(tmp_path / "new" / "run"), False)
    assert not (tmp_path / "new").exists()  # a folder to come is not made by the check
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "x").write_text("x")
    for force, said in ((False, "not empty"), (True, MARKER)):
        with pytest.raises(UserError, match=said):
            check_out(str(kept), force)
        with pytest.raises(UserError, match=said):
            prepare_out(str(kept), force)
    assert (kept / "x").read_text() == "x"
    (kept / MARKER).write_text("{}")
    check_out(str(kept), True)  # replaceable: the check passes and leaves it
    assert (kept / "x").exists()
    assert prepare_out(str(kept), True) == kept and not (kept / "x").exists()


def test_open_in_never_goes_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("secret")
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "sym").symlink_to(target)
    os.link(target, folder / "hard")
    os.mkfifo(folder / "fifo")
    for name in ("sym", "hard", "fifo"):
        with pytest.raises(OSError):
            write_in(folder, name, b"overwritten")
        with pytest.raises(OSError):
            os.close(open_in(folder, name, os.O_RDONLY))
    assert target.read_text() == "secret"
    (tmp_path / "link-folder").symlink_to(folder, target_is_directory=True)
    with pytest.raises(OSError):  # the folder itself is not reached through a link either
        write_in(tmp_path / "link-folder", "new", b"x")
    write_in(folder, "plain", b"first, longer")
    write_in(folder, "plain", b"second")
    assert (folder / "plain").read_bytes() == b"second"
    os.close(create_in(folder, "plain"))
    assert (folder / "plain").read_bytes() == b""
