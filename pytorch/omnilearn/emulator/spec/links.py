"""Network heterogeneity: a per-worker link (bandwidth, and where the kernel has netem, delay, jitter
and loss) and its validation from ``emulation.links``; :mod:`.shaping` enforces it with ``tc``.

Every value is strict: rates in bits (``100mbit``), durations with a unit (``10ms``), loss as a
percentage (``0.5%``). Bare numbers are refused because ``tc`` reads them in surprising units
(bytes per second for a rate, microseconds for a time).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnilearn.errors import UserError

MIN_RATE = 8_000  # bit/s: HTB's and TBF's useful floor (one byte per millisecond)
MAX_RATE = 100 * 10**9  # bit/s
MAX_DELAY_S = 60.0  # one-way delay or jitter
RATE_TOLERANCE = 0.02  # read-back rates may differ by this much (tc prints 3-4 significant digits)

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)", re.IGNORECASE)
_RATE_SCALE = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTE_RATE = re.compile(r"\d+(?:\.\d+)?\s*([kmgt]i?)?(bps|b/s)", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s)")
_DURATION_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
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


def format_percent(percent: float) -> str:
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
            parts.append(f"loss {format_percent(self.loss)}")
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
            d["loss"] = format_percent(self.loss)
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
