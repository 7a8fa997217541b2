"""ASP checkpoints: the parameter server saves on ``checkpoint.every`` and goes on from its checkpoint
(model, optimizer, controller, progress), each worker from the pushes it holds; ``--resume`` of a
stopped ASP job completes it with the configured samples and every update applied once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from test_asp import TinyBN

from omnilearn import config
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.errors import UserError
from omnilearn.files import read_records
from omnilearn.jobfile import JobSpec
from omnilearn.train import checkpoint
from omnilearn.train.asp import IndexStream
from omnilearn.train.checkpoint import cut_worker_metrics
from omnilearn.train.parameter_server import LockedWriter, ParameterServer

# ---------------------------------------------------------------------------------------- in process


def _cfg(*sets: tuple[str, Any]) -> config.JobConfig:
    return config.build(None, [("mode", "asp"), ("workers", 2), ("train.global_batch", 16), ("train.epochs", 2),
                               ("train.lr", 0.1), ("train.momentum", 0.9), ("train.milestones", [1]),
                               ("emulation.backend", "none"), ("emulation.hl", "HL1"), ("checkpoint.every", 1),
                               *sets])


def _server(out: Path, resume: bool = False, cfg: config.JobConfig | None = None) -> ParameterServer:
    cfg = cfg or _cfg()
    job = JobSpec(job_id="t", config=cfg, plan=build_plan(cfg), out_dir=out, backend="none", resume=resume)
    torch.manual_seed(0)
    return ParameterServer(job, TinyBN(), 40, LockedWriter(out / "metrics" / "rank-0.jsonl"))  # target: 80


def _push(server: ParameterServer, k: int) -> dict[str, Any]:
    """Push number k (0, 1, 2...) of a fixed sequence: workers alternate, each gradient seeded by k."""
    rank = 1 + k % 2
    flat = torch.randn(server.state.numel(), generator=torch.Generator().manual_seed(k))
    stats = {"loss": 1.0, "correct": 0, "compute_s": 0.1 * rank, "level": server.level}
    return server.push(rank, k // 2 + 1, server.version, flat, 8, stats)


def _run_to_end(server: ParameterServer, k: int) -> int:
    while not _push(server, k)["stop"]:
        k += 1
    return k + 1


def test_a_resumed_server_goes_on_from_its_checkpoint_like_an_uninterrupted_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _server(tmp_path / "whole")
    pushes = _run_to_end(whole, 0)
    assert whole.samples == 8 * pushes >= 80 and whole.samples < 80 + 16

    out = tmp_path / "run"
    first = _server(out)
    for k in range(6):  # 48 samples: epoch 1.2
        _push(first, k)
    assert first.checkpoint.due()
    first.checkpoint.save("every")
    saved = first.state.clone()
    assert not first.checkpoint.due()
    _push(first, 6)  # applied after the checkpoint: lost with the crash, made again after the resume
    first.snapshot()  # likewise: removed at the resume
    monkeypatch.setattr(os, "replace", lambda *_: (_ for _ in ()).throw(OSError("killed during the save")))
    with pytest.raises(OSError):
        first.checkpoint.save("every")  # a kill during the save: the previous checkpoint stays whole
    monkeypatch.undo()

    resumed = _server(out, resume=True)
    assert (resumed.version, resumed.samples, resumed.last_seq, resumed.worker_samples) == (6, 48, [3, 3], [24, 24])
    assert torch.equal(resumed.state, saved) and resumed.base_lr() == pytest.approx(0.1 * 0.1)  # past milestone 1
    assert checkpoint.load(out / "snapshots" / "checkpoint.pt", _cfg())["progress"]["version"] == 6
    assert not list((out / "snapshots").glob("snapshot-*.pt"))
    updates = [r for r in read_records(out / "metrics" / "rank-0.jsonl") if r["kind"] == "update"]
    assert [u["version"] for u in updates] == [1, 2, 3, 4, 5, 6]  # the lost update's record is cut
    resumed.t_start = time.time()  # as serve() sets it: hello answers at once
    reply = resumed.hello(2, timeout=1)
    assert (reply["pushes"], reply["samples"]) == (3, 24)
    assert _run_to_end(resumed, 6) == pushes
    assert resumed.samples == whole.samples and resumed.version == whole.version
    # The optimizer's momentum and the learning-rate schedule came back: the same model as without the stop.
    assert torch.allclose(resumed.state, whole.state, atol=1e-6)


def test_resume_refuses_an_asp_checkpoint_of_another_config(tmp_path: Path) -> None:
    from omnilearn.cli import build_parser
    from omnilearn.cli.run import resume_config
    from omnilearn.launch.runfolder import prepare_out

    out = prepare_out(str(tmp_path / "run"), False)
    cfg = _cfg()
    JobSpec("j", cfg, build_plan(cfg), out, "none").save()
    _server(out, cfg=cfg).checkpoint.save("stopped")
    parse = build_parser().parse_args
    assert resume_config(parse(["run", "--resume", str(out)]))[0].mode == "asp"
    with pytest.raises(UserError, match="made under another config"):
        resume_config(parse(["run", "--resume", str(out), "--set", "train.lr=0.5"]))


class _Planted:
    """What a compromised server container could write as its checkpoint: unpickling it makes a folder."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (str(self.marker),)


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path: Path) -> None:
    path, marker = tmp_path / "checkpoint.pt", tmp_path / "ran"
    torch.save({"format": checkpoint.FORMAT, "progress": _Planted(marker)}, path)
    with pytest.raises(UserError, match="cannot be read"):
        checkpoint.load(path, _cfg())
    assert not marker.exists()


def test_index_stream_skip_is_take_without_the_indices() -> None:
    for n in (0, 3, 10, 17, 20, 35):
        whole, skipped = IndexStream(10, seed=4, rank=2), IndexStream(10, seed=4, rank=2)
        skipped.skip(n)
        assert torch.equal(skipped.take(25), whole.take(n + 25)[n:]), n


def test_a_resumed_worker_cuts_its_steps_past_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "rank-1.jsonl"
    lines = [{"kind": "start"}, {"kind": "step", "seq": 1}, {"kind": "hl_change"}, {"kind": "step", "seq": 2},
             {"kind": "step", "seq": 3}, {"kind": "hl_change"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "st')
    cut_worker_metrics(path, 2)
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:4]
    cut_worker_metrics(path, 0)
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:1]


# ---------------------------------------------------------------------------------------- a whole job

