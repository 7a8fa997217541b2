"""``omnilearn record`` around unmodified DDP loops: the timing module's step records, as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.metrics import read_rank
from omnilearn.records import END, START, STEP, of_kind

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("hook_ddp_script.py")


def _record(tmp_path: Path, *script_args: str, ranks: int = 2, name: str = "rec") -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / name
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "omnilearn", "record", "--out", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           str(SCRIPT), "--report", str(tmp_path / f"{name}.json"), *script_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240), out


def _steps(out: Path, rank: int) -> list[dict]:
    return of_kind(read_rank(out, rank), STEP)


@pytest.mark.parametrize("hook", ["--own-hook", "--late-hook"])
def test_every_rank_of_a_ddp_loop_records_its_steps_once_each_and_whatif_reads_them(tmp_path: Path, hook: str) -> None:
    """Gradient accumulation under no_sync, AMP and the script's own comm hook (kept, wrapped; registered
    before the first forward, or after the first step) in one loop."""
    accumulate = 3
    proc, out = _record(tmp_path, "--steps", "5", "--micro", "8", "--accumulate", str(accumulate), "--amp", hook)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step records (hook) of rank(s) 0, 1" in proc.stderr
    seen = json.loads((tmp_path / "rec.json").read_text())
    assert seen["hook_calls"] >= (5 if hook == "--own-hook" else 4)  # its hook ran on every bucket of its steps
    assert seen["model_freed"]  # the timing module keeps no reference to the script's model
    for rank in (0, 1):
        steps = _steps(out, rank)
        assert len(steps) == 5  # accumulation steps counted once; the evaluation is no step
        assert all(s["source"] == "hook" and s["batch"] == 8 * accumulate and s["global_batch"] == 16 * accumulate
                   for s in steps)
        assert all(s["compute_ms"] > 0 and s["sync_ms"] >= 0 for s in steps)
        records = read_rank(out, rank)
        assert of_kind(records, START)[0]["library"] == "hook"
        end = of_kind(records, END)[-1]
        assert end["steps"] == 5 and end["samples"] == 5 * 16 * accumulate
    job = json.loads((out / "job.json").read_text())["config"]
    assert job["workers"] == 2 and job["train"]["global_batch"] == 16 * accumulate
    assert job["control"]["policy"] == "uniform"
    from omnilearn.cli import main

    assert main(["whatif", str(out)]) == 0  # the command's own function, in this process: no start-up to pay
    result = json.loads((out / "whatif.json").read_text())
    assert result["workers"] == 2 and result["steps"] == 5
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["models"]["k_status"] == "not identified"  # one batch size: k assumed, and said


def test_a_script_without_ddp_gets_one_line(tmp_path: Path) -> None:
    proc, out = _record(tmp_path, "--steps", "2", "--no-ddp", ranks=1)  # one rank: its all-reduce is no DDP's
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no step records: the command wrapped no DistributedDataParallel model" in proc.stderr
    assert not (out / "metrics" / "rank-0.jsonl").exists()


def test_record_passes_the_commands_exit_status(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "record", "--out", str(tmp_path / "x"), "--",
                           sys.executable, "-c", "raise SystemExit(3)"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "no step records" in proc.stderr


@pytest.mark.parametrize("args", [[], ["--", ]])
def test_record_without_a_command_is_a_user_error(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "record", "--out", str(tmp_path / "x"), *args],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give a command" in proc.stderr
    assert not (tmp_path / "x").exists()  # nothing half-started


def test_record_into_a_folder_in_use_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "record", "--out", str(tmp_path / "x"), "--", "true"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--out" in proc.stderr and "not an empty folder" in proc.stderr
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_the_timing_module_waits_for_the_scripts_own_import_of_torch_and_keeps_the_sitecustomize_it_shadows(
        tmp_path: Path) -> None:
    """A script may set its threads before it imports torch: nothing is imported at start-up; DDP is
    patched once the script's ``import torch`` has run; the environment's own sitecustomize still runs."""
    from omnilearn.launch.emulate import BOOTSTRAP

    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.OWN_SITECUSTOMIZE = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(own), str(ROOT / "pytorch")]),
           "OMNILEARN_HOOK": "1", "RANK": "0"}
    # a library may look for torch before it imports it (transformers does): the import still patches DDP
    probe = ("import builtins, importlib.util, sys; before = 'torch' in sys.modules; importlib.util.find_spec('torch'); "
             "import torch; "
             "from torch.nn.parallel import DistributedDataParallel as D; "
             "print(before, getattr(D, '_omnilearn_timed', False), getattr(builtins, 'OWN_SITECUSTOMIZE', False))")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True", "True"]
    proc = subprocess.run([sys.executable, "-c", probe], env={**env, "OMNILEARN_HOOK": "0"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False", "True"]  # left out on request
