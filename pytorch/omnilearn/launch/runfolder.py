"""Run folders: made new for each run, marked as omnilearn's, and only such a folder is ever replaced.

``--out`` names the folder a run writes (``run`` and ``cluster up``); without it each run gets a new
``runs/<time>-<random>`` folder, created exclusively, so two runs started in the same second never
share one. Every run folder carries the marker file :data:`MARKER`; ``--force`` replaces an existing,
non-empty folder only when it carries the marker, and never the file system's root, the home folder,
the project's checkout, the current folder or a folder holding any of them (the launcher may run as
root, and ``rm -rf`` of the wrong folder cannot be undone).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from omnilearn.errors import UserError
from omnilearn.files import open_in

MARKER = ".omnilearn-run"
"""Written into every run folder when the run creates it: what ``--force`` looks for."""
RUNS = Path("runs")
PROJECT_ROOT = Path(__file__).resolve().parents[3]
_CREATE_TRIES = 16


def default_out() -> Path:
    """A new run folder under ``runs/``, made here and now: the name is taken by nobody else."""
    try:
        RUNS.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {RUNS.resolve()} for the run folder: {e.strerror} (give --out)") from None
    for _ in range(_CREATE_TRIES):
        path = RUNS / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        try:
            path.mkdir()  # exclusive: an existing name is never reused
        except FileExistsError:
            continue
        except OSError as e:
            raise UserError(f"cannot create the run folder {path}: {e.strerror} (give --out)") from None
        try:
            _mark(path)
        except OSError as e:
            raise UserError(f"cannot write in the run folder {path}: {e.strerror} (give --out)") from None
        return path
    raise UserError(f"cannot find a free run folder name under {RUNS}")  # pragma: no cover


def check_out(out: str | None, force: bool) -> None:
    """The refusals of :func:`prepare_out` that need nothing made or removed, one line each: a path
    that is not a folder, a non-empty folder without ``force``, one ``force`` may not replace. The
    launcher says them before its preflight (which loads the data and builds the model)."""
    if out is None:
        return
    path = Path(out)
    try:
        if not (path.is_symlink() or path.exists()):
            return
        if not path.is_dir():
            raise UserError(f"--out {out}: exists and is not a folder")
        if any(path.iterdir()):
            if not force:
                raise UserError(f"--out {out}: folder exists and is not empty (choose another, or add "
                                f"--force to replace it)")
            _check_replaceable(path, out)
    except (OSError, ValueError) as e:
        raise _unusable(out, e) from None


def prepare_out(out: str | None, force: bool) -> Path:
    """The run folder for ``--out`` (None: a new one under ``runs/``), existing, empty and marked.

    A non-empty folder is refused, or with ``force`` replaced if it carries the run marker; a path
    that cannot be a folder, or one this process cannot write, is refused. Each refusal is one line.
    """
    if out is None:
        return default_out()
    check_out(out, force)
    path = Path(out)
    try:
        if (path.is_symlink() or path.exists()) and any(path.iterdir()):  # with force, and replaceable
            real = path.resolve()
            shutil.rmtree(real)  # never follows a link inside the folder
            real.mkdir()
        path.mkdir(parents=True, exist_ok=True)
        _mark(path)
    except (OSError, ValueError) as e:  # unwritable, a file in the way, a name the system refuses
        raise _unusable(out, e) from None
    return path


def _unusable(out: str, error: OSError | ValueError) -> UserError:
    return UserError(f"--out {out}: cannot use it as the run folder: {getattr(error, 'strerror', None) or error}")


def _check_replaceable(path: Path, out: str) -> Path:
    """The folder ``--force`` would remove (links resolved), or a UserError saying why it may not."""
    real = path.resolve()
    protected = {Path("/"), Path.home().resolve(), PROJECT_ROOT, Path.cwd().resolve()}
    for p in sorted(protected):
        if p == real or p.is_relative_to(real):
            raise UserError(f"--out {out}: --force never replaces {real} (it is or holds {p})")
    if not _has_marker(real):
        raise UserError(f"--out {out}: --force replaces only a run folder of omnilearn, and {real} has no "
                        f"{MARKER} file (remove it yourself, or choose another --out)")
    return real


def _has_marker(path: Path) -> bool:
    """Whether ``path`` carries the run marker as a plain file (a link planted under its name is not one)."""
    try:
        return stat.S_ISREG(os.lstat(path / MARKER).st_mode)
    except FileNotFoundError:
        return False


def _mark(path: Path) -> None:
    """Write the run marker (refusing a link planted under its name): also the proof the folder is writable."""
    fd = open_in(path, MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, (json.dumps({"omnilearn": "run folder", "created": time.time()}) + "\n").encode())
    finally:
        os.close(fd)


def resume_out(out: str) -> Path:
    """The folder ``--resume`` continues: a run folder of omnilearn (it carries :data:`MARKER`) with its
    job file; else one UserError saying what is missing."""
    path = Path(out)
    if not path.is_dir():
        raise UserError(f"--resume {out}: no such run folder")
    if not _has_marker(path):
        raise UserError(f"--resume {out}: not a run folder of omnilearn (no {MARKER} file)")
    if not (path / "job.json").is_file():
        raise UserError(f"--resume {out}: no job.json: the run never started")
    return path
