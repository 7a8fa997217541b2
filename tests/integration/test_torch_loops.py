"""omnilearn.torch in real loops, 2 gloo ranks: gradient accumulation, AMP with GradScaler, clipping, a
loop that draws its own batches, evaluation, and a peeked batch; each update checked against one process
computing the gradient of the same global batch."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from dist_helpers import init_gloo, run_ranks
from omnilearn.metrics import read_rank

N_FEATURES, N_CLASSES = 6, 3


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, N_FEATURES, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):  # noqa: ANN204
        return self.x[i], self.y[i], i


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(N_FEATURES, 12), nn.Tanh(), nn.Linear(12, N_CLASSES))


def _gather(obj):  # noqa: ANN001, ANN202
    import torch.distributed as dist

    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, obj)
    return box


def _worst_error(record: list, data: Indexed, clip: float | None = None, amp: bool = False) -> float:
    """The largest difference between a step's all-reduced gradient and one process's on its global batch
    (with ``clip``: the clipped gradients, and the norms before clipping)."""
    indices = _gather([r[2] for r in record])
    worst = 0.0
    for (before, grads, _, norm), *mine in zip(record, *indices, strict=True):
        ref = net()
        ref.load_state_dict(before)
        union = [i for part in mine for i in part]
        with torch.autocast("cpu", dtype=torch.bfloat16) if amp else nullcontext():
            loss = F.cross_entropy(ref(data.x[union]), data.y[union])
        loss.backward()
        if clip is not None:
            worst = max(worst, abs(norm - float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip))))
        worst = max(worst, max(float((g - q.grad).abs().max()) for g, q in zip(grads, ref.parameters(), strict=True)))
    return worst


def _accumulation(out: Path, rank: int) -> dict:
    """global_batch=22 in 3 micro-batches (shares of 11: micro-batches 4, 4, 3), DDP's no_sync pattern;
    90 samples: a last step of 2, one rank's share empty, the other's cut 1, 1, 0."""
    from omnilearn.torch import HeteroDataLoader, HeteroDataParallel

    torch.manual_seed(rank)
    data, k = Indexed(90), 3
    model = HeteroDataParallel(net(), out=str(out))
    loader = HeteroDataLoader(data, 22, accumulate=k, seed=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    record, step_indices, before = [], [], None
    for i, (x, y, idx) in enumerate(loader):
        if i % k == 0:
            before, step_indices = {n: v.clone() for n, v in model.module.state_dict().items()}, []
        step_indices += idx.tolist()
        last = (i + 1) % k == 0
        with nullcontext() if last else model.no_sync():
            (F.cross_entropy(model(x), y) / k).backward()
        if last:
            record.append((before, [p.grad.clone() for p in model.module.parameters()], step_indices, None))
            opt.step()
            opt.zero_grad()
    seen = sorted(i for part in _gather([i for r in record for i in r[2]]) for i in part)
    return {"grad_error": _worst_error(record, data), "every_sample_once": seen == list(range(len(data))),
            "micro_batches": len(loader), "steps": len(record)}


def _amp_clip_peek_eval(out: Path, rank: int) -> dict:
    """A per-device batch of 8, CPU autocast (bfloat16), GradScaler, clipping; a peek at the loader before
    each epoch (no backward: not a step); an evaluation loader in the middle of an epoch."""
    from omnilearn.torch import HeteroDataLoader, HeteroDataParallel

    torch.manual_seed(rank)
    data, clip = Indexed(64), 0.05
    model = HeteroDataParallel(net(), out=str(out))
    loader = HeteroDataLoader(data, batch_size=8, seed=2)
    evaluation = HeteroDataLoader(data, batch_size=5, train=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    record, scales, evaluated = [], set(), []
    for _ in range(2):
        next(iter(loader))  # a peek: the shape of a batch
        for step, (x, y, idx) in enumerate(loader):
            before = {n: v.clone() for n, v in model.module.state_dict().items()}
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            record.append((before, [p.grad.clone() for p in model.module.parameters()], idx.tolist(), norm))
            scales.add(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if step == 1 and not evaluated:
                model.eval()
                with torch.no_grad():
                    evaluated = [i for _, _, idx in evaluation for i in idx.tolist()]
                model.train()
    seen = sorted(i for part in _gather(evaluated) for i in part)
    return {"grad_error": _worst_error(record, data, clip=clip, amp=True), "steps": len(record),
            "eval_every_sample_once": seen == list(range(len(data))), "scale_finite": all(s > 0 for s in scales),
            "global_batch": loader.global_batch, "threads": torch.get_num_threads()}


def _get_batch_loop(out: Path, rank: int) -> dict:
    """A nanoGPT-style loop: no DataLoader; get_batch(size) draws random rows; 2 micro-batches a step."""
    from omnilearn.torch import HeteroBatches, HeteroDataParallel

    torch.manual_seed(rank)
    data, k, steps = Indexed(500), 2, 8
    g = torch.Generator().manual_seed(100 + rank)
    drawn: list[list[int]] = []

    def get_batch(size: int):  # noqa: ANN202
        idx = torch.randint(0, len(data), (size,), generator=g)
        drawn.append(idx.tolist())
        return data.x[idx], data.y[idx]

    model = HeteroDataParallel(net(), out=str(out), tensorboard=True)
    batches = HeteroBatches(get_batch, batch_size=5, accumulate=k, steps=steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    record, sizes, before = [], [], None
    for i, (x, y) in enumerate(batches):  # the loader's pattern; the pass ends with its summary.json
        if i % k == 0:
            before = {n: v.clone() for n, v in model.module.state_dict().items()}
        last = (i + 1) % k == 0
        with nullcontext() if last else model.no_sync():
            (F.cross_entropy(model(x), y) / k).backward()
        if last:
            mine = [j for part in drawn[-k:] for j in part]
            sizes.append(len(mine))
            record.append((before, [p.grad.clone() for p in model.module.parameters()], mine, None))
            opt.step()
            opt.zero_grad()
    totals = [sum(s) for s in zip(*_gather(sizes), strict=True)]
    return {"grad_error": _worst_error(record, data), "step_totals": totals}


def _probe(out: Path, rank: int) -> dict:
    """The start-up probe on the loop's own step (loader.start_up); rank 1 burns 5 ms of CPU a sample."""
    import time

    from omnilearn.torch import HeteroDataLoader, HeteroDataParallel

    torch.manual_seed(rank)
    data = Indexed(64)
    model = HeteroDataParallel(net(), out=str(out))
    loader = HeteroDataLoader(data, 16, seed=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(batch) -> None:  # noqa: ANN001
        x, y, _ = batch
        end = time.process_time() + (0.005 * len(y) if rank == 1 else 0.0)
        while time.process_time() < end:  # burnt, not slept: the probe counts CPU seconds
            pass
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    started = {n: v.clone() for n, v in model.module.state_dict().items()}
    loader.start_up(step, opt)
    after = model.module.state_dict()
    result = {"left_no_trace": all(torch.equal(v, after[n]) for n, v in started.items()) and not opt.state}
    steps = 0
    for batch in loader:
        step(batch)
        steps += 1
    return {**result, "steps": steps}


def _misuse(out: Path, rank: int) -> str:
    """no_sync around a step's only backward, the loader told of no accumulation: an error at the next step."""
    from omnilearn.errors import UserError
    from omnilearn.torch import HeteroDataLoader, HeteroDataParallel

    data = Indexed(40)
    model = HeteroDataParallel(net(), out=str(out))
    batches = iter(HeteroDataLoader(data, 8))
    x, y, _ = next(batches)
    with model.no_sync():
        F.cross_entropy(model(x), y).backward()
    try:
        next(batches)
    except UserError as e:
        return str(e)
    return ""


def _nanogpt_loop(out: Path, rank: int) -> dict:
    """nanoGPT's loop shape, converted: a first batch fetched before ``while True``, iterations 0 to
    ``max_iters`` inclusive, accumulation by ``require_backward_grad_sync``, GradScaler and clipping,
    and a ``break`` long before the pass of ``steps`` ends."""
    from omnilearn.torch import HeteroBatches, HeteroDataParallel

    torch.manual_seed(rank)
    data, k, max_iters = Indexed(500), 2, 5
    g = torch.Generator().manual_seed(7 + rank)

    def get_batch(size: int):  # noqa: ANN202
        idx = torch.randint(0, len(data), (size,), generator=g)
        return data.x[idx], data.y[idx]

    model = HeteroDataParallel(net(), out=str(out))
    batches = iter(HeteroBatches(get_batch, batch_size=4, accumulate=k, steps=100))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = next(batches)  # the first batch, before the loop
    iter_num = 0
    while True:
        for micro_step in range(k):
            model.require_backward_grad_sync = micro_step == k - 1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y) / k
            scaler.scale(loss).backward()
            x, y = next(batches)  # the next micro-batch, once this one's backward ran
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if iter_num == max_iters:
            break
        iter_num += 1
    return {"iterations": iter_num + 1}


def _loops_rank(rank: int, world: int, out: Path) -> None:
    init_gloo()
    results = {"accumulation": _accumulation(out / "accumulation", rank),
               "amp": _amp_clip_peek_eval(out / "amp", rank),
               "get_batch": _get_batch_loop(out / "get_batch", rank),
               "misuse": _misuse(out / "misuse", rank), "probe": _probe(out / "probe", rank),
               "nanogpt": _nanogpt_loop(out / "nanogpt", rank)}
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results))
    import torch.distributed as dist

    dist.destroy_process_group()


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("loops")
    out = tmp / "runs"
    out.mkdir()
    run_ranks(_loops_rank, 2, out, tmp=tmp, timeout=300)
    return out


def _steps(run: Path, rank: int) -> list[dict]:
    return [r for r in read_rank(run, rank) if r["kind"] == "step"]


def test_accumulation_updates_with_the_global_batch_gradient(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["accumulation"]
    assert got["grad_error"] < 1e-5 and got["every_sample_once"], got
    assert got["micro_batches"] == 5 * 3 and got["steps"] == 5  # ceil(90 / 22) steps of 3 micro-batches
    steps = _steps(loops / "accumulation", 0)
    assert len(steps) == 5 and [s["global_batch"] for s in steps] == [22, 22, 22, 22, 2]


def test_amp_gradscaler_and_clipping_keep_the_global_batch_gradient(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["amp"]
    assert got["grad_error"] < 2e-3 and got["scale_finite"], got  # bfloat16 forward; clipped to 0.05
    assert got["global_batch"] == 16  # batch_size=8 per device on 2 ranks


def test_a_peek_and_an_evaluation_are_not_training_steps(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["amp"]
    assert got["eval_every_sample_once"] and got["steps"] == 2 * 4
    summary = json.loads((loops / "amp" / "summary.json").read_text())
    assert summary["samples"] == 2 * 64 and summary["epochs_done"] == 2, summary  # no phantom step per epoch
    scores = summary["straggler_scores"]  # samples per compute-second of each rank, over its steps
    assert len(scores) == 2 and max(s["relative"] for s in scores) == 1.0
    assert all(0 < s["relative"] <= 1 and 0 < s["individual"] <= 1 for s in scores), scores
    for rank in (0, 1):
        assert len(_steps(loops / "amp", rank)) == 8


def test_the_launchers_threads_are_kept(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["amp"]
    assert got["threads"] == 1  # the harness's OMP_NUM_THREADS
    assert {s["threads"] for s in _steps(loops / "amp", 1)} == {1}


def test_a_get_batch_loop_draws_its_share_and_is_measured(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["get_batch"]
    assert got["grad_error"] < 1e-5 and got["step_totals"] == [20] * 8, got  # 5 per device x 2 ranks x 2
    summary = json.loads((loops / "get_batch" / "summary.json").read_text())
    assert summary["samples"] == 8 * 20 and summary["global_batch"] == 20


def test_tensorboard_shows_each_ranks_straggler_scores(loops: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    charts = sorted((loops / "get_batch" / "tensorboard").glob("straggler_relative_*"))
    assert len(charts) == 2, charts  # one line per rank, after its first window of 8 steps
    values = [EventAccumulator(str(c)).Reload().Scalars("straggler/relative")[-1].value for c in charts]
    assert max(values) == 1.0 and all(0 < v <= 1 for v in values), values


def test_a_step_left_without_its_all_reduce_is_named(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["misuse"]
    assert "no all-reduce" in got and "accumulate=" in got, got


def test_the_start_up_probe_runs_the_loops_step_before_step_one_and_leaves_no_trace(loops: Path) -> None:
    got = json.loads((loops / "results.json").read_text())["probe"]
    assert got["left_no_trace"] and got["steps"] == 4, got  # weights and momentum as before; 64 / 16 steps
    changes = [r for r in read_rank(loops / "probe", 0) if r["kind"] == "batch_change"]
    assert [r["reason"] for r in changes][:2] == ["initial", "probe"], changes
    probe = changes[1]
    assert probe["step"] == 0 and probe["warm"] is False
    assert probe["batch"][1] < probe["batch"][0], probe  # the slower rank 1 gets less before step 1


def test_a_nanogpt_loop_that_breaks_inside_the_pass_closes_its_records(loops: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    from omnilearn.cli import main

    got = json.loads((loops / "results.json").read_text())["nanogpt"]
    assert got["iterations"] == 6, got  # iterations 0..5
    run = loops / "nanogpt"
    for rank in (0, 1):
        steps = _steps(run, rank)
        assert len(steps) == 6 and all(s["global_batch"] == 16 for s in steps)  # 4 x 2 ranks x 2 micro-batches
        end = [r for r in read_rank(run, rank) if r["kind"] == "end"]
        assert len(end) == 1 and end[0]["stopped_early"] is True and end[0]["steps"] == 6, end
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] is True and summary["steps"] == 6 and summary["samples"] == 6 * 16
    capfd.readouterr()
    assert main(["report", str(run)]) == 0
    assert "Traceback" not in capfd.readouterr().err
