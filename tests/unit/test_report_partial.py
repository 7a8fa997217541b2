"""``omnilearn report`` on a run folder that is unfinished or partial: one clear line and exit status 2,
never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_simulate import make_run

from omnilearn.cli import main
from omnilearn.metrics import metrics_path


def _drop_end(run: Path, rank: int) -> None:
    path = metrics_path(run, rank)
    lines = [ln for ln in path.read_text().splitlines() if json.loads(ln)["kind"] != "end"]
    path.write_text("\n".join(lines) + "\n")


def _cut_mid_line(run: Path) -> None:
    path = metrics_path(run, 1)
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # the end record half written


def _no_metrics(run: Path) -> None:
    for r in (0, 1):
        metrics_path(run, r).unlink()


def _empty_rank(run: Path) -> None:
    metrics_path(run, 1).write_text("")


def _bad_job(run: Path) -> None:
    (run / "job.json").write_text('{"config": ')


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "no end record": (lambda run: _drop_end(run, 1), "no end record for rank(s) 1"),
    "a line cut short": (_cut_mid_line, "no end record for rank(s) 1"),
    "no metrics": (_no_metrics, "no end record"),
    "an empty rank file": (_empty_rank, "no end record for rank(s) 1"),
    "an unreadable job file": (_bad_job, "job.json"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_partial_run_folder_gets_one_line_and_status_2(tmp_path: Path, case: str,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    spoil, culprit = CASES[case]
    spoil(run)
    assert main(["report", str(run)]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and culprit in err and "Traceback" not in err, err


def test_a_finished_folder_reports(tmp_path: Path) -> None:
    assert main(["report", str(make_run(tmp_path / "run"))]) == 0
