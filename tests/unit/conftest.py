"""The unit tier starts no process: a test that tries (itself or through the code it calls) fails, naming it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

# ctypes.util.find_library runs ldconfig when a library (torch's tensorboard, for one) is first imported,
# and matplotlib runs fc-list when it first builds its font cache (a fresh machine's first import):
# lookups made by an import, not processes the code under test starts.
LIBRARY_LOOKUPS = {"ldconfig", "fc-list"}


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = subprocess.Popen.__init__

    def refuse(self: subprocess.Popen, args: object, *rest: object, **kw: object) -> None:
        first = args[0] if isinstance(args, (list, tuple)) and args else args
        if os.path.basename(str(first)) in LIBRARY_LOOKUPS:
            return real(self, args, *rest, **kw)
        raise AssertionError(f"the unit tier starts no process (tests/integration does): {args!r}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
