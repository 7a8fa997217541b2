"""omnilearn.torch under torchrun, 2 ranks on gloo: the library's guarantees and its run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_two_ranks_keep_the_global_batch_gradient_and_write_a_run_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch"), "OMP_NUM_THREADS": "1"}
    env.pop("OMNILEARN_OUT", None)
    out = tmp_path / "run"
    proc = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone",
                           str(ROOT / "tests" / "torch_lib_script.py"), str(out), "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["grad_error"] < 1e-5  # the update is the gradient of the whole global batch
    assert result["identical"]  # ranks started from different weights and end with the same ones
    assert result["every_sample_once"] == [True, True]
    assert any(a != b for a, b in result["shares"] if a + b == 32), result["shares"]  # the controller moved them
    assert not [t for t in result["threads_after_destroy"] if "gloo" in t], result["threads_after_destroy"]
    for rank in (0, 1):
        kinds = {json.loads(line)["kind"] for line in (out / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()}
        assert {"start", "step", "end", "batch_change"} <= kinds
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "dynamic" and summary["workers"] == 2 and summary["global_batch"] == 32
    assert summary["samples"] == 2 * 403 and summary["epochs_done"] == 2
