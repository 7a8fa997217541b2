"""One control loop: the BSP trainer, ``omnilearn.torch`` and the simulator decide through
:class:`~omnilearn.control.loop.ControlLoop`, so their recorded inputs replay to their recorded
decisions; a BSP step issues one collective."""

from __future__ import annotations

import json
from pathlib import Path

from dist_helpers import run_ranks
from jobs import decisions_replay
from omnilearn import config
from omnilearn.jobfile import JobSpec
from omnilearn.metrics import read_rank

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "barrier", "all_gather_object", "broadcast_object_list",
               "all_gather_into_tensor", "reduce_scatter", "reduce", "gather", "scatter", "all_to_all")
JOB = {"mode": "bsp", "workers": 2, "model": {"name": "smallcnn"},
       "data": {"name": "synthetic", "image_size": 16, "synthetic_size": 640},
       "train": {"epochs": 3, "global_batch": 64, "lr": 0.05},
       "control": {"policy": "dynamic", "memory_bounds": False},
       "emulation": {"backend": "none", "hl": "HL1", "ack_timeout": 0.01}}
UPDATE_S, FIRST_UPDATE_S = 0.04, 0.5  # CPU seconds of an optimizer step, and of one that allocates its state


def _bsp_rank(rank: int, world: int, out: Path) -> None:
    import time

    import torch.distributed as dist

    from omnilearn.emulator.spec.levels import Allocation
    from omnilearn.emulator.spec.plan import build_plan
    from omnilearn.train import bsp

    # One torch thread a rank, as an emulated level gives a one-CPU worker. Left at the host's two CPUs,
    # each rank's parallel regions wait for a thread queued behind the other rank's burner: rounds of a
    # few milliseconds of CPU then last a third of a second, on both ranks alike, and the probe cannot
    # tell them apart.
    Allocation.threads = lambda self, default=None: 1  # type: ignore[method-assign]
    cfg = config.from_dict(json.loads(json.dumps(JOB)), "test job").validate()
    job = JobSpec(job_id="oneloop", config=cfg, plan=build_plan(cfg), out_dir=out, backend="none")
    job.log_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        job.save()
    if rank == 1:  # a ten times slower worker, so the controller moves
        plain = bsp.share_loss

        def slow(work, model, x, y):  # noqa: ANN001, ANN202
            # about nine times the step's own CPU more (its backward about twice its forward), burnt
            # rather than slept, before the backward: the start-up probe counts a CPU's work in CPU
            # seconds, and a loaded host slows both ranks alike. A slower core slows a step's fixed part
            # as much as its per-sample part, as the model t = c (b + k) says: a burn of 10 ms a sample
            # on this tiny model (its step a few ms whatever the batch) gave the ranks opposite k, and
            # the probe sometimes held the equal split as uncertain.
            start = time.process_time()
            out = plain(work, model, x, y)
            end = time.process_time() + 27 * (time.process_time() - start)
            while time.process_time() < end:
                pass
            return out

        bsp.share_loss = slow
    counting, count = [False], [0]
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def wrapped(*a, _f=original, **k):  # noqa: ANN002, ANN003, ANN202
            count[0] += counting[0]
            return _f(*a, **k)

        setattr(dist, name, wrapped)
    trainer = bsp.BSPTrainer(job)
    opt, plain_step = trainer.optimizer, trainer.optimizer.step

    def burning_step(*a, **k):  # noqa: ANN002, ANN003, ANN202
        # an update of 40 ms of CPU, and 0.5 s where it allocates the optimizer's state (the first after
        # the start-up pass restored it empty): a one-off that no split changes
        start, burn = time.process_time(), UPDATE_S if opt.state else FIRST_UPDATE_S
        out = plain_step(*a, **k)
        while time.process_time() < start + burn:
            pass
        return out

    opt.step = burning_step  # type: ignore[method-assign]
    steps = [0]
    for method in ("train_step", "control"):
        inner = getattr(trainer, method)

        def counted(*a, _f=inner, _m=method, **k):  # noqa: ANN002, ANN003, ANN202
            counting[0] = True
            steps[0] += _m == "train_step"
            try:
                return _f(*a, **k)
            finally:
                counting[0] = False

        setattr(trainer, method, counted)
    trainer.run()
    (out / f"collectives-{rank}.json").write_text(json.dumps({"steps": steps[0], "collectives": count[0]}))


def test_bsp_trainer_issues_one_collective_a_step_and_its_decisions_replay(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_ranks(_bsp_rank, 2, out, tmp=tmp_path, timeout=300)
    for rank in (0, 1):
        counted = json.loads((out / f"collectives-{rank}.json").read_text())
        assert counted["steps"] == 24 and counted["collectives"] == counted["steps"], counted  # 3 x 512/64
    recorded, replayed = decisions_replay(out)
    assert [r["reason"] for r in recorded][:2] == ["initial", "probe"]
    assert recorded[1]["batch"][1] < recorded[1]["batch"][0]  # the probe saw the slower rank
    assert recorded == replayed
    # every rank decided alike: the same batch changes in every rank's file
    other = [{k: v for k, v in r.items() if k != "time"} for r in read_rank(out, 1) if r["kind"] == "batch_change"]
    assert other == recorded
    # A step's time carries the update before it; step 1's, the start-up pass's update (at least its
    # 40 ms of CPU; rank 0's forward and backward take a few ms). Step 1's own update allocated the
    # optimizer's state (0.5 s): a one-off that rides with no step's time.
    # every rank's start-up pass, at the probe's two sizes: what tells k where the steps run one size
    ups = [[r for r in read_rank(out, k) if r["kind"] == "start_up"] for k in (0, 1)]
    assert [len(u) for u in ups] == [1, 1] and all(u[0]["sizes"] == recorded[1]["sizes"] for u in ups)
    # the slower rank at each size (both carry the update's 40 ms of CPU, which no rank does faster)
    assert all(slow > 1.5 * fast for slow, fast in zip(ups[1][0]["times_ms"], ups[0][0]["times_ms"], strict=True))
    records = read_rank(out, 0)
    measured = {r["step"]: r["times_s"] for r in records if r["kind"] == "measurement"}
    compute = {r["step"]: r["compute_ms"] / 1e3 for r in records if r["kind"] == "step"}
    assert measured[1][0] >= UPDATE_S, measured[1]
    assert compute[1] >= FIRST_UPDATE_S  # the step's own record keeps its wall time, the one-off in it
    assert measured[2][0] < compute[2] + (FIRST_UPDATE_S - UPDATE_S) / 2, (measured[2], compute[2])
