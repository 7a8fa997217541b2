"""A toggler thread killed inside ``omnilearn emulate`` is restarted by its host, and the level is applied
once all the same (the command is a real process; the backend applies nothing and dies once)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from omnilearn.emulator.backends import NullBackend
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.spec.levels import Allocation


class DiesOnce(NullBackend):
    """Ends the toggler's thread in its first apply (after the write-ahead record): a crash mid-change."""

    def __init__(self) -> None:
        self.died = False
        self.applied: list[tuple[str, Allocation]] = []

    def apply(self, target: str, allocation: Allocation) -> Allocation:
        if not self.died:
            self.died = True
            raise SystemExit("toggler thread killed")
        self.applied.append((target, allocation))
        return allocation


def test_a_killed_toggler_thread_in_emulate_is_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from omnilearn.launch import emulate as emulate_module

    backend = DiesOnce()
    monkeypatch.setattr(emulate_module, "select_backend", lambda *a, **k: backend)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="omnilearn.toggler"):
        status = emulate_module.emulate([sys.executable, "-c", "pass"], "HL8", None, 2, out)
    assert status == 0 and backend.died
    assert "toggler thread died: restarting it from its audit" in caplog.text
    applied = read_audit(out / "logs")
    assert sorted((r["target"], r["level"]) for r in applied) == [("worker1", "HL8"), ("worker2", "HL8")]
    assert sorted(t for t, _ in backend.applied) == ["worker1", "worker2"]  # each once, the killed one too
