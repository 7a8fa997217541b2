"""The timing module of unmodified DDP scripts (``omnilearn.torch.hook_timing``) on a fake clock: a rank's
steps as DDP's hook sees them, with known work and waits."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from fakes import FakeClock
from omnilearn.torch import hook_timing
from omnilearn.torch.hook_timing import StepTimes, first_batch_size
from omnilearn.train import step as step_module


class NoQuota:
    def read(self) -> None:
        return None

    def cpus(self, reading: object) -> None:
        return None


def _times(monkeypatch: pytest.MonkeyPatch, world: int = 4) -> tuple[StepTimes, FakeClock, list[dict[str, Any]]]:
    clock = FakeClock()
    fake = types.SimpleNamespace(perf_counter=clock, process_time=clock, time=clock)
    monkeypatch.setattr(step_module, "time", fake)
    monkeypatch.setattr(hook_timing, "time", fake)
    records: list[dict[str, Any]] = []
    times = StepTimes(1, world, lambda kind, **f: records.append({"kind": kind, **f}), lambda: "HL8",
                      cpus=lambda level: {"HL8": 0.25}[level])
    times.clock.quota = NoQuota()  # type: ignore[assignment]
    return times, clock, records


def _step(times: StepTimes, clock: FakeClock, *, before: float, micro: list[tuple[int, float]], wait: float) -> None:
    """``before`` seconds after the last all-reduce (the update, the next batch), then each micro-batch's
    forward and backward (``(samples, seconds)``; the last one's backward reduces), then ``wait`` in its
    all-reduce."""
    clock.advance(before)
    for samples, seconds in micro:
        times.forward(samples, training=True)
        clock.advance(seconds)
    times.last_bucket()
    clock.advance(wait)
    times.reduced()


def test_a_steps_work_runs_from_the_last_all_reduce_to_its_last_bucket_and_its_wait_to_the_reduce(
        monkeypatch: pytest.MonkeyPatch) -> None:
    times, clock, records = _times(monkeypatch)
    clock.advance(5.0)  # start-up before the first forward is no step's
    _step(times, clock, before=0.0, micro=[(32, 0.2)], wait=0.5)
    _step(times, clock, before=0.05, micro=[(32, 0.2)], wait=0.1)
    _step(times, clock, before=0.05, micro=[(32, 0.2)], wait=0.3)
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["compute_ms"] for r in steps] == pytest.approx([200.0, 250.0, 250.0])
    assert [r["sync_ms"] for r in steps] == pytest.approx([500.0, 100.0, 300.0])
    assert [r["batch"] for r in steps] == [32, 32, 32]
    assert all(r["global_batch"] == 128 and r["source"] == "hook" and r["level"] == "HL8" and r["cpus"] == 0.25
               for r in steps)
    assert times.train_time_s() == pytest.approx(0.7 + 0.35 + 0.55)


def test_accumulation_steps_are_counted_once_with_every_micro_batchs_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backwards under no_sync call no hook: the step that reduces holds their work and samples."""
    times, clock, records = _times(monkeypatch)
    _step(times, clock, before=0.0, micro=[(16, 0.1), (16, 0.1), (8, 0.05)], wait=0.2)
    _step(times, clock, before=0.01, micro=[(16, 0.1), (16, 0.1), (8, 0.05)], wait=0.2)
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 2 and times.steps == 2
    assert [r["batch"] for r in steps] == [40, 40]
    assert [r["compute_ms"] for r in steps] == pytest.approx([250.0, 260.0])
    assert times.total_samples == 2 * 40 * 4


def test_evaluation_between_steps_is_neither_a_steps_work_nor_training_time(monkeypatch: pytest.MonkeyPatch) -> None:
    times, clock, records = _times(monkeypatch)
    _step(times, clock, before=0.0, micro=[(32, 0.2)], wait=0.1)
    clock.advance(0.05)
    for _ in range(3):  # an evaluation pass: forwards without gradients
        times.forward(64, training=False)
        clock.advance(1.0)
    _step(times, clock, before=0.02, micro=[(32, 0.2)], wait=0.1)
    steps = [r for r in records if r["kind"] == "step"]
    assert steps[1]["compute_ms"] == pytest.approx(200.0)  # from its first training forward
    assert steps[1]["batch"] == 32  # evaluation samples are no step's
    # the evaluation, from its first forward to the next training forward, is left out
    assert times.train_time_s() == pytest.approx(0.3 + 0.05 + 0.2 + 0.1)


def test_a_partial_last_step_is_recorded_at_its_size_and_the_usual_batch_is_the_full_steps() -> None:
    times = StepTimes(0, 2, lambda kind, **f: None, lambda: "HL1", on_cpu=False)
    for b in (64, 64, 64, 9):
        times.forward(b, training=True)
        times.last_bucket()
        times.reduced()
    assert times.usual_batch() == 64 and times.total_samples == 2 * (3 * 64 + 9)


def test_a_forwards_samples_are_its_first_tensors_first_dimension() -> None:
    x = torch.zeros(12, 3)
    assert first_batch_size((x, torch.zeros(5)), {}) == 12
    assert first_batch_size((), {"input_ids": torch.zeros(7, 20, dtype=torch.long)}) == 7
    assert first_batch_size(({"pixel_values": torch.zeros(3, 1, 2, 2)},), {}) == 3
    assert first_batch_size(([torch.zeros(6, 2), torch.zeros(6)], 0), {}) == 6  # Lightning: (batch, batch_idx)
    assert first_batch_size((torch.tensor(1.0), [1, 2]), {}) == 0  # no batched tensor: no samples


def test_the_pending_reduce_callback_holds_no_reference_to_the_hooks_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback runs on, and is dropped by, one of the process group's threads: were it the last
    holder of the hook's state (DDP's: the process group), the group's teardown would join that thread."""
    import gc
    import weakref

    from omnilearn.torch.autoload import Timed, timed_hook

    class State:  # stands for the process group
        pass

    times, _, records = _times(monkeypatch)
    times.forward(8, training=True)
    pending: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    state = State()
    timed = Timed(lambda s, bucket: pending, state, times)
    bucket = types.SimpleNamespace(is_last=lambda: True)
    reduced = timed_hook(timed, bucket)
    gone = weakref.ref(state)
    del timed, state
    gc.collect()
    assert gone() is None  # the script dropped its model and group: nothing of ours keeps the group
    pending.set_result(torch.zeros(3))
    assert reduced.wait().shape == (3,)
    assert [r["kind"] for r in records] == ["step"]
