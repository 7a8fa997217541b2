"""Containers' links, shaped from the host on the host end of each container's veth on the job's network.

A container on a Swarm overlay network has an interface on it (the one whose address lies in the
overlay's subnet); its veth peer lies in the overlay's own namespace on this host,
``/var/run/docker/netns/1-<first 10 characters of the network id>``, attached to the overlay's bridge.
That peer carries all of the job's traffic (gloo and TensorPipe are told to use the overlay's
interface; the container's other interface, on ``docker_gwbridge``, only reaches the outside world),
so it is the one shaped, both ways, by a :class:`~omnilearn.emulator.network.shaping.LinkShaper` entered into
that namespace. The container needs no NET_ADMIN and can neither see nor undo its shaping; the IFB
devices live in the overlay's namespace and go with it when the job's network is removed.

The peer is found by index: the container's interface names its peer's ``ifindex`` (``link_index``)
and the peer names the container's back; both are checked, so another namespace's interface that
happens to have the same index is never taken for it.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from omnilearn.emulator.backends.docker import DockerBackend
from omnilearn.emulator.network.shaping import TC_TIMEOUT_S, LinkShaper, QdiscSupport, ShapingError
from omnilearn.emulator.spec.links import Link

DOCKER_NETNS = Path("/var/run/docker/netns")


def interfaces(netns: str | Path) -> list[dict[str, Any]]:
    """``ip -j addr show`` in the network namespace at ``netns`` (a path: ``/proc/<pid>/ns/net`` or Docker's)."""
    nsenter, ip = shutil.which("nsenter"), shutil.which("ip")
    if nsenter is None or ip is None:
        raise ShapingError("finding a container's veth needs nsenter (util-linux) and ip (iproute2)")
    try:
        r = subprocess.run([nsenter, f"--net={netns}", "--", ip, "-j", "addr", "show"], capture_output=True,
                           text=True, timeout=TC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ShapingError(f"ip addr show in {netns}: {e}") from None
    if r.returncode != 0:
        raise ShapingError(f"ip addr show in {netns}: {(r.stderr or r.stdout).strip()}")
    try:
        found = json.loads(r.stdout or "[]")
    except json.JSONDecodeError:
        raise ShapingError(f"ip addr show in {netns}: not JSON: {r.stdout[:200]!r}") from None
    return [i for i in found if isinstance(i, dict)]


def overlay_end(ifaces: list[dict[str, Any]], subnet: str) -> dict[str, Any]:
    """The container's interface on the job's network: the one with an address in ``subnet``."""
    net = ipaddress.ip_network(subnet, strict=False)
    for iface in ifaces:
        for a in iface.get("addr_info") or []:
            if a.get("family") == "inet" and ipaddress.ip_address(a["local"]) in net:
                return iface
    raise ShapingError(f"no interface of the container has an address in the job's subnet {subnet}")


def peer_in(ifaces: list[dict[str, Any]], inside: dict[str, Any]) -> str | None:
    """The name of the veth peer of ``inside`` among ``ifaces`` (another namespace's), or None."""
    for iface in ifaces:
        if iface.get("ifindex") == inside.get("link_index") and iface.get("link_index") == inside.get("ifindex"):
            return str(iface["ifname"])
    return None


class ContainerLinks:
    """Shapes the links of one job's containers on this host (``network``: the job's overlay network)."""

    def __init__(self, backend: DockerBackend, network: str, support: QdiscSupport | None = None,
                 rate_qdisc: str = "htb", netns_dir: Path = DOCKER_NETNS) -> None:
        self.backend = backend
        self.network = network
        self.support = support
        self.rate_qdisc = rate_qdisc
        self.netns_dir = netns_dir
        self._ends: dict[str, tuple[str, str]] = {}  # target -> (namespace path, host-end interface)
        self._shapers: dict[str, LinkShaper] = {}
        self._links: dict[str, Link | None] = {}

    def host_end(self, target: str) -> tuple[str, str]:
        """The namespace and name of the host end of ``target``'s veth on the job's network."""
        if target in self._ends:
            return self._ends[target]
        container = self.backend.container(target)
        container.reload()
        pid = int(container.attrs["State"].get("Pid") or 0)
        settings = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        if pid <= 0 or self.network not in settings:
            raise ShapingError(f"{target}: not running on network {self.network} (pid {pid})")
        network = self.backend.default.networks.get(settings[self.network]["NetworkID"])
        subnet = ((network.attrs.get("IPAM") or {}).get("Config") or [{}])[0].get("Subnet")
        if not subnet:
            raise ShapingError(f"network {self.network} has no subnet")
        inside = overlay_end(interfaces(f"/proc/{pid}/ns/net"), subnet)
        expected = self.netns_dir / f"1-{network.id[:10]}"
        others = sorted(p for p in self.netns_dir.iterdir() if p != expected) if self.netns_dir.is_dir() else []
        for ns in ([expected] if expected.exists() else []) + others:
            try:
                dev = peer_in(interfaces(ns), inside)
            except ShapingError:
                continue  # a namespace going away meanwhile
            if dev is not None:
                self._ends[target] = (str(ns), dev)
                return self._ends[target]
        raise ShapingError(f"{target}: the host end of its {inside.get('ifname')} (peer index "
                           f"{inside.get('link_index')}) is in none of {self.netns_dir}'s namespaces")

    def apply_link(self, target: str, link: Link | None) -> Link | None:
        ns, dev = self.host_end(target)
        if ns not in self._shapers:
            self._shapers[ns] = LinkShaper(self.support, rate_qdisc=self.rate_qdisc, netns=ns)
        shaper = self._shapers[ns]
        if target in self._links and self._links[target] == link:
            return shaper.read(dev)[0]  # unchanged: read back, nothing to do
        got = shaper.apply(dev, link)
        self._links[target] = link
        return got

    def close(self) -> None:
        """Clear what is still there (the overlay's namespace and its IFBs usually go with the network)."""
        for ns, shaper in self._shapers.items():
            if Path(ns).exists():
                try:
                    shaper.close()
                except ShapingError:
                    pass  # the namespace went away meanwhile
        self._shapers.clear()
