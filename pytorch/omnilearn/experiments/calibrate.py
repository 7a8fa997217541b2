"""``omnilearn calibrate --out DIR``: measure this host for a job, and write ``DIR/calibration.yaml`` with a
level table whose *measured* speed ratios are the nominal ones where the host allows.

1. **Speed against CPU share and threads, per worker slot.** One probe process per worker slot
   (:mod:`omnilearn.train.probe`: the job's model and data, steps timed as a worker's ``compute_ms``),
   each in a cgroup of its own (the job's backend). Slot by slot, the others idle, the slot's probe runs
   at every share it takes in the nominal levels (the fastest slot also at the whole host), with
   ``ceil(share)`` threads and, from one CPU up, with 1 and 2 threads too.
2. **A calibrated table.** Each slot's curve (:func:`~omnilearn.emulator.spec.calibration.fit_curve`) is
   inverted into quotas whose predicted speeds stand in the nominal ratios, as fast as the host's CPUs
   allow (:func:`~omnilearn.emulator.spec.calibration.fit_level`). Each level is then checked with all
   probes running at once (workers compete for the host in a run too): first at the nominal quotas
   (the ratio a run gets without calibration), then at the calibrated ones, corrected from what the
   check measured (each slot's curve scaled by how much slower it ran among the others, and fitted
   again) for up to ``rounds`` checks; the quotas that came closest are kept (the nominal ones when
   nothing did better).
3. **The all-reduce** of gloo on loopback, against size (up to the model's gradient) and worker count.

On this project's 2-core host with the demo job (ResNet18, B = 256, 4 workers) it takes about
5 minutes. The file holds the raw measurements, the fitted curves and all-reduce lines, and the
table; ``emulation.calibration: DIR/calibration.yaml`` makes ``run`` and ``bench`` use the table.
"""

from __future__ import annotations

import json
import math
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from omnilearn.config import JobConfig
from omnilearn.emulator.backends import Backend, select_backend
from omnilearn.emulator.spec.calibration import (
    FORMAT,
    RATIO_TOLERANCE,
    SpeedCurve,
    fit_allreduce,
    fit_curve,
    fit_level,
    ratio,
)
from omnilearn.emulator.spec.levels import Allocation, host_cpus, load_tables, resolve_level
from omnilearn.emulator.spec.plan import build_plan, worker_target
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.launch.local import free_port, stop_processes, worker_env

WINDOW_S = 3.0  # seconds of steps per point of a curve (at least MIN_STEPS); a concurrent check takes twice
MIN_STEPS = 2
CALIBRATION_FILE = "calibration.yaml"


@dataclass
class Probe:
    target: str
    proc: subprocess.Popen

    def ask(self, threads: int, batch: int, seconds: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"threads": threads, "batch": batch, "seconds": seconds,
                                          "min_steps": MIN_STEPS}) + "\n")
        self.proc.stdin.flush()

    def speed(self, batch: int) -> tuple[float, list[float]]:
        """Samples/s (the batch over the median step) and the step times of the last request."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise UserError(f"calibration probe for {self.target} exited ({self.proc.poll()})")
        times = json.loads(line)["step_s"]
        return batch / statistics.median(times), times


def _threads(cpus: float) -> int:
    return max(1, math.ceil(cpus - 1e-6))


def _start_probes(job_file: Path, targets: list[str], backend: Backend, log: Path) -> list[Probe]:
    probes = []
    with log.open("w") as err:
        for rank, target in enumerate(targets):
            proc = subprocess.Popen([sys.executable, "-m", "omnilearn.train.probe", "speed", str(job_file)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=worker_env(rank, len(targets), 0))
            probes.append(Probe(target, proc))
            backend.add_process(target, proc.pid)
    for p in probes:
        assert p.proc.stdout is not None
        if p.proc.stdout.readline().strip() != "ready":
            raise UserError(f"calibration probe for {p.target} did not start; see {log}")
    return probes


def _check(probes: list[Probe], backend: Backend, quotas: list[float], batch: int, curves: list[SpeedCurve],
           seconds: float) -> list[float]:
    """Every probe at its quota at once, for ``seconds`` or as long as the slowest needs; their speeds."""
    window = max(seconds, *(2.5 * batch / c.at(q) for c, q in zip(curves, quotas, strict=True)))
    for p, q in zip(probes, quotas, strict=True):
        backend.apply(p.target, Allocation(cpus=q))
    for p, q in zip(probes, quotas, strict=True):
        p.ask(_threads(q), batch, window)
    return [round(p.speed(batch)[0], 3) for p in probes]


def _spread(speeds: list[float], nominal: list[float]) -> float:
    """How far the speeds are from the nominal proportions: the largest relative deviation of a worker's
    speed per nominal CPU from the mean (0: exactly proportional)."""
    per = [v / s for v, s in zip(speeds, nominal, strict=True)]
    mean = statistics.fmean(per)
    return max(abs(p / mean - 1) for p in per)


def _error(speeds: list[float], nominal: list[float]) -> tuple[float, float]:
    """How far from the nominal level: the fast/slow ratio's relative error, then the worst worker's."""
    return abs(ratio(speeds) / ratio(nominal) - 1), _spread(speeds, nominal)


def measure_speeds(backend: Backend, probes: list[Probe], nominal: dict[str, list[float]], batch: int,
                   rounds: int, window: float, console: Console
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], list[SpeedCurve]]:
    """The curves (slot by slot) and every level checked at nominal and calibrated quotas (all at once)."""
    host = len(host_cpus())
    measurements: list[dict[str, Any]] = []
    top = max(max(v) for v in nominal.values())
    for i, p in enumerate(probes):
        shares = {v[i] for v in nominal.values()}
        if top in shares:
            shares.add(float(host))  # the fastest slot: up to the whole host
        grid = [(c, t) for c in sorted(shares) for t in sorted({_threads(c), *((1, min(host, 2)) if c >= 1 else ())})]
        for cpus, threads in grid:
            backend.apply(p.target, Allocation(cpus=cpus))
            p.ask(threads, batch, window)
            speed, times = p.speed(batch)
            measurements.append({"slot": p.target, "cpus": cpus, "threads": threads, "batch": batch,
                                 "step_s": times, "samples_per_s": round(speed, 3)})
            console.print(f"  {p.target}: {cpus:g} CPUs, {threads} thread(s): {speed:.1f} samples/s", markup=False)
        backend.apply(p.target, Allocation(cpus=min(v[i] for v in nominal.values())))  # slow while the others run
    curves = [fit_curve([m for m in measurements if m["slot"] == p.target]) for p in probes]
    levels: dict[str, Any] = {}
    for level, shares in nominal.items():
        wanted = ratio(shares)
        before = _check(probes, backend, shares, batch, curves, 2 * window)
        tried = [(_error(before, shares), shares, before)]  # the nominal quotas stay when nothing does better
        level_curves, fit = list(curves), fit_level(curves, shares, host)
        for _ in range(rounds):
            speeds = _check(probes, backend, fit.quotas, batch, level_curves, 2 * window)
            tried.append((_error(speeds, shares), fit.quotas, speeds))
            if tried[-1][0][1] <= RATIO_TOLERANCE:
                break
            # Competing for the host, slot i ran at speeds[i] where alone it ran at curve_i(q_i): scale its
            # curve by that and fit again.
            level_curves = [c.scaled(v / c.at(q)) for c, q, v in zip(level_curves, fit.quotas, speeds, strict=True)]
            fit = fit_level(level_curves, shares, host)
        _, quotas, speeds = min(tried, key=lambda x: x[0])
        got = ratio(speeds)
        note = fit.note
        if abs(got / wanted - 1) > RATIO_TOLERANCE:
            note = (f"measured {got:.2f}:1 with all workers running, not {wanted:.2f}:1" +
                    (f" ({fit.note})" if fit.note else ""))
        levels[level] = {"nominal": shares, "quotas": quotas, "nominal_ratio": round(wanted, 3),
                         "predicted_ratio": round(fit.predicted_ratio, 3), "ratio_at_nominal": round(ratio(before), 3),
                         "speeds_at_nominal": before, "verified_ratio": round(got, 3), "verified_speeds": speeds,
                         "note": note}
        console.print(f"  {level}: nominal {wanted:.2f}:1, at nominal quotas {ratio(before):.2f}:1, calibrated "
                      f"{got:.2f}:1 with {quotas}", markup=False)
    return measurements, levels, curves


def measure_allreduce(workers: int, parameters: int, console: Console) -> list[dict[str, Any]]:
    sizes = sorted({2**10, 2**16, 2**20, max(2**10, parameters)})
    out: list[dict[str, Any]] = []
    for world in sorted({2, workers} - {1}) if workers > 1 else []:
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "omnilearn.train.probe", "allreduce", *map(str, sizes)],
                                  stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, text=True,
                                  env={**worker_env(r, world, port), "OMP_NUM_THREADS": "1"}) for r in range(world)]
        try:
            lines, _ = procs[0].communicate(timeout=300)
        finally:
            stop_processes(procs)
        out += [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
        console.print(f"  all-reduce, {world} workers: " + ", ".join(
            f"{m['bytes'] / 2**20:.1f} MiB {m['seconds'] * 1e3:.1f} ms" for m in out if m["workers"] == world),
            markup=False)
    return out


def calibrate(cfg: JobConfig, out: Path, console: Console, rounds: int = 3, window: float = WINDOW_S) -> Path:
    """Measure, fit, check and write ``out/calibration.yaml``; returns its path. ``window``: seconds of
    steps per measurement (a concurrent check runs twice as long)."""
    from omnilearn.train.preflight import preflight

    if cfg.emulation.backend in ("none", "docker"):
        raise UserError(f"{cfg.source}: emulation.backend {cfg.emulation.backend}: calibration measures CPU "
                        f"shares with this host's cgroups (or affinity); use auto, cgroup or affinity")
    started = time.time()
    facts = preflight(cfg)
    host = host_cpus()
    table = load_tables()[cfg.mode]
    resolved = {lv: resolve_level(table, lv, cfg.workers, "quota", host, cfg.emulation.host_share)
                for lv in table.levels}
    nominal = {lv: [a.cpus for a in workers] for lv, (workers, _) in resolved.items()}
    batch = max(1, cfg.train.global_batch // cfg.workers)
    targets = [worker_target(cfg.mode, r) for r in range(cfg.workers)]
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=build_plan(cfg), out_dir=Path(), backend="")
    console.print(f"calibrating {cfg.mode} · {cfg.workers} workers · {cfg.model.name} on {cfg.data.name}, local "
                  f"batch {batch} · {len(host)} CPUs", markup=False)
    with tempfile.TemporaryDirectory(prefix="omnilearn-calibrate-") as tmp:
        job.out_dir = Path(tmp)
        job_file = job.save()
        backend = select_backend(cfg.emulation.backend, job.job_id, targets, period_us=cfg.emulation.cpu_period_us)
        probes: list[Probe] = []
        try:
            probes = _start_probes(job_file, targets, backend, Path(tmp) / "probes.log")
            measurements, levels, curves = measure_speeds(backend, probes, nominal, batch, rounds, window, console)
        finally:
            for p in probes:
                if p.proc.stdin:
                    p.proc.stdin.close()
            stop_processes([p.proc for p in probes])
            backend.close()
    for level, (_, server) in resolved.items():
        if server is not None:  # ASP: the parameter server keeps its nominal share
            levels[level]["server"] = server.cpus
    allreduce = measure_allreduce(cfg.workers, int(facts["parameters"]), console)
    data = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "host": {"name": socket.gethostname(), "cpus": len(host), "backend": backend.name},
        "job": {"mode": cfg.mode, "workers": cfg.workers, "model": cfg.model.name, "data": cfg.data.name,
                "image_size": cfg.data.image_size, "global_batch": cfg.train.global_batch, "local_batch": batch,
                "parameters": int(facts["parameters"]), "config": cfg.source},
        "levels": levels,
        "speed": {"measurements": measurements, "fit": {p: c.to_dict() for p, c in zip(targets, curves, strict=True)},
                  "model": "piecewise linear in CPUs through the points, with ceil(CPUs) threads; through the "
                           "origin below the first point, flat above the last"},
        "allreduce": {"measurements": allreduce, "fit": fit_allreduce(allreduce),
                      "model": "seconds = latency_s + bytes / bandwidth_bytes_per_s (gloo, loopback, no CPU limit)"},
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / CALIBRATION_FILE
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=120))
    console.print(levels_table(levels))
    console.print(f"calibration written to {path} in {data['seconds']:.0f} s; use it with "
                  f"--set emulation.calibration={path}", markup=False)
    return path


def levels_table(levels: dict[str, Any]) -> Table:
    t = Table(title="fast/slow speed ratio per level, all workers running (probes, no synchronisation)")
    for col in ("level", "nominal", "at nominal quotas", "calibrated", "calibrated quotas", "where the host cannot"):
        t.add_column(col, justify="left" if col in ("level", "calibrated quotas", "where the host cannot") else "right")
    for level, row in levels.items():
        t.add_row(level, f"{row['nominal_ratio']:.2f}", f"{row['ratio_at_nominal']:.2f}", f"{row['verified_ratio']:.2f}",
                  ", ".join(f"{q:g}" for q in row["quotas"]), row["note"] or "-")
    return t
