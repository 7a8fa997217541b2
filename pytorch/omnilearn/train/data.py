"""Datasets: in-memory tensors, or image files decoded per batch.

Why tensors and not a ``DataLoader``: the controller resizes every worker's mini-batch every few
steps, and the emulator measures per-step compute time. A batch must therefore be gathered with one
index operation (no per-sample Python loop, no worker processes whose timing leaks into the
measurement). :class:`TensorData` stores the raw pixels (``uint8`` for CIFAR: 4x less memory per
worker than float) at their native resolution and applies the deterministic transforms (scale,
resize, channel replication, normalisation) and the optional random augmentation to the gathered
batch only, with torchvision's tensor functions.

Food-101, Caltech-256 and Places365 (the OmniLearn paper's ResNet18/ResNet50/VGG11 workloads) are far
too large for memory: they are :class:`~omnilearn.train.image_folders.ImageFiles`, which keep the
file list and decode a batch's JPEGs when :meth:`batch` gathers it, with the ImageNet transforms
(random resized crop + flip for the training split, resize + centre crop for the test split).
Both kinds share the interface the trainers use (:class:`BatchData`).
"""

from __future__ import annotations

import gzip
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from omnilearn.errors import UserError
from omnilearn.train.image_folders import (
    ImageFiles,
    caltech256_files,
    food101_files,
    places365_files,
)

IMAGE_FILE_DATASETS = ("food101", "caltech256", "places365")
KNOWN_DATASETS = ("digits", "cifar10", "cifar100", "synthetic", *IMAGE_FILE_DATASETS)

# Per-channel statistics of the CIFAR training sets (the values the literature uses).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


class TensorData:
    """A dataset of images and labels held as two tensors; batches are gathered in one op.

    ``x`` is ``(N, C, H, W)``: ``uint8`` pixels (scaled to [0, 1] in :meth:`batch`) or floats (used as
    they are). The optional transforms run on the gathered batch, in this order: resize to
    ``image_size`` (bilinear, antialiased), replicate a single channel to ``channels``, normalise with
    ``mean``/``std`` (one value per output channel, or one value for all), then augmentation when
    asked for. Stored raw so that neither a large ``image_size`` nor several workers on one host
    multiply the memory held.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        *,
        image_size: int | None = None,
        channels: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        assert x.dim() == 4, f"x must be (N, C, H, W), got {tuple(x.shape)}"
        assert y.dim() == 1 and len(y) == len(x), "y must be (N,) and match x"
        assert (mean is None) == (std is None), "mean and std go together"
        assert channels is None or x.shape[1] in (1, channels), "only a single channel can be replicated"
        self.x = x
        self.y = y.long()
        self.image_size = image_size
        self.channels = channels
        self.mean = None if mean is None else [float(v) for v in mean]
        self.std = None if std is None else [float(v) for v in std]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        """One sample, transformed like a batch: keeps the object usable as a ``Dataset``."""
        xb, yb = self.batch(torch.tensor([index]))
        return xb[0], yb[0]

    @property
    def targets(self) -> Tensor:
        """All labels, ``(N,)`` int64 (class counts, stratification)."""
        return self.y

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one sample as :meth:`batch` returns it (what a model is built for)."""
        c = self.channels or self.x.shape[1]
        h = self.image_size or self.x.shape[2]
        w = self.image_size or self.x.shape[3]
        return c, h, w

    def batch(
        self, indices: Tensor, augment: bool = False, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Gather samples ``indices`` (one ``index_select``) and transform them as a float batch."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        xb = self.x.index_select(0, indices)
        yb = self.y.index_select(0, indices)
        xb = xb.to(torch.float32).mul_(1.0 / 255) if xb.dtype == torch.uint8 else xb.float()
        if self.image_size is not None and xb.shape[-2:] != (self.image_size, self.image_size):
            xb = resize(xb, self.image_size)
        if self.channels is not None and xb.shape[1] != self.channels:
            xb = xb.expand(-1, self.channels, -1, -1)
        if self.mean is not None and self.std is not None:
            c = xb.shape[1]
            mean = self.mean * c if len(self.mean) == 1 else self.mean
            std = self.std * c if len(self.std) == 1 else self.std
            xb = (xb - torch.tensor(mean, dtype=xb.dtype).view(-1, 1, 1)) / torch.tensor(std, dtype=xb.dtype).view(-1, 1, 1)
        if augment:
            xb = augment_batch(xb, generator)
        return xb.contiguous(), yb


def resize(x: Tensor, size: int) -> Tensor:
    """A float batch ``(N, C, H, W)`` resized to ``size x size``: bilinear and antialiased, as torchvision's
    ``resize`` of a float tensor (the same call), without importing torchvision."""
    return F.interpolate(x, size=[size, size], mode="bilinear", align_corners=False, antialias=True)


def augment_batch(x: Tensor, generator: torch.Generator | None = None, padding: int = 4) -> Tensor:
    """Random crop after zero padding plus random horizontal flip, a different draw per sample.

    torchvision's ``RandomCrop``/``RandomHorizontalFlip`` draw one decision per call, i.e. the same
    crop for a whole batch; this draws per sample and applies crop and flip as a single gather.
    Zero padding after normalisation pads with the dataset mean. Seeded by ``generator``.
    """
    n, _, h, w = x.shape
    if n == 0:
        return x
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = dy[:, None] + torch.arange(h)[None, :]  # (n, h)
    cols_fwd = torch.arange(w)[None, :].expand(n, w)
    cols = dx[:, None] + torch.where(flip[:, None], (w - 1) - cols_fwd, cols_fwd)  # (n, w)
    sample = torch.arange(n)[:, None, None]
    # Advanced indices around a slice: the result is (n, h, w, C).
    out = padded[sample, :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2)


class BatchData(Protocol):
    """What the trainers need of a split: :class:`TensorData` and :class:`ImageFiles` both are one."""

    def __len__(self) -> int: ...

    def batch(
        self, indices: Tensor, augment: bool = False, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]: ...

    @property
    def targets(self) -> Tensor: ...

    @property
    def sample_shape(self) -> tuple[int, int, int]: ...


class LoadedData(NamedTuple):
    """What :func:`load_dataset` returns; unpacks as ``train, test, num_classes``."""

    train: TensorData | ImageFiles
    test: TensorData | ImageFiles
    num_classes: int


def load_dataset(
    name: str,
    root: str | Path,
    image_size: int,
    download: bool = False,
    test_fraction: float = 0.2,
    seed: int = 0,
    synthetic_size: int = 2048,
    synthetic_classes: int = 10,
    places365_small: bool = True,
) -> LoadedData:
    """Load dataset ``name`` as train/test splits of ``3 x image_size x image_size`` samples.

    ``digits``, ``cifar10``, ``cifar100`` and ``synthetic`` are in-memory :class:`TensorData`;
    ``food101``, ``caltech256`` and ``places365`` are file-backed :class:`ImageFiles` (training split:
    random ImageNet transforms on every batch, seeded with ``seed``; test split: deterministic).
    ``test_fraction`` and ``seed`` choose the stratified held-out split of ``digits``, ``synthetic``
    and ``caltech256``; CIFAR and Food-101 have an official test set, Places365 uses its official
    validation set. ``download`` lets torchvision fetch CIFAR, Food-101, Caltech-256 or Places365.
    ``places365_small`` (default true) selects Places365's 256x256 images, not the large ones.
    Raises :class:`UserError` for an unknown name, bad sizes, or data that is missing and cannot be
    downloaded.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise UserError(f"dataset {name!r}: image_size must be a positive integer, got {image_size!r}")
    if not 0.0 < test_fraction < 1.0:
        raise UserError(f"dataset {name!r}: test_fraction must be in (0, 1), got {test_fraction!r}")
    if name == "digits":
        return _load_digits(image_size, test_fraction, seed)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, Path(root), image_size, download)
    if name == "synthetic":
        return _make_synthetic(image_size, test_fraction, seed, synthetic_size, synthetic_classes)
    if name in IMAGE_FILE_DATASETS:
        return _load_image_files(name, Path(root).expanduser(), image_size, download, test_fraction, seed,
                                 places365_small)
    raise UserError(f"unknown dataset {name!r}; known datasets: {', '.join(KNOWN_DATASETS)}")


def split_indices(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded train/test split of ``range(len(labels))``: same seed, same split.

    scikit-learn's ``train_test_split(range(n), test_size=test_fraction, random_state=seed,
    stratify=labels)`` draw for draw (``tests/unit/test_data.py`` holds them equal), written out here:
    importing scikit-learn takes 0.75 CPU-seconds and 900 modules, which every launcher and worker
    would spend before its first step."""
    labels = np.asarray(labels)
    n_test = math.ceil(test_fraction * len(labels))
    n_train = len(labels) - n_test
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if min(n_train, n_test) < len(classes) or counts.min() < 2:
        raise UserError(f"cannot split {len(labels)} samples of {len(classes)} classes (the smallest has "
                        f"{counts.min()}) with test_fraction={test_fraction}: the training and the test "
                        f"split ({n_train} and {n_test} samples) each need a sample of every class")
    by_class = np.split(np.argsort(inverse.ravel(), kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    train, test = [], []
    for i, members in enumerate(by_class):
        drawn = members.take(rng.permutation(counts[i]), mode="clip")
        train.append(drawn[: n_i[i]])
        test.append(drawn[n_i[i] : n_i[i] + t_i[i]])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of ``draws`` each class gets: its share rounded down, the samples left given by the
    largest remainders, ties broken at random (scikit-learn's ``_approximate_mode``)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        if need <= 0:
            break
        (tied,) = np.where(remainder == value)
        add = min(len(tied), need)
        floored[rng.choice(tied, size=add, replace=False)] += 1
        need -= add
    return floored.astype(int)


def digits_file() -> Path:
    """scikit-learn's bundled 8x8 digits (1,797 rows of 64 pixels and the label), found without
    importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("dataset 'digits' is scikit-learn's bundled digits: install scikit-learn (make install)")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def _load_digits(image_size: int, test_fraction: float, seed: int) -> LoadedData:
    """scikit-learn's bundled 8x8 digits (no download), upsampled and standardised on the train split."""
    with gzip.open(digits_file(), "rt", encoding="utf-8") as f:
        table = np.loadtxt(f, delimiter=",")
    target = table[:, -1].astype(np.int64)
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 8, 8).astype(np.float32))  # (N, 1, 8, 8), 0..16
    labels = torch.from_numpy(target)
    train_idx, test_idx = split_indices(target, test_fraction, seed)
    x_train, x_test = images[train_idx], images[test_idx]
    # Statistics of the upsampled training images (upsampling smooths, so it changes the std).
    mean, std = _grey_stats(x_train, image_size)
    common = {"image_size": image_size, "channels": 3, "mean": [mean], "std": [std]}
    train = TensorData(x_train, labels[train_idx], **common)
    test = TensorData(x_test, labels[test_idx], **common)
    return LoadedData(train, test, 10)


def _grey_stats(x: Tensor, image_size: int, chunk: int = 256) -> tuple[float, float]:
    """Mean and std of ``x`` after resizing to ``image_size``, in chunks to bound memory."""
    total, total_sq, count = 0.0, 0.0, 0
    for start in range(0, len(x), chunk):
        part = x[start : start + chunk]
        if part.shape[-1] != image_size:
            part = resize(part, image_size)
        part = part.double()
        total += part.sum().item()
        total_sq += (part * part).sum().item()
        count += part.numel()
    mean = total / count
    std = math.sqrt(max(total_sq / count - mean * mean, 1e-12))
    return mean, std


def _load_cifar(name: str, root: Path, image_size: int, download: bool) -> LoadedData:
    """CIFAR-10/100 through torchvision's own classes (their checks, their on-disk format)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    if name == "cifar10":
        cls, mean, std = CIFAR10, CIFAR10_MEAN, CIFAR10_STD
    else:
        cls, mean, std = CIFAR100, CIFAR100_MEAN, CIFAR100_STD
    folder = root / cls.base_folder
    extract = f"extract {cls.filename} ({cls.url}) into {root}"
    splits = []
    for train in (True, False):
        try:
            dataset = cls(str(root), train=train, download=download)
        except RuntimeError as err:  # "Dataset not found or corrupted" / metadata missing or corrupted
            how = "check the files or" if download else "set download to true (needs network access) or"
            raise UserError(f"{name}: dataset not found or corrupted in {folder}; fix: {how} {extract}") from err
        except OSError as err:  # download failed: URLError (an OSError), DNS, timeout, permissions
            reason = str(err).replace("\n", " ")
            raise UserError(
                f"{name}: could not download the dataset to {root} ({reason}); "
                f"fix: check network access or {extract}"
            ) from err
        x = torch.from_numpy(np.ascontiguousarray(dataset.data)).permute(0, 3, 1, 2).contiguous()
        y = torch.tensor(dataset.targets, dtype=torch.long)
        size = None if image_size == x.shape[-1] else image_size
        splits.append((TensorData(x, y, image_size=size, mean=mean, std=std), len(dataset.classes)))
    (train_data, num_classes), (test_data, _) = splits
    return LoadedData(train_data, test_data, num_classes)


def _load_image_files(
    name: str, root: Path, image_size: int, download: bool, test_fraction: float, seed: int, small: bool
) -> LoadedData:
    """Food-101 / Caltech-256 / Places365 through torchvision, as file-backed :class:`ImageFiles`."""
    if name == "food101":
        train, test, num_classes = food101_files(root, download)
    elif name == "places365":
        train, test, num_classes = places365_files(root, download, small)
    else:
        files, num_classes = caltech256_files(root, download)
        train_idx, test_idx = split_indices(files.labels, test_fraction, seed)
        train, test = files.subset(train_idx), files.subset(test_idx)
    return LoadedData(
        ImageFiles(train, image_size, train=True, name=name, seed=seed),
        ImageFiles(test, image_size, train=False, name=name, seed=seed),
        num_classes,
    )


def _make_synthetic(
    image_size: int, test_fraction: float, seed: int, size: int, num_classes: int
) -> LoadedData:
    """A seeded classification problem a CNN learns in a few epochs: a smooth pattern per class + noise.

    Each class has a random 3x4x4 pattern upsampled to 16x16 (smooth, so convolutions see it); every
    sample is its class pattern plus i.i.d. Gaussian noise of 4x the pattern's amplitude, so a single
    pixel says little and the model has to pool evidence over the image (smallcnn: about 95% after
    2 epochs of batch 64, not after a few steps). Generated at 16x16 (less if ``image_size`` is
    smaller) and resized per batch, so the task is equally hard at every larger ``image_size`` and
    memory stays small.
    """
    if size < 2 * num_classes or num_classes < 2:
        raise UserError(
            f"synthetic dataset: need at least 2 classes and 2 samples per class, "
            f"got {num_classes} classes and {size} samples"
        )
    native = min(image_size, 16)
    gen = torch.Generator().manual_seed(seed)
    patterns = torch.randn(num_classes, 3, 4, 4, generator=gen)
    patterns = resize(patterns, native)
    patterns = (patterns - patterns.mean()) / patterns.std()
    labels = torch.randperm(size, generator=gen) % num_classes
    noise = 4.0
    x = patterns[labels] + noise * torch.randn(size, 3, native, native, generator=gen)
    x = x / math.sqrt(1.0 + noise * noise)  # about unit variance
    train_idx, test_idx = split_indices(labels.numpy(), test_fraction, seed)
    served = None if native == image_size else image_size
    train = TensorData(x[train_idx], labels[train_idx], image_size=served)
    test = TensorData(x[test_idx], labels[test_idx], image_size=served)
    return LoadedData(train, test, num_classes)
