"""The synchronous step's gradient sum (train/grad_sum.py), one rank's side, in one process: the sum over
one rank is the rank's own, so the all-reduce is left out and what goes into it is checked."""

from __future__ import annotations

import pytest
import torch

from omnilearn.errors import UserError
from omnilearn.train.grad_sum import GradientSum


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)


class Recorder:
    """The sum's fill and read, and its all-reduce, for a world of one: what the rank sent."""

    def __init__(self, model: torch.nn.Module, extra: int = 2) -> None:
        self.filled = self.read_back = 0
        self.sum = GradientSum(list(model.parameters()), extra, fill=self.fill, read=self.read)
        self.sent: list[torch.Tensor] = []
        self.sum.buffer.all_reduce = lambda: self.sent.append(self.sum.buffer.flat.clone())  # type: ignore[method-assign]

    def fill(self, extra: torch.Tensor) -> None:
        self.filled += 1
        extra.fill_(7.0)

    def read(self, extra: torch.Tensor) -> None:
        self.read_back += 1
        assert torch.all(extra == 7.0)


def _reference(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, weight: float) -> torch.Tensor:
    """``weight`` times the gradient of the mean loss over all of ``x``."""
    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * weight


def test_one_backward_sends_its_mean_gradient_times_its_weight_and_the_slots_once() -> None:
    model = _model()
    x, y = _data(6)
    want = _reference(model, x, y, 0.25)
    r = Recorder(model)
    r.sum.open([6], 0.25)
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert r.sum.reduced and r.filled == 1 and r.read_back == 1 and len(r.sent) == 1
    n = r.sum.buffer.numel
    assert torch.allclose(r.sent[0][:n], want, atol=1e-6)
    assert torch.all(r.sent[0][n:] == 7.0)  # the slots ride after the gradients
    assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(model.parameters(), r.sum.views, strict=True))


def test_unequal_micro_batches_weigh_as_the_whole_local_batch() -> None:
    model = _model()
    x, y = _data(7)
    want = _reference(model, x, y, 0.5)
    r = Recorder(model)
    r.sum.open([4, 3], 0.5)
    for lo, hi in ((0, 4), (4, 7)):  # each loss a mean over its micro-batch, divided by the micro-batches
        (torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]) / 2).backward()
    assert len(r.sent) == 1  # only the last backward all-reduces
    assert torch.allclose(r.sent[0][:r.sum.buffer.numel], want, atol=1e-6)


def test_deferred_backwards_stay_local_until_one_runs_undeferred() -> None:
    model = _model()
    x, y = _data(4)
    r = Recorder(model)
    r.sum.open([4], 1.0)
    r.sum.deferred = True
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert not r.sent and not r.sum.reduced
    with pytest.raises(UserError, match="no all-reduce"):
        r.sum.check_closed()


def test_a_rank_with_no_backward_to_its_end_sends_a_zero_gradient() -> None:
    model = _model()
    r = Recorder(model)
    r.sum.open([4], 0.5)
    for p in model.parameters():  # what a backward cut short (out of memory) left in the buffer
        p.grad.fill_(3.0)
    r.sum.reduce()
    r.sum.open([0], 0.0)  # an empty share of a partial last step
    r.sum.reduce()
    assert len(r.sent) == 2 and all(torch.all(s[:r.sum.buffer.numel] == 0.0) for s in r.sent)
    assert r.filled == 2 and r.read_back == 2


def test_a_backward_after_the_all_reduce_is_refused_and_none_outside_a_step_counts() -> None:
    model = _model()
    x, y = _data(4)
    r = Recorder(model)
    torch.nn.functional.mse_loss(model(x), y).backward()  # before any step: a probe's, local
    assert not r.sent and r.sum.backwards == 0
    r.sum.open([4], 1.0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(UserError, match="after the step's all-reduce"):
        torch.nn.functional.mse_loss(model(x), y).backward()
    r.sum.close()
    torch.nn.functional.mse_loss(model(x), y).backward()  # after the step: not the step's
    assert len(r.sent) == 1
