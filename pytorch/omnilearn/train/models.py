"""Model zoo: torchvision's ResNet/VGG/AlexNet adapted to small images, and a small test CNN.

The paper trains ResNet, VGG and AlexNet on CIFAR-sized inputs; torchvision's definitions target
224x224 ImageNet images. The adaptations below keep torchvision's code and change only the parts that
break or waste compute at 32x32 (the stem, the pools, the 100M-parameter classifiers). ``smallcnn`` has
no BatchNorm and no dropout, so one sample's output does not depend on the rest of its batch: the
distributed tests compare gradients of split batches against one process on the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torchvision import models as tvm

from omnilearn.errors import UserError

KNOWN_MODELS = ("resnet18", "resnet50", "vgg11", "alexnet", "smallcnn")
RESNET_STEMS = ("auto", "imagenet", "small", "cifar")

# Below this size VGG/AlexNet get the small-input variant and ``stem="auto"`` picks "small" at or below it.
SMALL_INPUT = 64
# Smallest input each model accepts (its pools would shrink the feature map to nothing below it).
MIN_IMAGE_SIZE = {"resnet18": 8, "resnet50": 8, "vgg11": 32, "alexnet": 16, "smallcnn": 4}


def build_model(
    name: str,
    num_classes: int,
    image_size: int,
    in_channels: int = 3,
    stem: str = "auto",
    seed: int | None = None,
) -> nn.Module:
    """Build model ``name`` for ``in_channels x image_size x image_size`` inputs, randomly initialised.

    ``stem`` applies to ResNets only: "imagenet" (stock 7x7/2 conv + max-pool), "small" (3x3/1 conv,
    max-pool kept: 4x the stem-output area of "imagenet"), "cifar" (3x3/1 conv, no max-pool), "auto"
    ("small" when ``image_size <= 64``, else "imagenet"). With ``seed``, initialisation uses that seed
    without touching the global RNG, so every rank can build identical weights on its own.
    """
    if name not in KNOWN_MODELS:
        raise UserError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    if stem not in RESNET_STEMS:
        raise UserError(f"unknown ResNet stem {stem!r}; known stems: {', '.join(RESNET_STEMS)}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise UserError(f"model {name}: num_classes must be an integer >= 2, got {num_classes!r}")
    if not isinstance(in_channels, int) or in_channels < 1:
        raise UserError(f"model {name}: in_channels must be a positive integer, got {in_channels!r}")
    if not isinstance(image_size, int) or image_size < MIN_IMAGE_SIZE[name]:
        raise UserError(
            f"model {name} needs image_size >= {MIN_IMAGE_SIZE[name]}, got {image_size!r}"
        )
    builders: dict[str, Callable[[], nn.Module]] = {
        "resnet18": lambda: _resnet(_torchvision().resnet18, num_classes, image_size, in_channels, stem),
        "resnet50": lambda: _resnet(_torchvision().resnet50, num_classes, image_size, in_channels, stem),
        "vgg11": lambda: _vgg11(num_classes, image_size, in_channels),
        "alexnet": lambda: _alexnet(num_classes, image_size, in_channels),
        "smallcnn": lambda: SmallCNN(num_classes, in_channels),
    }
    if seed is None:
        return builders[name]()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return builders[name]()


def _torchvision() -> ModuleType:
    """torchvision's models, imported by the models that use them: 1.5 CPU-seconds that a worker of any
    other model does not spend before its first step (under a container's CPU quota, several seconds)."""
    from torchvision import models

    return models


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (what an all-reduce moves each step, times 4 bytes)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def resolve_stem(stem: str, image_size: int) -> str:
    """The concrete ResNet stem that ``stem`` means at ``image_size`` ("auto" resolved)."""
    if stem == "auto":
        return "small" if image_size <= SMALL_INPUT else "imagenet"
    return stem


def _resnet(
    factory: Callable[..., tvm.ResNet], num_classes: int, image_size: int, in_channels: int, stem: str
) -> nn.Module:
    """torchvision ResNet whose stem suits the input size (see :func:`build_model`)."""
    model = factory(weights=None, num_classes=num_classes)
    stem = resolve_stem(stem, image_size)
    if stem == "imagenet":
        if in_channels == 3:
            return model
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        if stem == "cifar":
            model.maxpool = nn.Identity()
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision
    return model


def _vgg11(num_classes: int, image_size: int, in_channels: int) -> nn.Module:
    """torchvision VGG11 (no BatchNorm, as in the paper's model list).

    Below 64x64 the five 2x2 pools leave a 1x1 (at 32x32) map of 512 channels; the stock head would
    average-pool it *up* to 7x7 and feed 25088 values to a 25088x4096x4096 classifier (about 120M
    parameters, i.e. all-reduce traffic, for no information). There it is replaced by a global
    average pool and a dropout + linear 512 -> ``num_classes`` head.
    """
    if image_size >= SMALL_INPUT:
        model = _torchvision().vgg11(weights=None, num_classes=num_classes)
        if in_channels != 3:
            model.features[0] = nn.Conv2d(in_channels, 64, kernel_size=3, padding=1)
            _vgg_init(model.features[0])
        return model
    # Built on the meta device: allocating and initialising the stock head only to drop it takes seconds.
    with torch.device("meta"):
        model = _torchvision().vgg11(weights=None, num_classes=num_classes)
        model.features[0] = nn.Conv2d(in_channels, 64, kernel_size=3, padding=1)
        model.avgpool = nn.AdaptiveAvgPool2d(1)
        model.classifier = nn.Sequential(nn.Dropout(p=0.5), nn.Linear(512, num_classes))
    model.to_empty(device="cpu")
    _vgg_init(model)
    return model


def _vgg_init(model: nn.Module) -> None:
    """torchvision's VGG initialisation (``VGG.__init__`` with ``init_weights=True``)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


def _alexnet(num_classes: int, image_size: int, in_channels: int) -> nn.Module:
    """torchvision AlexNet; below 64x64 a small-input variant.

    The stock first layer (11x11 conv, stride 4) followed by three 3x3/2 max-pools shrinks 32x32 to
    nothing (32 -> 7 -> 3 -> 1 -> 0). The variant replaces only that first conv by a 3x3 stride-1 conv
    (64 channels, as stock), so the three pools take 32 -> 15 -> 7 -> 3, and it replaces the
    6x6-pool + 9216x4096x4096 classifier (58M parameters) by a 2x2 pool and the same three-layer
    dropout/linear/ReLU head at width 512 (about 0.8M parameters). Works from 16x16 up.
    """
    if image_size >= SMALL_INPUT:
        model = _torchvision().alexnet(weights=None, num_classes=num_classes)
        if in_channels != 3:
            model.features[0] = nn.Conv2d(in_channels, 64, kernel_size=11, stride=4, padding=2)
        return model
    # Built on the meta device (the stock head is 58M parameters), then given PyTorch's default
    # initialisation, which is what torchvision's AlexNet uses.
    with torch.device("meta"):
        model = _torchvision().alexnet(weights=None, num_classes=num_classes)
        model.features[0] = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1)
        model.avgpool = nn.AdaptiveAvgPool2d(2)
        model.classifier = nn.Sequential(
            nn.Dropout(p=0.5),
            nn.Linear(256 * 2 * 2, 512),
            nn.ReLU(inplace=True),
            nn.Dropout(p=0.5),
            nn.Linear(512, 512),
            nn.ReLU(inplace=True),
            nn.Linear(512, num_classes),
        )
    model.to_empty(device="cpu")
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.reset_parameters()
    return model


class SmallCNN(nn.Module):
    """conv-ReLU-pool x2, then a two-layer head: fast, and per-sample independent of the batch.

    No BatchNorm and no dropout, so a batch split across workers yields exactly the gradient of the
    whole batch (up to float summation order). The adaptive pool makes it work at any input size >= 4.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 4 * 4, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, num_classes)`` for images ``(N, C, H, W)``."""
        return self.classifier(self.features(x))
