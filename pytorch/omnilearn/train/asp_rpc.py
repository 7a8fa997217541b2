"""The parameter server's process: its RPC entry points, start, fault handling and shutdown.

TensorPipe calls module-level functions; they reach the one :class:`ParameterServer` of the server
process (set by :func:`run_server` before the RPC agent starts; workers never touch it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed.rpc as rpc

from omnilearn.emulator.protocol.client import AllocationClient
from omnilearn.emulator.spec.plan import SERVER_TARGET
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import metrics_path
from omnilearn.train.distributed import env_int
from omnilearn.train.models import count_parameters
from omnilearn.train.parameter_server import LockedWriter, ParameterServer, WorkerTimeout
from omnilearn.train.workload import load_workload

log = logging.getLogger("omnilearn.server")

SHUTDOWN_TIMEOUT_S = 30.0


class Terminated(Exception):
    """SIGTERM: the launcher is stopping the job."""


def rpc_options(cfg_timeout: float, workers: int) -> rpc.TensorPipeRpcBackendOptions:
    """TensorPipe options from torchrun's MASTER_ADDR/MASTER_PORT (the ``env://`` rendezvous)."""
    env_int("MASTER_PORT")  # a clear message when the launcher's variables are missing
    # TCP (libuv) transport and the basic channel only. TensorPipe's default shared-memory transport
    # busy-polls: measured, every RPC process then burns a whole CPU (mostly system time) even when
    # idle, which under a CPU quota is taken from the emulated worker's own compute. One thread per
    # worker can sit in hello; the rest answer pulls and pushes.
    return rpc.TensorPipeRpcBackendOptions(num_worker_threads=2 * workers + 4, rpc_timeout=cfg_timeout,
                                           init_method="env://", _transports=["uv"], _channels=["basic"])


_SERVER: ParameterServer | None = None


def _server() -> ParameterServer:
    assert _SERVER is not None, "no parameter server in this process"
    return _SERVER


# A worker names itself by its slot (its rank in the whole job), which stays when survivors are re-ranked.
def rpc_hello(slot: int, timeout: float, max_batch: int | None = None) -> dict[str, Any]:
    return _server().hello(slot, timeout, max_batch)


def rpc_pull(slot: int) -> tuple[torch.Tensor | None, dict[str, Any]]:
    return _server().pull(slot)


def rpc_idle(slot: int) -> dict[str, Any]:
    return _server().idle(slot)


def rpc_push(slot: int, seq: int, version: int, flat: torch.Tensor, batch: int, stats: dict[str, Any]
             ) -> dict[str, Any]:
    return _server().push(slot, seq, version, flat, batch, stats)


def _raise_terminated(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise Terminated


def run_server(job: JobSpec) -> None:
    """Rank 0 of an ASP job: serve until the target samples are applied, then snapshot and stop."""
    global _SERVER
    cfg = job.config
    t = cfg.train
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    assert rank == 0 and world == len(job.slots), (rank, world, job.slots)
    torch.manual_seed(t.seed)
    work = load_workload(cfg)
    train, test = work.train, work.test
    model = work.model()
    metrics = LockedWriter(metrics_path(job.out_dir, 0))
    server = ParameterServer(job, model, len(train), metrics)
    metrics.write("start", rank=0, world=world, target=SERVER_TARGET, role="server", params=count_parameters(model),
                  train_samples=len(train), test_samples=len(test), target_samples=server.target_samples,
                  policy=cfg.control.policy, lr_reference_batch=server.b_ref, lr_power=server.lr_power,
                  staleness_damping=cfg.asp.staleness_damping, update=cfg.asp.update, push=cfg.asp.push,
                  delay_tolerance=cfg.asp.delay_tolerance, workers=server.workers)
    if server.checkpoint.resumed:
        metrics.write("resume", version=server.version, samples=server.samples, epoch=server.epoch,
                      clock=server.clock, level=server.level, pushes=list(server.last_seq),
                      checkpoint_saved=server.checkpoint.state["saved"])
    metrics.write("batch_change", version=server.version, epoch=server.epoch, batch=list(server.controller.batch),
                  reason="resumed" if server.checkpoint.resumed else "initial")
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    client = AllocationClient(job.plan, job.log_dir, 0, SERVER_TARGET, cfg.emulation.ack_timeout)
    try:
        event = client.ensure(server.level, 0.0)
        if event is not None:
            metrics.write("hl_change", version=0, elapsed_s=0.0, **event)
        _SERVER = server
        rpc.init_rpc(SERVER_TARGET, rank=0, world_size=world,
                     rpc_backend_options=rpc_options(cfg.asp.worker_timeout_s, server.workers))
        server.serve(client)
    except BaseException as e:  # noqa: BLE001 - every way out of training leaves a checkpoint
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the checkpoint short
        if isinstance(e, UserError) and server.version == 0:
            metrics.write("fault", message=str(e), checkpoint=None, version=0, samples=0, epoch=0.0)
            metrics.close()
            print(f"omnilearn: error: {e}", file=sys.stderr, flush=True)  # nothing trained, nothing to keep
            os._exit(UserError.exit_status)
        if not isinstance(e, (WorkerTimeout, Terminated, KeyboardInterrupt, UserError)):
            traceback.print_exc()
        path = server.checkpoint.path
        reason = str(e) if isinstance(e, (WorkerTimeout, UserError)) else (
            "stopped by the launcher" if isinstance(e, (Terminated, KeyboardInterrupt))
            else f"parameter server failed: {type(e).__name__}: {e}")
        # Before the save: a resumed run keeps the records its checkpoint saw, this one included.
        metrics.write("fault", message=reason, checkpoint=str(path), version=server.version,
                      samples=server.samples, epoch=server.epoch)
        server.checkpoint.save("stopped")
        metrics.close()
        print(f"omnilearn: error: {reason}; job stopped, server checkpoint saved to {path}", file=sys.stderr,
              flush=True)
        # No RPC shutdown: it would wait for the worker that is gone. The launcher stops the rest.
        os._exit(143 if isinstance(e, Terminated) else UserError.exit_status if isinstance(e, UserError) else 1)
    signal.signal(signal.SIGTERM, previous)
    assert server.t_start is not None and server.t_done is not None and server.t_end is not None
    # Until the last worker stopped (every gradient applied): since the run first started (a resumed
    # run's pause included), and on the training clock, which goes on from the checkpoint's.
    assert server.started is not None
    metrics.write("end", wall_time_s=server.t_end - server.started, train_time_s=server.elapsed(server.t_end),
                  done_time_s=server.elapsed(server.t_done),
                  samples=server.samples, target_samples=server.target_samples, updates=list(server.updates),
                  version=server.version, duplicates=server.duplicates, batch=list(server.controller.batch),
                  level=server.level, epoch=server.epoch, **server.loop.summary())
    metrics.close()
    shutdown_rpc()


def shutdown_rpc() -> None:
    """Graceful RPC shutdown (every rank reaches it), bounded: a vanished peer must not hang us."""
    t0 = time.perf_counter()
    try:
        rpc.shutdown(graceful=True, timeout=SHUTDOWN_TIMEOUT_S)
        log.info("RPC shut down in %.2f s", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - any failure here only means a peer left first
        log.warning("graceful RPC shutdown failed (%s); shutting down locally", e)
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # noqa: BLE001
            pass
