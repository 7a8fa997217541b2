"""The synchronous step's gradient sum, one rank's side: what every BSP step of a model's own runs.

``omnilearn run``'s workers (:mod:`omnilearn.train.bsp`) and :class:`~omnilearn.torch.HeteroDataParallel`
in a user's loop train through one :class:`GradientSum`. A step of ``b_i`` samples on rank ``i`` of a
global batch ``B``, in one or more micro-batches:

- every backward's loss is a mean over its micro-batch, divided by the micro-batches of the step;
  a micro-batch's gradient is weighted by its part of the local mean (``k m_j / b_i``: 1 when the
  micro-batches are equal), so the local gradient is the mean over the rank's ``b_i`` samples;
- at the end of the step's last backward (not under ``no_sync``) the local gradient is weighted by
  ``b_i / B`` and every rank's is summed by one all-reduce of a flat buffer
  (:class:`~omnilearn.train.distributed.GradBuffer`): the update is the gradient of the whole global
  batch, whatever the split;
- the buffer's spare slots after the gradients carry the step's measurements
  (:class:`~omnilearn.train.step.Slots`), written by ``fill`` just before the all-reduce and read by
  ``read`` just after it, so a step has one collective.

A rank with nothing to backward in a step (an empty share of a partial last step, a step it could not
fit in memory) still joins the sum with a zero gradient: :meth:`GradientSum.reduce`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from omnilearn.errors import UserError
from omnilearn.train.distributed import GradBuffer


class GradientSum:
    """One rank's gradient sum of the synchronous step (see the module): :meth:`open` a step, run its
    backwards, and the last one all-reduces (or :meth:`reduce` where the rank ran none).

    ``extra``: spare slots after the gradients; ``fill(extra)`` writes this rank's just before the
    all-reduce, ``read(extra)`` reads the sum just after; ``sync``: what makes the backward's work done
    before ``fill`` times it (a GPU's synchronize). ``owner`` names the caller in error messages.
    """

    def __init__(self, params: list[torch.nn.Parameter], extra: int, *, fill: Callable[[torch.Tensor], None],
                 read: Callable[[torch.Tensor], None], sync: Callable[[], None] = lambda: None,
                 owner: str = "the BSP step") -> None:
        self.params = params
        self.buffer = GradBuffer(params, extra=extra)
        self.views = [p.grad for p in params]
        self.fill, self.read, self.sync, self.owner = fill, read, sync, owner
        self.is_open = False
        self.deferred = False  # backwards keep their gradient local (no_sync, require_backward_grad_sync)
        self.micro: list[int] = [0]  # this rank's micro-batch sizes in the open step
        self.weight = 0.0  # b_i / B of the open step
        self.backwards = 0  # backwards run in the open step
        self.reduced = False
        self._queued = False
        self._hooked = False

    @property
    def extra(self) -> torch.Tensor:
        return self.buffer.extra

    def open(self, micro: list[int], weight: float) -> None:
        """A step of ``micro`` (this rank's micro-batch sizes) with gradient weight ``weight`` (``b_i / B``;
        0 for an empty share): gradients zeroed, the parameters' ``.grad`` the buffer's views again."""
        if not self._hooked:  # on the first step: a model trained otherwise (DDP's peer) runs no hook
            for p in self.params:
                p.register_hook(self._on_grad)
            self._hooked = True
        self.micro, self.weight = list(micro), weight
        self.backwards, self.reduced, self._queued, self.is_open = 0, False, False, True
        self.buffer.zero()
        for p, v in zip(self.params, self.views, strict=True):
            p.grad = v

    def close(self) -> None:
        """The step is over: backwards until the next :meth:`open` are not the step's."""
        self.is_open = False
        self.backwards, self.reduced = 0, False

    def _on_grad(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self.is_open:
            return None
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        j, k = self.backwards, len(self.micro)
        if k == 1 or j >= k:
            return None
        if self.micro[j] == 0:  # an empty micro-batch of a partial last step: its loss is no number
            return torch.zeros_like(grad)
        weight = k * self.micro[j] / sum(self.micro)  # its part of the local mean (the loss was divided by k)
        return None if weight == 1.0 else grad * weight

    def _end_backward(self) -> None:
        """End of a backward: a step's last one (not deferred) all-reduces."""
        self._queued = False
        if self.reduced:
            raise UserError(f"{self.owner}: a backward after the step's all-reduce; with gradient "
                            "accumulation, give the loader accumulate=<micro-batches per optimizer step>")
        self.backwards += 1
        if self.deferred or self.backwards < len(self.micro):
            return
        self.reduce()

    def reduce(self) -> None:
        """This rank's gradient, weighted by ``b_i / B``, summed over ranks with the slots
        (``fill`` before, ``read`` after): at the end of the step's last backward, or called where
        this rank ran none in the step (its gradient is then zero)."""
        assert self.is_open and not self.reduced, "reduce outside an open step, or twice"
        self.reduced = True
        for p, v in zip(self.params, self.views, strict=True):
            if p.grad is None or self.backwards == 0:
                v.zero_()
            elif p.grad.data_ptr() != v.data_ptr():  # zero_grad(set_to_none) let backward allocate anew
                v.copy_(p.grad)
            p.grad = v
        if self.weight == 0.0:
            self.buffer.zero()  # an empty share of a partial last step: its loss is no number
        else:
            self.buffer.flat[:self.buffer.numel].mul_(self.weight)
        self.sync()
        extra = self.buffer.extra
        self.fill(extra)
        self.buffer.all_reduce()
        self.sync()
        self.read(extra)

    def check_closed(self) -> None:
        """A step whose backwards ran and never all-reduced (its last under ``no_sync``, or fewer than
        its micro-batches): a UserError."""
        if self.backwards and not self.reduced:
            raise UserError(f"{self.owner}: a step ended after {self.backwards} backward(s) and no "
                            f"all-reduce (its last one under no_sync(), or fewer than the loader's "
                            f"accumulate={len(self.micro)} micro-batches): give the loader "
                            "accumulate=<micro-batches per optimizer step>, and run its last backward "
                            "outside no_sync()")
