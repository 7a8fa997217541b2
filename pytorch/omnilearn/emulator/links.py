"""Network heterogeneity: a per-worker link (bandwidth, and where the kernel has netem, delay,
jitter and loss), its validation from ``emulation.links``, and the ``tc`` commands that enforce it.

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

Every value is strict: rates in bits (``100mbit``), durations with a unit (``10ms``), loss as a
percentage (``0.5%``). Bare numbers are refused because ``tc`` reads them in surprising units
(bytes per second for a rate, microseconds for a time).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnilearn.errors import UserError

MIN_RATE = 8_000  # bit/s: HTB's and TBF's useful floor (one byte per millisecond)
MAX_RATE = 100 * 10**9  # bit/s
MAX_DELAY_S = 60.0  # one-way delay or jitter
BURST_S = 0.01  # a rate limit's bucket holds this much time at the rate...
MIN_BURST_BYTES = 16 * 1024  # ...but at least this, so that a few GSO segments pass at low rates
TBF_LATENCY = "50ms"  # the longest a packet may wait in TBF's queue before it is dropped
HTB_QUANTUM = 60_000  # bytes a class sends per round; one class, so only the kernel's warning cares
NETEM_MIN_LIMIT = 1000  # packets netem may hold (its default)
NETEM_NO_RATE_LIMIT = 10_000  # ...when no rate bounds the bandwidth-delay product
IFB_TXQUEUELEN = 1000  # packets, as a veth or an Ethernet device
IFB_PREFIX = "olifb"  # the IFB device of interface index N is olifbN (at most 15 characters)
RATE_TOLERANCE = 0.02  # read-back rates may differ by this much (tc prints 3-4 significant digits)
TC_TIMEOUT_S = 10.0

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)", re.IGNORECASE)
_RATE_SCALE = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTE_RATE = re.compile(r"\d+(?:\.\d+)?\s*([kmgt]i?)?(bps|b/s)", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s)")
_DURATION_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_TC_RATE = re.compile(r"\brate (\d+(?:\.\d+)?)([KMGT]?)(i?)bit\b")
_LINK_KEYS = ("rate", "delay", "jitter", "loss")


# ---------------------------------------------------------------- values


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut short: messages echo what they refuse without repeating a whole line of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_rate(value: Any) -> int:
    """``"100mbit"`` -> 100_000_000 (bit/s). ValueError says why a value is refused."""
    if not isinstance(value, str):
        raise ValueError(f"expected a rate with its unit such as 100mbit, got {shown(value)}")
    text = value.strip()
    m = _RATE.fullmatch(text)
    if m is None:
        if _BYTE_RATE.fullmatch(text):
            raise ValueError(f"{shown(value)} is in bytes per second to tc; write the rate in bits, "
                             f"such as 100mbit")
        raise ValueError(f"expected a rate in bits with its unit (bit, kbit, mbit, gbit), such as "
                         f"100mbit, got {shown(value)}")
    bits = float(m.group(1)) * _RATE_SCALE[m.group(2).lower()]
    if not MIN_RATE <= bits <= MAX_RATE:  # (an overlong number is inf, and outside too)
        raise ValueError(f"{shown(value)} is outside [{format_rate(MIN_RATE)}, {format_rate(MAX_RATE)}]")
    return round(bits)


def parse_duration(value: Any, limit_s: float = MAX_DELAY_S) -> float:
    """``"10ms"`` -> 0.01 (seconds); a unit (us, ms, s) is required."""
    if not isinstance(value, str):
        raise ValueError(f"expected a duration with its unit (us, ms, s) such as 10ms, got {shown(value)}")
    m = _DURATION.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"expected a duration with its unit (us, ms, s) such as 10ms, got {shown(value)}")
    seconds = float(m.group(1)) * _DURATION_SCALE[m.group(2)]
    if seconds > limit_s:
        raise ValueError(f"{shown(value)} exceeds {limit_s:g}s")
    return seconds


def parse_loss(value: Any) -> float:
    """``"0.5%"`` -> 0.5 (percent); the ``%`` is required (is 0.5 half a percent or half of all?)."""
    if not isinstance(value, str) or (m := _PERCENT.fullmatch(value.strip())) is None:
        raise ValueError(f"expected a percentage such as 0.5%, got {shown(value)}")
    percent = float(m.group(1))
    if percent > 100:
        raise ValueError(f"{shown(value)} exceeds 100%")
    return percent


def format_rate(bits: int) -> str:
    """100_000_000 -> ``"100mbit"``: the largest unit that divides the rate exactly."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % _RATE_SCALE[unit] == 0:
            return f"{bits // _RATE_SCALE[unit]}{unit}"
    return f"{bits}bit"


def _format_percent(percent: float) -> str:
    return f"{percent:.7f}".rstrip("0").rstrip(".") + "%"


def _format_duration(seconds: float) -> str:
    us = round(seconds * 1e6)
    return f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


@dataclass(frozen=True)
class Link:
    """One worker's link, the same in both directions. ``None`` fields are not shaped.

    ``rate`` in bit/s; ``delay`` and ``jitter`` in seconds (one way); ``loss`` in percent.
    """

    rate: int | None = None
    delay: float | None = None
    jitter: float | None = None
    loss: float | None = None

    def __post_init__(self) -> None:
        assert self.jitter is None or self.delay is not None, "jitter without delay"
        assert any(v is not None for v in (self.rate, self.delay, self.loss)), "an empty link is None"

    @property
    def needs_netem(self) -> bool:
        return self.delay is not None or self.jitter is not None or self.loss is not None

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(format_rate(self.rate))
        if self.delay is not None:
            jitter = f" ± {_format_duration(self.jitter)}" if self.jitter is not None else ""
            parts.append(f"delay {_format_duration(self.delay)}{jitter}")
        if self.loss is not None:
            parts.append(f"loss {_format_percent(self.loss)}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The config form (``{"rate": "100mbit", "delay": "10ms", ...}``), which :func:`parse_link` reads."""
        d: dict[str, Any] = {}
        if self.rate is not None:
            d["rate"] = format_rate(self.rate)
        if self.delay is not None:
            d["delay"] = _format_duration(self.delay)
        if self.jitter is not None:
            d["jitter"] = _format_duration(self.jitter)
        if self.loss is not None:
            d["loss"] = _format_percent(self.loss)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Link:
        link = parse_link(d, "link")
        assert link is not None
        return link

    def matches(self, other: Link | None) -> bool:
        """True when ``other`` (read back from the kernel) enforces this link, within tc's rounding."""
        if other is None:
            return False

        def close(a: float | None, b: float | None, rel: float, abs_: float) -> bool:
            if a is None or b is None:
                return a is None and b is None
            return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)

        return (close(self.rate, other.rate, RATE_TOLERANCE, 0) and close(self.delay, other.delay, 1e-3, 2e-6)
                and close(self.jitter, other.jitter, 1e-3, 2e-6) and close(self.loss, other.loss, 1e-3, 1e-6))


def parse_link(value: Any, where: str) -> Link | None:
    """One link from config: null (unshaped), a rate (``"100mbit"``), or a mapping of
    rate/delay/jitter/loss. Raises UserError naming ``where`` and the key."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return Link(rate=parse_rate(value))
        except ValueError as e:
            raise UserError(f"{where}: {e}") from None
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected null, a rate such as 100mbit, or a mapping of "
                        f"{', '.join(_LINK_KEYS)}; got {shown(value)}")
    unknown = sorted(str(k) for k in value if k not in _LINK_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_LINK_KEYS)})")
    fields: dict[str, Any] = {}
    parsers = {"rate": parse_rate, "delay": parse_duration, "jitter": parse_duration, "loss": parse_loss}
    for key, parse in parsers.items():
        if value.get(key) is None:
            continue
        try:
            fields[key] = parse(value[key])
        except ValueError as e:
            raise UserError(f"{where}.{key}: {e}") from None
    # Zero delay, jitter or loss shapes nothing: keep them out so that they never need netem.
    fields = {k: v for k, v in fields.items() if k == "rate" or v > 0}
    if "jitter" in fields and "delay" not in fields:
        raise UserError(f"{where}.jitter: needs a delay (netem varies the delay by the jitter)")
    if not fields:
        raise UserError(f"{where}: shapes nothing; give a rate, delay or loss, or null for an unshaped link")
    return Link(**fields)


def parse_links(
    spec: Any,
    targets: Sequence[str],
    worker_targets: Sequence[str],
    levels: Sequence[str],
    where: str,
) -> dict[str, dict[str, Link]]:
    """``emulation.links`` -> level -> target -> link, for every level in ``levels``.

    The forms (``where`` is ``<file>: emulation.links`` and prefixes every message):

    - per worker, the same at every level: a list with one entry per worker (ASP: or one more, the
      parameter server's first, as in ``emulation.levels``), or a mapping target -> entry
      (``{worker1: 100mbit}``); targets not named are unshaped;
    - per level: a mapping level -> a per-worker list or mapping; levels not named are unshaped.

    An entry is null, a rate such as ``100mbit``, or ``{rate, delay, jitter, loss}``. Unshaped
    targets are left out of the result.
    """
    if spec is None:
        return {}
    if isinstance(spec, list):
        per_worker = _per_worker(spec, targets, worker_targets, where)
        return {level: dict(per_worker) for level in levels}
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected a list (one entry per worker), a mapping of targets, or a "
                        f"mapping of levels; got {spec!r}")
    keys = [str(k) for k in spec]
    if not keys:
        return {}
    named_targets = [k for k in keys if k in targets]
    if len(named_targets) == len(keys):
        per_worker = _per_worker(spec, targets, worker_targets, where)
        return {level: dict(per_worker) for level in levels}
    if named_targets:
        others = [k for k in keys if k not in targets]
        raise UserError(f"{where}: {', '.join(others)} {'is' if len(others) == 1 else 'are'} not a target "
                        f"of this job ({', '.join(targets)}); keys are either all targets or all levels")
    unknown = [k for k in keys if k not in levels]
    if unknown:
        raise UserError(f"{where}: {', '.join(unknown)}: neither a target of this job ({', '.join(targets)}) "
                        f"nor a level of its schedule ({', '.join(levels)})")
    resolved: dict[str, dict[str, Link]] = {level: {} for level in levels}
    for level, entries in spec.items():
        if not isinstance(entries, (list, dict)):
            raise UserError(f"{where}.{level}: expected a list (one entry per worker) or a mapping of "
                            f"targets, got {entries!r}")
        resolved[str(level)] = _per_worker(entries, targets, worker_targets, f"{where}.{level}")
    return resolved


def _per_worker(entries: list[Any] | dict[Any, Any], targets: Sequence[str], worker_targets: Sequence[str],
                where: str) -> dict[str, Link]:
    if isinstance(entries, list):
        if len(entries) == len(worker_targets):
            named = dict(zip(worker_targets, entries, strict=True))
        elif len(entries) == len(targets):
            named = dict(zip(targets, entries, strict=True))
        else:
            sizes = sorted({len(worker_targets), len(targets)})
            raise UserError(f"{where}: has {len(entries)} entries; expected {' or '.join(map(str, sizes))} "
                            f"(one per worker: {', '.join(targets)})")
    else:
        unknown = [str(k) for k in entries if k not in targets]
        if unknown:
            raise UserError(f"{where}: {', '.join(unknown)}: not a target of this job ({', '.join(targets)})")
        named = {str(k): v for k, v in entries.items()}
    links = {}
    for target, entry in named.items():
        link = parse_link(entry, f"{where}.{target}")
        if link is not None:
            links[target] = link
    return links


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
        args += ["loss", _format_percent(link.loss)]
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
