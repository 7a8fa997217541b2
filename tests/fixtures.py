"""Tiny CIFAR-10/100 copies in the real on-disk format, so tests load them through torchvision.

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
import pickle
import struct
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
