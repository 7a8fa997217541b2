"""ASP: the parameter server (in process) and whole jobs (server + 3 workers over TensorPipe RPC)."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from omnilearn import config
from omnilearn.emulator.spec.plan import SERVER_TARGET, build_plan
from omnilearn.errors import UserError
from omnilearn.files import read_records as read_jsonl
from omnilearn.jobfile import JobSpec
from omnilearn.train import asp as asp_worker
from omnilearn.train import parameter_server
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
                 ("emulation.backend", "none"), ("emulation.hl", "HL1"),
                 ("asp.batch_tolerance", None),  # one tolerance for delay and batch, as each test sets it
                 ("asp.second_moment", "push"), ("asp.warmup_epochs", 0.0), *sets]  # the rule's hand computations
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
    server = make_server(tmp_path, ("train.optimizer", "sgd"), ("asp.delay_tolerance", math.inf))
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


def test_a_push_beyond_the_cap_makes_later_ones_staler_by_its_step_only(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("train.optimizer", "sgd"), ("asp.delay_tolerance", 1.0))
    grad = torch.zeros_like(server.state)
    push(server, 1, 1, 0, grad, batch=24)  # 3 units of samples, a step of 1 unit (the cap, rho = 1)
    push(server, 2, 1, 0, grad, batch=4)  # computed before it: 1 unit late, not 3
    late = [u["staleness_time"] for u in records(tmp_path, "update")]
    assert late == pytest.approx([0.0, 1.0])
    assert server.kclock == pytest.approx(1.5)  # the steps taken: 1 and half a unit


def test_scaled_gradient_adamw_weighs_each_gradient_by_its_batch_and_keeps_its_lr(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("train.optimizer", "adamw"), ("asp.update", "scaled-gradient"))
    optimizer = server.rule.optimizer
    n = server.n_params
    grad = torch.ones_like(server.state)
    reply = push(server, 1, 1, 0, grad, batch=4)
    # A 4-sample gradient counts half an 8-sample one (b_ref = 16 / 2), in Adam's moments as in SGD's
    # momentum; the optimizer's lr stays the base lr, which every gradient in its moments shares.
    assert reply["lr"] == pytest.approx(0.1 * 4 / 8) and optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert torch.allclose(server.grads.flat, 0.5 * grad[:n])
    first = next(iter(optimizer.state.values()))["exp_avg"].clone()
    push(server, 2, 1, 0, grad, batch=12)  # then a 12-sample one: 1.5 times the weight
    second = next(iter(optimizer.state.values()))["exp_avg"]
    beta1 = optimizer.param_groups[0]["betas"][0]
    assert torch.allclose(first, torch.full_like(first, (1 - beta1) * 0.5))
    assert torch.allclose(second, beta1 * first + (1 - beta1) * 1.5)
    root = make_server(tmp_path / "sqrt", ("train.optimizer", "adamw"), ("asp.lr_scaling", "sqrt"),
                       ("asp.update", "scaled-gradient"))
    assert push(root, 1, 1, 0, grad, batch=4)["lr"] == pytest.approx(0.1 * math.sqrt(0.5))  # as asked
    assert torch.allclose(root.grads.flat, math.sqrt(0.5) * grad[:n])


def test_an_unknown_lr_scaling_is_refused() -> None:
    with pytest.raises(UserError, match="asp.lr_scaling"):
        config.build(None, [("mode", "asp"), ("asp.lr_scaling", "cubic")])


def test_staleness_damping_divides_the_lr(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("asp.staleness_damping", True), ("asp.lr_reference_batch", 4), ("train.optimizer", "sgd"),
                         ("asp.update", "scaled-gradient"))
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


def test_server_dynamic_moves_to_the_split_its_model_prefers(tmp_path: Path) -> None:
    # Worker 1 four times slower: at equal batches its pushes wait for about 4 of worker 2's, twice
    # what the step tolerates, and its samples count half; evening the update rates keeps them whole.
    server = make_server(tmp_path, ("control.policy", "dynamic"), ("asp.delay_tolerance", 2.0))
    flat = torch.zeros_like(server.state)
    assert push(server, 1, 1, 0, flat, batch=8, compute_s=0.4)["batch"] == 8
    assert server.controller.holds == {}  # worker 2 has no measurement yet: nothing is decided
    version, seq = 1, {1: 1, 2: 0}
    for rank, seconds in ((2, 0.1), (2, 0.1), (1, 0.4), (2, 0.1)):
        seq[rank] += 1
        reply = push(server, rank, seq[rank], version, flat, batch=8, compute_s=seconds)
        version += 1
    new = server.controller.batch
    assert new[0] < 8 < new[1] and sum(new) == 16 and reply["batch"] == new[1]
    change = records(tmp_path, "batch_change")[-1]
    assert change["old"] == [8, 8] and change["reason"] == "progress" and change["worth_new"] > change["worth"]


def test_a_measuring_baseline_is_never_told_the_allocations_or_the_level(tmp_path: Path) -> None:
    schedule = tmp_path / "sched.yaml"
    schedule.write_text("unit: seconds\npoints:\n  - {at: 0, level: EVEN}\n  - {at: 5, level: SKEW}\n")
    server = make_server(tmp_path, ("emulation.hl", None), ("emulation.schedule", str(schedule)),
                         ("emulation.backend", "auto"), ("emulation.allocation", "quota"),
                         ("emulation.levels", {"EVEN": [0.5, 0.5], "SKEW": [0.2, 0.6]}),
                         ("control.policy", "paper"), ("train.epochs", 3), train_size=32)

    def unreadable(level: str) -> list[float | None]:
        raise AssertionError("the paper policy was given the allocations")

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
    share = cfg.emulation.host_share  # the table's quotas add up to this share of the host's CPUs
    assert [round(paper.allocation("HL8", t).cpus / share, 3) for t in paper.targets] == [0.333, 0.167, 0.167, 0.167,
                                                                                         1.167]
    with pytest.raises(UserError, match=r"emulation.levels.SKEW: has 2 entries for 3 workers \(or 4"):
        build_plan(config.build(None, [("mode", "asp"), ("workers", 3), ("emulation.hl", "SKEW"),
                                       ("emulation.levels", {"SKEW": [0.3, 0.3]})]), host=[0, 1])


@pytest.mark.parametrize("key,value,message", [
    ("asp.eval_interval", 0, "asp.eval_interval: must be positive"),
    ("asp.worker_timeout_s", -1, "asp.worker_timeout_s: must be positive"),
    ("asp.lr_reference_batch", 0, "asp.lr_reference_batch: must be at least 1"),
    ("asp.bogus", 1, "unknown key 'asp.bogus'"),
    ("asp.second_moment", "raw", "asp.second_moment: must be one of reference, push, not 'raw'"),
    ("asp.worker_timeout_s", 20, "asp.worker_timeout_s: 20 must exceed emulation.ack_timeout 20"),
])
def test_asp_config_errors_name_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(UserError, match=message):
        config.build(None, [("mode", "asp"), (key, value)])


def test_the_final_snapshot_is_timed_at_the_end_of_training_not_when_it_is_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = make_server(tmp_path)
    monkeypatch.setattr(time, "time", lambda: 1000.0)  # the clock at saving, fixed
    server.t_start = 997.0
    server.t_end = 999.0  # saving comes after the end: the final snapshot must not carry the save's time
    server.snapshot(final=True)
    server.snapshot()
    final, later = records(tmp_path, "snapshot")
    assert final["final"] and final["elapsed_s"] == pytest.approx(2.0, abs=1e-9)
    assert not later["final"] and later["elapsed_s"] == pytest.approx(3.0, abs=1e-9)


# ---------------------------------------------------------------------------------------- whole jobs


def test_an_idle_worker_waits_until_a_move_gives_it_a_batch(tmp_path: Path) -> None:
    """An idle worker's call returns its batch of 0 after the poll, having told the watchdog it lives; and
    as soon as a push's decision gives it a batch, with that batch."""
    server = make_server(tmp_path, ("control.policy", "dynamic"))
    server.controller._adopt([0, 16])
    server.last_contact[0] = 0.0
    assert server.idle(1)["batch"] == 0 and server.last_contact[0] > 0.0
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(server.idle(1)))
    parameter_server.IDLE_POLL_S, poll = 60.0, parameter_server.IDLE_POLL_S
    try:
        waiter.start()
        server.controller._adopt([2, 14])  # as a decision would, then the push that took it
        push(server, 2, 1, 0, torch.zeros_like(server.state), batch=16)
        waiter.join(timeout=30)
    finally:
        parameter_server.IDLE_POLL_S = poll
    assert not waiter.is_alive() and answers[0]["batch"] == 2


def test_an_idle_worker_calls_idle_following_the_level_until_it_has_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{"batch": 0, "stop": False}, {"batch": 3, "stop": False}])
    calls: list[tuple[Any, tuple]] = []
    followed: list[dict[str, Any]] = []

    def call(fn: Any, args: tuple, timeout: float) -> dict[str, Any]:  # noqa: ARG001
        calls.append((fn, args))
        return next(answers)

    monkeypatch.setattr(asp_worker, "_call", call)
    control = asp_worker.wait_for_batch(5, {"batch": 0, "stop": False}, lambda c, s: followed.append(c), 7, 1.0)
    assert control["batch"] == 3 and len(calls) == 2 and len(followed) == 2
    assert all(fn.__name__ == "rpc_idle" and args == (5,) for fn, args in calls)
    assert asp_worker.wait_for_batch(5, {"batch": 0, "stop": True}, None, 7, 1.0)["stop"]  # over: no call
    assert asp_worker.wait_for_batch(5, {"batch": 4, "stop": False}, None, 7, 1.0)["batch"] == 4
    assert len(calls) == 2
