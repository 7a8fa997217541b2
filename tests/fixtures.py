"""Tiny dataset copies in the real on-disk formats, so tests load them through torchvision.

CIFAR-10/100 (pickled batches) and, further down, Food-101, Caltech-256 and Places365 (folders of
JPEGs with their metadata files).

The real files are Python 2 pickles: their dict keys and label names are Python 2 ``str``, which a
Python 3 reader sees as ``bytes`` (``encoding="bytes"``, the CIFAR web page's recipe: ``b"data"``) or
as ``str`` (``encoding="latin1"``, torchvision's choice). Python 3's pickler cannot write a Python 2
``str``, so :class:`_Py2Pickler` emits the ``BINSTRING`` opcodes Python 2 used; the fixtures then read
back exactly like the real files under both encodings.

torchvision checks each file's MD5 against the real archive's, which a fixture can never match: tests
replace ``torchvision.datasets.cifar.check_integrity`` (see :func:`skip_cifar_checksums`), and
``omnilearn.train.data`` itself uses torchvision's stock ``CIFAR10``/``CIFAR100`` classes.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class _Py2Str(bytes):
    """Marks bytes that are to be pickled as a Python 2 ``str``."""


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table is extensible
    """Pickles :class:`_Py2Str` with ``SHORT_BINSTRING``/``BINSTRING``, as Python 2 did for ``str``."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj: _Py2Str) -> None:
        data = bytes(obj)
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + struct.pack("<B", len(data)) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[_Py2Str] = save_py2_str


def _py2(obj: Any) -> Any:
    """Turn the ``str`` keys and values of ``obj`` (dicts, lists) into Python 2 strings."""
    if isinstance(obj, str):
        return _Py2Str(obj.encode("latin1"))
    if isinstance(obj, dict):
        return {_py2(k): _py2(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_py2(v) for v in obj]
    return obj


def _dump(path: Path, obj: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(_py2(obj))
    path.write_bytes(buffer.getvalue())


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random images as CIFAR stores them: uint8 rows of 3072 (R plane, G plane, B plane)."""
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _labels(rng: np.random.Generator, n: int, num_classes: int) -> list[int]:
    return [int(v) for v in rng.integers(0, num_classes, size=n)]


def write_cifar_fixture(
    root: Path, num_classes: int = 10, train: int = 50, test: int = 20, seed: int = 0
) -> Path:
    """Write a tiny CIFAR-10 (``num_classes=10``) or CIFAR-100 (``100``) under ``root``; return its folder.

    CIFAR-10: ``cifar-10-batches-py/data_batch_1..5`` (``train`` images spread over the five),
    ``test_batch``, ``batches.meta``. CIFAR-100: ``cifar-100-python/train``, ``test``, ``meta`` with
    fine (``num_classes``) and coarse (20) labels.
    """
    assert num_classes in (10, 100), num_classes
    rng = np.random.default_rng(seed)
    root = Path(root)
    if num_classes == 10:
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        bounds = np.linspace(0, train, 6).astype(int)
        for i in range(5):
            n = int(bounds[i + 1] - bounds[i])
            _dump(folder / f"data_batch_{i + 1}", {
                "batch_label": f"training batch {i + 1} of 5",
                "labels": _labels(rng, n, 10),
                "data": _images(rng, n),
                "filenames": [f"train_{i}_{j}.png" for j in range(n)],
            })
        _dump(folder / "test_batch", {
            "batch_label": "testing batch 1 of 1",
            "labels": _labels(rng, test, 10),
            "data": _images(rng, test),
            "filenames": [f"test_{j}.png" for j in range(test)],
        })
        _dump(folder / "batches.meta", {
            "num_cases_per_batch": int(bounds[1]),
            "label_names": [f"class{c}" for c in range(10)],
            "num_vis": 3072,
        })
        return folder
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        fine = _labels(rng, n, 100)
        _dump(folder / split, {
            "filenames": [f"{split}_{j}.png" for j in range(n)],
            "batch_label": f"{split}ing batch 1 of 1",
            "fine_labels": fine,
            "coarse_labels": [c // 5 for c in fine],
            "data": _images(rng, n),
        })
    _dump(folder / "meta", {
        "fine_label_names": [f"fine{c}" for c in range(100)],
        "coarse_label_names": [f"coarse{c}" for c in range(20)],
    })
    return folder


def skip_cifar_checksums(monkeypatch: Any) -> None:
    """Make torchvision accept fixture files whose MD5 differs from the real archive's.

    Both ``CIFAR10._check_integrity`` and ``CIFAR10._load_meta`` call the module-level
    ``check_integrity``; replacing it accepts a file that exists and still rejects a missing one.
    """
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda fpath, md5=None: Path(fpath).is_file())


# ---------------------------------------------------------------------- folders of JPEGs


def write_jpeg(path: Path, rng: np.random.Generator, width: int, height: int, grey: bool = False) -> None:
    """A small smooth random JPEG (a colour gradient plus noise): decodes to distinct, non-flat pixels."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 255, size=3)
    slope = rng.uniform(-3, 3, size=(3, 2))
    planes = [base[c] + slope[c, 0] * xx + slope[c, 1] * yy for c in range(3)]
    pixels = np.stack(planes, axis=-1) + rng.normal(0, 12, size=(height, width, 3))
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels[..., 0] if grey else pixels)  # uint8: mode L or RGB
    image.save(path, format="JPEG", quality=90)


def _size(rng: np.random.Generator) -> tuple[int, int]:
    """Width and height between 24 and 64: mostly non-square, some wider than tall, some taller."""
    return int(rng.integers(24, 65)), int(rng.integers(24, 65))


FOOD101_CLASSES = ("apple_pie", "baby_back_ribs", "ramen")
CALTECH256_CLASSES = ("ak47", "american-flag", "backpack", "clutter")
PLACES365_CLASSES = ("/a/airfield", "/b/bakery/shop", "/c/canyon")


def write_food101_fixture(
    root: Path, classes: Sequence[str] = FOOD101_CLASSES, train: int = 4, test: int = 2, seed: int = 0
) -> Path:
    """Food-101 as the archive extracts: ``food-101/images/<class>/<id>.jpg`` and ``food-101/meta/``.

    ``meta`` holds ``classes.txt``, ``labels.txt``, ``train.txt``/``test.txt`` (``<class>/<id>`` per
    line) and ``train.json``/``test.json`` (``{class: ["<class>/<id>", ...]}``, what torchvision
    reads). ``train``/``test`` images per class, random ids as in the real set. Returns ``food-101``.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "food-101"
    meta = folder / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    splits: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    for name in classes:
        ids = rng.choice(np.arange(1000, 4_000_000), size=train + test, replace=False)
        for split, chosen in (("train", ids[:train]), ("test", ids[train:])):
            splits[split][name] = [f"{name}/{int(i)}" for i in chosen]
            for rel in splits[split][name]:
                write_jpeg(folder / "images" / f"{rel}.jpg", rng, *_size(rng))
    (meta / "classes.txt").write_text("".join(f"{c}\n" for c in classes))
    (meta / "labels.txt").write_text("".join(f"{c.replace('_', ' ').capitalize()}\n" for c in classes))
    for split, entries in splits.items():
        (meta / f"{split}.txt").write_text("".join(f"{rel}\n" for rels in entries.values() for rel in rels))
        (meta / f"{split}.json").write_text(json.dumps(entries))
    return folder


def write_caltech256_fixture(
    root: Path, classes: Sequence[str] = CALTECH256_CLASSES, per_class: Sequence[int] = (6, 7, 5, 8), seed: int = 0
) -> Path:
    """Caltech-256 as torchvision expects it: ``caltech256/256_ObjectCategories/<nnn>.<name>/<nnn>_<iiii>.jpg``.

    Numbered from 1 in each folder (torchvision derives the file names from the counts). The first
    image of the second class is greyscale and a stray non-JPEG sits in the first folder, both as in
    the real archive. Returns the ``256_ObjectCategories`` folder.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "caltech256" / "256_ObjectCategories"
    for c, (name, count) in enumerate(zip(classes, per_class, strict=True)):
        category = folder / f"{c + 1:03d}.{name}"
        for i in range(count):
            write_jpeg(category / f"{c + 1:03d}_{i + 1:04d}.jpg", rng, *_size(rng), grey=(c == 1 and i == 0))
    (folder / f"001.{classes[0]}" / "RENAME2").write_text("not an image\n")
    return folder


def write_places365_fixture(
    root: Path, classes: Sequence[str] = PLACES365_CLASSES, train: int = 3, val: int = 2, seed: int = 0
) -> Path:
    """Places365-Standard, small images, as torchvision's ``Places365(small=True)`` reads it under ``root``.

    ``categories_places365.txt`` (``/a/airfield 0``), ``places365_train_standard.txt``
    (``/a/airfield/00000001.jpg 0``), ``places365_val.txt`` (``Places365_val_00000001.jpg 0``),
    ``places365_test.txt`` (names only), the images in ``data_256_standard/<category>/`` and
    ``val_256/`` (square, as the 256x256 originals; tiny here). Returns ``root``.
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "categories_places365.txt").write_text("".join(f"{c} {i}\n" for i, c in enumerate(classes)))
    train_lines, val_lines = [], []
    for i, category in enumerate(classes):
        for j in range(train):
            rel = f"{category}/{j + 1:08d}.jpg"
            train_lines.append(f"{rel} {i}\n")
            write_jpeg(root / "data_256_standard" / rel.lstrip("/"), rng, 32, 32)
    labels = [i for i in range(len(classes)) for _ in range(val)]
    for k, label in enumerate(rng.permutation(labels)):  # the val list is not sorted by class
        name = f"Places365_val_{k + 1:08d}.jpg"
        val_lines.append(f"{name} {int(label)}\n")
        write_jpeg(root / "val_256" / name, rng, 32, 32)
    (root / "places365_train_standard.txt").write_text("".join(train_lines))
    (root / "places365_val.txt").write_text("".join(val_lines))
    (root / "places365_test.txt").write_text("".join(f"Places365_test_{k + 1:08d}.jpg\n" for k in range(2)))
    return root


def skip_places365_checksums(monkeypatch: Any) -> None:
    """Make torchvision accept fixture metadata files whose MD5 differs from the real devkit's.

    ``Places365.load_categories``/``load_file_list`` call the module-level ``check_integrity``
    (Food-101 and Caltech-256 check no checksums when loading).
    """
    import torchvision.datasets.places365 as places365

    monkeypatch.setattr(places365, "check_integrity", lambda fpath, md5=None: Path(fpath).is_file())


def fail_downloads(monkeypatch: Any) -> list[str]:
    """Make every torchvision download fail as it does offline; returns the URLs it tried.

    Replaces the two network calls of ``torchvision.datasets.utils.download_url`` (the redirect
    probe and ``_urlretrieve``), so the rest of torchvision's download path runs as usual.
    """
    from urllib.error import URLError

    import torchvision.datasets.utils as tv_utils

    tried: list[str] = []

    def offline(url: str, *args: Any, **kwargs: Any) -> None:
        tried.append(url)
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(tv_utils, "_get_redirect_url", lambda url, max_hops=3: url)
    monkeypatch.setattr(tv_utils, "_urlretrieve", offline)
    return tried
