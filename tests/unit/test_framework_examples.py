"""The framework examples' conversions, as docs/guide/frameworks.md shows them, are the examples' own.

Each ``diff`` block of the guide names a framework's example and its omnilearn conversion
(``--- examples/a.py`` / ``+++ examples/b.py``) and lists every changed line of code (the module
docstrings, which say which script is which, left out). The table of changed lines matches the
blocks, and the conversions stay as small as their frameworks' users were promised.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "frameworks.md"
# example -> its conversion, and the most lines (added + removed) the conversion may change
PAIRS = {
    "examples/lightning_backbone.py": ("examples/lightning_backbone_omnilearn.py", 5),
    "examples/accelerate_nlp.py": ("examples/accelerate_nlp_omnilearn.py", 10),
    "examples/hf_trainer_lm.py": ("examples/hf_trainer_lm_omnilearn.py", 10),
}


def code_lines(path: Path) -> list[str]:
    """The file's lines after its module docstring."""
    text = path.read_text()
    first = ast.parse(text).body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant), f"{path}: no module docstring"
    assert first.end_lineno is not None
    return text.splitlines()[first.end_lineno:]


def changed_lines(a: Path, b: Path) -> list[str]:
    """``-line`` / ``+line`` for every line of code removed from ``a`` or added in ``b``, in order."""
    return [f"{d[0]}{d[2:]}" for d in difflib.ndiff(code_lines(a), code_lines(b)) if d[:2] in ("- ", "+ ")]


def guide_diffs() -> dict[str, tuple[str, list[str]]]:
    blocks = re.findall(r"^```diff\n--- (\S+)\n\+\+\+ (\S+)\n(.*?)^```", GUIDE.read_text(), flags=re.M | re.S)
    return {a: (b, body.splitlines()) for a, b, body in blocks}


@pytest.mark.parametrize("example", sorted(PAIRS))
def test_the_guide_shows_the_whole_conversion(example: str) -> None:
    converted, most = PAIRS[example]
    shown = guide_diffs()
    assert example in shown, f"{GUIDE.name}: no diff block for {example}"
    assert shown[example][0] == converted
    lines = changed_lines(ROOT / example, ROOT / converted)
    assert shown[example][1] == lines, "\n".join(lines)
    added, removed = sum(s.startswith("+") for s in lines), sum(s.startswith("-") for s in lines)
    assert added + removed <= most, (added, removed)
    assert f"| `{converted}` | {added + removed} (+{added} −{removed}) |" in GUIDE.read_text()


def test_the_check_sees_a_change(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text('"""A."""\nx = 1\ny = 2\n')
    b.write_text('"""B,\nlonger."""\nx = 1\ny = 3\nz = 4\n')
    assert changed_lines(a, b) == ["-y = 2", "+y = 3", "+z = 4"]
