"""The run records: every kind of line in ``metrics/rank-<r>.jsonl``, its fields and who writes it.

One home for writers and readers. :class:`~omnilearn.metrics.MetricsWriter` checks each record against
its kind here (an unknown kind or a missing required field is a programming error, raised at once);
a unit test checks every ``write("<kind>", field=...)`` in the package against the fields listed; the
readers select records by the names below (:func:`of_kind`); and the reference table of the run folder
(docs/reference/records.md) is generated from :data:`KINDS`.

Every record also has ``kind`` and ``time`` (Unix seconds, added by the writer). BSP's events come from
rank 0; ASP's server is rank 0. Where BSP labels an event by ``step``, ASP labels it by ``version``
(the server's model version), so neither is required of the kinds both write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind of record: who writes it, the fields it always has, the ones it may have, and what
    they mean where a name does not say it (the reference table's text)."""

    name: str
    writer: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    doc: str

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.required) | frozenset(self.optional) | {"time"}


START = "start"
STEP = "step"
BATCH_CHANGE = "batch_change"
MEASUREMENT = "measurement"
SPEED_CHANGE = "speed_change"
MEMORY_BOUNDS = "memory_bounds"
START_UP = "start_up"
HL_CHANGE = "hl_change"
HL_OUTCOME = "hl_outcome"
EVAL = "eval"
CHECKPOINT = "checkpoint"
RESUME = "resume"
STOPPED = "stopped"
END = "end"
TRAIN_START = "train_start"
UPDATE = "update"
DUPLICATE = "duplicate"
SNAPSHOT = "snapshot"
DONE = "done"
FAULT = "fault"

_LEVEL_FIELDS = ("from_level", "level", "epoch", "target", "requested", "effective", "status", "threads", "ack_s",
                 "retries", "link", "effective_link", "stall_s", "elapsed_s", "step", "version", "clock_s")

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(START, "every rank, once per attempt",
         ("rank", "world", "target", "params", "train_samples", "policy"),
         ("slot", "role", "steps_per_epoch", "test_samples", "metric", "language_model", "device", "dist_backend",
          "library", "workers", "samples", "target_samples", "pushes", "lr_reference_batch", "lr_power",
          "staleness_damping", "update", "push", "delay_tolerance"),
         "`rank`, `slot`, `world`, `target`, `role`, `params`, `policy`, `steps_per_epoch`, `train_samples`, "
         "`test_samples`, `metric`, `language_model`, `device`, `dist_backend`, `library`; ASP: `workers`, "
         "`samples`, `target_samples`, `pushes`, `lr_reference_batch`, `lr_power` (scaled-gradient: the exponent "
         "of b / b_ref in a gradient's weight), `staleness_damping`, `update`, `push`, `delay_tolerance`"),
    Kind(STEP, "every worker, every step",
         ("step", "epoch", "batch", "compute_ms"),
         ("sync_ms", "held_ms", "cpus", "threads", "level", "loss", "train_acc", "global_batch", "lr", "sample_sum",
          "seq", "version", "staleness", "pull_ms", "push_ms", "source"),
         "`step`, `epoch`, `batch`, `global_batch`, `compute_ms`, `sync_ms`, `held_ms` (BSP on a CPU, whatever "
         "the policy: the wait for the CPU of this worker's compute and update beyond their wall time under a "
         "CPU quota, their CPU at the quota's rate less their wall time; 0 without a quota, null on a GPU), "
         "`cpus`, `threads`, "
         "`level`, `loss`, `lr`, `train_acc`, `sample_sum` (a checksum of the step's samples), `source` "
         "(`hook`: an unmodified DDP script's step, timed by the module `omnilearn record` loads); ASP: `seq`, "
         "`version`, `staleness`, `pull_ms`, `push_ms`"),
    Kind(BATCH_CHANGE, "the controller's rank",
         ("batch", "reason"),
         ("step", "version", "epoch", "old", "compute_ms", "overhead", "samples", "gain_s", "gain_sd_s", "cost_s",
          "horizon", "stride", "sizes", "probe_ms", "probe_times_s", "probe_own_ms", "speeds", "probe_s", "warm",
          "cut_short", "kinds", "k_by_worker", "worker", "worth", "worth_new", "k", "noise_scale", "staleness_predicted"),
         "`step` (ASP: `version`, `epoch`, `worker`: whose push it followed), `batch`, `old`, `reason` (`initial`, "
         "`probe`, `compute-time`, `progress` (ASP `dynamic`), `allocation`, `memory`, `resumed`), `compute_ms`, "
         "`overhead` (k), `samples`; ASP `dynamic`'s moves: `worth` and `worth_new` (the effective samples a "
         "second predicted before and after), `k`, `noise_scale`, `staleness_predicted`; BSP `dynamic`'s decisions: "
         "`gain_s`, `gain_sd_s`, `cost_s`, `horizon`, `stride` (the part of the way to the balanced split "
         "taken: 1, 0.5 or 0.25); `probe`: `sizes`, `probe_ms`, `probe_times_s` (what the controller took: "
         "under CPU quotas the median CPU seconds of the workers on the same kind of core with as many "
         "threads, at each one's own rate), `probe_own_ms` (each worker's own rounds alone), `speeds`, "
         "`probe_s`, `warm` (false where a framework's first step still carries its one-off costs and is "
         "left out), `cut_short` (true where a worker's pass stopped after `control.probe_steps` rounds: the whole "
         "pass would have cost more than balancing can win over the job's steps; the controller was not "
         "told its times), `kinds` (each worker's threads and kind of core); `dynamic`: `k_by_worker` (each "
         "worker's k, where workers of more than one kind tell theirs apart)"),
    Kind(MEASUREMENT, "BSP rank 0",
         ("step", "times_s", "due", "steps_left"), ("cost_s", "threads"),
         "`step`, `times_s` (every worker's compute time the controller took, null for a partial step), `due`, "
         "`steps_left`, `cost_s` (the controller's cost of a step, the largest rank's), `threads` (every "
         "worker's threads): the inputs that replay "
         "the run's decisions (`omnilearn.control.loop.replay`)"),
    Kind(SPEED_CHANGE, "the controller's rank",
         ("regimes",), ("step", "version", "epoch", "workers", "worker"),
         "`step` or `version`, `workers` (or `worker`), `regimes`"),
    Kind(MEMORY_BOUNDS, "the controller's rank",
         ("max_batch", "enforced"), ("step", "version"),
         "`step` or `version`, `max_batch`, `enforced`"),
    Kind(START_UP, "every BSP worker of `omnilearn run`, after its start-up pass (any policy)",
         ("sizes", "times_ms"), ("level", "cpu"),
         "`sizes` (the pass's two batch sizes), `times_ms` (this worker's time at each: the least of its rounds, "
         "or of more the median of each pair's least; CPU milliseconds under a CPU quota, `cpu` true, else wall), "
         "`level`: what tells `k` where the steps ran one batch size (`omnilearn whatif` of a `uniform` run)"),
    Kind(HL_CHANGE, "every rank, at a level change",
         ("level", "status"), _LEVEL_FIELDS,
         "`step` or `version`, `elapsed_s`, `from_level`, `level`, `epoch`, `target`, `requested`, `effective`, "
         "`status`, `threads`, `ack_s`, `retries`, and `link`, `effective_link`, `stall_s` where the level has them"),
    Kind(HL_OUTCOME, "every rank, when a retried change ends",
         ("level", "status"), _LEVEL_FIELDS,
         "`step` or `version`, `elapsed_s`, and the fields of `hl_change`"),
    Kind(EVAL, "BSP rank 0; ASP `eval.jsonl`",
         ("epoch", "accuracy", "loss"),
         ("step", "metric", "samples", "perplexity", "lower_is_better", "elapsed_s", "test_samples", "snapshot",
          "version", "final"),
         "`epoch`, `step`, `accuracy`, `loss`, `perplexity`, `metric`, `lower_is_better`, `elapsed_s`, `samples`; "
         "ASP adds `snapshot`, `version`"),
    Kind(CHECKPOINT, "the rank that saves",
         ("epoch", "samples", "save_s"),
         ("step", "step_in_epoch", "bytes", "clock", "reason", "version", "locked_s"),
         "`step`, `epoch`, `step_in_epoch`, `samples`, `bytes`, `save_s`; ASP: `reason`, `version`, `clock`, "
         "`locked_s`"),
    Kind(RESUME, "every rank after a restart or `--resume`",
         ("epoch", "samples", "clock", "checkpoint_saved"),
         ("step", "step_in_epoch", "level", "batch", "workers", "version", "pushes"),
         "`step`, `epoch`, `step_in_epoch`, `samples`, `clock`, `level`, `checkpoint_saved`, `batch`, `workers`; "
         "ASP: `version`, `pushes`"),
    Kind(STOPPED, "BSP ranks on SIGTERM",
         ("step", "epoch", "samples", "elapsed_s"), (),
         "`step`, `epoch`, `samples`, `elapsed_s`"),
    Kind(END, "every rank",
         ("wall_time_s", "samples", "batch", "level"),
         ("train_time_s", "steps", "epochs", "out_of_time", "stopped_early", "controller_overhead_ms",
          "controller_steps_measured", "holds", "pushes", "updates", "duplicates", "version", "epoch", "target_samples", "done_time_s"),
         "`wall_time_s`, `train_time_s`, `samples`, `steps`, `epochs`, `batch`, `level`, `out_of_time`, "
         "`stopped_early` (omnilearn.torch: the loop ended inside a pass, after `steps` steps), "
         "`controller_overhead_ms`, `controller_steps_measured` (BSP: the steps the controller measured), `holds`; ASP: `pushes`, `updates`, `duplicates`, `version`, `epoch`, "
         "`target_samples`, `done_time_s`"),
    Kind(TRAIN_START, "ASP server",
         ("batch", "level", "samples", "target_samples", "version", "clock"), (),
         "`batch`, `level`, `samples`, `target_samples`, `version`, `clock`"),
    Kind(UPDATE, "ASP server, every applied push",
         ("worker", "seq", "version", "grad_version", "staleness", "batch", "scale", "lr", "loss", "compute_ms",
          "samples", "epoch", "elapsed_s"), ("staleness_time", "apply_ms"),
         "`worker`, `seq`, `version`, `grad_version`, `staleness` (updates applied since the pull), "
         "`staleness_time` (their b / b_ref summed), `batch`, `scale` (the gradient's weight: b / b_ref times "
         "its staleness factor), `lr` (the step: the schedule's lr times the weight), `loss`, `compute_ms`, "
         "`apply_ms` (the server's time to apply it), `samples`, `epoch`, `elapsed_s`"),
    Kind(DUPLICATE, "ASP server, a retried push",
         ("worker", "seq", "applied_seq"), (),
         "`worker`, `seq`, `applied_seq`"),
    Kind(SNAPSHOT, "ASP server",
         ("file", "version", "epoch", "samples", "elapsed_s", "final"), (),
         "`file`, `version`, `epoch`, `samples`, `elapsed_s`, `final`"),
    Kind(DONE, "ASP server",
         ("version", "samples", "epoch", "elapsed_s"), (),
         "`version`, `samples`, `epoch`, `elapsed_s`"),
    Kind(FAULT, "ASP server, stopping on a fault",
         ("message", "checkpoint", "version", "samples", "epoch"), (),
         "`message`, `checkpoint`, `version`, `samples`, `epoch`"),
)}


def check(kind: str, fields: Mapping[str, Any]) -> None:
    """Raise ValueError when ``kind`` is not a record kind or ``fields`` lacks one it requires."""
    k = KINDS.get(kind)
    if k is None:
        raise ValueError(f"record kind {kind!r} is not one of omnilearn.records.KINDS")
    missing = [f for f in k.required if f not in fields]
    if missing:
        raise ValueError(f"a {kind!r} record lacks {', '.join(missing)}")


def of_kind(records: Iterable[Mapping[str, Any]], *kinds: str) -> list[Any]:
    """The records of any of ``kinds``, in order."""
    return [r for r in records if r.get("kind") in kinds]


def markdown() -> str:
    """The reference table of the record kinds (docs/reference/records.md)."""
    lines = ["# Metrics records", "",
             "<!-- Generated from pytorch/omnilearn/records.py by `make docs`; edit the code, not this file. -->", "",
             "`metrics/rank-<r>.jsonl` holds one JSON object per line.",
             "Every record has `kind` and `time` (Unix seconds).",
             "Rank 0 of BSP writes the job's events; ASP's server is rank 0.",
             "Required fields are in every record of the kind; the others where the text says.", "",
             "| kind | written by | required | fields |", "|---|---|---|---|"]
    for k in KINDS.values():
        lines.append(f"| `{k.name}` | {k.writer} | {', '.join(f'`{f}`' for f in k.required)} | {k.doc} |")
    return "\n".join(lines) + "\n"
