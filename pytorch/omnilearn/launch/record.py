"""``omnilearn record -- COMMAND``: an unmodified DDP job's step times, with nothing emulated.

What ``omnilearn emulate`` does to a command's ranks, less the emulation: the command runs as given (a
real cluster's job, ``torchrun ... train.py``) with the timing module loaded into every rank through
the environment (:func:`~omnilearn.launch.emulate.command_env`), which writes each rank's step records
to the run folder (:mod:`omnilearn.torch.hook_timing`). ``omnilearn whatif`` reads them. The command's
exit status is record's.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from omnilearn import config
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.launch.emulate import SCAN_S, command_env, end_process
from omnilearn.launch.interrupts import Interrupts
from omnilearn.metrics import read_rank
from omnilearn.records import STEP, of_kind


def record_job(argv: list[str], out: Path) -> JobSpec:
    """The run folder's job (no emulation), checked before anything starts; the timing module sets its
    ranks and batch from what the script runs."""
    if not argv:
        raise UserError("omnilearn record: give a command after --, e.g. -- torchrun --nproc-per-node 4 train.py")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder")
    cfg = config.build(None, [("emulation.backend", "none"), ("emulation.hl", "HL1")])
    return JobSpec(job_id=new_job_id(), config=cfg, plan=build_plan(cfg), out_dir=out.resolve(), backend="none")


def record(argv: list[str], out: Path) -> int:
    """Run ``argv`` with its ranks' step times recorded into ``out``; returns its exit status."""
    job = record_job(argv, out)
    job.save()
    proc: subprocess.Popen | None = None
    with Interrupts() as interrupts:
        try:
            try:
                proc = subprocess.Popen(argv, env=command_env(job, time.time()))
            except OSError as e:
                raise UserError(f"omnilearn record: cannot start {argv[0]!r}: {e.strerror}") from None
            while proc.poll() is None:
                interrupts.wait(SCAN_S)
            return proc.returncode
        except KeyboardInterrupt:
            return 130
        finally:
            end_process(proc)


def recorded_ranks(out: Path) -> dict[int, str]:
    """The ranks with step records in the run folder ``out``, and what wrote them (``hook``: the timing
    module; ``omnilearn.torch``: the script's own use of it)."""
    found = {}
    for path in sorted((out / "metrics").glob("rank-*.jsonl")):
        name = path.stem.split("-", 1)[1]
        steps = of_kind(read_rank(out, name), STEP) if name.isdigit() else []
        if steps:
            found[int(name)] = "hook" if steps[0].get("source") == "hook" else "omnilearn.torch"
    return dict(sorted(found.items()))


def steps_line(out: Path, command: str) -> str:
    """One line on what the run folder holds of the command's steps (``command``: record or emulate)."""
    ranks = recorded_ranks(out)
    if ranks:
        sources = " and ".join(sorted(set(ranks.values())))
        return (f"omnilearn {command}: step records ({sources}) of rank(s) {', '.join(map(str, ranks))} in "
                f"{out / 'metrics'}; what balancing would give: omnilearn whatif {out}")
    why = ("the command wrapped no DistributedDataParallel model (or registered a hook the timing module "
           "cannot wrap)")
    extra = ": its ranks' CPU and busy seconds are in summary.json" if command == "emulate" else ""
    return f"omnilearn {command}: no step records: {why}{extra}"
