"""The problems of the ASP benchmark: losses whose optimum is known, with the gradient noise of a batch.

Every problem holds ``S`` independent runs at once, one row of ``θ`` each (``(S, d)``), so one
simulated update moves every seed's model in a few tensor operations.

- **Noisy quadratic model** (Zhang et al., NeurIPS 2019, "Which algorithmic choices matter at which
  batch sizes?"): ``L(θ) = ½ Σ_j h_j θ_j²`` with ``h_j = 1 / j`` (``j = 1..d``); a gradient of ``b``
  samples is ``h ⊙ θ + ξ ⊙ √(ν h / b)``, ``ξ`` standard normal: the noise covariance is ``ν H / b``,
  ``H / b`` in the paper. The optimum is ``L* = 0`` at ``θ = 0``; each seed starts at ``θ_j ~ N(0, 1)``.
- **Logistic regression** on a fixed synthetic set (``N`` points in ``d`` dimensions, labels drawn
  from a logistic model with a known weight, an L2 term ``ℓ₂ / 2 |θ|²``): a gradient of ``b``
  samples is the mean over ``b`` points drawn with replacement; ``L*`` is found once, by Newton's
  method on the whole set.

:meth:`excess` is ``L(θ) − L*`` per row: what the benchmark's losses report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PROBLEMS = ("nqm", "logistic")


@dataclass
class Quadratic:
    """The noisy quadratic model in ``dim`` dimensions."""

    dim: int = 100
    noise: float = 1.0
    """The noise covariance is ``noise · H / b``."""

    def __post_init__(self) -> None:
        self.h = 1.0 / torch.arange(1, self.dim + 1, dtype=torch.float64)

    def start(self, seeds: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(seeds, self.dim, generator=gen, dtype=torch.float64)

    def gradient(self, theta: torch.Tensor, batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``theta`` ``(S, d)``, ``batch`` ``(S, 1)`` samples per row."""
        noise = torch.randn(theta.shape, generator=gen, dtype=theta.dtype)
        return self.h * theta + noise * torch.sqrt(self.noise * self.h / batch)

    def excess(self, theta: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.h * theta * theta).sum(dim=1)


@dataclass
class Logistic:
    """L2-regularised logistic regression on ``points`` synthetic points in ``dim`` dimensions."""

    dim: int = 20
    points: int = 4096
    l2: float = 1e-3

    def __post_init__(self) -> None:
        self._z: torch.Tensor | None = None
        self._zf = torch.empty(0)
        gen = torch.Generator().manual_seed(20191202)
        self.x = torch.randn(self.points, self.dim, generator=gen, dtype=torch.float64)
        w = torch.randn(self.dim, generator=gen, dtype=torch.float64) * 2.0 / self.dim ** 0.5
        p = torch.sigmoid(self.x @ w)
        self.y = (torch.rand(self.points, generator=gen, dtype=torch.float64) < p).to(torch.float64)
        self.xy = self.x.T @ self.y / self.points  # the labels' term of the loss is linear in θ
        self.best = float(self._loss(self._newton()[None, :])[0])

    def _loss(self, theta: torch.Tensor) -> torch.Tensor:
        # Every update's loss is taken: the (S, N) buffers are kept, since allocating them anew each time
        # costs more than the arithmetic; softplus runs in single precision (a third of double's time,
        # an error near 1e-7 of a loss whose targets are above 1e-2).
        if self._z is None or self._z.shape[0] != theta.shape[0]:
            self._z = torch.empty(theta.shape[0], self.points, dtype=torch.float64)
            self._zf = torch.empty(theta.shape[0], self.points, dtype=torch.float32)
        torch.matmul(theta, self.x.T, out=self._z)
        self._zf.copy_(self._z)
        torch.nn.functional.softplus(self._zf, out=self._zf)
        data = self._zf.mean(dim=1).double() - theta @ self.xy
        return data + 0.5 * self.l2 * (theta * theta).sum(dim=1)

    def _newton(self, steps: int = 50) -> torch.Tensor:
        w = torch.zeros(self.dim, dtype=torch.float64)
        eye = torch.eye(self.dim, dtype=torch.float64)
        for _ in range(steps):
            p = torch.sigmoid(self.x @ w)
            g = self.x.T @ (p - self.y) / self.points + self.l2 * w
            hess = (self.x.T * (p * (1 - p))) @ self.x / self.points + self.l2 * eye
            step = torch.linalg.solve(hess, g)
            w = w - step
            if float(step.abs().max()) < 1e-12:
                break
        return w

    def start(self, seeds: int, gen: torch.Generator) -> torch.Tensor:
        return torch.zeros(seeds, self.dim, dtype=torch.float64)

    def gradient(self, theta: torch.Tensor, batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        most = int(batch.max())
        index = torch.randint(self.points, (theta.shape[0], most), generator=gen)
        mask = (torch.arange(most)[None, :] < batch).to(theta.dtype)  # (S, most): each row's own b points
        x = self.x[index]  # (S, most, d)
        z = torch.einsum("sbd,sd->sb", x, theta)
        r = (torch.sigmoid(z) - self.y[index]) * mask
        return torch.einsum("sb,sbd->sd", r, x) / batch + self.l2 * theta

    def excess(self, theta: torch.Tensor) -> torch.Tensor:
        return self._loss(theta) - self.best


def make_problem(name: str, noise: float = 1.0) -> Quadratic | Logistic:
    """The problem ``name``; ``noise``: the quadratic's ``ν``."""
    assert name in PROBLEMS, name
    return Quadratic(noise=noise) if name == "nqm" else Logistic()
