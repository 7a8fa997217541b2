"""The parameter server's update rules: how one pushed gradient moves the model.

A push carries the mean gradient ``g`` of ``b`` samples computed on the parameters of some updates
ago; its staleness ``τ`` is the optimiser's time those updates took: the steps they took, in units
(``Σ min(κ, ρ_b)`` over them, :meth:`SampleTime.elapsed`; with equal batches within the cap, their
count). It is how far the parameters moved since the pull, in steps of one unit. :class:`SampleTime` (``asp.update: sample-time``) is the rule derived in
``docs/design/asp.md``:

- **Batch.** The update counts as ``κ = b / b_ref`` units of the optimiser's time: every moment
  decays by ``β^κ`` and the step is ``η κ`` times the moment's direction. A split of unequal batches
  then moves the model as equal batches of the same samples would in the first moment. Adam's second
  moment takes the push's square (``asp.second_moment: push``), whose noise is the push's own batch's,
  or the square a push of ``b_ref`` samples would bring (``reference``, :meth:`SampleTime._square`).
- **Tolerance.** ``ρ`` (``asp.delay_tolerance``) is how many units of the optimiser's time the
  configured step tolerates at once: a step ``η`` at a share ``q`` of its stability limit stays
  stable over a delay of about ``1 / q`` units and for a batch of about ``1 / q`` units. So the
  gradient enters the first moment weighed by ``a(τ) = min(1, ρ / τ)`` (the full weight while the
  delay keeps the step stable, beyond it a weight cut in proportion to the delay: the delay-adaptive
  rule under which asynchronous SGD converges whatever the largest delay), and the step is
  ``η min(κ, ρ)``: a batch of more than ``ρ`` units moves the model as far as one of ``ρ``.
  ``asp.batch_tolerance`` sets that cap apart (``s = min(κ, ρ_b)``): with momentum a step keeps more
  of its stability for a batch than for a delay (``docs/design/asp.md``).
- **Correction.** ``asp.delay_correction`` carries a late gradient to the current parameters first
  (:meth:`SampleTime._corrected`).

With ``μ`` SGD's momentum (``β₁`` for Adam), ``λ`` the weight decay and ``m``, ``v`` zero at the start:

    SGD:    m ← μ^κ m + (1 − μ^κ) (a g + λ θ)             θ ← θ − η s m / (1 − μ)
    AdamW:  m ← β₁^κ m + (1 − β₁^κ) a g                    v ← β₂^κ v + (1 − β₂^κ) q
            q = g² (push), or max(0, (1 − κ) m̂² + κ g²) (reference, m̂ before the push)
            p₁ ← p₁ β₁^κ,  p₂ ← p₂ β₂^κ                     θ ← θ (1 − η λ κ) − η s m̂ / (√v̂ + ε)
            m̂ = m / (1 − p₁),  v̂ = v / (1 − p₂),  s = min(κ, ρ)

At ``κ = 1`` and ``τ = 0`` these are torch's SGD (momentum, coupled weight decay, no dampening) and
AdamW step for step. Every operation broadcasts: ``θ`` may be one flat parameter vector (the server)
or a batch of them, one row per simulated run (the ASP benchmark), with ``κ`` and ``τ`` a column.

:class:`ScaledGradient` (``asp.update: scaled-gradient``) is the rule kept for comparison:
torch's optimiser on the gradient scaled by ``(b / b_ref) ** p`` (``asp.lr_scaling``) and, with
``asp.staleness_damping``, by ``1 / (1 + τ)``.

Both keep their whole state in :meth:`state_dict` (the checkpoint saves it): the moments, the
bias-correction products and the count of updates applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from omnilearn.config.sections import ADAMW_BETA2
from omnilearn.config.sections import ASP_UPDATES as UPDATES  # noqa: F401 - the rules' names, one home

LR_POWERS = {"auto": 1.0, "linear": 1.0, "sqrt": 0.5, "none": 0.0}


@dataclass(frozen=True)
class Hyper:
    """The optimiser's settings (``train``), and the rule's own (``asp``)."""

    optimizer: str  # "sgd" | "adamw"
    momentum: float  # SGD's μ
    weight_decay: float
    betas: tuple[float, float] = (0.9, ADAMW_BETA2)
    eps: float = 1e-8
    delay_tolerance: float = float("inf")  # ρ of a(τ) = min(1, ρ / τ); inf: staleness is not weighed
    batch_tolerance: float | None = None  # the step's cap, min(κ, this) units (None: ρ)
    correction: float = 0.0  # asp.delay_correction: λ₀ of the late gradient's first-order correction (0: none)
    second_moment: str = "push"  # asp.second_moment: Adam's v takes the push's square, or a b_ref batch's


def staleness_factor(tau: Any, rho: float) -> Any:
    """``a(τ) = min(1, ρ / τ)``: the weight of a gradient ``τ`` updates late (1 up to ``τ = ρ``)."""
    if rho == float("inf"):
        return tau * 0 + 1.0
    if isinstance(tau, torch.Tensor):
        return torch.clamp(rho / torch.clamp(tau, min=1e-12), max=1.0)
    return min(1.0, rho / tau) if tau > 0 else 1.0


def batch_cap(hyper: Hyper) -> float:
    """The units of batch one push's step may take (``asp.batch_tolerance``, by default ``ρ``)."""
    return hyper.delay_tolerance if hyper.batch_tolerance is None else hyper.batch_tolerance


class UpdateRule(Protocol):
    """What the server calls: one update, and the state a checkpoint keeps."""

    corrects: bool
    """Whether :meth:`apply` uses ``pulled`` (``asp.delay_correction``): the caller keeps it only then."""

    def apply(self, theta: torch.Tensor, grad: torch.Tensor, kappa: Any, tau: Any, lr: Any,
              pulled: torch.Tensor | None = None) -> None:
        """Move ``theta`` in place by one push: its gradient ``grad``, batch weight ``κ = b / b_ref``,
        staleness ``τ`` and learning rate ``lr`` (floats, or columns broadcasting against the rows);
        ``pulled``, the parameters the gradient was computed on."""
        ...

    def weight(self, kappa: float, tau: float) -> float:
        """The push's weight as the update records it (``κ a(τ)``, or the scale applied)."""
        ...

    def elapsed(self, kappa: Any) -> Any:
        """The optimiser's time a push of ``κ`` units adds to every later push's staleness."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SampleTime:
    """``asp.update: sample-time`` (see the module). ``shape``: the shape of ``θ`` it updates."""

    def __init__(self, hyper: Hyper, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float32) -> None:
        assert hyper.optimizer in ("sgd", "adamw"), hyper.optimizer
        self.hyper = hyper
        self.corrects = bool(hyper.correction)
        self.m = torch.zeros(shape, dtype=dtype)
        # the second moment: Adam's, and the mean square the correction of a late gradient divides by
        self.v = torch.zeros(shape, dtype=dtype) if hyper.optimizer == "adamw" or hyper.correction else None
        column = (*shape[:-1], 1)
        self.p1 = torch.ones(column, dtype=torch.float64)  # bias-correction products, per row
        self.p2 = torch.ones(column, dtype=torch.float64)
        self.updates = 0

    def weight(self, kappa: float, tau: float) -> float:
        return float(min(kappa, batch_cap(self.hyper)) * staleness_factor(tau, self.hyper.delay_tolerance))

    def elapsed(self, kappa: Any) -> Any:
        """The step the push takes, ``s = min(κ, ρ_b)`` units: a batch beyond the cap moves the
        parameters no farther, so it makes no later push staler."""
        cap = batch_cap(self.hyper)
        return kappa.clamp(max=cap) if isinstance(kappa, torch.Tensor) else min(kappa, cap)

    def apply(self, theta: torch.Tensor, grad: torch.Tensor, kappa: Any, tau: Any, lr: Any,
              rows: torch.Tensor | None = None, pulled: torch.Tensor | None = None) -> None:
        """One update (see :class:`UpdateRule`). ``rows``: the rows of the state that ``theta`` and
        ``grad`` hold, when they are some rows only (the ASP benchmark's workers' own optimisers);
        ``pulled``: the parameters the gradient was computed on (needed by ``asp.delay_correction``)."""
        if self.corrects and pulled is not None:
            grad = self._corrected(theta, grad, pulled, rows)
        if rows is None and not any(isinstance(x, torch.Tensor) for x in (kappa, tau, lr)):
            self._apply_one(theta, grad, float(kappa), float(tau), float(lr))
        else:
            self._apply_rows(theta, grad, kappa, tau, lr, rows)
        self.updates += 1

    def _corrected(self, theta: torch.Tensor, grad: torch.Tensor, pulled: torch.Tensor,
                   rows: torch.Tensor | None) -> torch.Tensor:
        """The late gradient carried to the current parameters to first order (DC-ASGD, Zheng et al.
        2017): ``g + λ₀ g ⊙ g ⊙ (θ − θ_pulled) / √v̂``, the Hessian's diagonal taken as ``λ₀ g ⊙ g``
        scaled by the gradient's mean square (their adaptive ``λ``)."""
        assert self.v is not None
        v = self.v if rows is None else self.v[rows]
        p2 = self.p2 if rows is None else self.p2[rows]
        c2 = torch.clamp((1 - p2).to(v.dtype), min=1e-12)  # 0 only before any push, when θ is θ_pulled
        rms = torch.div(v, c2).sqrt_().add_(self.hyper.eps)
        # two temporaries the size of the model, the rest in place: the server applies every push
        return torch.sub(theta, pulled).mul_(grad).mul_(grad).div_(rms).mul_(self.hyper.correction).add_(grad)

    def _square(self, grad: torch.Tensor, kappa: Any, m: torch.Tensor, p1: torch.Tensor) -> torch.Tensor:
        """What the push brings to Adam's second moment. The mean gradient of ``b`` samples has
        ``E[g²] = μ² + σ²/b``: its square holds the noise of the push's own batch. Under
        ``second_moment: reference`` it is brought to a batch of ``b_ref`` samples, ``μ² + σ²/b_ref``,
        the noise the step was tuned at: ``(1 − κ) m̂² + κ g²`` with ``m̂`` the first moment before this
        push (its noise averaged out over many pushes), at least 0; before any push, ``g²``."""
        square = grad * grad
        if self.hyper.second_moment != "reference":
            return square
        c1 = (1 - p1).to(m.dtype)
        m_hat = m / torch.clamp(c1, min=1e-12)
        reference = torch.clamp(m_hat * m_hat * (1 - kappa) + square * kappa, min=0.0)
        return torch.where(c1 > 0, reference, square)

    def _apply_one(self, theta: torch.Tensor, grad: torch.Tensor, kappa: float, tau: float, lr: float) -> None:
        """The server's update: one parameter vector, in place, no temporaries the size of the model
        but Adam's denominator."""
        h = self.hyper
        a = staleness_factor(tau, h.delay_tolerance)
        if h.optimizer == "sgd":
            keep = h.momentum ** kappa
            self.m.mul_(keep).add_(grad, alpha=a * (1 - keep))
            if h.weight_decay:
                self.m.add_(theta, alpha=h.weight_decay * (1 - keep))
            theta.add_(self.m, alpha=-lr * min(kappa, batch_cap(h)) / (1 - h.momentum))
            if self.v is not None:  # the mean square of the correction
                k2 = h.betas[1] ** kappa
                self.v.mul_(k2).addcmul_(grad, grad, value=1 - k2)
                self.p2.mul_(k2)
            return
        assert self.v is not None
        b1, b2 = h.betas
        k1, k2 = b1 ** kappa, b2 ** kappa
        self._second_moment_one(grad, kappa, k2)  # before the first moment moves: it reads m̂
        self.m.mul_(k1).add_(grad, alpha=a * (1 - k1))
        self.p1.mul_(k1)
        self.p2.mul_(k2)
        c1, c2 = 1 - float(self.p1.reshape(-1)[0]), 1 - float(self.p2.reshape(-1)[0])
        if h.weight_decay:
            theta.mul_(1 - lr * h.weight_decay * kappa)
        denom = torch.sqrt(self.v).div_(math.sqrt(c2)).add_(h.eps)
        theta.addcdiv_(self.m, denom, value=-lr * min(kappa, batch_cap(h)) / c1)

    def _second_moment_one(self, grad: torch.Tensor, kappa: float, k2: float) -> None:
        """:meth:`_square` into ``v`` for the server's one vector, in place: one more pass over the
        model than the push's own square, and a temporary only for a push of more than one unit (its
        estimate may fall below 0)."""
        assert self.v is not None
        c1 = 1 - float(self.p1.reshape(-1)[0])
        self.v.mul_(k2)
        if self.hyper.second_moment != "reference" or c1 <= 0:
            self.v.addcmul_(grad, grad, value=1 - k2)
        elif kappa <= 1:
            self.v.addcmul_(grad, grad, value=(1 - k2) * kappa).addcmul_(self.m, self.m,
                                                                        value=(1 - k2) * (1 - kappa) / c1 ** 2)
        else:
            square = torch.mul(grad, grad).mul_(kappa).addcmul_(self.m, self.m, value=(1 - kappa) / c1 ** 2)
            self.v.add_(square.clamp_(min=0.0), alpha=1 - k2)

    def _apply_rows(self, theta: torch.Tensor, grad: torch.Tensor, kappa: Any, tau: Any, lr: Any,
                    rows: torch.Tensor | None) -> None:
        """The benchmark's update: rows of runs, each with its own ``κ`` and ``τ`` (columns)."""
        h = self.hyper
        a = staleness_factor(tau, h.delay_tolerance)
        m = self.m if rows is None else self.m[rows]
        cap = batch_cap(h)
        step = torch.clamp(kappa, max=cap) if isinstance(kappa, torch.Tensor) else min(kappa, cap)
        if h.optimizer == "sgd":
            keep = h.momentum ** kappa
            entry = grad * a
            if h.weight_decay:
                entry = entry + h.weight_decay * theta
            m.mul_(keep).add_(entry * (1 - keep))
            theta.sub_(m * (lr * step / (1 - h.momentum)))
            if self.v is not None:  # the mean square of the correction
                k2 = h.betas[1] ** kappa
                v = self.v if rows is None else self.v[rows]
                v.mul_(k2).add_(grad * grad * (1 - k2))
                p2 = (self.p2 if rows is None else self.p2[rows]) * k2
                if rows is None:
                    self.p2 = p2
                else:
                    self.v[rows], self.p2[rows] = v, p2
        else:
            assert self.v is not None
            v = self.v if rows is None else self.v[rows]
            p1 = self.p1 if rows is None else self.p1[rows]
            p2 = self.p2 if rows is None else self.p2[rows]
            b1, b2 = h.betas
            k1, k2 = b1 ** kappa, b2 ** kappa
            square = self._square(grad, kappa, m, p1)
            m.mul_(k1).add_(grad * a * (1 - k1))
            v.mul_(k2).add_(square * (1 - k2))
            p1, p2 = p1 * k1, p2 * k2
            m_hat = m / (1 - p1).to(m.dtype)
            v_hat = v / (1 - p2).to(v.dtype)
            if h.weight_decay:
                theta.mul_(1 - lr * h.weight_decay * kappa)
            theta.sub_(m_hat / (v_hat.sqrt() + h.eps) * (lr * step))
            if rows is None:
                self.p1, self.p2 = p1, p2
            else:
                self.v[rows], self.p1[rows], self.p2[rows] = v, p1, p2
        if rows is not None:
            self.m[rows] = m

    def state_dict(self) -> dict[str, Any]:
        return {"rule": "sample-time", "m": self.m.clone(), "v": None if self.v is None else self.v.clone(),
                "p1": self.p1.clone(), "p2": self.p2.clone(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert state.get("rule") == "sample-time", f"a checkpoint of update rule {state.get('rule')!r}"
        self.m.copy_(state["m"])
        if self.v is not None:
            self.v.copy_(state["v"])
        self.p1, self.p2 = state["p1"].clone(), state["p2"].clone()
        self.updates = int(state["updates"])


class ScaledGradient:
    """``asp.update: scaled-gradient``: torch's optimiser over ``params`` on the gradient scaled by
    ``(b / b_ref) ** power`` and, with ``damping``, divided by ``1 + τ``. ``grads``: the flat buffer the
    parameters' ``.grad`` views (:class:`~omnilearn.train.distributed.GradBuffer`'s)."""

    def __init__(self, optimizer: torch.optim.Optimizer, grads: torch.Tensor, power: float, damping: bool) -> None:
        self.optimizer, self.grads, self.power, self.damping = optimizer, grads, power, damping
        self.corrects = False

    def weight(self, kappa: Any, tau: Any) -> Any:
        scale = kappa ** self.power
        return scale / (1 + tau) if self.damping else scale

    def elapsed(self, kappa: Any) -> Any:
        """``κ``: this rule counts staleness in updates, and records the optimiser's time in samples."""
        return kappa

    def apply(self, theta: torch.Tensor, grad: torch.Tensor, kappa: Any, tau: Any, lr: Any,
              pulled: torch.Tensor | None = None) -> None:
        self.grads.copy_(grad).mul_(self.weight(kappa, tau))
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"rule": "scaled-gradient", "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rule" not in state:  # a checkpoint from before the rule was named: the optimizer's own
            self.optimizer.load_state_dict(state)
            return
        assert state["rule"] == "scaled-gradient", f"a checkpoint of update rule {state['rule']!r}"
        self.optimizer.load_state_dict(state["optimizer"])


def build_rule(cfg: Any, theta: torch.Tensor, make_optimizer: Any, grads: torch.Tensor) -> UpdateRule:
    """The rule ``cfg.asp.update`` names for the flat parameters ``theta``. ``make_optimizer``: builds
    torch's optimizer (``scaled-gradient``); ``grads``: the flat buffer its parameters' ``.grad`` view."""
    t, asp = cfg.train, cfg.asp
    if asp.update == "scaled-gradient":
        return ScaledGradient(make_optimizer(), grads, LR_POWERS[asp.lr_scaling], asp.staleness_damping)
    hyper = Hyper(t.optimizer, t.momentum, t.weight_decay, betas=t.betas,
                  delay_tolerance=asp.delay_tolerance, batch_tolerance=asp.batch_tolerance,
                  correction=asp.delay_correction, second_moment=asp.second_moment)
    return SampleTime(hyper, tuple(theta.shape), theta.dtype)


def local_rule(cfg: Any, theta: torch.Tensor) -> SampleTime:
    """A worker's own optimiser under ``asp.push: parameters``, as the paper's released code steps it:
    its batch counted in the optimiser's time (``κ``), no staleness (its gradient is of the parameters
    it steps) and no cap."""
    t = cfg.train
    return SampleTime(Hyper(t.optimizer, t.momentum, t.weight_decay, betas=t.betas), tuple(theta.shape), theta.dtype)


def scheduled_lr(cfg: Any, epoch: float) -> float:
    """The learning rate at ``epoch`` (samples applied over the training set): ``train.lr`` times
    ``train.gamma`` for every milestone passed, and within ``asp.warmup_epochs`` times the share of it
    passed."""
    train, warmup = cfg.train, cfg.asp.warmup_epochs
    ramp = min(1.0, max(epoch, 0.0) / warmup) if warmup > 0 else 1.0
    return ramp * train.lr * train.gamma ** sum(1 for m in train.milestones if epoch >= m)


def reference_batch(cfg: Any) -> float:
    """``b_ref``: the batch a push counts one unit of the optimiser's time at."""
    return float(cfg.asp.lr_reference_batch or cfg.train.global_batch / cfg.workers)
