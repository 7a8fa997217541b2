"""A user's own workload (config key ``workload``): the examples trained through the real CLI in BSP
and ASP, and a broken workload stopped before anything starts with one clear line and exit status 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnilearn import Workload, config
from omnilearn.errors import UserError
from omnilearn.images.requirements import dockerfile
from omnilearn.metrics import read_rank
from omnilearn.train.preflight import preflight
from omnilearn.train.workload import gather, load_workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["tabular_mlp", "text_classifier"]


def omnilearn(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "pytorch"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "omnilearn", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize("mode", ["bsp", "asp"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_trains_through_the_cli(tmp_path: Path, example: str, mode: str) -> None:
    out = tmp_path / "run"
    proc = omnilearn("run", "--mode", mode, "--set", f"workload=examples/{example}.py:workload", "--workers", "2",
                     "--set", "train.epochs=2", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == mode
    assert summary["samples"] > 0
    # Above chance, 0.25 (4 classes in both examples): the user's model, data and loss trained.
    assert summary["final_accuracy"] > 0.35, summary["final_accuracy"]


def test_a_uniform_run_records_every_workers_start_up_pass_for_the_what_if(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = omnilearn("run", "--policy", "uniform", "--set", "workload=examples/tabular_mlp.py:workload",
                     "--workers", "2", "--set", "train.epochs=1", "--backend", "none", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        ups = [r for r in read_rank(out, rank) if r["kind"] == "start_up"]
        assert len(ups) == 1 and len(ups[0]["sizes"]) == 2 and ups[0]["sizes"][0] < ups[0]["sizes"][1]
        assert all(t > 0 for t in ups[0]["times_ms"]) and ups[0]["cpu"] is False  # no quota: wall times
    assert omnilearn("whatif", str(out)).returncode == 0
    models = json.loads((out / "whatif.json").read_text())["models"]
    assert models["k_status"] in ("start-up pass", "not identified")  # the steps ran one batch size


BROKEN = {
    "import": ("import no_such_package_xyz\n", "cannot import", "ModuleNotFoundError"),
    "type": ("def workload(config):\n    return {'model': None}\n", "returned dict, not an omnilearn.Workload", None),
    "raises": ('''
import torch
from torch import nn
from torch.utils.data import Dataset
from omnilearn import Workload

class Bad(Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        raise KeyError("row missing")

def workload(config):
    return Workload(model=lambda: nn.Linear(3, 2), train=Bad(), test=Bad())
''', "train[[0, 1]] raised KeyError", "row missing"),
}


def _write_broken(folder: Path, case: str) -> list[str]:
    """``folder/mine.py`` broken as ``case`` says; returns the words its error must hold."""
    source, *expected = BROKEN[case]
    if case == "import":
        source += "def workload(config):\n    pass\n"
    (folder / "mine.py").write_text(source)
    return [f"{folder / 'mine.py'}:workload", *(text for text in expected if text)]


def test_a_broken_workload_is_one_clear_error(tmp_path: Path) -> None:
    """Through the command line (the workload named relative to the working folder): one line, status 2,
    nothing started. The other breakages take the same path (the launcher's preflight, a UserError);
    their messages are checked in test_each_breakage_of_a_workload_is_named."""
    expected = _write_broken(tmp_path, "raises")
    out = tmp_path / "run"
    proc = omnilearn("run", "--set", "workload=mine.py:workload", "--workers", "2", "--out", str(out),
                     "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for text in expected:
        assert text in lines[0]
    assert not out.exists()  # nothing started


@pytest.mark.parametrize("case", ["import", "type", "raises"])
def test_each_breakage_of_a_workload_is_named(tmp_path: Path, case: str) -> None:
    expected = _write_broken(tmp_path, case)
    cfg = config.build(None, [("workload", f"{tmp_path / 'mine.py'}:workload"), ("workers", 2)])
    with pytest.raises(UserError) as e:
        preflight(cfg)
    assert len(str(e.value).splitlines()) == 1, e.value
    for text in expected:
        assert text in str(e.value)


def test_model_not_a_module_and_iterable_data_are_refused(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text('''
import torch
from torch.utils.data import IterableDataset, TensorDataset
from omnilearn import Workload

data = TensorDataset(torch.randn(8, 3), torch.zeros(8, dtype=torch.long))

class Stream(IterableDataset):
    def __iter__(self):
        return iter(data)

def not_a_module(config):
    return Workload(model=lambda: "linear", train=data, test=data)

def iterable(config):
    return Workload(model=lambda: torch.nn.Linear(3, 2), train=Stream(), test=data)

def scalar_loss(config):
    return Workload(model=lambda: torch.nn.Linear(3, 2), train=data, test=data,
                    loss=torch.nn.functional.cross_entropy)
''')
    cases = {"not_a_module": "model() returned str, not a torch.nn.Module",
             "iterable": "train must be a map-style Dataset",
             "scalar_loss": "loss must give one value per sample"}
    for function, message in cases.items():
        cfg = config.build(None, [("workload", f"{tmp_path / 'w.py'}:{function}")])
        with pytest.raises(UserError, match=re.escape(message)):
            preflight(cfg)


def test_builtin_workloads_are_the_same_interface() -> None:
    work = load_workload(config.build(None, [("data.name", "synthetic"), ("model.name", "smallcnn"),
                                             ("data.image_size", 16)]))
    assert isinstance(work, Workload)
    x, y = gather(work.train, torch.arange(4))
    assert x.shape[0] == 4 and y.shape == (4,)
    loss, score = work.terms(work.model()(x), y)
    assert loss.dim() == 0 and 0 <= float(score) <= 4
    # The built-in dataset is also map-style: its samples are its batch's rows.
    x0, y0 = work.train[2]
    assert torch.allclose(x0, x[2]) and int(y0) == int(y[2])


def test_a_user_dataset_is_batched_by_indices(tmp_path: Path) -> None:
    work = load_workload(config.build(None, [("workload", "examples/text_classifier.py:workload")]))
    idx = torch.tensor([5, 0, 7])
    x, y = gather(work.train, idx)
    assert torch.equal(x[1], work.train[0][0]) and int(y[2]) == int(work.train[7][1])
    empty_x, empty_y = gather(work.train, torch.tensor([], dtype=torch.long))
    assert empty_x.shape[0] == 0 and empty_y.shape == (0,)


def test_requirements_layer_is_an_argument_list() -> None:
    text = dockerfile("sha256:abc", ["six==1.16.0", "numpy>=1; python_version>'3'"])
    run = next(line for line in text.splitlines() if "install" in line)
    assert json.loads(run[len("RUN "):]) == ["pip", "install", "--no-cache-dir", "six==1.16.0",
                                             "numpy>=1; python_version>'3'"]
    assert text.splitlines()[0] == "FROM sha256:abc" and text.rstrip().endswith("USER 10001:10001")


LOWER = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from omnilearn import Metric, Workload

def workload(config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g)
    data = TensorDataset(x, y)
    return Workload(model=lambda: nn.Linear(6, 1), train=data, test=data,
                    loss=lambda out, t: ((out - t) ** 2).mean(1),
                    metric=Metric("mae", lambda out, t: (out - t).abs().mean(1), lower_is_better=True))
'''


def test_a_lower_is_better_metric_is_judged_downwards(tmp_path: Path) -> None:
    from omnilearn.report.summary import compare

    (tmp_path / "regression.py").write_text(LOWER)
    out = tmp_path / "run"
    proc = omnilearn("run", "--set", f"workload={tmp_path / 'regression.py'}:workload", "--workers", "2",
                     "--set", "train.epochs=2", "--set", "train.global_batch=64", "--set", "train.lr=0.05",
                     "--set", "train.momentum=0", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric_name"] == "mae" and summary["metric_lower_is_better"] is True
    first, last = summary["accuracy_curve"][0]["accuracy"], summary["final_accuracy"]
    assert last <= first  # the regression learned: its error did not grow
    (tmp_path / "cmp").mkdir()
    result = compare(tmp_path / "cmp", {"uniform": out, "dynamic": out})
    t = result["targets"]
    assert t["lower_is_better"] is True
    assert t["target"] == pytest.approx(last / 0.95)  # above the best error, not 95% of it
    assert t["time_to_target_s"]["uniform"] is not None
