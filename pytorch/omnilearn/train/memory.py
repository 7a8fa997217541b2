"""Memory-aware batch bounds: how large a batch this worker can take without being killed.

In a container or cgroup with a memory limit the kernel kills a process that exceeds it, with no
Python exception to catch, so the bound must be known before a batch grows. Each worker learns its
budget (its cgroup's limit, else the memory available on the host; on a GPU, the device's memory),
measures at start-up how its peak memory grows with the batch size (two short probe steps), and
derives ``max_batch``: the largest batch whose predicted peak stays below the budget minus a margin.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from omnilearn.control.controller import Controller
from omnilearn.control.policies import Bounds
from omnilearn.emulator.backends.cgroupfs import memory_limit, memory_peak_file
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.memory")

@dataclass(frozen=True)
class MemoryBudget:
    bytes: int
    source: str  # e.g. "cgroup v1 /sys/fs/cgroup/memory/omnilearn/<job>/worker1", "host MemAvailable", "cuda:0"


def host_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def memory_budget(device: torch.device) -> MemoryBudget:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return MemoryBudget(total, f"{device}")
    limit = memory_limit()
    if limit is not None:
        return MemoryBudget(*limit)
    return MemoryBudget(host_available() + current_rss(), "host MemAvailable")


def current_rss() -> int:
    return _status_kb("VmRSS") * 1024


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cgroup_peak_file() -> Path | None:
    """The kernel's peak-usage counter of this process's own memory cgroup, if we may reset it.

    It counts exactly what the limit is checked against (anonymous memory and the page cache this
    cgroup touched first), unlike the process's peak RSS, which also counts shared library pages
    that other processes loaded and the kernel charged elsewhere.
    """
    f = memory_peak_file()
    if f is None:
        return None
    try:
        f.write_text("0")  # v1 and recent v2 kernels reset the counter to the current usage
    except OSError:
        return None
    return f


def reset_peak(device: torch.device) -> Path | None:
    """Start a new peak measurement; returns the cgroup counter used, or None for VmHWM/CUDA."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return None
    counter = _cgroup_peak_file()
    if counter is not None:
        return counter
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return None


def peak_bytes(device: torch.device, counter: Path | None = None) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if counter is not None:
        return int(counter.read_text())
    return _status_kb("VmHWM") * 1024


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory ~ base + per_sample * batch, fitted from two probe steps."""

    base: int
    per_sample: int
    budget: MemoryBudget
    margin: float

    def max_batch(self) -> int:
        usable = self.budget.bytes * (1 - self.margin) - self.base
        if usable <= 0:
            return 0
        return int(usable // max(self.per_sample, 1))

    def max_batch_now(self, device: torch.device) -> int:
        """:meth:`max_batch` under the budget as it is now (re-read: a level may change the limit)."""
        return replace(self, budget=memory_budget(device)).max_batch()

    def describe(self) -> str:
        return (f"budget {self.budget.bytes / 2**20:.0f} MiB ({self.budget.source}), base "
                f"{self.base / 2**20:.0f} MiB + {self.per_sample / 2**20:.2f} MiB/sample, margin "
                f"{self.margin:.0%} -> max batch {self.max_batch()}")


def probe(step: Callable[[int], None], device: torch.device, available: int, margin: float,
          budget: MemoryBudget | None = None, sizes: tuple[int, int] | None = None) -> MemoryModel:
    """Run ``step(b)`` (forward + backward of b samples) at two sizes and fit the peak-memory line.

    The sizes (``sizes``, else up to 4 and 16) stay within ``available`` samples. Each size runs
    twice and the second peak is kept: the first call also allocates one-off state (optimizer
    buffers, caches), which belongs to the base, not to the samples.
    """
    if sizes is None:
        sizes = (4, 16)
    sizes = (max(1, min(sizes[0], available // 4)), max(2, min(sizes[1], available)))
    budget = budget or memory_budget(device)
    peaks = []
    for b in sizes:
        step(b)
        counter = reset_peak(device)
        step(b)
        peaks.append(peak_bytes(device, counter))
    (b1, b2), (p1, p2) = sizes, peaks
    per_sample = max(int(math.ceil((p2 - p1) / (b2 - b1))), 1)
    base = p1 - per_sample * b1
    model = MemoryModel(base=max(base, 0), per_sample=per_sample, budget=budget, margin=margin)
    log.info("memory: %s", model.describe())
    return model


def memory_bounds(configured: Bounds, memory_max: Sequence[int | None], global_batch: int, who: str) -> Bounds:
    """The configured bounds capped by each worker's memory bound (None: not known, not capped).

    Raises :class:`UserError` when the global batch cannot fit; ``who`` names the workers in it.
    """
    bounds = Bounds(configured.min_batch, tuple(c if m is None else min(m, c)
                                                for m, c in zip(memory_max, configured.max_batch, strict=True)))
    if not bounds.feasible(global_batch):
        raise UserError(f"train.global_batch={global_batch} does not fit in the {who}' memory: they can take "
                        f"at most {list(bounds.max_batch)} samples (sum {sum(bounds.max_batch)}; "
                        f"control.min_batch={bounds.min_batch}); lower the global batch or raise the memory "
                        f"limits")
    return bounds


@dataclass(frozen=True)
class BoundsChange:
    """What :func:`enforce_bounds` did: the bounds, whether the controller keeps to them, and the effect."""

    bounds: Bounds
    enforced: bool
    over: list[int]
    """Workers (indices) given more than their bound by a policy that does not enforce it."""
    old: list[int]
    new: list[int] | None
    """The batch sizes after enforcement moved them; None when nothing moved."""


def enforce_bounds(controller: Controller, configured: Bounds, memory_max: Sequence[int | None], who: str,
                   force: bool = False) -> BoundsChange:
    """Bound ``controller`` by the workers' memory: the one path BSP and the parameter server share.

    A controller not ``bounded_by_memory`` (``uniform``, the baseline) ignores the bounds (``over`` names
    the workers it overloads) unless ``force`` (a worker already ran out of memory). Raises
    :class:`UserError` when the global batch cannot fit.
    """
    bounds = memory_bounds(configured, memory_max, controller.global_batch, who)
    old = list(controller.batch)
    if not controller.bounded_by_memory and not force:
        return BoundsChange(bounds, False, [i for i, m in enumerate(bounds.max_batch) if old[i] > m], old, None)
    new = controller.set_bounds(bounds)
    return BoundsChange(bounds, True, [], old, new)
