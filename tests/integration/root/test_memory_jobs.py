"""Memory limits in whole jobs (the memory cgroup: root), and the budget a process reads from its cgroup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT_CGROUP = Path("/sys/fs/cgroup/memory")


needs_memory_cgroup = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(ROOT_CGROUP, os.W_OK),
    reason="needs root and a writable cgroup v1 memory controller")


@needs_memory_cgroup
def test_budget_is_read_from_the_processes_cgroup(tmp_path: Path) -> None:
    cg = ROOT_CGROUP / f"omnilearn-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text(str(3 * 2**30))
        code = (f"import os,sys; open('/sys/fs/cgroup/memory/{cg.name}/cgroup.procs','w').write(str(os.getpid()));"
                "from omnilearn.train.memory import memory_budget; import torch;"
                "b=memory_budget(torch.device('cpu')); print(b.bytes, b.source)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        size, source = out.stdout.split(maxsplit=1)
        assert int(size) == 3 * 2**30 and "cgroup v1" in source
    finally:
        cg.rmdir()


JOB = """
mode: bsp
workers: 2
model: {name: smallcnn}
data: {name: synthetic, image_size: 128, synthetic_size: 384}
train: {epochs: 1, global_batch: 128, lr: 0.05, eval_every: 1}
control: {policy: POLICY, interval: 2}
emulation:
  backend: cgroup
  allocation: quota
  hl: LIMITED
  levels:
    LIMITED: [{cpus: 1.0, memory: LIMIT0}, {cpus: 1.0, memory: LIMIT1}]
"""


def _run(tmp_path: Path, name: str, policy: str, limit0: str, limit1: str, job: str = JOB
         ) -> tuple[subprocess.CompletedProcess, Path]:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(job.replace("POLICY", policy).replace("LIMIT0", limit0).replace("LIMIT1", limit1))
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", str(cfg), "--out", str(out),
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    return r, out


def _records(path: Path, kind: str) -> list[dict]:
    return [rec for rec in map(json.loads, path.read_text().splitlines()) if rec["kind"] == kind]


@needs_memory_cgroup
def test_memory_limited_worker_is_killed_under_uniform_and_finishes_under_dynamic(tmp_path: Path) -> None:
    # Worker 1 may use 800 MiB: the uniform split (64 images of 128x128 through the CNN, about
    # 0.45 GiB over the ~0.5 GiB the process has charged) does not fit; about 20 samples do.
    r, _ = _run(tmp_path, "uniform", "uniform", "800M", "8G")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "worker rank 0 died: SIGKILL" in r.stdout + r.stderr  # the kernel's OOM killer
    r, out = _run(tmp_path, "dynamic", "dynamic", "800M", "8G")
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    bounds = _records(out / "metrics" / "rank-0.jsonl", "memory_bounds")
    assert bounds and bounds[0]["enforced"] and bounds[0]["max_batch"][0] < 64 <= bounds[0]["max_batch"][1]
    steps = _records(out / "metrics" / "rank-0.jsonl", "step")
    assert steps and all(st["batch"] <= bounds[0]["max_batch"][0] for st in steps)
    assert sum(s["batch_sizes"]) == 128 and s["final_accuracy"] is not None


@needs_memory_cgroup
def test_a_global_batch_that_cannot_fit_stops_before_training(tmp_path: Path) -> None:
    # 800 MiB each: the start-up probe (16 samples) fits, as in the test above; 64 samples a worker do not.
    r, out = _run(tmp_path, "nofit", "dynamic", "800M", "800M")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not fit in the workers' memory" in r.stderr and "train.global_batch=128" in r.stderr
    assert not _records(out / "metrics" / "rank-0.jsonl", "step")


ASP_JOB = """
mode: asp
workers: 2
model: {name: smallcnn}
data: {name: synthetic, image_size: 128, synthetic_size: 384}
train: {epochs: 1, global_batch: 128, lr: 0.02, momentum: 0.0}
control: {policy: POLICY}
asp: {eval_interval: 1, worker_timeout_s: 60}
emulation:
  backend: cgroup
  allocation: quota
  hl: LIMITED
  levels:
    LIMITED: [{cpus: 1.0, memory: LIMIT0}, {cpus: 1.0, memory: LIMIT1}]
"""


@needs_memory_cgroup
def test_asp_server_keeps_a_memory_limited_worker_under_its_bound(tmp_path: Path) -> None:
    # ASP worker rank 1 (aspworker2) may use 800 MiB: like in BSP, its uniform share (64) would not fit.
    r, out = _run(tmp_path, "dynamic", "dynamic", "800M", "8G", ASP_JOB)
    assert r.returncode == 0, r.stdout + r.stderr
    server = out / "metrics" / "rank-0.jsonl"
    bounds = _records(server, "memory_bounds")
    assert bounds and bounds[0]["enforced"] and bounds[0]["max_batch"][0] < 64 <= bounds[0]["max_batch"][1]
    updates = _records(server, "update")
    limit = bounds[0]["max_batch"][0]
    assert updates and all(u["batch"] <= limit for u in updates if u["worker"] == 1)
    assert {u["worker"] for u in updates} == {1, 2}
    s = json.loads((out / "summary.json").read_text())
    assert 0 < sum(s["batch_sizes"]) <= 128 and s["final_accuracy"] is not None  # dynamic may push less


@needs_memory_cgroup
def test_asp_global_batch_that_cannot_fit_stops_before_training(tmp_path: Path) -> None:
    r, out = _run(tmp_path, "nofit", "dynamic", "600M", "600M", ASP_JOB)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not fit in the ASP workers' memory" in r.stderr and "train.global_batch=128" in r.stderr
    assert not _records(out / "metrics" / "rank-0.jsonl", "update")
    assert not (out / "snapshots" / "checkpoint.pt").exists()
