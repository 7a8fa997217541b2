"""Model zoo: every model trains at 32x32, the small-input adaptations, smallcnn's batch independence."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omnilearn.errors import UserError
from omnilearn.train.models import KNOWN_MODELS, build_model, count_parameters, resolve_stem


@pytest.mark.parametrize("name", KNOWN_MODELS)
def test_forward_backward_at_32(name: str) -> None:
    model = build_model(name, num_classes=10, image_size=32, seed=0)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    nn.functional.cross_entropy(out, torch.tensor([1, 7])).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_small_input_heads_are_small() -> None:
    # Stock heads are 120M (VGG11) and 58M (AlexNet) parameters: pointless traffic at 32x32.
    assert count_parameters(build_model("vgg11", 10, 32)) < 10_000_000
    assert count_parameters(build_model("alexnet", 100, 32)) < 4_000_000
    stock = build_model("alexnet", 10, 64)  # the stock AlexNet works from 63x63
    assert stock(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    assert count_parameters(stock) > 50_000_000


def stem_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.maxpool(model.relu(model.bn1(model.conv1(x))))


def test_resnet_stems_change_the_compute() -> None:
    x = torch.randn(1, 3, 32, 32)
    sizes = {stem: stem_output(build_model("resnet18", 10, 32, stem=stem), x).shape[-1]
             for stem in ("imagenet", "small", "cifar")}
    # "small" keeps 4x the feature-map area of "imagenet" after the stem (so ~4x the FLOPs after it).
    assert sizes == {"imagenet": 8, "small": 16, "cifar": 32}
    assert resolve_stem("auto", 32) == resolve_stem("auto", 64) == "small"
    assert resolve_stem("auto", 224) == "imagenet"
    assert build_model("resnet18", 10, 32).conv1.kernel_size == (3, 3)
    assert build_model("resnet18", 10, 128).conv1.kernel_size == (7, 7)


def test_in_channels() -> None:
    for name in ("resnet18", "vgg11", "alexnet", "smallcnn"):
        model = build_model(name, 5, 32, in_channels=1)
        assert model(torch.randn(2, 1, 32, 32)).shape == (2, 5)


def test_seed_gives_identical_weights_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("alexnet", 10, 32, seed=5)
    assert torch.equal(torch.rand(1), expected), "global RNG untouched"
    b = build_model("alexnet", 10, 32, seed=5)
    c = build_model("alexnet", 10, 32, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


def test_smallcnn_gradient_is_batch_independent() -> None:
    # What the distributed tests rely on: (b1/B) * grad(part 1) + (b2/B) * grad(part 2) == grad(all B).
    model = build_model("smallcnn", 10, 16, seed=0)
    x, y = torch.randn(12, 3, 16, 16), torch.randint(0, 10, (12,))

    def grad(xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        nn.functional.cross_entropy(model(xs), ys).backward()
        return [p.grad.clone() for p in model.parameters()]

    whole = grad(x, y)
    first, second = grad(x[:5], y[:5]), grad(x[5:], y[5:])
    for g, g1, g2 in zip(whole, first, second, strict=True):
        assert torch.allclose(g, (5 * g1 + 7 * g2) / 12, atol=1e-6)
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.Dropout)) for m in model.modules())


def test_count_parameters() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    assert count_parameters(model) == 3 * 4 + 4 + 4 * 2 + 2
    model[0].weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 4 + 4 * 2 + 2
    assert count_parameters(model) == 26


def test_user_errors() -> None:
    with pytest.raises(UserError, match="resnet18, resnet50, vgg11, alexnet, smallcnn"):
        build_model("resnet152", 10, 32)
    with pytest.raises(UserError, match="stem"):
        build_model("resnet18", 10, 32, stem="tiny")
    with pytest.raises(UserError, match="vgg11 needs image_size >= 32"):
        build_model("vgg11", 10, 16)
    with pytest.raises(UserError, match="num_classes"):
        build_model("smallcnn", 1, 32)


@pytest.mark.parametrize("name", KNOWN_MODELS)
def test_the_fork_server_preloads_torchvision_for_exactly_the_models_that_import_it(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.launch import forked
    from omnilearn.train import models

    used: list[str] = []
    real = models._torchvision
    monkeypatch.setattr(models, "_torchvision", lambda: used.append(name) or real())
    build_model(name, num_classes=10, image_size=32)
    assert bool(used) == (name in forked.TORCHVISION_MODELS)
    assert ("torchvision" in forked.preload(name, "synthetic")) == bool(used)
    assert "torchvision" in forked.preload(name, "cifar10")  # CIFAR's loader is torchvision's
