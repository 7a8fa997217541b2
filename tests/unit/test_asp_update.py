"""The ASP server's update rules: torch's optimizers at one unit of time, a hand computation of two
workers' pushes, and the parameter server's two push semantics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_asp import make_server, push

from omnilearn import config
from omnilearn.errors import UserError
from omnilearn.train.asp_update import Hyper, SampleTime, build_rule, scheduled_lr, staleness_factor
from omnilearn.train.workload import make_optimizer


def _same_steps(torch_opt: torch.optim.Optimizer, param: torch.nn.Parameter, rule: SampleTime,
                theta: torch.Tensor) -> None:
    """25 fresh pushes of one unit through ``rule`` move ``theta`` as ``torch_opt`` moves ``param``."""
    for _ in range(25):
        grad = torch.randn(40)
        param.grad = grad.clone()
        torch_opt.step()
        rule.apply(theta, grad, 1.0, 0.0, 0.01)
    assert torch.allclose(param.detach(), theta, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_one_unit_without_delay_is_torchs_own_step(optimizer: str) -> None:
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(40))
    theta = param.detach().clone()
    rule = SampleTime(Hyper(optimizer, 0.9, 0.01), theta.shape)
    torch_opt = (torch.optim.AdamW([param], lr=0.01, weight_decay=0.01) if optimizer == "adamw"
                 else torch.optim.SGD([param], lr=0.01, momentum=0.9, weight_decay=0.01))
    _same_steps(torch_opt, param, rule, theta)


def test_train_momentum_is_adams_beta1_on_the_server_as_in_torchs_optimizer() -> None:
    cfg = config.from_dict({"mode": "asp", "train": {"optimizer": "adamw", "lr": 0.01, "momentum": 0.5,
                                                     "weight_decay": 0.01}}, "test").validate()
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(40))
    theta = param.detach().clone()
    torch_opt = make_optimizer(cfg, [param])
    assert torch_opt.param_groups[0]["betas"] == (0.5, 0.999)
    rule = build_rule(cfg, theta, None, torch.zeros(40))
    _same_steps(torch_opt, param, rule, theta)
    with pytest.raises(UserError, match="train.momentum"):
        config.from_dict({"train": {"momentum": 1.0}}, "test").validate()


def test_two_workers_adamw_by_hand() -> None:
    # Worker A pushes 8 samples (b_ref 16: half a unit) on fresh parameters; worker B then pushes 48
    # samples (three units) computed before A's push and one more unit: 1.5 units late. rho = 1.
    b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 0.1, 0.0
    rule = SampleTime(Hyper("adamw", 0.0, wd, delay_tolerance=1.0), (1,))
    theta = torch.tensor([1.0], dtype=torch.float64)
    rule.m, rule.v = rule.m.double(), rule.v.double()
    rule.apply(theta, torch.tensor([2.0], dtype=torch.float64), 0.5, 0.0, lr)
    k1, k2 = b1 ** 0.5, b2 ** 0.5
    m, v = (1 - k1) * 2.0, (1 - k2) * 4.0
    p1, p2 = k1, k2
    expect = 1.0 - lr * 0.5 * (m / (1 - p1)) / (math.sqrt(v / (1 - p2)) + eps)
    assert float(theta) == pytest.approx(expect, rel=1e-12)
    rule.apply(theta, torch.tensor([-1.0], dtype=torch.float64), 3.0, 1.5, lr)
    a = 1 / 1.5  # min(1, rho / tau)
    k1, k2 = b1 ** 3.0, b2 ** 3.0
    m, v = k1 * m + (1 - k1) * a * -1.0, k2 * v + (1 - k2) * 1.0  # the second moment takes the raw gradient
    p1, p2 = p1 * k1, p2 * k2
    expect -= lr * 1.0 * (m / (1 - p1)) / (math.sqrt(v / (1 - p2)) + eps)  # the step: min(3, rho) = 1 unit
    assert float(theta) == pytest.approx(expect, rel=1e-12)
    assert float(rule.p1) == pytest.approx(b1 ** 3.5) and float(rule.p2) == pytest.approx(b2 ** 3.5)
    assert rule.weight(3.0, 1.5) == pytest.approx(a)


def test_the_reference_second_moment_by_hand() -> None:
    # The same two pushes with asp.second_moment: reference. The first has no first moment before it
    # and brings its own square; the second (three units) brings (1 - 3) m_hat^2 + 3 g^2, m_hat the
    # first moment before it; a third, a quarter unit, brings 0.75 m_hat^2 + 0.25 g^2.
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.1
    rule = SampleTime(Hyper("adamw", 0.0, 0.0, delay_tolerance=1.0, second_moment="reference"), (1,))
    theta = torch.tensor([1.0], dtype=torch.float64)
    rule.m, rule.v = rule.m.double(), rule.v.double()
    m = v = 0.0
    p1 = p2 = 1.0
    expect = 1.0
    for g, kappa, tau in ((2.0, 0.5, 0.0), (-1.0, 3.0, 1.5), (0.5, 0.25, 0.0)):
        rule.apply(theta, torch.tensor([g], dtype=torch.float64), kappa, tau, lr)
        square = g * g if p1 == 1.0 else max(0.0, (1 - kappa) * (m / (1 - p1)) ** 2 + kappa * g * g)
        k1, k2 = b1 ** kappa, b2 ** kappa
        m, v = k1 * m + (1 - k1) * min(1.0, 1.0 / tau if tau else 1.0) * g, k2 * v + (1 - k2) * square
        p1, p2 = p1 * k1, p2 * k2
        expect -= lr * min(kappa, 1.0) * (m / (1 - p1)) / (math.sqrt(v / (1 - p2)) + eps)
        assert float(theta) == pytest.approx(expect, rel=1e-12)
        assert float(rule.v) == pytest.approx(v, rel=1e-12)


def test_under_the_reference_second_moment_small_pushes_keep_the_steps_of_reference_ones() -> None:
    # Pure noise of per-sample variance 1 on one coordinate whose mean gradient is 0.5: pushes of a
    # quarter unit bring E[g^2] = 0.25 + 4 / b_ref under push, and 0.25 + 1 / b_ref under reference.
    torch.manual_seed(1)
    b_ref, n = 16, 1000
    denominators = {}
    for moment in ("push", "reference"):
        for kappa in (1.0, 0.25):
            rule = SampleTime(Hyper("adamw", 0.9, 0.0, second_moment=moment), (1,))
            rule.m, rule.v = rule.m.double(), rule.v.double()
            theta = torch.zeros(1, dtype=torch.float64)
            b = int(kappa * b_ref)
            for _ in range(int(n / kappa)):
                rule.apply(theta, 0.5 + torch.randn(1, dtype=torch.float64) / math.sqrt(b), kappa, 0.0, 0.0)
            denominators[moment, kappa] = float(rule.v / (1 - rule.p2))
    one_unit = 0.25 + 1 / b_ref
    assert denominators["push", 1.0] == pytest.approx(one_unit, rel=0.15)
    assert denominators["reference", 1.0] == pytest.approx(one_unit, rel=0.15)
    assert denominators["push", 0.25] == pytest.approx(0.25 + 4 / b_ref, rel=0.15)
    assert denominators["reference", 0.25] == pytest.approx(one_unit, rel=0.15)


def test_two_workers_sgd_momentum_by_hand() -> None:
    mu, lr = 0.9, 0.05
    rule = SampleTime(Hyper("sgd", mu, 0.0, delay_tolerance=2.0), (1,), torch.float64)
    theta = torch.tensor([0.0], dtype=torch.float64)
    rule.apply(theta, torch.tensor([1.0], dtype=torch.float64), 2.0, 0.0, lr)
    m = (1 - mu ** 2) * 1.0
    assert float(theta) == pytest.approx(-lr * 2.0 * m / (1 - mu))
    rule.apply(theta, torch.tensor([1.0], dtype=torch.float64), 1.0, 4.0, lr)  # 4 units late: weight 2 / 4
    m2 = mu * m + (1 - mu) * 0.5
    assert float(theta) == pytest.approx(-lr * 2.0 * m / (1 - mu) - lr * 1.0 * m2 / (1 - mu))


def test_the_staleness_factor_keeps_the_full_weight_up_to_the_tolerance() -> None:
    assert [staleness_factor(t, 2.0) for t in (0.0, 1.0, 2.0, 4.0, 8.0)] == [1.0, 1.0, 1.0, 0.5, 0.25]
    assert staleness_factor(100.0, math.inf) == 1.0
    column = staleness_factor(torch.tensor([[0.0], [3.0]]), 1.5)
    assert torch.allclose(column, torch.tensor([[1.0], [0.5]]))


def test_a_late_gradient_is_corrected_to_the_current_parameters_by_hand() -> None:
    # SGD without momentum, correction λ₀ = 0.5: a fresh push sets the mean square; a push computed
    # on the parameters before it is carried forward by λ₀ g² (θ − θ_pulled) / rms(g).
    lam, b2, eps, lr = 0.5, 0.999, 1e-8, 0.1
    rule = SampleTime(Hyper("sgd", 0.0, 0.0, betas=(0.0, b2), correction=lam), (1,), torch.float64)
    assert rule.corrects
    start = torch.tensor([1.0], dtype=torch.float64)
    theta = start.clone()
    rule.apply(theta, torch.tensor([2.0], dtype=torch.float64), 1.0, 0.0, lr, pulled=start.clone())
    assert float(theta) == pytest.approx(1.0 - lr * 2.0)  # fresh: θ − θ_pulled = 0, nothing to correct
    v, p2 = (1 - b2) * 4.0, b2
    g = -1.0
    corrected = g + lam * g * g / (math.sqrt(v / (1 - p2)) + eps) * (float(theta) - 1.0)
    expect = float(theta) - lr * corrected
    rule.apply(theta, torch.tensor([g], dtype=torch.float64), 1.0, 1.0, lr, pulled=start.clone())
    assert float(theta) == pytest.approx(expect, rel=1e-12)
    plain = SampleTime(Hyper("sgd", 0.0, 0.0), (1,), torch.float64)
    assert not plain.corrects and plain.v is None  # no correction: no second moment kept for SGD


def test_the_batch_cap_is_apart_from_the_delay_tolerance_where_it_is_set() -> None:
    split = SampleTime(Hyper("adamw", 0.0, 0.0, delay_tolerance=0.5, batch_tolerance=2.0), (1,))
    assert split.weight(3.0, 0.0) == pytest.approx(2.0)  # the batch capped at two units
    assert split.weight(1.0, 2.0) == pytest.approx(0.25)  # the delay cut at half a unit: 1 x 0.5 / 2
    one = SampleTime(Hyper("adamw", 0.0, 0.0, delay_tolerance=0.5), (1,))
    assert one.weight(3.0, 0.0) == pytest.approx(0.5)  # by default one number for both
    with pytest.raises(UserError, match="asp.batch_tolerance"):
        config.from_dict({"mode": "asp", "asp": {"batch_tolerance": 0}}, "test").validate()


def test_a_push_adds_its_step_not_its_batch_to_the_staleness_of_later_ones() -> None:
    rule = SampleTime(Hyper("sgd", 0.9, 0.0, delay_tolerance=0.5, batch_tolerance=2.0), (1,))
    assert rule.elapsed(0.25) == 0.25 and rule.elapsed(3.0) == 2.0  # the cap: the model moves 2 units, not 3
    rows = rule.elapsed(torch.tensor([[0.25], [3.0]]))
    assert rows.flatten().tolist() == [0.25, 2.0]
    assert SampleTime(Hyper("sgd", 0.9, 0.0, delay_tolerance=0.5), (1,)).elapsed(3.0) == 0.5  # cap = rho


@pytest.mark.parametrize("moment", ["push", "reference"])
def test_rows_apply_each_their_own_time_and_delay(moment: str) -> None:
    hyper = Hyper("adamw", 0.0, 0.01, delay_tolerance=1.0, second_moment=moment)
    rows = SampleTime(hyper, (2, 5))
    one, two = SampleTime(hyper, (5,)), SampleTime(hyper, (5,))
    theta = torch.randn(2, 5)
    a, b = theta[0].clone(), theta[1].clone()
    for step in range(4):
        grad = torch.randn(2, 5)
        kappa, tau = torch.tensor([[0.5], [2.0]]), torch.tensor([[0.0], [float(step)]])
        rows.apply(theta, grad, kappa, tau, 0.01)
        one.apply(a, grad[0], 0.5, 0.0, 0.01)
        two.apply(b, grad[1], 2.0, float(step), 0.01)
    assert torch.allclose(theta[0], a, atol=1e-6) and torch.allclose(theta[1], b, atol=1e-6)


def test_the_rules_state_round_trips() -> None:
    rule = SampleTime(Hyper("adamw", 0.0, 0.0), (3,))
    theta = torch.zeros(3)
    rule.apply(theta, torch.ones(3), 1.0, 0.0, 0.1)
    copy = SampleTime(Hyper("adamw", 0.0, 0.0), (3,))
    copy.load_state_dict(rule.state_dict())
    other = theta.clone()
    rule.apply(theta, torch.ones(3), 2.0, 1.0, 0.1)
    copy.apply(other, torch.ones(3), 2.0, 1.0, 0.1)
    assert torch.equal(theta, other) and copy.updates == 2


def test_a_parameter_push_replaces_every_update_since_its_pull(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("asp.push", "parameters"))
    n = server.n_params
    slow, _ = server.pull(2)  # the slow worker pulls version 0 ...
    fast = torch.zeros_like(server.state)
    for seq in (1, 2, 3):  # ... the fast one pushes three times meanwhile
        pulled, _ = server.pull(1)
        fast = pulled.clone()
        fast[:n] -= 0.1 * seq
        fast[n:] = 0.0  # no change to the running statistics
        push(server, 1, seq, seq - 1, fast, batch=8)
    assert server.version == 3 and torch.allclose(server.state[:n], fast[:n])
    mine = slow.clone()
    mine[:n] += 1.0  # its own optimizer's step from version 0
    mine[n:] = 0.0
    reply = push(server, 2, 1, 0, mine, batch=8)
    assert reply["staleness"] == 3
    assert torch.equal(server.state[:n], mine[:n])  # the last writer's parameters: nothing of the three is left


def test_under_gradient_pushes_no_update_is_lost(tmp_path: Path) -> None:
    server = make_server(tmp_path, ("train.optimizer", "sgd"), ("asp.delay_tolerance", math.inf))
    n = server.n_params
    start = server.state[:n].clone()
    grads = []
    for rank, seq, version in ((1, 1, 0), (1, 2, 1), (1, 3, 2), (2, 1, 0)):
        g = torch.zeros_like(server.state)
        g[:n] = torch.randn(n)
        grads.append(g[:n].clone())
        push(server, rank, seq, version, g, batch=8)
    # plain SGD at one unit a push, no cut: the parameters moved by every gradient, the stale one included
    assert torch.allclose(server.state[:n], start - 0.1 * sum(grads), atol=1e-6)


def test_the_server_corrects_a_late_push_from_the_parameters_its_worker_pulled(tmp_path: Path) -> None:
    sets = (("train.optimizer", "sgd"), ("asp.delay_tolerance", math.inf))
    plain, corrected = make_server(tmp_path / "plain", *sets), make_server(tmp_path / "dc", *sets,
                                                                        ("asp.delay_correction", 1.0))
    n = plain.n_params
    torch.manual_seed(1)
    grads = [torch.randn(plain.state.numel()) for _ in range(3)]
    for server in (plain, corrected):
        for slot in (1, 2):
            server.pull(slot)
        push(server, 1, 1, 0, grads[0].clone(), batch=8)  # fresh
        server.pull(1)
        push(server, 1, 2, 1, grads[1].clone(), batch=8)  # fresh
    before = corrected.state[:n].clone()
    rule = corrected.rule
    rms = torch.sqrt(rule.v / (1 - float(rule.p2))) + 1e-8  # the mean square before the late push
    assert corrected.pulled_state[0] is not None and plain.pulled_state[0] is None  # kept only when correcting
    start = corrected.pulled_state[1]  # slot 2's pull: version 0
    assert start is not None
    for server in (plain, corrected):
        push(server, 2, 1, 0, grads[2].clone(), batch=8)  # two pushes late, on the parameters of version 0
    late = grads[2][:n]
    # plain SGD at one unit: the late gradient as pushed, or carried from version 0's parameters to the current
    assert torch.allclose(before - corrected.state[:n], 0.1 * (late + late * late * (before - start) / rms), atol=1e-6)
    assert not torch.allclose(plain.state[:n], corrected.state[:n])


def test_the_warmup_raises_the_servers_rate_with_the_epochs_applied_then_the_milestones_take_over() -> None:
    cfg = config.from_dict({"mode": "asp", "train": {"lr": 0.01, "milestones": [3], "gamma": 0.1},
                            "asp": {"warmup_epochs": 0.5}}, "test")
    cfg.validate()
    assert [scheduled_lr(cfg, e) for e in (0.0, 0.125, 0.25, 0.5, 2.0)] == pytest.approx([0.0, 0.0025, 0.005, 0.01, 0.01])
    assert scheduled_lr(cfg, 3.0) == pytest.approx(0.001)
    none = config.from_dict({"mode": "asp", "train": {"lr": 0.01}}, "test")
    assert scheduled_lr(none, 0.0) == pytest.approx(0.01)
    with pytest.raises(UserError, match="warmup_epochs"):
        config.from_dict({"mode": "asp", "asp": {"warmup_epochs": -1}}, "test").validate()
