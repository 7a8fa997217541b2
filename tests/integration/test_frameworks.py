"""omnilearn.lightning, omnilearn.accelerate and omnilearn.hf under torchrun, 2 ranks on gloo.

Each script (frameworks_<name>_script.py) first meets two wrong set-ups (each one UserError), then
trains with the controller; the checks are framework_checks.report's and the run folder's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from framework_checks import EPOCHS, GLOBAL_BATCH, SAMPLES

from jobs import decisions_replay

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).with_name("torchrun")

# what each script's wrong set-ups must name
REFUSALS = {
    "lightning": ("accumulate_grad_batches=2", "WeightedRandomSampler"),
    "accelerate": ("gradient_accumulation_steps=2", "WeightedRandomSampler", "start_up comes after"),
    "hf": ("gradient_accumulation_steps=2", "map-style"),
}


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'pytorch'}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    env.pop("OMNILEARN_OUT", None)
    return env


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_two_ranks_get_shares_and_the_global_batch_gradient(name: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone",
                           str(HERE / f"frameworks_{name}_script.py"), str(out), str(tmp_path / "scratch")],
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith('{"grad_error"')][-1])
    assert result["grad_error"] < 1e-5, result  # the update is the gradient of the whole global batch
    assert result["identical"]  # ranks started from different weights and end with the same ones
    assert result["every_sample_once"] == [True] * EPOCHS, result
    assert any(len(set(s)) > 1 for s in result["shares"] if sum(s) == GLOBAL_BATCH), result  # the shares moved
    for error, culprit in zip(result["errors"], REFUSALS[name], strict=True):
        assert culprit in error, result["errors"]
    assert not (tmp_path / "runs").exists()  # the refused set-ups started nothing
    assert result["broadcast_buffers"] is False  # no collective of DDP's inside the step
    for rank in (0, 1):
        kinds = {json.loads(line)["kind"] for line in (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()}
        assert {"start", "step", "end", "batch_change"} <= kinds
    recorded, replayed = decisions_replay(out)  # the controller decided on the times the all-reduce carried
    assert any(r["reason"] == "compute-time" for r in recorded) and recorded == replayed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "dynamic" and summary["workers"] == 2 and summary["global_batch"] == GLOBAL_BATCH
    assert summary["samples"] == EPOCHS * SAMPLES and summary["epochs_done"] == EPOCHS
    probes = [r for r in recorded if r["reason"] == "probe"]  # the loop's own step timed before step 1
    assert len(probes) == 1 and probes[0]["step"] == 0 and probes[0]["warm"] is False, recorded
    assert result["probe_left_no_trace"], result
    if name == "lightning":
        assert result["broadcasts_between_steps"] == 0  # Lightning's SIGTERM flag rode the all-reduce
        stopped = sorted(json.loads(line)["stopped_rank"] for line in proc.stdout.splitlines()
                         if line.startswith('{"stopped_rank"'))
        steps = {json.loads(line)["steps"] for line in proc.stdout.splitlines() if line.startswith('{"stopped_rank"')}
        assert stopped == [0, 1] and steps == {3}, proc.stdout[-2000:]  # rank 1's SIGTERM stopped both, together


def test_importing_omnilearn_imports_no_framework() -> None:
    code = ("import sys, omnilearn, omnilearn.torch, omnilearn.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'accelerate', "
            "'transformers'}))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_ddp_hook_over_several_buckets_in_one_or_in_several_collectives(tmp_path: Path) -> None:
    proc = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone",
                           str(HERE / "frameworks_ddp_hook_script.py"), str(tmp_path)],
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"grad_error"')]
    assert [r["one_collective"] for r in results] == [True, False]
    for r in results:
        assert r["grad_error"] < 1e-5, r  # the global batch's gradient, whichever way the buckets travel
        assert r["every_sample_once"] == [True] * EPOCHS and r["identical"]
        assert r["buckets"] >= 2, r
        (start0, end0), (start1, end1) = r["marks"]
        assert start0 == start1 == 0.0 and end0 != end1, r["marks"]  # rank 0's buffers once, then each rank's own
    one, per_bucket = results
    assert one["all_reduces"] == one["steps"]  # one collective a step, carrying every bucket and the times
    assert per_bucket["all_reduces"] > per_bucket["steps"]
