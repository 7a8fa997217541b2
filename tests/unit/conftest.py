"""The unit tier starts no process: a test that tries (itself or through the code it calls) fails, naming it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: subprocess.Popen, args: object, *rest: object, **kw: object) -> None:
        raise AssertionError(f"the unit tier starts no process (tests/integration does): {args!r}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
