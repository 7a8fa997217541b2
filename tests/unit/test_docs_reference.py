"""docs/reference/config.md and cli.md are what the code generates (``make docs``), so they cannot drift.

A guard shows that the comparison could fail: a config field added without regenerating changes the
generated text. Every config field carries its docstring, and ``summary.json``'s ``control`` follows the
control section's fields.
"""

from __future__ import annotations

import dataclasses

import pytest

from omnilearn import config, docs_gen
from omnilearn.config.sections import ControlConfig
from omnilearn.report.summary import CONTROL_KEYS


@pytest.mark.parametrize("name", ["config.md", "cli.md", "records.md", "torch.md"])
def test_committed_reference_is_generated(name: str) -> None:
    path = docs_gen.REFERENCE / name
    assert path.exists(), f"{path} is missing: run `make docs`"
    assert path.read_text() == docs_gen.generated()[path], f"{path} differs from the code: run `make docs`"


def test_check_mode_passes_on_the_committed_files() -> None:
    assert docs_gen.main(["--check"]) == 0


@dataclasses.dataclass
class _JobWithNewKey(config.JobConfig):
    added_key: int = 7
    """A key added to the config without running ``make docs``."""


def test_a_new_field_without_regenerating_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The guard: the same check fails once the dataclasses hold a field the committed file lacks."""
    monkeypatch.setattr(docs_gen.config, "JobConfig", _JobWithNewKey)
    text = docs_gen.config_markdown()
    assert "| `added_key` | `int` | `7` | A key added to the config without running ``make docs``. |" in text
    assert docs_gen.main(["--check"]) == 1
    assert "config.md differs from the code" in capsys.readouterr().err


def test_generation_is_deterministic() -> None:
    assert docs_gen.config_markdown() == docs_gen.config_markdown()
    assert docs_gen.cli_markdown() == docs_gen.cli_markdown()


def test_every_config_key_has_a_docstring() -> None:
    assert docs_gen.undocumented_keys() == []


def test_every_config_key_is_in_the_reference() -> None:
    text = (docs_gen.REFERENCE / "config.md").read_text()
    keys = [k for k, _, _ in docs_gen.config_keys()]
    assert len(keys) >= 80
    for key in keys:
        assert f"| `{key}` |" in text, key


def test_every_command_and_flag_is_in_the_reference() -> None:
    text = (docs_gen.REFERENCE / "cli.md").read_text()
    flags = docs_gen.cli_flags()
    assert {"omnilearn run", "omnilearn bench", "omnilearn emulate", "omnilearn cluster up", "omnilearn image build"} <= set(flags)
    for cmd, options in flags.items():
        section = text.split(f"\n## {cmd}\n", 1)[1].split("\n## ", 1)[0]
        for flag in options:
            assert f"`{flag}`" in section, f"{cmd} {flag}"


def test_control_keys_follow_the_control_section() -> None:
    names = {f.name for f in dataclasses.fields(ControlConfig)}
    assert set(CONTROL_KEYS) == names - {"policy", "memory_bounds", "memory_margin"}
    assert {"confidence", "hazard", "probe_steps"} <= set(CONTROL_KEYS)


def test_the_torch_reference_names_every_public_class_and_member() -> None:
    import omnilearn.torch as lib

    text = docs_gen.torch_markdown()
    for name in lib.__all__:
        assert f"## {name}\n" in text and f"{name}(" in text
        for member in docs_gen.TORCH_MEMBERS[name]:
            section = text.split(f"### `{name}.{member}", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
            assert len(section.strip().splitlines()) >= 2, f"{name}.{member} has no doc"
