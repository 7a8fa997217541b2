"""torch.distributed set-up from torchrun's environment variables, small collectives, and flat buffers.

Flat buffers: the BSP all-reduce, the ASP pull and push and the server's snapshots each move ONE
tensor; parameters, gradients and buffers are views into it, so none of them packs or unpacks.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import socket
import struct
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


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every network interface of this process's namespace (SIOCGIFADDR)."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                out[name] = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
            except OSError:
                continue  # no IPv4 address on this interface
    return out


def select_interface(subnet: str) -> str | None:
    """The interface whose address lies in ``subnet`` (a container's overlay network)."""
    net = ipaddress.ip_network(subnet, strict=False)
    for name, addr in interface_addresses().items():
        if ipaddress.ip_address(addr) in net:
            return name
    return None


def use_overlay_interface() -> None:
    """In a container on several networks, make gloo and TensorPipe use the job's overlay network.

    The launcher passes the overlay's subnet as OMNILEARN_SUBNET; without this, gloo may pick the
    docker_gwbridge interface, which other hosts cannot reach.
    """
    subnet = os.environ.get("OMNILEARN_SUBNET")
    if not subnet or "GLOO_SOCKET_IFNAME" in os.environ:
        return
    name = select_interface(subnet)
    if name is None:
        raise UserError(f"no network interface in the job's overlay subnet {subnet} "
                        f"(interfaces: {interface_addresses()})")
    os.environ["GLOO_SOCKET_IFNAME"] = name
    os.environ.setdefault("TP_SOCKET_IFNAME", name)


def preload_for_clean_exit() -> None:
    """Import torch's compiler stack now, before any process group exists.

    The first optimizer a process builds imports ``torch._dynamo`` and with it
    ``torch.distributed.fsdp``; imported while a process group exists, that keeps a reference to the
    default group past ``destroy_process_group``. Its gloo threads then live until the interpreter
    finalizes, where tearing them down can abort the process (SIGABRT) after a clean run. Imported
    before the group exists, nothing holds it and ``destroy_process_group`` ends its threads.
    """
    import torch._dynamo  # noqa: F401


def init(backend: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    """Join the process group described by RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK.

    ``auto`` picks NCCL when this process has a GPU and gloo otherwise (the CPU path).
    """
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK", 0)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise UserError(f"environment variable {name} is not set (run under `omnilearn run` or torchrun)")
    use_overlay_interface()
    preload_for_clean_exit()
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


class GradBuffer:
    """One flat tensor holding every parameter's gradient (``.grad`` are views into it).

    Backward accumulates straight into the buffer, so the all-reduce is a single call with no
    packing or unpacking copies, and zeroing is one ``fill_``.
    """

    def __init__(self, params: list[torch.nn.Parameter], extra: int = 0) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel + extra, device=params[0].device)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = self.flat[offset:offset + n].view_as(p)
            offset += n
        self.extra = self.flat[self.numel:]

    def zero(self) -> None:
        self.flat.zero_()

    def all_reduce(self) -> None:
        dist.all_reduce(self.flat)


def flat_state(model: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """Move the model's parameters and floating-point buffers into one flat tensor; return it.

    Parameters and buffers become views into the returned tensor (parameters first, in
    ``model.parameters()`` order, then the buffers in ``model.modules()`` order), so a pull is one
    ``copy_`` and a snapshot one ``clone``. Also returns the number of parameter elements.
    """
    params = list(model.parameters())
    assert all(p.requires_grad for p in params), "every parameter is trained"
    buffers = [(m, name, b) for m in model.modules() for name, b in m.named_buffers(recurse=False)
               if b.dtype.is_floating_point]
    n_params = sum(p.numel() for p in params)
    flat = torch.cat([p.detach().reshape(-1) for p in params] + [b.reshape(-1) for _, _, b in buffers])
    offset = 0
    for p in params:
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    for m, name, b in buffers:
        setattr(m, name, flat[offset:offset + b.numel()].view_as(b))
        offset += b.numel()
    return flat, n_params
