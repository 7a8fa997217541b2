"""File-backed image datasets (Food-101, Caltech-256, Places365) with the ImageNet-style transforms.

These datasets are tens of gigabytes of JPEGs, so unlike :class:`~omnilearn.train.data.TensorData`
nothing but the file list and the labels is held in memory: :class:`ImageFiles` decodes the images of
a batch when :meth:`ImageFiles.batch` gathers it (PIL, as torchvision's own loader does), which is
the real per-step cost of these workloads and is therefore part of the measured compute time.

The file lists come from torchvision's own dataset classes (their layouts, their download code);
the ``*_files`` functions below turn whatever they raise into one-line :class:`UserError` messages
that name the dataset, the folder and the fix.

Transforms are the usual ImageNet recipe, the one the OmniLearn workloads use. Training:
``RandomResizedCrop(S)`` (scale 0.08-1, ratio 3/4-4/3) then ``RandomHorizontalFlip()``. Evaluation:
``Resize(int(S * 256 / 224))`` (shorter side) then ``CenterCrop(S)``. Both end with the ImageNet
mean/std normalisation. The random draws are exactly torchvision's (same algorithm, same order),
but come from a per-sample ``torch.Generator`` instead of the global RNG, so a batch is a pure
function of ``(per-call seed, sample index)``: reproducible, independent of the number of decoding
threads and of the order of the indices.
"""

from __future__ import annotations

import math
import os
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from omnilearn.errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)

FOOD101_URL = "http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz"
CALTECH256_URL = "https://data.caltech.edu/records/nyy15-4j048/files/256_ObjectCategories.tar"
PLACES365_URL = "http://data.csail.mit.edu/places/places365/"

_MASK64 = (1 << 64) - 1


def eval_resize(image_size: int) -> int:
    """Shorter side before the centre crop at evaluation: 256 for 224, same ratio otherwise."""
    return int(image_size * 256 / 224)


# ---------------------------------------------------------------------- transforms


def random_resized_crop_params(
    height: int, width: int, generator: torch.Generator,
    scale: tuple[float, float] = CROP_SCALE, ratio: tuple[float, float] = CROP_RATIO,
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` as ``torchvision.transforms.v2.RandomResizedCrop.make_params`` draws them.

    Same algorithm and the same sequence of draws (so a generator seeded with ``k`` gives the crop
    torchvision gives after ``torch.manual_seed(k)``), but from ``generator``, not the global RNG.
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1]), generator=generator))
        aspect_ratio = aspect.item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    in_ratio = float(width) / float(height)  # fallback: central crop, as torchvision
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_transform(image: Image.Image, image_size: int, generator: torch.Generator) -> Image.Image:
    """``RandomResizedCrop(image_size)`` then ``RandomHorizontalFlip()``, drawing from ``generator``."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    top, left, h, w = random_resized_crop_params(image.height, image.width, generator)
    out = TF.resized_crop(image, top, left, h, w, [image_size, image_size],
                          interpolation=InterpolationMode.BILINEAR, antialias=True)
    if torch.rand(1, generator=generator).item() < 0.5:  # RandomHorizontalFlip(p=0.5)
        out = TF.horizontal_flip(out)
    return out


def eval_transform(image: Image.Image, image_size: int) -> Image.Image:
    """``Resize(int(image_size * 256 / 224))`` (shorter side) then ``CenterCrop(image_size)``."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    out = TF.resize(image, [eval_resize(image_size)], interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.center_crop(out, [image_size, image_size])


def load_rgb(path: str) -> Image.Image:
    """torchvision's ``pil_loader``: decode and convert to RGB (Caltech-256 has greyscale JPEGs)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        return image.convert("RGB")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(call_seed: int, index: int) -> int:
    """Seed of sample ``index``'s random transform in a call drawn as ``call_seed`` (63 bits)."""
    return _splitmix64(call_seed ^ _splitmix64(index)) >> 1


# ---------------------------------------------------------------------- the file list


@dataclass(frozen=True)
class FileList:
    """Image paths and labels, compactly: ``base / dirs[dir_ids[i]] / names[i]`` is sample ``i``.

    Storing each distinct folder once keeps Places365's 1.8M training paths at ~30 MB per worker
    (a list of Python strings would be several times that).
    """

    base: str
    dirs: tuple[str, ...]
    dir_ids: np.ndarray  # (N,) int32
    names: np.ndarray  # (N,) bytes (numpy "S"), UTF-8 file names
    labels: np.ndarray  # (N,) int64

    @classmethod
    def from_paths(cls, base: str | Path, paths: Sequence[str], labels: Sequence[int]) -> FileList:
        """Build from full paths (each under ``base``; a path that is not stays absolute)."""
        assert len(paths) == len(labels), (len(paths), len(labels))
        base = os.fspath(base)
        prefix = base.rstrip(os.sep) + os.sep
        index: dict[str, int] = {}
        dir_ids = np.empty(len(paths), dtype=np.int32)
        names = []
        for i, path in enumerate(paths):
            path = os.fspath(path)
            rel = path[len(prefix):] if path.startswith(prefix) else path
            folder, _, name = rel.rpartition(os.sep)
            dir_ids[i] = index.setdefault(folder, len(index))
            names.append(name.encode())
        return cls(base, tuple(index), dir_ids, np.array(names, dtype=bytes), np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return os.path.join(self.base, self.dirs[self.dir_ids[i]], self.names[i].decode())

    def subset(self, indices: np.ndarray) -> FileList:
        indices = np.asarray(indices, dtype=np.int64)
        return FileList(self.base, self.dirs, self.dir_ids[indices], self.names[indices], self.labels[indices])


# ---------------------------------------------------------------------- the dataset

_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _pool() -> ThreadPoolExecutor:
    """One decoding pool per process (re-created after a fork, where the parent's threads are gone)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=32, thread_name_prefix="omnilearn-decode"))
    return _POOL[1]


class ImageFiles:
    """A file-backed image dataset with the interface of ``TensorData``: ``len``, ``batch``, ``targets``.

    ``train=True`` (the training split) applies the random training transform to every batch;
    ``train=False`` applies the deterministic evaluation transform unless ``batch(augment=True)``
    asks for the random one (``augment`` can only add randomness: ``train.batch(idx)`` and
    ``train.batch(idx, augment=False)`` both use the training transform, the paper's recipe).
    :meth:`eval_view` gives the evaluation transform over the same files.

    Random draws: every :meth:`batch` call takes one seed from ``generator`` (or, without one, from
    the dataset's own generator seeded with ``seed``: the same sequence of calls gives the same
    batches) and sample ``i`` uses ``sample_seed(call_seed, i)``. Images are decoded by
    ``threads`` threads (default: ``torch.get_num_threads()`` at the call, i.e. what the worker's CPU
    allocation set; decoding and the model never run at the same time).
    """

    def __init__(
        self,
        files: FileList,
        image_size: int,
        *,
        train: bool,
        name: str = "images",
        seed: int = 0,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        threads: int | None = None,
    ) -> None:
        assert image_size >= 1, image_size
        assert threads is None or threads >= 1, threads
        self.files = files
        self.image_size = image_size
        self.train = train
        self.name = name
        self.seed = seed
        self.mean = [float(v) for v in mean]
        self.std = [float(v) for v in std]
        self.threads = threads
        self._targets = torch.from_numpy(files.labels)
        self._shift = torch.tensor(self.mean).mul_(255.0)[:, None, None]
        self._scale = torch.tensor(self.std).mul_(255.0).reciprocal_()[:, None, None]
        self._generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        xb, yb = self.batch(torch.tensor([index]))
        return xb[0], yb[0]

    @property
    def targets(self) -> Tensor:
        """All labels, ``(N,)`` int64."""
        return self._targets

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return 3, self.image_size, self.image_size

    def path(self, index: int) -> str:
        return self.files.path(index)

    def eval_view(self) -> ImageFiles:
        """The same files with the evaluation transform (e.g. to score the training split)."""
        return ImageFiles(self.files, self.image_size, train=False, name=self.name, seed=self.seed,
                          mean=self.mean, std=self.std, threads=self.threads)

    def load(self, index: int, call_seed: int | None = None) -> Image.Image:
        """Sample ``index`` decoded and transformed (random when ``call_seed`` is given), as PIL."""
        path = self.files.path(index)
        try:
            image = load_rgb(path)
        except OSError as err:  # missing, unreadable or not an image (PIL's UnidentifiedImageError)
            raise UserError(f"{self.name}: cannot read image {path} ({_one_line(err)})") from err
        if call_seed is None:
            return eval_transform(image, self.image_size)
        generator = torch.Generator().manual_seed(sample_seed(call_seed, index))
        return train_transform(image, self.image_size, generator)

    def batch(
        self, indices: Tensor, augment: bool = False, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Decode and transform samples ``indices``: ``x`` float32 ``(n, 3, S, S)``, ``y`` int64 ``(n,)``."""
        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        yb = self._targets.index_select(0, indices)  # also rejects out-of-range indices
        call_seed = None
        if self.train or augment:
            source = generator if generator is not None else self._generator
            call_seed = int(torch.randint(0, 1 << 62, (1,), generator=source).item())
        n, size = len(indices), self.image_size
        pixels = np.empty((n, size, size, 3), dtype=np.uint8)
        order = indices.tolist()

        def decode(lo: int, hi: int) -> None:
            for pos in range(lo, hi):
                pixels[pos] = np.asarray(self.load(order[pos], call_seed))

        threads = min(self.threads or torch.get_num_threads(), n)
        if threads <= 1:
            decode(0, n)
        else:
            bounds = np.linspace(0, n, threads + 1).astype(int)
            futures = [_pool().submit(decode, int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
            wait(futures)
            for future in futures:
                future.result()  # re-raises the first failure (a UserError naming the file)
        # ToDtype(scale=True) + Normalize as one copy and two in-place ops: (p - 255 m) / (255 s)
        xb = torch.empty((n, 3, size, size), dtype=torch.float32)
        xb.copy_(torch.from_numpy(pixels).permute(0, 3, 1, 2))
        return xb.sub_(self._shift).mul_(self._scale), yb


# ---------------------------------------------------------------------- torchvision datasets

T = TypeVar("T")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _require(name: str, folder: Path, paths: Sequence[Path], fix: str) -> None:
    """Before torchvision runs with ``download=False``: name the first missing file or folder."""
    for p in paths:
        if not p.exists():
            raise UserError(f"{name}: dataset not found in {folder} (missing {p}); "
                            f"fix: set download to true (needs network access) or {fix}")


def _torchvision(name: str, folder: Path, download: bool, fix: str, make: Callable[[], T]) -> T:
    """Run torchvision's constructor ``make``; turn what it raises into one-line UserErrors."""
    try:
        return make()
    except OSError as err:  # URLError (an OSError), DNS, timeout, disk full, permissions
        if download:
            raise UserError(f"{name}: could not download the dataset to {folder} ({_one_line(err)}); "
                            f"fix: check network access or {fix}") from err
        raise UserError(f"{name}: cannot read the dataset in {folder} ({_one_line(err)}); "
                        f"fix: check the files or {fix}") from err
    except (RuntimeError, ValueError, KeyError, tarfile.TarError, zipfile.BadZipFile, EOFError) as err:
        # "Dataset not found or corrupted", a checksum mismatch, a truncated archive, bad metadata
        how = "delete the partial files and retry, or" if download else "set download to true (needs network access) or"
        raise UserError(f"{name}: dataset not found or corrupted in {folder} ({_one_line(err)}); "
                        f"fix: {how} {fix}") from err


def _check_files(name: str, folder: Path, files: FileList, split: str, fix: str) -> FileList:
    """After torchvision: the split is not empty and its first image exists (a cheap completeness check)."""
    which = f"{split} " if split else ""
    if len(files) == 0:
        raise UserError(f"{name}: no {which}images listed in {folder}; fix: {fix}")
    first = files.path(0)
    if not os.path.isfile(first):
        raise UserError(f"{name}: dataset incomplete in {folder} (missing {first}, the first {which}image); "
                        f"fix: {fix}")
    return files


def food101_files(root: Path, download: bool) -> tuple[FileList, FileList, int]:
    """Food-101's official train/test split: ``root/food-101/images/<class>/<id>.jpg`` + ``meta/*.json``."""
    from torchvision.datasets import Food101

    name, folder = "food101", root / "food-101"
    fix = f"download {FOOD101_URL} and extract it into {root} (giving {folder}/images and {folder}/meta)"
    if not download:
        _require(name, folder, [folder / "images", folder / "meta" / "train.json", folder / "meta" / "test.json"], fix)
    splits = []
    for split in ("train", "test"):
        # loader=str: indexing yields (path, label) without decoding anything
        dataset = _torchvision(name, folder, download, fix,
                               lambda split=split: Food101(str(root), split=split, download=download, loader=str))
        pairs = [dataset[i] for i in range(len(dataset))]
        files = FileList.from_paths(folder, [p for p, _ in pairs], [label for _, label in pairs])
        splits.append((_check_files(name, folder, files, split, fix), len(dataset.classes)))
    (train, num_classes), (test, _) = splits
    return train, test, num_classes


def caltech256_files(root: Path, download: bool) -> tuple[FileList, int]:
    """All of Caltech-256 (no official split): ``root/caltech256/256_ObjectCategories/<nnn.name>/<nnn>_<iiii>.jpg``.

    The classes are torchvision's: every category folder, ``257.clutter`` included (257 classes).
    """
    from torchvision.datasets import Caltech256

    name, folder = "caltech256", root / "caltech256"
    categories = folder / "256_ObjectCategories"
    fix = f"download {CALTECH256_URL} and extract it into {folder} (giving {categories})"
    if not download:  # checked first: torchvision would create the folder even with download=False
        _require(name, folder, [categories], fix)
    dataset = _torchvision(name, folder, download, fix, lambda: Caltech256(str(root), download=download))
    # torchvision's own path formula (Caltech256.__getitem__), without opening the images
    paths = [os.path.join(dataset.root, "256_ObjectCategories", dataset.categories[y], f"{y + 1:03d}_{i:04d}.jpg")
             for y, i in zip(dataset.y, dataset.index, strict=True)]
    files = FileList.from_paths(folder, paths, dataset.y)
    return _check_files(name, folder, files, "", fix), len(dataset.categories)


def places365_files(root: Path, download: bool, small: bool = True) -> tuple[FileList, FileList, int]:
    """Places365-Standard: ``train-standard`` for training, the official ``val`` split for testing.

    ``small=True`` (the default) uses the 256x256 images (``data_256_standard/``, ``val_256/``),
    ``small=False`` the high-resolution ones (``data_large_standard/``, ``val_large/``); both need
    ``categories_places365.txt``, ``places365_train_standard.txt`` and ``places365_val.txt`` in ``root``.
    """
    from torchvision.datasets import Places365

    name, size = "places365", "256" if small else "large"
    train_dir, val_dir = root / f"data_{size}_standard", root / f"val_{size}"
    train_tar = f"train_{size}_places365standard.tar"
    fix = (f"download filelist_places365-standard.tar, {train_tar} and val_{size}.tar from {PLACES365_URL} "
           f"and extract them into {root} (renaming data_{size} to {train_dir.name})")
    if not download:
        _require(name, root, [root / "categories_places365.txt", root / "places365_train_standard.txt",
                              root / "places365_val.txt", train_dir, val_dir], fix)
    splits = []
    for split, images in (("train-standard", train_dir), ("val", val_dir)):
        dataset = _torchvision(name, root, download, fix,
                               lambda split=split: Places365(str(root), split=split, small=small, download=download))
        if not images.is_dir():  # torchvision only looks for the images when it downloads them
            raise UserError(f"{name}: dataset not found in {root} (missing {images}); fix: {fix}")
        files = FileList.from_paths(dataset.images_dir, [p for p, _ in dataset.imgs], dataset.targets)
        splits.append((_check_files(name, root, files, split, fix), len(dataset.classes)))
        del dataset  # its list of 1.8M (path, label) tuples
    (train, num_classes), (test, _) = splits
    return train, test, num_classes

