"""Datasets (digits, CIFAR and the image-folder datasets through torchvision from fixture files,
synthetic) and the BSP sampler."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from fixtures import (
    fail_downloads,
    skip_cifar_checksums,
    skip_places365_checksums,
    write_caltech256_fixture,
    write_cifar_fixture,
    write_food101_fixture,
    write_places365_fixture,
)
from omnilearn.errors import UserError
from omnilearn.train.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGE_FILE_DATASETS,
    TensorData,
    augment_batch,
    load_dataset,
    split_indices,
)
from omnilearn.train.image_folders import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFiles,
    eval_transform,
    load_rgb,
    random_resized_crop_params,
    sample_seed,
    train_transform,
)
from omnilearn.train.sampler import GlobalBatchSampler, eval_indices, proportional_split

# ---------------------------------------------------------------- sampler


def random_composition(rng: random.Random, total: int, parts: int, allow_zero: bool = False) -> list[int]:
    """A random list of ``parts`` non-negative (positive unless allow_zero) ints summing to ``total``."""
    low = 0 if allow_zero else 1
    cuts = sorted(rng.randint(0, total - parts * low) for _ in range(parts - 1))
    bounds = [0, *cuts, total - parts * low]
    return [bounds[i + 1] - bounds[i] + low for i in range(parts)]


def step_indices(sampler: GlobalBatchSampler, step: int) -> torch.Tensor:
    """All sample indices of step ``step`` (every rank's slices, in rank order)."""
    start = step * sampler.global_batch
    return sampler.permutation[start:start + sampler.step_size(step)]


def run_epoch(samplers: list[GlobalBatchSampler], compositions: list[list[int]]) -> list[list[torch.Tensor]]:
    """Every rank (one sampler object each, as in separate processes) walks the epoch."""
    steps = {s.steps_per_epoch for s in samplers}
    assert len(steps) == 1, "every rank must run the same number of steps"
    per_step = []
    for step in range(steps.pop()):
        sizes = compositions[step]
        per_step.append([s.local_indices(step, sizes, rank) for rank, s in enumerate(samplers)])
    return per_step


@pytest.mark.parametrize("dataset_size", [103, 96, 5])
def test_every_sample_once_with_batch_sizes_changing_every_step(dataset_size: int) -> None:
    world, global_batch = 4, 16
    rng = random.Random(dataset_size)
    samplers = [GlobalBatchSampler(dataset_size, global_batch, seed=7) for _ in range(world)]
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        steps = samplers[0].steps_per_epoch
        assert steps == -(-dataset_size // global_batch)
        comps = [random_composition(rng, global_batch, world, allow_zero=step % 3 == 0) for step in range(steps)]
        comps[-1] = [1, 5, 5, 5] if epoch == 0 else comps[-1]  # a worker with batch 1 in the last step
        used = []
        for step, parts in enumerate(run_epoch(samplers, comps)):
            sizes = samplers[0].step_sizes(step, comps[step])
            assert [len(p) for p in parts] == sizes
            assert sum(sizes) == samplers[0].step_size(step) == min(global_batch, dataset_size - step * global_batch)
            used.extend(torch.cat(parts).tolist())
        assert sorted(used) == list(range(dataset_size)), "each sample exactly once per epoch"


def test_partial_last_step_proportional_and_no_single_sample_worker() -> None:
    sampler = GlobalBatchSampler(dataset_size=103, global_batch=16, seed=0)
    last = sampler.steps_per_epoch - 1
    assert sampler.step_size(last) == 7
    # 7 * [1, 5, 5, 5] / 16 -> largest remainder [1, 2, 2, 2]; rank 0's single sample moves to rank 1.
    assert sampler.step_sizes(last, [1, 5, 5, 5]) == [0, 3, 2, 2]
    assert sampler.step_sizes(last, [8, 8]) == [4, 3]
    assert sampler.step_sizes(last, [12, 2, 2]) == [7, 0, 0]  # 5.25, 0.875, 0.875 -> [5, 1, 1] -> [7, 0, 0]
    # Full steps use the batch sizes as given, even a batch of 1.
    assert sampler.step_sizes(0, [1, 5, 5, 5]) == [1, 5, 5, 5]
    rng = random.Random(1)
    for _ in range(200):
        sizes = sampler.step_sizes(last, random_composition(rng, 16, rng.randint(1, 6), allow_zero=True))
        assert sum(sizes) == 7
        assert 1 not in sizes


def test_permutation_same_on_every_rank_and_changes_with_epoch_and_seed() -> None:
    a, b = GlobalBatchSampler(50, 8, seed=3), GlobalBatchSampler(50, 8, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    assert torch.equal(a.permutation, b.permutation)
    assert sorted(a.permutation.tolist()) == list(range(50))
    sizes = [3, 5]
    assert torch.equal(torch.cat([a.local_indices(1, sizes, 0), b.local_indices(1, sizes, 1)]), step_indices(a, 1))
    first = a.permutation.clone()
    a.set_epoch(3)
    assert not torch.equal(first, a.permutation)
    a.set_epoch(2)
    assert torch.equal(first, a.permutation), "an epoch's permutation is reproducible"
    c = GlobalBatchSampler(50, 8, seed=4)
    c.set_epoch(2)
    assert not torch.equal(first, c.permutation)


def test_drop_last() -> None:
    world, global_batch = 3, 10
    samplers = [GlobalBatchSampler(47, global_batch, seed=1, drop_last=True) for _ in range(world)]
    assert samplers[0].steps_per_epoch == 4
    rng = random.Random(0)
    comps = [random_composition(rng, global_batch, world) for _ in range(4)]
    used = torch.cat([torch.cat(parts) for parts in run_epoch(samplers, comps)]).tolist()
    assert len(used) == 40 and len(set(used)) == 40
    with pytest.raises(UserError, match="exceeds the training set"):
        GlobalBatchSampler(5, 10, seed=0, drop_last=True)


def test_sampler_rejects_bad_input() -> None:
    with pytest.raises(UserError, match="global batch"):
        GlobalBatchSampler(10, 0, seed=0)
    sampler = GlobalBatchSampler(10, 4, seed=0)
    with pytest.raises(AssertionError, match="sum to 5"):
        sampler.local_indices(0, [2, 3], 0)


def test_proportional_split_and_eval_indices_cover_exactly_once() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(0, 500)
        shares = [rng.choice([0, rng.randint(1, 64), rng.random() * 10]) for _ in range(rng.randint(1, 6))]
        if sum(shares) == 0:
            shares[0] = 1
        parts = proportional_split(n, shares)
        assert sum(parts) == n
        assert all(abs(p - n * s / sum(shares)) < 1 for p, s in zip(parts, shares, strict=True))
        covered = [i for rank in range(len(shares)) for i in eval_indices(n, shares, rank)]
        assert covered == list(range(n))
    assert eval_indices(10, [1, 1, 2], 2) == range(5, 10)


# ---------------------------------------------------------------- TensorData and augmentation


def test_tensor_data_gathers_rows_in_one_batch() -> None:
    x = torch.arange(5 * 3 * 4 * 4, dtype=torch.float32).reshape(5, 3, 4, 4)
    y = torch.tensor([0, 1, 2, 3, 4])
    data = TensorData(x, y)
    xb, yb = data.batch(torch.tensor([4, 0, 2]))
    assert torch.equal(xb, x[[4, 0, 2]]) and yb.tolist() == [4, 0, 2]
    assert len(data) == 5 and data.sample_shape == (3, 4, 4)
    x0, y0 = data[1]
    assert torch.equal(x0, x[1]) and int(y0) == 1
    empty_x, empty_y = data.batch(torch.tensor([], dtype=torch.long), augment=True)
    assert empty_x.shape == (0, 3, 4, 4) and empty_y.shape == (0,)


def test_augment_is_seeded_per_sample_crop_and_flip() -> None:
    x = torch.randn(64, 3, 8, 8)
    a = augment_batch(x, torch.Generator().manual_seed(0))
    assert torch.equal(a, augment_batch(x, torch.Generator().manual_seed(0)))
    assert not torch.equal(a, augment_batch(x, torch.Generator().manual_seed(1)))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    flipped = 0
    for i in range(len(x)):
        crops = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(9) for dx in range(9)]
        plain = any(torch.equal(a[i], c) for c in crops)
        mirrored = any(torch.equal(a[i], c.flip(-1)) for c in crops)
        assert plain or mirrored, f"sample {i} is not a crop of its padded image"
        flipped += mirrored and not plain
    assert 10 < flipped < 54, "about half the samples are flipped"


# ---------------------------------------------------------------- datasets


def test_digits_shapes_split_and_normalisation() -> None:
    from sklearn.datasets import load_digits

    train, test, num_classes = load_dataset("digits", "unused", image_size=16, test_fraction=0.2, seed=3)
    assert num_classes == 10
    assert len(train) + len(test) == 1797 and len(test) == 360
    xb, yb = train.batch(torch.arange(len(train)))
    assert xb.shape == (len(train), 3, 16, 16) and xb.dtype == torch.float32
    assert torch.equal(xb[:, 0], xb[:, 2]), "grey replicated to three channels"
    assert abs(xb.mean().item()) < 1e-3 and abs(xb.std().item() - 1) < 1e-3
    assert set(yb.tolist()) == set(range(10)) and set(test.targets.tolist()) == set(range(10))
    again = load_dataset("digits", "unused", image_size=16, test_fraction=0.2, seed=3).train
    assert torch.equal(again.batch(torch.arange(len(again)))[0], xb), "deterministic for a seed"
    other = load_dataset("digits", "unused", image_size=16, test_fraction=0.2, seed=4).test
    assert not torch.equal(other.targets, test.targets)

    # At 8x8 (no resize) train + test is exactly the original set: no sample in both, none lost.
    train8, test8, _ = load_dataset("digits", "unused", image_size=8, seed=0)
    both = torch.cat([train8.batch(torch.arange(len(train8)))[0], test8.batch(torch.arange(len(test8)))[0]])
    rows = both[:, 0].reshape(len(both), -1).numpy()
    original = load_digits().data
    scale = lambda a: np.round((a - a.min()) / (a.max() - a.min()), 4)  # noqa: E731 - same affine map
    assert sorted(map(tuple, scale(rows))) == sorted(map(tuple, scale(original)))


def test_split_indices_is_stratified_disjoint_and_complete() -> None:
    labels = np.repeat(np.arange(4), 25)
    train, test = split_indices(labels, 0.2, seed=0)
    assert set(train).isdisjoint(test) and sorted([*train, *test]) == list(range(100))
    assert np.bincount(labels[test]).tolist() == [5, 5, 5, 5]


@pytest.mark.parametrize("classes,fraction", [(2, 0.1), (3, 0.2), (7, 0.33), (10, 0.2), (25, 0.5)])
def test_split_indices_draws_what_scikit_learns_stratified_split_draws(classes: int, fraction: float) -> None:
    """Every run folder's held-out samples stay those scikit-learn's train_test_split chose: the same
    labels, fraction and seed give the same split, ties among the remainders included."""
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(classes)
    for seed in range(8):
        labels = rng.integers(0, classes, size=int(rng.integers(8 * classes, 40 * classes)))
        labels[:2 * classes] = np.repeat(np.arange(classes), 2)  # every class at least twice
        want = train_test_split(np.arange(len(labels)), test_size=fraction, random_state=seed, stratify=labels)
        got = split_indices(labels, fraction, seed)
        assert [g.tolist() for g in got] == [np.sort(w).tolist() for w in want], (classes, fraction, seed)


def test_a_split_without_every_class_on_both_sides_is_refused() -> None:
    with pytest.raises(UserError, match="each need a sample of every class"):
        split_indices(np.repeat(np.arange(10), 3), 0.1, seed=0)  # 3 test samples for 10 classes
    with pytest.raises(UserError, match="the smallest has 1"):
        split_indices(np.asarray([0, 0, 0, 0, 1]), 0.4, seed=0)


@pytest.mark.parametrize("num_classes", [10, 100])
def test_cifar_loads_fixture_through_torchvision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_classes: int
) -> None:
    skip_cifar_checksums(monkeypatch)
    folder = write_cifar_fixture(tmp_path, num_classes=num_classes, train=50, test=20, seed=1)
    name = f"cifar{num_classes}"
    train, test, classes = load_dataset(name, tmp_path, image_size=32)
    assert classes == num_classes and (len(train), len(test)) == (50, 20)
    xb, yb = test.batch(torch.arange(20))
    assert xb.shape == (20, 3, 32, 32) and xb.dtype == torch.float32
    with open(folder / ("test_batch" if num_classes == 10 else "test"), "rb") as f:
        raw = pickle.load(f, encoding="bytes")  # the CIFAR page's recipe: bytes keys
    assert yb.tolist() == raw[b"labels" if num_classes == 10 else b"fine_labels"]
    if num_classes == 10:
        mean, std = torch.tensor(CIFAR10_MEAN)[:, None, None], torch.tensor(CIFAR10_STD)[:, None, None]
        pixels = torch.from_numpy(raw[b"data"]).reshape(20, 3, 32, 32).float() / 255
        assert torch.allclose(xb * std + mean, pixels, atol=1e-5)
    resized = load_dataset(name, tmp_path, image_size=24).train
    assert resized.batch(torch.arange(4))[0].shape == (4, 3, 24, 24) and resized.sample_shape == (3, 24, 24)


def test_cifar_missing_or_undownloadable_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "no-cifar-here"
    with pytest.raises(UserError, match="cifar10") as info:
        load_dataset("cifar10", root, image_size=32, download=False)
    assert str(root) in str(info.value) and "download" in str(info.value) and "\n" not in str(info.value)

    import torchvision.datasets.cifar as cifar

    def offline(*args: object, **kwargs: object) -> None:
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cifar, "download_and_extract_archive", offline)
    with pytest.raises(UserError, match="could not download") as info:
        load_dataset("cifar100", root, image_size=32, download=True)
    assert str(root) in str(info.value) and "\n" not in str(info.value)


def test_unknown_dataset_and_bad_arguments() -> None:
    with pytest.raises(UserError, match="digits, cifar10, cifar100, synthetic, food101, caltech256, places365"):
        load_dataset("imagenet", "x", image_size=32)
    with pytest.raises(UserError, match="test_fraction"):
        load_dataset("digits", "x", image_size=32, test_fraction=1.5)
    with pytest.raises(UserError, match="image_size"):
        load_dataset("synthetic", "x", image_size=0)


def test_synthetic_is_deterministic_and_learnable() -> None:
    from omnilearn.train.models import build_model

    train, test, num_classes = load_dataset("synthetic", "x", image_size=16, seed=0, synthetic_size=1024)
    assert (len(train), len(test), num_classes) == (819, 205, 10)
    assert torch.equal(train.x, load_dataset("synthetic", "x", image_size=16, seed=0, synthetic_size=1024).train.x)
    assert not torch.equal(train.x, load_dataset("synthetic", "x", image_size=16, seed=1, synthetic_size=1024).train.x)
    assert load_dataset("synthetic", "x", image_size=40).train.sample_shape == (3, 40, 40)

    model = build_model("smallcnn", num_classes, 16, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = GlobalBatchSampler(len(train), 64, seed=0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        x_test, y_test = test.batch(torch.arange(len(test)))
        before = (model(x_test).argmax(1) == y_test).float().mean().item()
    for epoch in range(4):  # 52 steps of 64
        sampler.set_epoch(epoch)
        for step in range(sampler.steps_per_epoch):
            xb, yb = train.batch(sampler.local_indices(step, [64], 0), augment=False, generator=generator)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        after = (model(x_test).argmax(1) == y_test).float().mean().item()
    assert before < 0.3 and after > 0.8, (before, after)


# ---------------------------------------------------------------- file-backed image datasets


def _pil(rng: np.random.Generator, width: int, height: int):  # noqa: ANN202 - a PIL image
    from PIL import Image

    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


def _imagenet_eval(image_size: int):  # noqa: ANN202 - torchvision's own evaluation pipeline
    from torchvision.transforms import v2

    return v2.Compose([
        v2.Resize(int(image_size * 256 / 224)), v2.CenterCrop(image_size),
        v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def test_transforms_are_torchvisions_with_a_private_generator() -> None:
    from torchvision.transforms import v2

    rng = np.random.default_rng(0)
    reference = v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()])
    for width, height in ((64, 48), (30, 90), (50, 50), (200, 12)):
        image = _pil(rng, width, height)
        for seed in range(12):
            torch.manual_seed(seed)  # torchvision draws from the global RNG ...
            expected = np.asarray(reference(image))
            got = np.asarray(train_transform(image, 32, torch.Generator().manual_seed(seed)))  # ... we do not
            assert got.shape == (32, 32, 3) and np.array_equal(got, expected), (width, height, seed)
        evaluated = np.asarray(v2.Compose([v2.Resize(36), v2.CenterCrop(32)])(image))
        assert np.array_equal(np.asarray(eval_transform(image, 32)), evaluated)
    # The central-crop fallback (no attempt fits): a 200x12 strip with scale (0.9, 1).
    strip = _pil(rng, 200, 12)
    for seed in range(3):
        torch.manual_seed(seed)
        params = v2.RandomResizedCrop(32, scale=(0.9, 1.0)).make_params([strip])
        mine = random_resized_crop_params(12, 200, torch.Generator().manual_seed(seed), scale=(0.9, 1.0))
        assert mine == (params["top"], params["left"], params["height"], params["width"]) == (0, 92, 12, 16)


def test_food101_is_file_backed_and_matches_torchvisions_own_dataset(tmp_path: Path) -> None:
    from torchvision.datasets import Food101

    write_food101_fixture(tmp_path, train=4, test=2)
    train, test, num_classes = load_dataset("food101", tmp_path, image_size=32)
    assert isinstance(train, ImageFiles) and isinstance(test, ImageFiles)
    assert num_classes == 3 and (len(train), len(test)) == (12, 6)
    assert train.targets.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and train.targets.dtype == torch.int64
    assert train.sample_shape == test.sample_shape == (3, 32, 32)

    # The test split is exactly torchvision's Food101 (its files, its labels, its loader) through
    # torchvision's Resize + CenterCrop + Normalize: deterministic, whatever the order asked.
    official = Food101(str(tmp_path), split="test")
    pipeline = _imagenet_eval(32)
    expected = torch.stack([pipeline(official[i][0]) for i in range(len(official))])
    xb, yb = test.batch(torch.arange(6))
    assert xb.shape == (6, 3, 32, 32) and xb.dtype == torch.float32 and xb.is_contiguous()
    assert yb.tolist() == [official[i][1] for i in range(6)]
    assert torch.allclose(xb, expected, atol=1e-5)
    assert torch.equal(test.batch(torch.tensor([5, 0, 5]))[0], xb[[5, 0, 5]])
    x0, y0 = test[3]
    assert torch.equal(x0, xb[3]) and int(y0) == int(yb[3])

    # The training split: a fresh random crop + flip at every call, the same sequence for the same seed.
    idx = torch.tensor([0, 5, 11])
    first, second = train.batch(idx), train.batch(idx)
    assert first[0].shape == (3, 3, 32, 32) and first[1].tolist() == [0, 1, 2]
    assert not torch.equal(first[0], second[0])
    again = load_dataset("food101", tmp_path, image_size=32).train
    assert torch.equal(again.batch(idx)[0], first[0]) and torch.equal(again.batch(idx)[0], second[0])
    other_seed = load_dataset("food101", tmp_path, image_size=32, seed=1).train
    assert not torch.equal(other_seed.batch(idx)[0], first[0])

    # As the BSP worker consumes it: each rank's slice of a global step, then its share of the test set.
    sampler = GlobalBatchSampler(len(train), 8, seed=0)
    sizes = [5, 3]
    parts = [train.batch(sampler.local_indices(0, sizes, rank))[0] for rank in range(2)]
    assert [p.shape[0] for p in parts] == sizes
    assert sum(len(eval_indices(len(test), sizes, rank)) for rank in range(2)) == len(test)


def test_training_transform_is_per_sample_seeded_order_and_thread_independent(tmp_path: Path) -> None:
    write_caltech256_fixture(tmp_path)
    train, test, _ = load_dataset("caltech256", tmp_path, image_size=24, seed=0)
    idx = torch.arange(len(train))
    seeded = lambda k: torch.Generator().manual_seed(k)  # noqa: E731
    a, ya = train.batch(idx, generator=seeded(3))
    assert a.shape == (len(train), 3, 24, 24) and torch.equal(ya, train.targets)
    assert torch.equal(a, train.batch(idx, generator=seeded(3))[0])
    assert not torch.equal(a, train.batch(idx, generator=seeded(4))[0])
    assert torch.equal(train.batch(idx.flip(0), generator=seeded(3))[0], a.flip(0)), "order does not matter"
    for threads in (1, 3):
        single = ImageFiles(train.files, 24, train=True, name="caltech256", threads=threads)
        assert torch.equal(single.batch(idx, generator=seeded(3))[0], a), f"threads={threads}"
    # The documented recipe: one seed per call from the generator, sample i uses sample_seed(call, i).
    call_seed = int(torch.randint(0, 1 << 62, (1,), generator=seeded(3)).item())
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    i = 5
    crop = train_transform(load_rgb(train.path(i)), 24, torch.Generator().manual_seed(sample_seed(call_seed, i)))
    pixels = torch.from_numpy(np.array(crop)).permute(2, 0, 1).float() / 255
    assert torch.allclose(a[i] * std + mean, pixels, atol=1e-5)

    # The test split is deterministic unless augment=True asks for the training transform.
    tidx = torch.arange(len(test))
    plain = test.batch(tidx, generator=seeded(0))[0]
    assert torch.equal(plain, test.batch(tidx)[0])
    augmented = test.batch(tidx, augment=True, generator=seeded(0))[0]
    assert not torch.equal(augmented, plain)
    assert torch.equal(augmented, test.batch(tidx, augment=True, generator=seeded(0))[0])
    # eval_view: the training files with the evaluation transform.
    view = train.eval_view()
    assert torch.equal(view.batch(idx)[0], view.batch(idx)[0]) and len(view) == len(train)


def test_caltech256_split_is_seeded_stratified_and_complete(tmp_path: Path) -> None:
    folder = write_caltech256_fixture(tmp_path, per_class=(6, 7, 5, 8))
    train, test, num_classes = load_dataset("caltech256", tmp_path, image_size=32, test_fraction=0.25, seed=0)
    assert num_classes == 4 and (len(train), len(test)) == (19, 7)
    paths = lambda data: [data.path(i) for i in range(len(data))]  # noqa: E731
    on_disk = {str(p) for p in folder.glob("*/*.jpg")}  # the stray RENAME2 file is not a sample
    assert len(on_disk) == 26 and set(paths(train)).isdisjoint(paths(test))
    assert set(paths(train)) | set(paths(test)) == on_disk
    for data in (train, test):  # label = the folder's number - 1
        assert [int(Path(p).parent.name[:3]) - 1 for p in paths(data)] == data.targets.tolist()
    assert sorted(set(test.targets.tolist())) == [0, 1, 2, 3], "every class is in the test split"
    again = load_dataset("caltech256", tmp_path, image_size=32, test_fraction=0.25, seed=0)
    assert paths(again.train) == paths(train) and paths(again.test) == paths(test)
    other = load_dataset("caltech256", tmp_path, image_size=32, test_fraction=0.25, seed=1)
    assert set(paths(other.test)) != set(paths(test))
    # The greyscale JPEG comes out as three equal channels before normalisation.
    grey = str(folder / "002.american-flag" / "002_0001.jpg")
    data, position = (train, paths(train).index(grey)) if grey in paths(train) else (test, paths(test).index(grey))
    x = data.eval_view().batch(torch.tensor([position]))[0][0]
    raw = x * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None, None]
    assert torch.allclose(raw[0], raw[1], atol=1e-5) and torch.allclose(raw[1], raw[2], atol=1e-5)


def test_places365_small_reads_the_standard_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_places365_checksums(monkeypatch)
    write_places365_fixture(tmp_path, train=3, val=2)
    train, test, num_classes = load_dataset("places365", tmp_path, image_size=28)
    assert num_classes == 3 and (len(train), len(test)) == (9, 6)
    val_lines = (tmp_path / "places365_val.txt").read_text().split("\n")[:-1]
    assert test.targets.tolist() == [int(line.split()[1]) for line in val_lines]
    assert [Path(test.path(i)).name for i in range(6)] == [line.split()[0] for line in val_lines]
    assert train.path(3) == str(tmp_path / "data_256_standard" / "b" / "bakery" / "shop" / "00000001.jpg")
    assert train.targets.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    xb, yb = test.batch(torch.arange(6))
    assert xb.shape == (6, 3, 28, 28) and torch.equal(yb, test.targets)
    from torchvision.datasets import Places365

    official = Places365(str(tmp_path), split="val", small=True)
    assert torch.allclose(xb[2], _imagenet_eval(28)(official[2][0]), atol=1e-5)
    # The high-resolution variant lives elsewhere: a clear error, not an empty dataset.
    with pytest.raises(UserError, match="data_large_standard"):
        load_dataset("places365", tmp_path, image_size=28, places365_small=False)


def test_places365_corrupted_metadata_is_a_user_error(tmp_path: Path) -> None:
    write_places365_fixture(tmp_path)  # the fixture's lists cannot have the real MD5s
    with pytest.raises(UserError, match="places365: dataset not found or corrupted") as info:
        load_dataset("places365", tmp_path, image_size=32)
    assert "categories_places365.txt" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", IMAGE_FILE_DATASETS)
def test_image_dataset_missing_or_undownloadable_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root = tmp_path / "no-data-here"
    with pytest.raises(UserError, match=f"^{name}: dataset not found") as info:
        load_dataset(name, root, image_size=32, download=False)
    message = str(info.value)
    assert str(root) in message and "set download to true" in message and "\n" not in message
    assert not root.exists(), "download=False creates nothing"

    tried = fail_downloads(monkeypatch)
    with pytest.raises(UserError, match=f"^{name}: could not download") as info:
        load_dataset(name, root, image_size=32, download=True)
    message = str(info.value)
    assert str(root) in message and "name resolution" in message and "\n" not in message
    assert tried and all(url.startswith("http") for url in tried)


def test_missing_images_are_user_errors_naming_the_file(tmp_path: Path) -> None:
    folder = write_food101_fixture(tmp_path)
    train, _, _ = load_dataset("food101", tmp_path, image_size=32)
    gone = Path(train.path(2))
    gone.unlink()
    with pytest.raises(UserError, match="cannot read image") as info:
        train.batch(torch.tensor([0, 1, 2, 3]))
    assert str(gone) in str(info.value)
    Path(train.path(0)).unlink()  # the first listed image: found when loading, not at the first step
    with pytest.raises(UserError, match="dataset incomplete") as info:
        load_dataset("food101", tmp_path, image_size=32)
    assert str(folder) in str(info.value)


def test_resize_normalise_and_scale_match_torchvision_bit_for_bit() -> None:
    from torchvision.transforms.v2 import functional as TF

    from omnilearn.train.data import resize

    g = torch.Generator().manual_seed(0)
    for shape, size in [((5, 3, 8, 8), 24), ((7, 1, 32, 32), 16), ((3, 3, 4, 4), 16)]:
        x = torch.randn(*shape, generator=g)
        assert torch.equal(resize(x, size), TF.resize(x, [size, size], antialias=True))
    pixels = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=g)
    data = TensorData(pixels, torch.zeros(4, dtype=torch.long), image_size=12, mean=[0.1, 0.2, 0.3],
                      std=[0.5, 0.6, 0.7])
    xb, _ = data.batch(torch.arange(4))
    want = TF.normalize(TF.resize(TF.to_dtype(pixels, torch.float32, scale=True), [12, 12], antialias=True),
                        [0.1, 0.2, 0.3], [0.5, 0.6, 0.7])
    assert torch.equal(xb, want)
