"""The DDP peer: with equal batches, DDP's mean-loss step updates the model exactly as our weighted step."""

from __future__ import annotations

from pathlib import Path

import torch

from dist_helpers import init_gloo, run_ranks
from omnilearn.train.models import build_model

SIZES = [8, 8, 8]  # equal batches: the only split plain DDP averages correctly


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def _rank_steps(rank: int, world: int, sizes: list[int], out: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from omnilearn.train.bsp import share_loss
    from omnilearn.train.ddp import ddp_backward
    from omnilearn.train.grad_sum import GradientSum
    from omnilearn.train.workload import Workload

    init_gloo()
    work = Workload(model=lambda: build_model("smallcnn", 10, 16), train=[], test=[])  # default loss and metric
    x, y = make_data(sum(sizes))
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    results = {}
    for name in ("ours", "ddp"):
        torch.manual_seed(0)
        model = build_model("smallcnn", 10, 16)
        grads = GradientSum(list(model.parameters()), 0, fill=lambda extra: None, read=lambda extra: None)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        ddp = DistributedDataParallel(model) if name == "ddp" else None
        for _ in range(3):  # momentum carries the first steps into the later ones
            grads.buffer.zero()
            if ddp is not None:
                ddp_backward(work, ddp, x[lo:hi], y[lo:hi])
            else:  # the trainer's step: its end sums the gradients
                grads.open([hi - lo], (hi - lo) / sum(sizes))
                share_loss(work, model, x[lo:hi], y[lo:hi])[0].backward()
            opt.step()
        results[name] = [p.detach().clone() for p in model.parameters()]
    if rank == 0:
        torch.save(results, out / "params.pt")
    dist.destroy_process_group()


def test_ddp_update_equals_our_uniform_update(tmp_path: Path) -> None:
    run_ranks(_rank_steps, len(SIZES), SIZES, tmp_path, tmp=tmp_path)
    results = torch.load(tmp_path / "params.pt")
    torch.manual_seed(0)
    start = [p.detach() for p in build_model("smallcnn", 10, 16).parameters()]
    moved = max(float((a - s).abs().max()) for a, s in zip(results["ours"], start, strict=True))
    assert moved > 1e-3  # the steps did change the model: the comparison below means something
    for ours, ddp in zip(results["ours"], results["ddp"], strict=True):
        assert torch.allclose(ours, ddp, atol=1e-5, rtol=0), (ours - ddp).abs().max()


def test_ddp_is_a_bsp_peer_only(tmp_path: Path) -> None:
    import pytest

    from omnilearn import config
    from omnilearn.errors import UserError

    assert config.build(None, [("control.policy", "ddp")]).control.policy == "ddp"
    with pytest.raises(UserError, match="control.policy: ddp is a BSP peer"):
        config.build(None, [("mode", "asp"), ("control.policy", "ddp")])
