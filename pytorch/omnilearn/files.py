"""The project's files, read and written one way: YAML configs, lines and JSONL records, atomic replacement,
and files opened inside a folder without following links.

Every module that reads a YAML file, a JSONL file or replaces a file goes through here, so they
all fail the same way (one :class:`UserError` naming the file) and no reader ever sees half a file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from omnilearn.errors import UserError

CONFIG_DIR = Path(os.environ.get("OMNILEARN_CONFIGS", Path(__file__).resolve().parents[2] / "configs"))
"""The project's named configs: job files, ``levels.yaml``, ``schedules.yaml``."""


def load_yaml(path: str | Path, what: str = "file") -> Any:
    """The YAML document in ``path``; a missing file or bad YAML is a UserError naming it."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {p} not found")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"{p}: not valid YAML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read: {e}") from None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary name beside ``path``, fsync, rename: readers see the old file or the new one.

    A crash at any point leaves the previous version (or nothing, for a new file) under ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_dir(path: Path) -> int:
    """A descriptor of the folder ``path``, never through a symlink at its last step (the caller closes it)."""
    return os.open(path, _DIR_FLAGS)


def open_in(folder: Path | int, name: str, flags: int, mode: int = 0o644) -> int:
    """Open the plain file ``name`` in ``folder`` (a path or a folder's descriptor) as a host process
    must open anything in a folder that someone else can write: relative to the folder's descriptor,
    never through a symlink, never blocking on a FIFO, and only a regular file with one link (a hard
    link could name a file elsewhere). OSError otherwise; the caller closes the descriptor.
    """
    assert name and "/" not in name and name not in (".", ".."), name
    dir_fd = folder if isinstance(folder, int) else open_dir(folder)
    try:
        fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=dir_fd)
    finally:
        if dir_fd is not folder:
            os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, f"{name} is not a plain regular file")
    return fd


def create_in(folder: Path | int, name: str) -> int:
    """A descriptor of ``name`` in ``folder`` open for writing, created if missing and emptied, opened with
    :func:`open_in`: a symlink or hard link planted under that name is refused, never written through."""
    fd = open_in(folder, name, os.O_WRONLY | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)  # after open_in's checks: O_TRUNC would empty whatever a link names
    except OSError:
        os.close(fd)
        raise
    return fd


def write_in(folder: Path | int, name: str, data: bytes) -> None:
    """Replace the contents of ``name`` in ``folder`` with ``data`` (see :func:`create_in`)."""
    fd = create_in(folder, name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_lines(path: Path, offset: int = 0) -> tuple[list[tuple[bytes, int]], int]:
    """The complete lines of ``path`` from byte ``offset`` on, each with the offset after it.

    An incomplete last line (its writer has not finished it yet) is left for the next call; the
    returned offset is where that call should start. A missing file has no lines.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    lines: list[tuple[bytes, int]] = []
    pos = 0
    while (end := data.find(b"\n", pos)) >= 0:
        lines.append((data[pos:end], offset + end + 1))
        pos = end + 1
    return lines, offset + pos


def iter_lines(fd: int, max_line: int, chunk: int = 2**20) -> Iterator[tuple[bytes | None, int]]:
    """Stream the complete lines of an open file: (line, or None when longer than ``max_line``,
    offset after it). Memory stays within ``chunk + max_line`` whatever the file holds.

    For files others may write (see :func:`read_lines` for one's own, read from an offset).
    """
    offset = 0  # of the start of ``buf`` in the file
    buf = b""
    too_long = False  # inside a line already known to be too long
    while data := os.pread(fd, chunk, offset + len(buf)):
        buf += data
        pos = 0
        while (end := buf.find(b"\n", pos)) >= 0:
            yield (None if too_long or end - pos > max_line else buf[pos:end]), offset + end + 1
            too_long = False
            pos = end + 1
        offset += pos
        buf = buf[pos:]
        if len(buf) > max_line:
            too_long = True
            offset += len(buf)
            buf = b""


def _loads_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_jsonl(path: Path, offset: int = 0,
               loads: Callable[[bytes], Any] = _loads_or_none) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects on the complete lines of ``path`` from byte ``offset``, and where to go on.

    An incomplete last line (its writer is still writing it) is left for the next call; lines that
    are not JSON objects are skipped. A missing file has no records. ``loads`` parses one line (None
    for one it refuses; a file others may write wants a bounded one), by default ``json.loads``.
    """
    lines, end = read_lines(path, offset)
    records: list[dict[str, Any]] = []
    for raw, _ in lines:
        record = loads(raw)
        if isinstance(record, dict):
            records.append(record)
    return records, end


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a JSONL file (see :func:`read_jsonl`)."""
    return read_jsonl(path)[0]
