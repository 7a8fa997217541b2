"""Fixtures of the integration tier (processes, root, the kernel)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def spawn() -> Iterator:
    """Starts ``python -c CODE`` children; whatever happens, each is resumed, killed and reaped after."""
    procs: list[subprocess.Popen] = []

    def start(code: str, **kw: object) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait()
