"""BSP numerics across real gloo processes: the trainer's step (its share's mean loss, the gradient sum
weighted by ``b_i / B``) equals one process on the whole batch."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from dist_helpers import init_gloo, run_ranks
from omnilearn.train.models import build_model

SIZES = [3, 8, 13]  # deliberately unequal local batches; B = 24


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def _rank_step(rank: int, world: int, sizes: list[int], out: Path) -> None:
    import torch.distributed as dist

    from omnilearn.train.bsp import share_loss
    from omnilearn.train.grad_sum import GradientSum
    from omnilearn.train.workload import Workload

    init_gloo()
    work = Workload(model=lambda: build_model("smallcnn", 10, 16), train=[], test=[])  # default loss and metric
    torch.manual_seed(0)
    model = build_model("smallcnn", 10, 16)
    grads = GradientSum(list(model.parameters()), 0, fill=lambda extra: None, read=lambda extra: None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = make_data(sum(sizes))
    start = sum(sizes[:rank])
    for step in range(2):  # two steps: the second also checks the momentum state stays in agreement
        grads.open([sizes[rank]], sizes[rank] / sum(sizes))
        share_loss(work, model, x[start:start + sizes[rank]], y[start:start + sizes[rank]])[0].backward()
        assert grads.reduced  # the backward's end summed the gradients, as the trainer's step does
        if rank == 0:
            torch.save(grads.buffer.flat[:grads.buffer.numel].clone(), out / f"grad-{step}.pt")
        opt.step()
    if rank == 0:
        torch.save([p.detach().clone() for p in model.parameters()], out / "params.pt")
    dist.destroy_process_group()


def test_weighted_aggregation_equals_single_process(tmp_path: Path) -> None:
    run_ranks(_rank_step, len(SIZES), SIZES, tmp_path, tmp=tmp_path)
    torch.manual_seed(0)
    model = build_model("smallcnn", 10, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = make_data(sum(SIZES))
    for step in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the mean over the whole global batch
        ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        got = torch.load(tmp_path / f"grad-{step}.pt")
        assert got.shape == ref.shape
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
        opt.step()
    for p, q in zip(model.parameters(), torch.load(tmp_path / "params.pt"), strict=True):
        assert torch.allclose(p.detach(), q, atol=1e-5, rtol=0)


def test_unweighted_mean_would_differ() -> None:
    """Guard that the test above can fail: averaging per-worker means is not the global mean."""
    torch.manual_seed(0)
    model = build_model("smallcnn", 10, 16)
    x, y = make_data(sum(SIZES))
    grads = []
    start = 0
    for b in SIZES:
        model.zero_grad()
        F.cross_entropy(model(x[start:start + b]), y[start:start + b]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        start += b
    naive = sum(grads) / len(grads)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert (naive - ref).abs().max() > 1e-4
