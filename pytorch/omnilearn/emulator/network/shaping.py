"""Shaping a worker's link with ``tc``: the commands, what the kernel offers, and the shaper that applies,
reads back and clears a :class:`~.links.Link` on an interface.

**Where a link is shaped.** A worker's link is its veth pair: the container's ``eth0`` (Docker) or
the worker's own network namespace (local backend) on one end, the host (or bridge) side on the
other. :class:`LinkShaper` shapes the *host-side* end only, in both directions:

- outbound from the host end (into the worker): a root qdisc on the interface, HTB (a class
  ``1:1`` at the rate) or TBF;
- inbound to the host end (out of the worker): an ``ingress`` qdisc whose u32 match-all filter
  redirects every packet (``mirred``) to an IFB device that carries the same root qdisc.

This is the standard way to shape ingress (wondershaper, tcconfig, the kernel's IFB docs) and it is
chosen over shaping the worker's own end because every rule then lives in the host's namespace:
the container needs no NET_ADMIN, cannot see or undo its shaping, and the shaper never has to enter
a namespace it does not own. It also works for any interface, not only veth pairs.

**Delay, jitter, loss** need ``sch_netem``: a netem qdisc as the root (no rate), or as the child of
the rate class (``parent 1:1``). Delay is one-way and applied in each direction, so a round trip
gains twice the delay. The kernel this project is developed on has HTB, TBF, ingress, u32, mirred
and IFB but *not* netem; :func:`detect_qdiscs` finds that out and :meth:`LinkShaper.check` refuses
such a link naming ``sch_netem``. The netem commands are tested only against a recorded ``tc``
here, never against a kernel that runs them.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.emulator.spec.links import Link, format_percent
from omnilearn.errors import UserError

BURST_S = 0.01  # a rate limit's bucket holds this much time at the rate...
MIN_BURST_BYTES = 16 * 1024  # ...but at least this, so that a few GSO segments pass at low rates
TBF_LATENCY = "50ms"  # the longest a packet may wait in TBF's queue before it is dropped
HTB_QUANTUM = 60_000  # bytes a class sends per round; one class, so only the kernel's warning cares
NETEM_MIN_LIMIT = 1000  # packets netem may hold (its default)
NETEM_NO_RATE_LIMIT = 10_000  # ...when no rate bounds the bandwidth-delay product
IFB_TXQUEUELEN = 1000  # packets, as a veth or an Ethernet device
IFB_PREFIX = "olifb"  # the IFB device of interface index N is olifbN (at most 15 characters)
TC_TIMEOUT_S = 10.0
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_TC_RATE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMGT]?)(i?)bit\b")


# ---------------------------------------------------------------- tc commands


def _burst_bytes(rate: int) -> int:
    return max(MIN_BURST_BYTES, math.ceil(rate / 8 * BURST_S))


def _netem_args(link: Link) -> list[str]:
    if link.rate is not None and link.delay is not None:
        # The queue must hold the bandwidth-delay product, or netem drops what the user never asked to lose.
        in_flight = link.rate / 8 * (link.delay + (link.jitter or 0)) / 1500
        limit = max(NETEM_MIN_LIMIT, math.ceil(2 * in_flight))
    else:
        limit = NETEM_NO_RATE_LIMIT if link.delay is not None else NETEM_MIN_LIMIT
    args = ["netem", "limit", str(limit)]
    if link.delay is not None:
        args += ["delay", f"{round(link.delay * 1e6)}us"]
        if link.jitter is not None:
            args.append(f"{round(link.jitter * 1e6)}us")
    if link.loss is not None:
        args += ["loss", format_percent(link.loss)]
    return args


def egress_commands(dev: str, link: Link, rate_qdisc: str = "htb") -> list[list[str]]:
    """The ``tc`` argument lists that shape what leaves ``dev``: a rate limit at root handle ``1:``
    (HTB class ``1:1``, or TBF, whose class is ``1:1`` too), netem as its child; netem alone at the
    root when there is no rate."""
    assert rate_qdisc in ("htb", "tbf"), rate_qdisc
    cmds: list[list[str]] = []
    if link.rate is None:
        return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *_netem_args(link)]]
    rate, burst = f"{link.rate}bit", str(_burst_bytes(link.rate))
    if rate_qdisc == "htb":
        cmds.append(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
        cmds.append(["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate,
                     "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(HTB_QUANTUM)])
    else:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", rate,
                     "burst", burst, "latency", TBF_LATENCY])
    if link.needs_netem:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *_netem_args(link)])
    return cmds


def ingress_commands(dev: str, ifb: str, link: Link, rate_qdisc: str = "htb") -> list[list[str]]:
    """Shape what enters ``dev``: redirect all of it to the IFB device ``ifb`` and shape that device's
    egress. Creating ``ifb`` (``ip link add IFB type ifb``) is the shaper's job: it may exist already."""
    return [
        ["ip", "link", "set", "dev", ifb, "up"],
        *egress_commands(ifb, link, rate_qdisc),
        ["tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
         "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb],
    ]


# ---------------------------------------------------------------- what the kernel offers


@dataclass(frozen=True)
class QdiscSupport:
    """What this kernel can shape with. ``None``: could not be found out (the shaper then just tries)."""

    htb: bool | None
    tbf: bool | None
    netem: bool | None
    ingress: bool | None  # ingress qdisc + u32 filter + mirred redirect + IFB devices
    how: str  # how it was found out, for messages

    def refusal(self, link: Link, rate_qdisc: str = "htb") -> str | None:
        """Why this kernel cannot enforce ``link`` in both directions, or None when it can."""
        if link.needs_netem and self.netem is False:
            asked = [k for k in ("delay", "jitter", "loss") if getattr(link, k) is not None]
            verb = "needs" if len(asked) == 1 else "need"
            return (f"{', '.join(asked)} {verb} the sch_netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM; "
                    f"{self.how}); rate limits (htb, tbf) work here: keep only the rate")
        if link.rate is not None and getattr(self, rate_qdisc) is False:
            other = "tbf" if rate_qdisc == "htb" else "htb"
            hint = f"; use {other}, which it has" if getattr(self, other) else ""
            return f"a rate limit with {rate_qdisc} needs sch_{rate_qdisc}, which this kernel lacks{hint}"
        if self.ingress is False:
            return ("shaping what a worker sends needs the ingress qdisc, the u32 filter, the mirred action "
                    f"and IFB devices (CONFIG_NET_SCH_INGRESS, NET_CLS_U32, NET_ACT_MIRRED, IFB; {self.how})")
        return None


# Each probe runs in a private, empty network namespace that vanishes with the probing process, so
# nothing is left behind whatever happens; its loopback device is enough to attach a qdisc to.
_PROBES: dict[str, list[list[str]]] = {
    "htb": [["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"]],
    "tbf": [["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "tbf", "rate", "1mbit",
             "burst", "16kb", "latency", "50ms"]],
    "netem": [["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem", "delay", "1ms"]],
    "ingress": [["ip", "link", "add", "olprobe", "type", "ifb"],
                ["tc", "-batch", "-"]],
}
_INGRESS_BATCH = ("qdisc add dev lo handle ffff: ingress\n"
                  "filter add dev lo parent ffff: protocol all prio 1 u32 match u32 0 0 "
                  "action mirred egress redirect dev lo\n")
_CONFIG_KEYS = {"htb": ["NET_SCH_HTB"], "tbf": ["NET_SCH_TBF"], "netem": ["NET_SCH_NETEM"],
                "ingress": ["NET_SCH_INGRESS", "NET_CLS_U32", "NET_ACT_MIRRED", "IFB"]}


def detect_qdiscs(kernel_config: Path = Path("/proc/config.gz")) -> QdiscSupport:
    """Find out which qdiscs this kernel has, by adding each in a private network namespace
    (``unshare --net``, or ``--user --map-root-user --net`` without root); where that cannot run,
    from the kernel's build config; else unknown."""
    unshare, tc, ip = shutil.which("unshare"), shutil.which("tc"), shutil.which("ip")
    if unshare and tc and ip:
        prefix = [unshare, "--net", "--"] if os.geteuid() == 0 else [unshare, "--user", "--map-root-user",
                                                                        "--net", "--"]
        programs = {"tc": tc, "ip": ip}

        def ok(argv: list[str], stdin: str | None = None) -> bool:
            try:
                r = subprocess.run(prefix + [programs[argv[0]], *argv[1:]], input=stdin, capture_output=True,
                                   text=True, timeout=TC_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                return False
            return r.returncode == 0

        if ok(["tc", "qdisc", "show", "dev", "lo"]):  # the probe itself works: failures below are the kernel's
            found = {}
            for name, steps in _PROBES.items():
                if name == "ingress":
                    # Two namespaces: IFB creation, then the redirect (to lo: it is only added, never used).
                    found[name] = ok(steps[0]) and ok(steps[1], _INGRESS_BATCH)
                else:
                    found[name] = all(ok(s) for s in steps)
            return QdiscSupport(**found, how="probed in a private network namespace")
    config = _read_kernel_config(kernel_config)
    if config is not None:
        found = {name: all(config.get(f"CONFIG_{k}") in ("y", "m") for k in keys)
                 for name, keys in _CONFIG_KEYS.items()}
        return QdiscSupport(**found, how=f"read from {kernel_config}")
    return QdiscSupport(htb=None, tbf=None, netem=None, ingress=None, how="not detectable here")


def _read_kernel_config(path: Path) -> dict[str, str] | None:
    try:
        text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("CONFIG_"):
            config[key] = value
    return config


# ---------------------------------------------------------------- the shaper


class ShapingError(RuntimeError):
    """A ``tc`` or ``ip`` command failed, or the kernel does not hold what was asked."""


def require_root(where: str = "emulation.links") -> None:
    """Link settings change the host's interfaces: refuse them clearly without root."""
    if os.geteuid() != 0:
        raise UserError(f"{where}: shaping a worker's link needs root (CAP_NET_ADMIN on the host's "
                        f"interfaces); run as root, or switch links off with --set emulation.links=null")


class LinkShaper:
    """Applies, reads back and clears links on named interfaces (the host ends of workers' veths).

    ``netns``: the namespace the interfaces live in: None (this one), a name under ``/run/netns``
    (``tc -n``), or a path such as Docker's ``/var/run/docker/netns/…`` (``nsenter --net=``). The IFB
    device of an interface is created next to it, named after its index, and removed with its link.
    Commands are argument lists; nothing is ever passed through a shell.
    """

    def __init__(
        self,
        support: QdiscSupport | None = None,
        *,
        rate_qdisc: str = "htb",
        netns: str | None = None,
        needs_root: bool = True,
    ) -> None:
        if rate_qdisc not in ("htb", "tbf"):
            raise UserError(f"link rate qdisc must be htb or tbf, not {rate_qdisc!r}")
        if needs_root:
            require_root()
        tc, ip = shutil.which("tc"), shutil.which("ip")
        if tc is None or ip is None:
            raise UserError("emulation.links: shaping needs iproute2's tc and ip on the host's PATH")
        self.support = support if support is not None else detect_qdiscs()
        self.rate_qdisc = rate_qdisc
        self.netns = netns
        self._programs = {"tc": tc, "ip": ip}
        self._prefix: list[str] = []
        if netns is not None and "/" in netns:
            nsenter = shutil.which("nsenter")
            if nsenter is None:
                raise UserError(f"entering the network namespace {netns} needs nsenter (util-linux)")
            self._prefix = [nsenter, f"--net={netns}", "--"]
        self._shaped: set[str] = set()

    # -- checks

    def check(self, link: Link | None, where: str = "emulation.links") -> None:
        """Refuse (UserError) a link this kernel cannot enforce, before anything changes."""
        if link is None:
            return
        reason = self.support.refusal(link, self.rate_qdisc)
        if reason is not None:
            raise UserError(f"{where}: {link.describe()}: {reason}")

    def check_all(self, links: dict[str, dict[str, Link]]) -> None:
        """Check every link of a plan (level -> target -> link), naming the first one refused."""
        for level, per_target in links.items():
            for target, link in per_target.items():
                self.check(link, f"emulation.links: {target} at {level}")

    # -- applying

    def apply(self, dev: str, link: Link | None) -> Link | None:
        """Make ``dev`` carry ``link`` both ways (None: unshaped); returns the link read back from the kernel.

        Replaces whatever this shaper put there before; raises ShapingError when a command fails or
        the kernel holds something else than asked.
        """
        _check_ifname(dev)
        self.check(link)
        self.clear(dev)
        if link is None:
            return None
        ifb = self.ifb_name(dev)
        if not self._exists(ifb):
            # IFB's default queue is 32 packets: too short for a shaped TCP flow, which it would drop.
            self._run(["ip", "link", "add", ifb, "txqueuelen", str(IFB_TXQUEUELEN), "type", "ifb"])
        self._shaped.add(dev)
        for argv in egress_commands(dev, link, self.rate_qdisc) + ingress_commands(dev, ifb, link, self.rate_qdisc):
            self._run(argv)
        out, into = self.read(dev)
        if not (link.matches(out) and link.matches(into)):
            raise ShapingError(f"{dev}: asked for {link.describe()}, the kernel holds "
                               f"{out.describe() if out else 'nothing'} outbound and "
                               f"{into.describe() if into else 'nothing'} inbound")
        return out

    def clear(self, dev: str) -> None:
        """Remove this shaper's qdiscs from ``dev`` and its IFB device; safe when there are none."""
        _check_ifname(dev)
        for q in self._qdiscs(dev):
            if q.get("kind") == "ingress":
                self._run(["tc", "qdisc", "del", "dev", dev, "ingress"])
            elif q.get("root") and q.get("handle") == "1:":
                self._run(["tc", "qdisc", "del", "dev", dev, "root"])
        ifb = self.ifb_name(dev, missing_ok=True)
        if ifb is not None and self._exists(ifb):
            self._run(["ip", "link", "del", ifb])
        self._shaped.discard(dev)

    def close(self) -> None:
        """Clear every interface this shaper shaped (those that still exist)."""
        for dev in sorted(self._shaped):
            if self._exists(dev):
                self.clear(dev)
        self._shaped.clear()

    # -- reading back

    def read(self, dev: str) -> tuple[Link | None, Link | None]:
        """The links the kernel enforces on ``dev``: (outbound from ``dev``, inbound through its IFB)."""
        _check_ifname(dev)
        out = self._read_egress(dev)
        ifb = self.ifb_name(dev, missing_ok=True)
        redirected = any(q.get("kind") == "ingress" for q in self._qdiscs(dev))
        into = self._read_egress(ifb) if ifb is not None and redirected and self._exists(ifb) else None
        return out, into

    def counters(self, dev: str) -> dict[str, dict[str, int]]:
        """Bytes, packets and drops of the root qdiscs: ``{"out": {...}, "in": {...}}`` (``tc -s``)."""
        result = {}
        ifb = self.ifb_name(dev, missing_ok=True)
        for direction, name in (("out", dev), ("in", ifb)):
            if name is None or not self._exists(name):
                continue
            for q in self._qdiscs(name, stats=True):
                if q.get("root"):
                    result[direction] = {k: int(q.get(k, 0)) for k in ("bytes", "packets", "drops")}
        return result

    def ifb_name(self, dev: str, missing_ok: bool = False) -> str | None:
        """``olifb<ifindex>``: unique per interface in its namespace, and found again after a restart."""
        r = self._run(["ip", "-j", "link", "show", "dev", dev], check=not missing_ok)
        if r.returncode != 0:
            return None
        try:
            return f"{IFB_PREFIX}{int(json.loads(r.stdout)[0]['ifindex'])}"
        except (ValueError, KeyError, IndexError, TypeError):
            raise ShapingError(f"ip link show {dev}: unexpected output {r.stdout[:200]!r}") from None

    def _read_egress(self, dev: str) -> Link | None:
        rate = delay = jitter = loss = None
        ours = False
        for q in self._qdiscs(dev):
            options = q.get("options") or {}
            if q.get("root") and q.get("handle") == "1:":
                ours = True
                if q.get("kind") == "tbf":
                    rate = round(float(options["rate"]) * 8)
                elif q.get("kind") == "htb":
                    rate = self._htb_rate(dev)
            if q.get("kind") == "netem" and (q.get("root") or q.get("parent") == "1:1"):
                d = options.get("delay") or {}
                delay = float(d["delay"]) if d.get("delay") else None
                jitter = float(d["jitter"]) if d.get("jitter") else None
                lost = (options.get("loss-random") or {}).get("loss")
                loss = float(lost) * 100 if lost else None
        if not ours or (rate is None and delay is None and loss is None):
            return None
        return Link(rate=rate, delay=delay, jitter=jitter if delay is not None else None, loss=loss)

    def _htb_rate(self, dev: str) -> int | None:
        # iproute2 prints HTB classes as text even with -j: "class htb 1:1 root prio 0 rate 100Mbit ceil ...".
        r = self._run(["tc", "class", "show", "dev", dev, "classid", "1:1"])
        m = _TC_RATE.search(r.stdout)
        if m is None:
            return None
        kilo = 1024 if m.group(3) else 1000
        return round(float(m.group(1)) * kilo ** " KMGT".index(m.group(2) or " "))

    def _qdiscs(self, dev: str, stats: bool = False) -> list[dict[str, Any]]:
        r = self._run(["tc", *(["-s"] if stats else []), "-j", "qdisc", "show", "dev", dev])
        try:
            qdiscs = json.loads(r.stdout or "[]")
        except json.JSONDecodeError:
            raise ShapingError(f"tc qdisc show dev {dev}: not JSON: {r.stdout[:200]!r}") from None
        return [q for q in qdiscs if isinstance(q, dict)]

    def _exists(self, dev: str) -> bool:
        return self._run(["ip", "link", "show", "dev", dev], check=False).returncode == 0

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``tc``/``ip`` in the shaper's namespace; ShapingError with tc's own words on failure."""
        program, args = argv[0], argv[1:]
        ns = ["-n", self.netns] if self.netns is not None and not self._prefix else []
        full = [*self._prefix, self._programs[program], *ns, *args]
        try:
            r = subprocess.run(full, capture_output=True, text=True, timeout=TC_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ShapingError(f"{' '.join(argv)}: {e}") from None
        if check and r.returncode != 0:
            raise ShapingError(f"{' '.join(argv)}: {(r.stderr or r.stdout).strip() or f'exit {r.returncode}'}")
        return r


def _check_ifname(dev: str) -> None:
    if not isinstance(dev, str) or _IFNAME.fullmatch(dev) is None or dev in (".", ".."):
        raise ShapingError(f"{dev!r} is not an interface name")
