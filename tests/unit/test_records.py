"""The run records have one home (omnilearn.records): every writer in the package names a known kind
and only the fields listed for it, and the writer refuses a record its kind does not allow."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from omnilearn import records
from omnilearn.metrics import MetricsWriter

PACKAGE = Path(__file__).resolve().parents[2] / "pytorch" / "omnilearn"


def _record_writes() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, kind, keyword names) of every ``<x>.write("<kind>", field=...)`` in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "write"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and node.keywords):
                continue  # a file's write(text) has no keywords
            names = [k.arg for k in node.keywords if k.arg is not None]  # None: a **spread, checked at run time
            found.append((str(path.relative_to(PACKAGE)), node.lineno, node.args[0].value, names))
    return found


WRITES = _record_writes()


def test_the_scan_finds_the_writers() -> None:
    kinds = {kind for _, _, kind, _ in WRITES}
    assert {"step", "batch_change", "start", "end", "update", "hl_change"} <= kinds
    assert len(WRITES) >= 30


@pytest.mark.parametrize("where,line,kind,names", WRITES, ids=[f"{w}:{n}" for w, n, _, _ in WRITES])
def test_every_written_record_is_of_a_known_kind_with_its_fields(where: str, line: int, kind: str,
                                                                 names: list[str]) -> None:
    assert kind in records.KINDS, f"{where}:{line}: kind {kind!r} is not in omnilearn.records"
    unknown = sorted(set(names) - records.KINDS[kind].fields)
    assert not unknown, f"{where}:{line}: {kind} fields {unknown} are not listed in omnilearn.records"


def test_the_writer_refuses_an_unknown_kind_and_a_missing_field(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "rank-0.jsonl")
    with pytest.raises(ValueError, match="'stpe' is not one of"):
        w.write("stpe", step=1)
    with pytest.raises(ValueError, match="lacks reason"):
        w.write("batch_change", step=1, batch=[1, 2])
    w.write("batch_change", step=1, batch=[1, 2], reason="initial")
    w.close()
    (line,) = (tmp_path / "rank-0.jsonl").read_text().splitlines()
    assert json.loads(line)["kind"] == "batch_change"  # nothing of the refused ones was written


def test_of_kind_keeps_order_and_selects_several_kinds() -> None:
    recs = [{"kind": "step", "step": 1}, {"kind": "hl_change"}, {"kind": "eval"}, {"kind": "step", "step": 2}]
    assert records.of_kind(recs, records.STEP) == [recs[0], recs[3]]
    assert records.of_kind(recs, records.HL_CHANGE, records.EVAL) == [recs[1], recs[2]]


def test_every_required_field_is_a_field_and_every_kind_is_documented() -> None:
    for k in records.KINDS.values():
        assert set(k.required) <= k.fields and k.doc and k.writer
        assert f"| `{k.name}` |" in records.markdown()
