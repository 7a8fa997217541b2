"""The worker's side of the emulator: ask for the allocation of a level, wait, adapt threads."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnilearn.emulator.levels import Allocation
from omnilearn.emulator.plan import EmulationPlan
from omnilearn.emulator.requests import RequestWriter

log = logging.getLogger("omnilearn.worker")


@dataclass
class AllocationClient:
    """Tracks the level in force for one target and the allocation the toggler confirmed.

    A change goes through the CPU-request log (never straight to the kernel), so the same worker
    code drives local cgroups and Docker containers alike.
    """

    plan: EmulationPlan
    log_dir: Path
    rank: int
    target: str
    ack_timeout: float
    level: str | None = None
    allocation: Allocation = field(default_factory=Allocation)
    threads: int = 0

    def __post_init__(self) -> None:
        self._writer = RequestWriter(self.log_dir, self.rank)

    def ensure(self, level: str, epoch: float) -> dict[str, Any] | None:
        """Switch to ``level`` if it is not in force; returns the change event, or None."""
        if level == self.level:
            return None
        wanted = self.plan.allocation(level, self.target)
        t0 = time.time()
        req = self._writer.submit(self.target, level, wanted, epoch)
        record = self._writer.wait_applied(req, timeout=self.ack_timeout)
        waited = time.time() - t0
        if record is None:
            log.warning("rank %d: toggler did not confirm %s for %s within %.0f s; continuing with "
                        "the requested allocation", self.rank, level, self.target, self.ack_timeout)
            effective, status = wanted, "unconfirmed"
        elif record.get("status") == "applied":
            effective, status = Allocation.from_dict(record.get("effective") or {}), "applied"
        else:
            # Refused (or not applied by the backend): the allocation in force stays.
            log.warning("rank %d: request for %s %s: %s (%s)", self.rank, level, record.get("status"),
                        record.get("reason"), record.get("detail"))
            effective, status = self.allocation, "rejected"
        previous = self.level
        self.level, self.allocation = level, effective
        self.threads = effective.threads()
        torch.set_num_threads(self.threads)
        return {
            "from_level": previous, "level": level, "epoch": epoch, "target": self.target,
            "requested": wanted.to_dict(), "effective": effective.to_dict(), "status": status,
            "threads": self.threads, "ack_s": round(waited, 3),
        }
