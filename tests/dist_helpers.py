"""Run a function in N gloo processes on this machine (the tests' multi-process harness)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple, errors: Path) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        fn(rank, world, *args)
    except BaseException:
        errors.joinpath(f"rank-{rank}.err").write_text(traceback.format_exc())
        raise


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, tmp: Path, timeout: float = 120) -> None:
    """Start ``fn(rank, world, *args)`` in ``world`` spawned processes; fail with the first traceback."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, tmp)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    errs = sorted(tmp.glob("rank-*.err"))
    if errs:
        raise AssertionError(errs[0].read_text())
    assert not alive, f"{len(alive)} rank(s) hung"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def init_gloo() -> None:
    import torch.distributed as dist

    from omnilearn.train.distributed import preload_for_clean_exit

    preload_for_clean_exit()  # or a rank's exit can abort (SIGABRT) after its test passed
    dist.init_process_group("gloo")
