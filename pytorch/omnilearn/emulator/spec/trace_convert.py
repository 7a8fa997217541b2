"""Public cluster traces (Alibaba 2018 ``machine_usage``, Google 2011 ``task_usage``) turned into trace files.

The share of a machine left to the job is ``1 - co-located utilisation``, averaged over windows and
resampled to the run's length; each selected machine becomes one worker.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

from omnilearn.emulator.spec.trace import MAX_ROWS, MAX_TIME_S, MAX_WORKERS, Trace, TraceEvent, load_trace
from omnilearn.errors import UserError
from omnilearn.files import write_atomic

FORMATS = ("alibaba2018", "google2011")
MAX_SOURCE_LINE_CHARS = 4096
MAX_SOURCE_SAMPLES = 5_000_000  # samples kept over all selected machines
MAX_MACHINE_ID_CHARS = 64
_MACHINE_ID = re.compile(rf"[\w.:-]{{1,{MAX_MACHINE_ID_CHARS}}}", re.ASCII)
MIN_SHARE = 0.05  # a fully used machine still leaves the job this much (a CPU quota must be > 0)
DEFAULT_POINTS = 20  # output windows over the run


# ---------------------------------------------------------------- public cluster traces

def convert_trace(
    src: str | Path,
    fmt: str,
    workers: int,
    length_s: float,
    out: str | Path | None = None,
    *,
    points: int = DEFAULT_POINTS,
    machines: list[str] | None = None,
    capacity: float = 1.0,
) -> Trace:
    """Turn a public cluster trace into a trace of ``workers`` workers over ``length_s`` seconds.

    The first ``workers`` machines of ``src`` that have CPU data (or ``machines``, in that order)
    become workers 1..N. The machines' common time range is cut into ``points`` equal windows, the
    run into as many; in each the worker's ``share`` of its full allocation is 1 - the machine's mean
    CPU utilisation there, to the hundredth and at least MIN_SHARE (a window without samples keeps
    the previous value). The result is written to ``out`` (CSV, with a comment saying how it was
    made) when given, and returned.

    Formats (both without a header, streamed line by line, so the full traces' size is no problem):

    - ``alibaba2018``: the Alibaba cluster-trace v2018 ``machine_usage.csv``: machine_id, time_stamp
      (s), cpu_util_percent, mem_util_percent, mem_gps, mkpi, net_in, net_out, disk_io_percent.
      Lines with an empty cpu_util_percent (gaps in the trace) are skipped.
    - ``google2011``: the Google cluster-data 2011 (clusterdata-2011-2) ``task_usage`` table: start
      time (µs), end time, job ID, task index, machine ID, mean CPU usage rate, … (19 or 20 fields;
      only the first six are read). A machine's utilisation over a measurement window is the sum of
      its tasks' mean CPU rates starting at that time (CPU rates are normalised to the largest
      machine), divided by ``capacity``: the machine's normalised CPU capacity from the
      ``machine_events`` table (1.0: the largest machine).
    """
    if fmt not in FORMATS:
        raise UserError(f"trace format {fmt!r}: known formats are {', '.join(FORMATS)}")
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"workers must be in 1..{MAX_WORKERS}, not {workers}")
    if not 0 < length_s <= MAX_TIME_S:
        raise UserError(f"length_s must be in (0, {MAX_TIME_S:g}], not {length_s}")
    if not 1 <= points <= MAX_ROWS // max(workers, 1) - 1:
        raise UserError(f"points must be in 1..{MAX_ROWS // workers - 1} for {workers} workers, not {points}")
    if not capacity > 0:
        raise UserError(f"capacity must be positive, not {capacity}")
    src = Path(src)
    series = _read_usage(src, fmt, workers, machines, capacity)
    chosen = list(series)
    t0 = min(series[m][0][0] for m in chosen)
    # The last sample covers one sampling period (the median gap between samples), not an instant.
    gaps = sorted(b[0] - a[0] for m in chosen for a, b in zip(series[m], series[m][1:], strict=False))
    t1 = max(series[m][-1][0] for m in chosen) + (gaps[len(gaps) // 2] if gaps else 1.0)
    window = (t1 - t0) / points
    events = []
    for w, machine in enumerate(chosen, start=1):
        shares = _window_means(series[machine], t0, window, points)
        previous = None
        for k, util in enumerate(shares):
            share = round(max(MIN_SHARE, 1.0 - util), 2)  # hundredths: no level change for noise
            if share != previous:
                events.append(TraceEvent(at=k * length_s / points, worker=w, cpu=(None, share, None)))
            previous = share
        # A last row restating the last share: the trace then lasts the whole run.
        events.append(TraceEvent(at=float(length_s), worker=w, cpu=(None, previous, None)))
    events.sort(key=lambda e: (e.at, e.worker))
    trace = Trace(unit="seconds", workers=workers, events=tuple(events), span=float(length_s),
                  source=f"{src} ({fmt})")
    if out is not None:
        names = chosen if len(chosen) <= 8 else [*chosen[:4], "...", chosen[-1]]
        header = (f"# Converted from the {fmt} trace {src.name!r} by\n"
                  f"# omnilearn.emulator.spec.trace_convert.convert_trace({str(src)!r}, {fmt!r}, {workers}, {length_s:g}, out, "
                  f"points={points}):\n"
                  f"# machines {', '.join(names)} -> workers 1..{workers}; share = 1 - CPU utilisation, the mean\n"
                  f"# over each of {points} equal windows ({window:g} s) of the source (at least {MIN_SHARE}),\n"
                  f"# stretched to a run of {length_s:g} s.\n")
        write_atomic(Path(out), header + trace.to_csv())
        return load_trace(out, workers)
    return trace


def _read_usage(src: Path, fmt: str, workers: int, machines: list[str] | None,
                capacity: float) -> dict[str, list[tuple[float, float]]]:
    """machine -> [(time s, utilisation 0..1)], sorted, for the selected machines only."""
    wanted = list(machines) if machines is not None else None
    if wanted is not None and len(wanted) != workers:
        raise UserError(f"machines: {len(wanted)} named for {workers} workers")
    samples: dict[str, dict[float, float]] = {}
    kept = 0
    for n, fields in _source_lines(src):
        if fmt == "alibaba2018":
            if len(fields) != 9:
                raise UserError(f"{src}:{n}: has {len(fields)} fields; alibaba2018 machine_usage has 9 "
                                f"(machine_id, time_stamp, cpu_util_percent, ...)")
            machine, stamp, util_text = fields[0], fields[1], fields[2]
            if util_text == "":
                continue
            time_s = _source_number(stamp, src, n, "time_stamp")
            util = _source_number(util_text, src, n, "cpu_util_percent") / 100
            if util > 1:
                raise UserError(f"{src}:{n}: cpu_util_percent {util_text} is above 100")
        else:
            if len(fields) not in (19, 20):
                raise UserError(f"{src}:{n}: has {len(fields)} fields; google2011 task_usage has 19 or 20")
            machine, cpu_text = fields[4], fields[5]
            if machine == "" or cpu_text == "":
                continue
            time_s = _source_number(fields[0], src, n, "start time") / 1e6
            util = _source_number(cpu_text, src, n, "CPU rate") / capacity
        if _MACHINE_ID.fullmatch(machine) is None:
            raise UserError(f"{src}:{n}: machine id {machine[:80]!r} is not 1-{MAX_MACHINE_ID_CHARS} letters, "
                            f"digits or _.:-")
        if machine not in samples:
            if (wanted is not None and machine not in wanted) or (wanted is None and len(samples) == workers):
                continue
            samples[machine] = {}
        per_time = samples[machine]
        if fmt == "google2011":
            per_time[time_s] = per_time.get(time_s, 0.0) + util  # tasks on one machine add up
        else:
            per_time[time_s] = util
        kept += 1
        if kept > MAX_SOURCE_SAMPLES:
            raise UserError(f"{src}:{n}: more than {MAX_SOURCE_SAMPLES} samples for the selected machines; "
                            f"cut the source to the time range you need")
    order = wanted if wanted is not None else list(samples)
    missing = [m for m in order if m not in samples]
    if wanted is not None and missing:
        raise UserError(f"{src}: no CPU data for machine(s) {', '.join(missing)}")
    if len(samples) < workers:
        raise UserError(f"{src}: {len(samples)} machine(s) with CPU data, {workers} workers asked for")
    return {m: sorted((t, min(u, 1.0)) for t, u in samples[m].items()) for m in order}


def _source_lines(src: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        f = open(src, "rb")
    except OSError as e:
        raise UserError(f"trace source {src}: cannot read: {e.strerror}") from None
    with f:
        for n, raw in enumerate(f, start=1):
            if len(raw) > MAX_SOURCE_LINE_CHARS:
                raise UserError(f"{src}:{n}: line longer than {MAX_SOURCE_LINE_CHARS} bytes")
            if b"\x00" in raw:
                raise UserError(f"{src}:{n}: binary data (NUL bytes): not a CSV trace")
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise UserError(f"{src}:{n}: not UTF-8 text") from None
            if line:
                yield n, [c.strip() for c in line.split(",")]


def _source_number(text: str, src: Path, n: int, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{src}:{n}: {key} {text[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{src}:{n}: {key} {text[:40]!r} must be a finite number >= 0")
    return value


def _window_means(samples: list[tuple[float, float]], t0: float, window: float, points: int) -> list[float]:
    """The mean utilisation in each of ``points`` windows from ``t0`` (the last window includes its end);
    a window without samples holds the previous value (the first such holds the first sample)."""
    sums = [0.0] * points
    counts = [0] * points
    for t, u in samples:
        k = min(int((t - t0) // window), points - 1)
        sums[k] += u
        counts[k] += 1
    means: list[float] = []
    previous = samples[0][1]
    for s, c in zip(sums, counts, strict=True):
        previous = s / c if c else previous
        means.append(previous)
    return means
