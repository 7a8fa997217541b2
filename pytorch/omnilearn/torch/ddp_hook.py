"""DDP's communication hook for a :class:`~omnilearn.torch.session.StepSession`: weighted sums, and the slots.

A framework that wraps the model in :class:`~torch.nn.parallel.DistributedDataParallel` (Lightning,
Accelerate, the Hugging Face Trainer) keeps its own backward; this hook changes what DDP does with
each bucket of gradients. DDP's own reduction averages over ranks, which is the global batch's
gradient only when every rank has the same share. The hook weights this rank's bucket by
``b_i / B`` (the rank's loss is a mean over its ``b_i`` samples) and sums over ranks, so the update
is the gradient of the whole global batch, whatever the split. The last bucket of a step (DDP
reduces it after every other one, once the backward has produced every gradient) also carries the
session's spare slots (rank 0's clock and every rank's compute time): the controller's
measurements ride the gradient all-reduce, and a step has no collective of its own. On gloo the
hook holds every earlier bucket for the last one, so that a step has one all-reduce in all.

DDP also stops syncing buffers at every forward (:data:`BUFFERS_STAY_LOCAL`): by default it
broadcasts rank 0's buffers at the start of every forward, a collective inside the step that makes
every rank wait for rank 0 there and hides the faster ranks' speed from the controller. As in
omnilearn's own BSP step and ``HeteroDataParallel``, every rank starts from rank 0's buffers (DDP
broadcasts them once, when it wraps the model) and then keeps its own.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations (dist.GradBucket) at registration.
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from omnilearn.errors import UserError
from omnilearn.torch.session import StepSession

BUFFERS_STAY_LOCAL = ("DDP's buffer broadcast at every forward would make every rank wait for rank 0 inside the "
                      "step, and hide the faster ranks' speed from the controller")


@dataclass
class HookState:
    """What the hook needs: the rank's session, DDP's process group, and the buckets held for the last one."""

    session: StepSession
    group: dist.ProcessGroup | None
    one_collective: bool
    held: list[tuple[torch.Tensor, torch.futures.Future[torch.Tensor]]] = field(default_factory=list)


def register_weighted_sum(model: DistributedDataParallel, session: StepSession, *,
                          one_collective: bool | None = None) -> None:
    """Replace DDP's averaging by :func:`weighted_sum_hook` and its buffer sync at every forward by none.

    Call it before the model's first forward.

    ``one_collective``: every bucket of a step goes in the last bucket's all-reduce (default: on
    gloo, whose collectives cost their latency, most of all on ranks with a small share of CPU);
    else each bucket is reduced as soon as it is ready, overlapping the backward (NCCL's default).
    """
    if not isinstance(model, DistributedDataParallel):
        raise UserError(f"omnilearn needs the model wrapped in DistributedDataParallel, got {type(model).__name__}")
    model.broadcast_buffers = False  # at every forward (DDP synced them once when it wrapped the model)
    if one_collective is None:
        one_collective = dist.get_backend(model.process_group) == "gloo"
    model.register_comm_hook(HookState(session, model.process_group, one_collective), weighted_sum_hook)


def weighted_sum_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """This rank's bucket times ``b_i / B``, summed over ranks; the last bucket carries the session's slots.

    With ``state.one_collective``, a bucket before the last is held, its future completed by the
    last bucket's all-reduce, which carries every held bucket: a step has one collective, as
    omnilearn's own BSP step. DDP calls the hook for its buckets in order and waits for their
    futures only after the last one.
    """
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
        if state.one_collective:
            held: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            state.held.append((grads, held))
            return held
        return dist.all_reduce(grads, group=state.group, async_op=True).get_future().then(lambda f: f.value()[0])
    parts, state.held = [*state.held, (grads, None)], []
    n = sum(g.numel() for g, _ in parts)
    # float32 at least: the slots hold seconds since the schedule began, which a half-precision bucket would round
    flat = torch.empty(n + session.extra_slots, dtype=torch.promote_types(grads.dtype, torch.float32),
                       device=grads.device)
    torch.cat([g.reshape(-1) for g, _ in parts], out=flat[:n])
    session.fill_slots(flat[n:])

    def unpack(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        total = fut.value()[0]
        session.read_slots(total[n:])
        offset = 0
        for g, future in parts:
            # a copy unless it starts the storage: DDP reads a bucket's result from its storage's start
            piece = total[offset:offset + g.numel()].to(g.dtype, copy=offset > 0)
            offset += g.numel()
            if future is None:
                return piece
            future.set_result(piece)
        raise AssertionError("the last bucket is the last part")

    return dist.all_reduce(flat, group=state.group, async_op=True).get_future().then(unpack)
