"""torch.distributed set-up from torchrun's environment variables, and small collectives."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from omnilearn.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise UserError(f"environment variable {name} is not set (run under `omnilearn run` or torchrun)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer") from None


def init(backend: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    """Join the process group described by RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK.

    ``auto`` picks NCCL when this process has a GPU and gloo otherwise (the CPU path).
    """
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK", 0)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise UserError(f"environment variable {name} is not set (run under `omnilearn run` or torchrun)")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


def all_gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's small vector of floats, in rank order (one collective)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def broadcast_float(value: float, src: int, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=src)
    return float(t.item())


def average_buffers(module: torch.nn.Module) -> None:
    """Average floating-point buffers (BatchNorm running statistics) over ranks, in one call.

    Each replica's statistics come from its own (differently sized) batches; evaluation should see
    one model, the same on every rank.
    """
    bufs = [b for b in module.buffers() if b.dtype.is_floating_point]
    if not bufs:
        return
    flat = torch.cat([b.reshape(-1) for b in bufs])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for b in bufs:
        n = b.numel()
        b.copy_(flat[offset:offset + n].view_as(b))
        offset += n
