"""``omnilearn whatif`` on a synthetic run folder whose workers follow known lines (``test_simulate``'s:
``t = c (b + k)`` with ``c`` 10 and 2.5 ms a sample, ``k = 2``, the all-reduce 30 ms): the known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_simulate import BATCHES, LINES, SYNC_S, make_run

from omnilearn.cli import main
from omnilearn.metrics import metrics_path
from omnilearn.simulate.whatif import whatif


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """The synthetic run, as a run of ``uniform`` (the policy whose what-if a user asks)."""
    folder = make_run(tmp_path / "run")
    job = json.loads((folder / "job.json").read_text())
    job["config"]["control"]["policy"] = "uniform"
    (folder / "job.json").write_text(json.dumps(job))
    return folder


def _times(batch: list[int]) -> list[float]:
    return [a + c * b for (a, c), b in zip(LINES, batch, strict=True)]


def test_the_what_if_of_known_lines(run: Path, tmp_path: Path) -> None:
    w = whatif(run, tmp_path / "out")
    assert (tmp_path / "out" / "whatif.json").is_file() and (tmp_path / "out" / "whatif.png").is_file()
    assert w["models"]["k"] == pytest.approx(2.0, abs=1e-3) and w["models"]["k_status"] == "fitted"
    steps = [_times(b) for b in BATCHES]
    for r in (0, 1):
        mine = [t[r] for t in steps]
        other = [t[1 - r] for t in steps]
        assert w["ranks"][r]["work_s"] == pytest.approx(sum(mine) / len(mine), abs=1e-6)
        lost = [max(0.0, a - b) for a, b in zip(mine, other, strict=True)]  # one other rank waits
        assert w["ranks"][r]["cost_to_others_s"] == pytest.approx(sum(lost) / len(lost), abs=1e-6)
    job = w["job"]
    recorded = sum(max(t) + SYNC_S for t in steps)
    assert job["recorded_s"] == pytest.approx(recorded, rel=1e-6) and w["outside_steps_s"] == pytest.approx(0, abs=1e-6)
    # balanced: b_i + k in proportion to 1 / c_i over 64 + 2k samples: (64 + 4) / 5 = 13.6 for the slow one
    assert job["balanced_s"] == pytest.approx(12 * (0.010 * 13.6 + SYNC_S), rel=1e-4)
    assert job["no_straggler_s"] == pytest.approx(sum(sum(t) / 2 + SYNC_S for t in steps), rel=1e-6)
    assert job["balanced_s"] < job["no_straggler_s"] < job["recorded_s"]
    assert 0 < job["dynamic_s"] < job["recorded_s"]  # the simulator's dynamic moves towards the fast worker
    # static's replay, scaled by the same ratio: the run's own policy's replay is the recorded time
    assert job["static_s"] == pytest.approx(job["recorded_s"] * w["replayed"]["static_s"] / w["replayed"]["own_policy_s"],
                                            rel=1e-3)


def _uniform_run(folder: Path, start_up: tuple[int, int] | None) -> Path:
    run = make_run(folder, batches=[[32, 32]] * 12, start_up=start_up)
    job = json.loads((run / "job.json").read_text())
    job["config"]["control"]["policy"] = "uniform"
    (run / "job.json").write_text(json.dumps(job))
    return run


def test_a_run_at_one_batch_size_takes_k_from_its_start_up_passes(tmp_path: Path) -> None:
    told = whatif(_uniform_run(tmp_path / "told", (8, 16)), tmp_path / "a", figure=False)
    assert told["models"]["k_status"] == "start-up pass" and told["models"]["k"] == pytest.approx(2.0, rel=1e-3)
    assert "start-up pass" in told["models"]["k_source"]
    c = told["models"]["c_ms_per_sample"]
    assert c["rank0@SKEW"] == pytest.approx(10.0, rel=1e-3) and c["rank1@SKEW"] == pytest.approx(2.5, rel=1e-3)
    blind = whatif(_uniform_run(tmp_path / "blind", None), tmp_path / "b", figure=False)
    assert blind["models"]["k_status"] == "not identified" and blind["models"]["k"] == 0
    # static's split (the allocations, 0.4 : 1.6: 12.8 and 51.2 samples) is not the speeds': its slow worker
    # takes 0.010 (12.8 + 2) = 148 ms a step, where k = 0 reads 0.010625 x 12.8 = 136 ms
    assert told["replayed"]["static_s"] > blind["replayed"]["static_s"] * 1.02
    # a balanced split of equal k costs the same under either reading: 0.010 (11.6 + 2) = 0.010625 x 12.8
    assert told["job"]["balanced_s"] == pytest.approx(blind["job"]["balanced_s"], rel=1e-3)


def test_the_command_prints_and_writes(run: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(run)]) == 0
    out = capfd.readouterr().out
    assert "rank 1:" in out and "balanced" in out and (run / "whatif.json").is_file()
    assert set(json.loads((run / "whatif.json").read_text())["job"]) == {"recorded_s", "no_straggler_s", "balanced_s",
                                                                          "dynamic_s", "static_s"}


def _no_steps_for(run: Path, rank: int) -> None:
    path = metrics_path(run, rank)
    path.write_text("".join(ln + "\n" for ln in path.read_text().splitlines() if json.loads(ln)["kind"] != "step"))


@pytest.mark.parametrize("spoil, culprit", [
    (lambda run: _no_steps_for(run, 1), "no step records for rank(s) 1"),
    (lambda run: (_no_steps_for(run, 0), _no_steps_for(run, 1)), "no step records for rank(s) 0, 1"),
    (lambda run: metrics_path(run, 1).unlink(), "no step records for rank(s) 1"),
    (lambda run: (run / "job.json").unlink(), "not a run folder"),
])
def test_a_folder_it_cannot_read_is_one_clear_error(run: Path, spoil, culprit: str,  # noqa: ANN001
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    spoil(run)
    assert main(["whatif", str(run)]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and culprit in err and "Traceback" not in err, err
