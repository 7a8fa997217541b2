"""Local workers' network, for jobs with links: each worker in a network namespace of its own, joined
by a veth pair to a bridge, so that a link is shaped on the host end of the worker's veth exactly as on
a container's (:mod:`.shaping`). Jobs without links never come here: their workers talk over loopback.

Everything lives in namespaces named after the job: the bridge ``br0`` and the host ends ``w<rank>``
(with their IFB devices and qdiscs) in ``omnilearn-<job id>-hub``, worker r's ``eth0`` (address
``10.47.x.y``, rank 0 is ``10.47.0.1``) and loopback in ``omnilearn-<job id>-<r>``. Deleting the
namespaces removes every device and qdisc of the job, whatever state it was left in: :meth:`JobNetwork.close`
does it when the job ends, :func:`sweep_netns` (``omnilearn cleanup``) for a launcher that died.

Workers enter their namespace with ``nsenter --net`` (the network namespace only: ``ip netns exec``
would also remount ``/sys``, hiding the cgroup files a worker reads its limits from).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from omnilearn.emulator.network.shaping import LinkShaper, QdiscSupport, ShapingError, require_root
from omnilearn.emulator.spec.links import Link
from omnilearn.errors import UserError

log = logging.getLogger("omnilearn.netns")

NETNS_DIR = Path("/run/netns")
PREFIX = "omnilearn-"
SUBNET = ipaddress.ip_network("10.47.0.0/16")
WORKER_IFNAME = "eth0"
BRIDGE = "br0"
IP_TIMEOUT_S = 10.0
_NAME = re.compile(rf"{PREFIX}([A-Za-z0-9_.-]+)-(hub|\d+)")
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _ip(*args: str) -> None:
    try:
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ShapingError(f"ip {' '.join(args)}: {e}") from None
    if r.returncode != 0:
        raise ShapingError(f"ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")


class JobNetwork:
    """The namespaces, bridge and veths of one local job, and the shaper of its links."""

    def __init__(self, job_id: str, targets: Sequence[str], support: QdiscSupport | None = None,
                 rate_qdisc: str = "htb") -> None:
        require_root()
        if shutil.which("ip") is None or shutil.which("nsenter") is None:
            raise UserError("emulation.links: local workers with links need iproute2's ip and util-linux's nsenter")
        if _JOB_ID.fullmatch(job_id) is None:
            raise UserError(f"job id {job_id!r} cannot name a network namespace")
        if len(targets) >= SUBNET.num_addresses - 2:
            raise UserError(f"emulation.links: {len(targets)} workers do not fit the subnet {SUBNET}")
        self.targets = list(targets)
        self.hub = f"{PREFIX}{job_id}-hub"
        self.spaces = [f"{PREFIX}{job_id}-{rank}" for rank in range(len(targets))]
        self.shaper = LinkShaper(support, rate_qdisc=rate_qdisc, netns=self.hub)
        self._made: list[str] = []
        self._links: dict[str, Link | None] = {}

    def address(self, rank: int) -> str:
        return str(SUBNET.network_address + rank + 1)

    def up(self) -> JobNetwork:
        """Make the namespaces, the bridge and one veth pair per worker; on failure, nothing is left."""
        try:
            _ip("netns", "add", self.hub)
            self._made.append(self.hub)
            _ip("-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
            for dev in (BRIDGE, "lo"):
                _ip("-n", self.hub, "link", "set", dev, "up")
            for rank, space in enumerate(self.spaces):
                _ip("netns", "add", space)
                self._made.append(space)
                host_end = f"w{rank}"
                _ip("-n", self.hub, "link", "add", host_end, "type", "veth", "peer", "name", WORKER_IFNAME,
                    "netns", space)
                _ip("-n", self.hub, "link", "set", host_end, "master", BRIDGE)
                _ip("-n", self.hub, "link", "set", host_end, "up")
                _ip("-n", space, "addr", "add", f"{self.address(rank)}/{SUBNET.prefixlen}", "dev", WORKER_IFNAME)
                for dev in (WORKER_IFNAME, "lo"):
                    _ip("-n", space, "link", "set", dev, "up")
        except ShapingError as e:
            self.close()
            raise UserError(f"emulation.links: cannot set up the workers' network namespaces: {e}") from None
        return self

    def env(self, rank: int) -> dict[str, str]:
        """What a worker needs to find rank 0 and to keep gloo and TensorPipe on its veth."""
        return {"MASTER_ADDR": self.address(0), "GLOO_SOCKET_IFNAME": WORKER_IFNAME, "TP_SOCKET_IFNAME": WORKER_IFNAME}

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run in worker ``rank``'s namespace (the same process: nsenter execs it)."""
        nsenter = shutil.which("nsenter")
        assert nsenter is not None
        return [nsenter, f"--net={NETNS_DIR / self.spaces[rank]}", "--", *argv]

    def apply_link(self, target: str, link: Link | None) -> Link | None:
        """Shape ``target``'s veth both ways (None: unshaped); returns the link read back from the kernel."""
        dev = f"w{self.targets.index(target)}"
        if target in self._links and self._links[target] == link:
            return self.shaper.read(dev)[0]  # unchanged: read back, nothing to do
        got = self.shaper.apply(dev, link)
        self._links[target] = link
        return got

    def close(self) -> None:
        """Delete the job's namespaces (and with them every device and qdisc in them)."""
        for space in reversed(self._made):
            try:
                _ip("netns", "del", space)
            except ShapingError as e:
                log.warning("cannot delete network namespace %s: %s", space, e)
        self._made.clear()


def sweep_netns(jobs: Sequence[str] | None = None, min_age: float = 60.0, root: Path = NETNS_DIR) -> list[str]:
    """Delete the network namespaces of jobs whose workers are gone; returns the names deleted.

    A job's namespaces stay while a process is in one of them, or while they are younger than
    ``min_age`` seconds (a launcher may be between making them and starting its workers).
    """
    if not root.is_dir():
        return []
    wanted = set(jobs) if jobs is not None else None
    by_job: dict[str, list[str]] = {}
    for name in sorted(os.listdir(root)):
        m = _NAME.fullmatch(name)
        if m and (wanted is None or m.group(1) in wanted):
            by_job.setdefault(m.group(1), []).append(name)
    if not by_job:
        return []
    in_use = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                in_use.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    removed: list[str] = []
    now = time.time()
    for names in by_job.values():
        try:
            stats = [os.stat(root / n) for n in names]
        except FileNotFoundError:
            continue
        if any(st.st_ino in in_use for st in stats) or any(now - st.st_mtime < min_age for st in stats):
            continue
        for name in names:
            try:
                _ip("netns", "del", name)
                removed.append(f"network namespace {name}")
            except ShapingError as e:
                log.warning("cannot delete network namespace %s: %s", name, e)
    return removed
