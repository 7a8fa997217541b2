"""DDP's communication hook for a :class:`~omnilearn.torch.session.StepSession`: weighted sums, and the slots.

A framework that wraps the model in :class:`~torch.nn.parallel.DistributedDataParallel` (Lightning,
Accelerate, the Hugging Face Trainer) keeps its own backward; this hook changes what DDP does with
each bucket of gradients. DDP's own reduction averages over ranks, which is the global batch's
gradient only when every rank has the same share. The hook weights this rank's bucket by
``b_i / B`` (the rank's loss is a mean over its ``b_i`` samples) and sums over ranks, so the update
is the gradient of the whole global batch, whatever the split. The last bucket of a step (DDP
reduces it after every other one, once the backward has produced every gradient) also carries the
session's spare slots (rank 0's clock and every rank's compute time): the controller's
measurements ride the gradient all-reduce, and a step has no collective of its own.

DDP must also leave buffers alone (``broadcast_buffers=False``, :data:`BUFFERS_STAY_LOCAL`): by
default it broadcasts rank 0's buffers at the start of every forward, a collective inside the step
that makes every rank wait for rank 0 there and hides the faster ranks' speed from the controller.
As in omnilearn's own BSP step and ``HeteroDataParallel``, every rank starts from rank 0's buffers
(DDP broadcasts them once, when it wraps the model) and then keeps its own.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations (dist.GradBucket) at registration.
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from omnilearn.errors import UserError
from omnilearn.torch.session import StepSession

BUFFERS_STAY_LOCAL = ("DDP's broadcast_buffers must be False: its broadcast at every forward would make every rank "
                      "wait for rank 0 inside the step, and hide the faster ranks' speed from the controller")


@dataclass
class HookState:
    """What the hook needs: the rank's session and DDP's process group."""

    session: StepSession
    group: dist.ProcessGroup | None


def register_weighted_sum(model: DistributedDataParallel, session: StepSession) -> None:
    """Replace DDP's averaging by :func:`weighted_sum_hook` (before the model's first backward)."""
    if not isinstance(model, DistributedDataParallel):
        raise UserError(f"omnilearn needs the model wrapped in DistributedDataParallel, got {type(model).__name__}")
    assert not model.broadcast_buffers, BUFFERS_STAY_LOCAL
    model.register_comm_hook(HookState(session, model.process_group), weighted_sum_hook)


def weighted_sum_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """This rank's bucket times ``b_i / B``, summed over ranks; the last bucket carries the session's slots."""
    session = state.session
    if session.pending is None:
        raise UserError("a backward ran outside a training step of omnilearn's loader: every step's batch must "
                        "come from it, and each step has one backward")
    grads = bucket.buffer()
    weight = session.weight
    if weight == 0.0:
        grads.zero_()  # an empty share of a partial last step: its loss (a mean of nothing) is no number
    else:
        grads.mul_(weight)
    if not bucket.is_last():
        return dist.all_reduce(grads, group=state.group, async_op=True).get_future().then(lambda f: f.value()[0])
    n = grads.numel()
    # float32 at least: the slots hold seconds since the schedule began, which a half-precision bucket would round
    flat = torch.empty(n + session.extra_slots, dtype=torch.promote_types(grads.dtype, torch.float32),
                       device=grads.device)
    flat[:n].copy_(grads)
    session.fill_slots(flat[n:])

    def unpack(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        total = fut.value()[0]
        session.read_slots(total[n:])
        return total[:n].to(grads.dtype)

    return dist.all_reduce(flat, group=state.group, async_op=True).get_future().then(unpack)
