"""ASP: the parameter server (in process) and whole jobs (server + 3 workers over TensorPipe RPC)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs import live_workers
from omnilearn import config
from omnilearn.emulator.plan import SERVER_TARGET, build_plan
from omnilearn.errors import UserError
from omnilearn.files import read_records as read_jsonl
from omnilearn.jobfile import JobSpec
from omnilearn.train.asp import IndexStream
from omnilearn.train.distributed import flat_state
from omnilearn.train.parameter_server import LockedWriter, ParameterServer

# ---------------------------------------------------------------------------------------- in process


class TinyBN(torch.nn.Module):
    """A linear layer and a BatchNorm: parameters and running statistics in one small model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


def make_server(tmp_path: Path, *sets: tuple[str, Any], train_size: int = 100) -> ParameterServer:
    overrides = [("mode", "asp"), ("workers", 2), ("train.global_batch", 16), ("train.epochs", 1),
                 ("train.lr", 0.1), ("train.momentum", 0.0), ("train.weight_decay", 0.0),
                 ("emulation.backend", "none"), ("emulation.hl", "HL1"), *sets]
    cfg = config.build(None, overrides)
    job = JobSpec(job_id="t", config=cfg, plan=build_plan(cfg), out_dir=tmp_path, backend="none")
    torch.manual_seed(0)
    return ParameterServer(job, TinyBN(), train_size, LockedWriter(tmp_path / "metrics" / "rank-0.jsonl"))


def push(server: ParameterServer, rank: int, seq: int, version: int, flat: torch.Tensor, batch: int,
         compute_s: float = 0.1) -> dict[str, Any]:
    stats = {"loss": 1.0, "correct": 0, "compute_s": compute_s, "level": server.level}
    return server.push(rank, seq, version, flat, batch, stats)


def records(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(tmp_path / "metrics" / "rank-0.jsonl") if r["kind"] == kind]


def test_flat_state_makes_parameters_and_buffers_views() -> None:
    model = TinyBN()
    flat, n_params = flat_state(model)
    assert n_params == 3 * 2 + 2 + 2 + 2  # fc weight, fc bias, bn weight, bn bias
    assert flat.numel() == n_params + 4  # running mean and var
    flat.fill_(7.0)
    assert float(model.fc.weight[0, 0].detach()) == 7.0 and float(model.bn.running_var[1]) == 7.0
    model(torch.randn(5, 3))  # a training forward updates the running statistics inside ``flat``
    assert float(flat[n_params]) != 7.0


def test_push_is_applied_once_with_linear_lr_scaling(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    assert server.b_ref == 8  # global_batch / workers
    before = server.state.clone()
    grad = torch.zeros_like(server.state)
    grad[: server.n_params] = 1.0
    reply = push(server, 1, 1, 0, grad, batch=4)
    assert reply["version"] == 1 and reply["staleness"] == 0 and reply["lr"] == pytest.approx(0.1 * 4 / 8)
    # Plain SGD: every parameter moved by lr * b / b_ref * gradient.
    assert torch.allclose(server.state[: server.n_params], before[: server.n_params] - 0.05)
    # The same push again (a retry after an RPC timeout): answered, not applied.
    again = push(server, 1, 1, 0, grad, batch=4)
    assert again == reply and server.version == 1
    assert torch.allclose(server.state[: server.n_params], before[: server.n_params] - 0.05)
    # A stale gradient from the other worker, computed on version 0, applied at version 1.
    reply2 = push(server, 2, 1, 0, grad, batch=12)
    assert reply2["staleness"] == 1 and reply2["version"] == 2 and reply2["lr"] == pytest.approx(0.1 * 12 / 8)
    updates = records(tmp_path, "update")
    assert [(u["worker"], u["seq"], u["version"], u["staleness"]) for u in updates] == [(1, 1, 1, 0), (2, 1, 2, 1)]
    assert len(records(tmp_path, "duplicate")) == 1
    with pytest.raises(AssertionError, match="seq 3 after 1"):
        push(server, 1, 3, 2, grad, batch=4)  # a lost push is an internal error, never skipped silently


def test_adamw_scales_the_update_lr_instead_of_the_gradient(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("train.optimizer", "adamw"))
    grad = torch.ones_like(server.state)
    reply = push(server, 1, 1, 0, grad, batch=4)
    assert reply["lr"] == pytest.approx(0.05) and server.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert torch.equal(server.grads.flat, grad[: server.n_params])  # Adam would normalise a scale away


def test_staleness_damping_divides_the_lr(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("asp.staleness_damping", True), ("asp.lr_reference_batch", 4))
    grad = torch.zeros_like(server.state)
    push(server, 1, 1, 0, grad, batch=4)
    push(server, 1, 2, 1, grad, batch=4)
    reply = push(server, 2, 1, 0, grad, batch=8)  # staleness 2
    assert reply["staleness"] == 2 and reply["lr"] == pytest.approx(0.1 * 8 / 4 / 3)


def test_batchnorm_statistics_add_up_as_changes(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    n = server.n_params
    start = server.state[n:].clone()
    # Both workers pulled version 0; each pushes what its forward pass did to the statistics.
    for rank, delta in ((1, 0.5), (2, 0.25)):
        flat = torch.zeros_like(server.state)
        flat[n:] = delta
        push(server, rank, 1, 0, flat, batch=8)
    assert torch.allclose(server.state[n:], start + 0.75)  # neither change overwrote the other
    assert int(server.model.bn.num_batches_tracked) == 2


def test_server_dynamic_rebalances_on_one_measurement_of_each_worker(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("control.policy", "dynamic"))
    flat = torch.zeros_like(server.state)
    push(server, 1, 1, 0, flat, batch=8, compute_s=0.4)
    push(server, 1, 2, 1, flat, batch=8, compute_s=0.4)  # worker 2 has no measurement yet: no decision
    assert server.controller.batch == [8, 8] and server.controller.holds == {"uncertain": 2}
    reply = push(server, 2, 1, 2, flat, batch=8, compute_s=0.1)  # worker 1 is 4x slower
    assert server.controller.batch[0] <= 3 and reply["batch"] == server.controller.batch[1]
    assert sum(server.controller.batch) == 16
    change = records(tmp_path, "batch_change")[-1]
    assert change["old"] == [8, 8] and change["reason"] == "compute-time" and change["gain_s"] > 0


def test_server_controller_rebalances_without_a_barrier(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("control.policy", "dynamic-v1"), ("control.min_samples", 2),
                         ("control.deadband", 0.05))
    flat = torch.zeros_like(server.state)
    assert server.controller.batch == [8, 8]
    push(server, 1, 1, 0, flat, batch=8, compute_s=0.4)
    push(server, 1, 2, 1, flat, batch=8, compute_s=0.4)  # worker 2 has no measurement yet: no decision
    assert server.controller.batch == [8, 8]
    push(server, 2, 1, 2, flat, batch=8, compute_s=0.1)
    reply = push(server, 2, 2, 3, flat, batch=8, compute_s=0.1)  # worker 1 is 4x slower
    assert server.controller.batch == [3, 13] and reply["batch"] == 13
    assert sum(server.controller.batch) == 16
    # Worker 1 learns its size at its next push; its time at the old size must not count.
    reply = push(server, 1, 3, 4, flat, batch=8, compute_s=0.4)
    assert reply["batch"] == 3 and server.controller.estimates()[1][0] == 0
    changes = records(tmp_path, "batch_change")
    assert changes[-1]["old"] == [8, 8] and changes[-1]["batch"] == [3, 13]


def test_server_dynamic_is_never_told_the_allocations_or_the_level(tmp_path: Path) -> None:
    schedule = tmp_path / "sched.yaml"
    schedule.write_text("unit: seconds\npoints:\n  - {at: 0, level: EVEN}\n  - {at: 5, level: SKEW}\n")
    server = make_server(tmp_path, ("emulation.hl", None), ("emulation.schedule", str(schedule)),
                         ("emulation.backend", "auto"), ("emulation.allocation", "quota"),
                         ("emulation.levels", {"EVEN": [0.5, 0.5], "SKEW": [0.2, 0.6]}),
                         ("control.policy", "dynamic-v1"), ("control.min_samples", 2))

    def unreadable(level: str) -> list[float | None]:
        raise AssertionError("the dynamic policy was given the allocations")

    server.shares = unreadable  # type: ignore[method-assign]
    flat = torch.zeros_like(server.state)
    push(server, 1, 1, 0, flat, batch=8, compute_s=0.2)
    push(server, 1, 2, 1, flat, batch=8, compute_s=0.2)
    server.t_start = time.time() - 6  # six seconds into training: the schedule moves to SKEW
    with server.lock:
        server.advance()
    assert server.level == "SKEW" and server.controller.batch == [8, 8]  # nothing moved on the event
    assert server.controller.estimates()[1][0] == 2  # and nothing measured was dropped
    push(server, 2, 1, 2, flat, batch=8, compute_s=0.6)
    push(server, 2, 2, 3, flat, batch=8, compute_s=0.6)  # measured: worker 2 is 3x slower
    assert server.controller.batch == [12, 4]


def test_a_seconds_schedule_moves_the_level_and_static_batches_follow(tmp_path: Path) -> None:
    schedule = tmp_path / "sched.yaml"
    schedule.write_text("unit: seconds\npoints:\n  - {at: 0, level: EVEN}\n  - {at: 5, level: SKEW}\n")
    server = make_server(tmp_path, ("emulation.hl", None), ("emulation.schedule", str(schedule)),
                         ("emulation.backend", "auto"), ("emulation.allocation", "quota"),
                         ("emulation.levels", {"EVEN": [0.5, 0.5], "SKEW": [0.2, 0.6]}),
                         ("control.policy", "static"))
    assert server.level == "EVEN" and server.controller.batch == [8, 8]
    server.t_start = time.time() - 6  # six seconds into training
    with server.lock:
        server.advance()
    assert server.level == "SKEW" and server.controller.batch == [4, 12]  # in proportion to 0.2 : 0.6
    assert records(tmp_path, "batch_change")[-1]["reason"] == "allocation"
    _, control = server.pull(1)
    assert control["level"] == "SKEW" and control["batch"] == 4 and control["elapsed"] >= 6


def test_training_stops_at_the_target_samples(tmp_path: Path) -> None:
    server = make_server(tmp_path, train_size=20)  # 1 epoch: 20 samples
    flat = torch.zeros_like(server.state)
    assert not push(server, 1, 1, 0, flat, batch=8)["stop"]
    assert not push(server, 2, 1, 1, flat, batch=8)["stop"]
    assert push(server, 1, 2, 2, flat, batch=8)["stop"]  # 24 >= 20
    state, control = server.pull(2)
    assert state is None and control["stop"] and all(server.stopped)
    reply = push(server, 2, 2, 2, flat, batch=8)  # a gradient in flight is still applied
    assert reply["stop"] and server.version == 4 and server.samples == 32


def test_index_stream_sees_every_sample_once_per_pass() -> None:
    stream = IndexStream(10, seed=1, rank=1)
    taken = torch.cat([stream.take(k) for k in (3, 4, 2, 5, 6)])  # 20 indices: two passes
    assert sorted(taken[:10].tolist()) == list(range(10)) and sorted(taken[10:].tolist()) == list(range(10))
    assert not torch.equal(taken[:10], taken[10:])
    other = IndexStream(10, seed=1, rank=2).take(10)
    assert not torch.equal(other, taken[:10])
    assert torch.equal(IndexStream(10, seed=1, rank=1).take(20), taken)


def test_asp_targets_are_in_rank_order_and_levels_may_set_the_server(tmp_path: Path) -> None:
    cfg = config.build(None, [("mode", "asp"), ("workers", 3), ("emulation.allocation", "quota"),
                              ("emulation.levels", {"SKEW": [0.3, 0.15, 0.3, 1.2]}), ("emulation.hl", "SKEW")])
    plan = build_plan(cfg, host=[0, 1])
    assert plan.targets == (SERVER_TARGET, "aspworker2", "aspworker3", "aspworker4")
    assert [plan.allocation("SKEW", t).cpus for t in plan.targets] == [0.3, 0.15, 0.3, 1.2]
    cfg3 = config.build(None, [("mode", "asp"), ("workers", 3), ("emulation.allocation", "quota"),
                               ("emulation.levels", {"SKEW": [0.15, 0.3, 1.2]}), ("emulation.hl", "SKEW")])
    assert build_plan(cfg3, host=[0, 1]).allocation("SKEW", SERVER_TARGET).cpus is None  # unlimited
    paper = build_plan(config.build(None, [("mode", "asp"), ("emulation.hl", "HL8"),
                                           ("emulation.allocation", "quota")]), host=[0, 1])
    assert paper.targets[0] == SERVER_TARGET
    assert [round(paper.allocation("HL8", t).cpus, 3) for t in paper.targets] == [0.333, 0.167, 0.167, 0.167, 1.167]
    with pytest.raises(UserError, match=r"emulation.levels.SKEW: has 2 entries for 3 workers \(or 4"):
        build_plan(config.build(None, [("mode", "asp"), ("workers", 3), ("emulation.hl", "SKEW"),
                                       ("emulation.levels", {"SKEW": [0.3, 0.3]})]), host=[0, 1])


@pytest.mark.parametrize("key,value,message", [
    ("asp.eval_interval", 0, "asp.eval_interval: must be positive"),
    ("asp.worker_timeout_s", -1, "asp.worker_timeout_s: must be positive"),
    ("asp.lr_reference_batch", 0, "asp.lr_reference_batch: must be at least 1"),
    ("asp.bogus", 1, "unknown key 'asp.bogus'"),
    ("asp.worker_timeout_s", 20, "asp.worker_timeout_s: 20 must exceed emulation.ack_timeout 20"),
])
def test_asp_config_errors_name_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(UserError, match=message):
        config.build(None, [("mode", "asp"), (key, value)])


# ---------------------------------------------------------------------------------------- whole jobs

# 1 server + 3 workers; quotas 0.15 / 0.3 / 1.2 CPU (8x) for the workers and 0.3 for the server.
JOB = """
mode: asp
workers: 3
model: {name: smallcnn}
data: {name: synthetic, image_size: 64, synthetic_size: 1536}
train: {epochs: EPOCHS, global_batch: 192, lr: 0.02, momentum: 0.0}
control: {policy: dynamic, window: 3, min_samples: 2, deadband: 0.1}
asp: {worker_timeout_s: TIMEOUT, eval_interval: 1}
emulation:
  backend: auto
  allocation: quota
  ack_timeout: 5
  hl: SKEW
  levels:
    SKEW: [0.3, 0.15, 0.3, 1.2]
"""


def write_job(tmp_path: Path, epochs: int = 3, timeout: float = 20) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.replace("EPOCHS", str(epochs)).replace("TIMEOUT", str(timeout)))
    return path


def check_exactly_once(run: Path, workers: int, lr: float, b_ref: float) -> list[dict[str, Any]]:
    """Every push applied once, versions 1, 2, 3..., staleness and lr as recomputed from the records."""
    server = read_jsonl(run / "metrics" / "rank-0.jsonl")
    updates = [r for r in server if r["kind"] == "update"]
    ends = [[r for r in read_jsonl(run / "metrics" / f"rank-{w}.jsonl") if r["kind"] == "end"][-1]
            for w in range(1, workers + 1)]
    assert len(updates) == sum(e["pushes"] for e in ends)
    assert [u["version"] for u in updates] == list(range(1, len(updates) + 1))
    for w in range(1, workers + 1):
        mine = [u["seq"] for u in updates if u["worker"] == w]
        assert mine == list(range(1, ends[w - 1]["pushes"] + 1))  # each of its pushes, once, in order
    for u in updates:
        assert u["staleness"] == u["version"] - 1 - u["grad_version"] >= 0
        assert u["lr"] == pytest.approx(lr * u["batch"] / b_ref)
    # What the workers were told matches what the server recorded.
    for w in range(1, workers + 1):
        steps = [r for r in read_jsonl(run / "metrics" / f"rank-{w}.jsonl") if r["kind"] == "step"]
        mine = {u["seq"]: u for u in updates if u["worker"] == w}
        assert all(mine[s["seq"]]["grad_version"] == s["version"] and mine[s["seq"]]["staleness"] == s["staleness"]
                   for s in steps)
    end = [r for r in server if r["kind"] == "end"][-1]
    assert end["samples"] == sum(u["batch"] for u in updates) >= end["target_samples"]
    return updates


@pytest.mark.slow
def test_asp_compare_applies_every_gradient_once_and_evens_update_rates(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", str(write_job(tmp_path)), "--compare",
                        "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    summaries = {}
    for policy in ("uniform", "dynamic"):
        run = out / policy
        check_exactly_once(run, 3, lr=0.02, b_ref=64)
        s = json.loads((run / "summary.json").read_text())
        summaries[policy] = s
        for key in ("mode", "policy", "backend", "workers", "global_batch", "epochs", "wall_time_s", "samples_per_s",
                    "final_accuracy", "final_loss", "batch_sizes", "allocations", "compute_ms", "imbalance",
                    "hl_changes", "batch_changes", "update_rates", "update_rate_spread", "staleness_mean",
                    "staleness_p95"):
            assert key in s and s[key] is not None, (policy, key)
        assert s["mode"] == "asp" and s["global_batch"] == sum(s["batch_sizes"]) == 192
        assert s["allocations"] == pytest.approx([0.15, 0.3, 1.2])
        assert s["accuracy_curve"][-1]["epoch"] >= 3 and len(s["accuracy_curve"]) >= 3
        snapshots = sorted((run / "snapshots").glob("snapshot-*.pt"))
        assert len(snapshots) == len(s["accuracy_curve"])
        assert (run / "run.png").stat().st_size > 10_000
        assert not (run / "snapshots" / "checkpoint.pt").exists()
        if os.geteuid() == 0:
            assert s["backend"].startswith("cgroup")
    u, d = summaries["uniform"], summaries["dynamic"]
    assert u["batch_changes"] == 0 and d["batch_changes"] >= 1
    assert d["batch_sizes"][2] > 64 > d["batch_sizes"][0]  # batch moved to the 1.2-CPU worker
    # Uniform batches: each worker updates as often as its speed allows (8x apart by quota); the
    # controller evens the rates out. A busy host squeezes the fast worker's quota (another job's
    # threads compete for the same 2 CPUs): the uniform run's measured speed ratio says how much
    # heterogeneity there was to remove. Three epochs leave the controller two or three decisions, and
    # a step's time here is not linear in its batch (per-sample time grows with the batch), so the
    # rates are even only within noise: 1.04-1.20 in quiet and loaded runs, 1.66 seen on a busy
    # host. The dynamic run removes at least half the uniform spread (on a log scale), and never
    # needs to do better than 1.6.
    measured = u["level_speeds"]["SKEW"]["measured_ratio"]
    assert d["update_rate_spread"] < max(1.6, math.sqrt(u["update_rate_spread"])), (u, d)
    if measured >= 2:
        assert d["update_rate_spread"] < u["update_rate_spread"], (u, d)
    if measured >= 3:
        assert u["update_rate_spread"] >= 2, (u, d)
    c = json.loads((out / "compare.json").read_text())
    assert c["update_rate_spread"] == {"uniform": u["update_rate_spread"], "dynamic": d["update_rate_spread"]}
    assert (out / "compare.png").stat().st_size > 10_000


def _start(tmp_path: Path, timeout: float) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "omnilearn", "run", "--config",
                             str(write_job(tmp_path, epochs=50, timeout=timeout)), "--out", str(out),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics" / "rank-0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count('"kind":"update"') >= 6):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    return proc, out


def _pid_of_rank(out: Path, rank: int) -> int:
    pids = live_workers(out)
    assert rank in pids, pids
    return pids[rank]


def _assert_cleaned_up(out: Path) -> None:
    job_id = json.loads((out / "job.json").read_text())["job_id"]
    for ctrl in ("cpu", "cpuset"):
        assert not Path(f"/sys/fs/cgroup/{ctrl}/omnilearn/{job_id}").exists()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and str(out / "job.json") in Path(p, "cmdline").read_bytes().decode(errors="replace")
                and "zombie" not in Path(p, "status").read_text()]


@pytest.mark.slow
def test_a_killed_asp_worker_stops_the_job_with_its_rank_and_a_checkpoint(tmp_path: Path) -> None:
    proc, out = _start(tmp_path, timeout=20)
    t0 = time.time()
    os.kill(_pid_of_rank(out, 2), signal.SIGKILL)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert "ASP worker rank 2 (aspworker3) died: SIGKILL" in output
    assert time.time() - t0 < 15
    saved = torch.load(out / "snapshots" / "checkpoint.pt", weights_only=True)
    assert saved["progress"]["version"] >= 6 and set(saved) >= {"model", "optimizer", "controller", "progress"}
    fault = [r for r in read_jsonl(out / "metrics" / "rank-0.jsonl") if r["kind"] == "fault"]
    assert fault and fault[-1]["checkpoint"] == str(out / "snapshots" / "checkpoint.pt")
    _assert_cleaned_up(out)


@pytest.mark.slow
def test_a_hung_asp_worker_is_detected_by_the_server_watchdog(tmp_path: Path) -> None:
    proc, out = _start(tmp_path, timeout=6)
    victim = _pid_of_rank(out, 1)
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)  # alive but silent: only the server can tell
    try:
        output, _ = proc.communicate(timeout=60)
    finally:
        if Path(f"/proc/{victim}").exists():
            os.kill(victim, signal.SIGCONT)
    assert proc.returncode == 1, output
    # The server's watchdog stops the job; the launcher then names the silent rank and why it is silent.
    assert ("ASP worker rank 1 (aspworker2) sent nothing for more than 6 s" in output
            or "ASP worker rank 1 (aspworker2) made no step" in output and "stopped (SIGSTOP?)" in output), output
    assert time.time() - t0 < 6 + 15
    assert (out / "snapshots" / "checkpoint.pt").is_file()
    _assert_cleaned_up(out)
