"""ASP: a stopped job resumes from its checkpoint and completes the run (a whole job)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from omnilearn import config
from omnilearn.files import read_records
from omnilearn.train import checkpoint

EPOCHS, BATCH = 4, 64


def _job(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "omnilearn", "run", "--model", "smallcnn", "--dataset", "synthetic", "--workers",
            "2", "--epochs", str(EPOCHS), "--global-batch", str(BATCH), "--policy", "dynamic", "--hl", "HL1",
            "--set", "mode=asp", "--set", "data.synthetic_size=1024", "--set", "data.image_size=32",
            "--set", "asp.eval_interval=100", "--set", "checkpoint.every=1", "--out", str(out), "--no-progress",
            *extra]


def test_a_stopped_asp_job_resumes_from_its_checkpoint_and_completes_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(_job(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = out / "metrics" / "rank-0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (server.exists() and '"reason":"every"' in server.read_text()):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # the user stops the job: the server saves its checkpoint as it goes
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, output
    cfg = config.from_dict(json.loads((out / "job.json").read_text())["config"], "job.json")
    saved = checkpoint.load(out / "snapshots" / "checkpoint.pt", cfg)["progress"]
    target = saved["samples"] and json.loads(server.read_text().splitlines()[0])["target_samples"]
    assert 0 < saved["samples"] < target, saved  # stopped part way

    r = subprocess.run(_job(out)[:-3] + ["--resume", str(out), "--no-progress"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    records = read_records(server)
    resume = [x for x in records if x["kind"] == "resume"]
    assert len(resume) == 1 and resume[0]["samples"] == saved["samples"] and resume[0]["version"] == saved["version"]
    updates = [x for x in records if x["kind"] == "update"]
    assert [u["version"] for u in updates] == list(range(1, len(updates) + 1))  # each update once, none redone
    assert updates[len(updates) - 1]["samples"] == sum(u["batch"] for u in updates)
    for w in (1, 2):
        seqs = [u["seq"] for u in updates if u["worker"] == w]
        assert seqs == list(range(1, len(seqs) + 1))  # the resumed worker went on from its pushes
        steps = [x["seq"] for x in read_records(out / "metrics" / f"rank-{w}.jsonl") if x["kind"] == "step"]
        assert steps == sorted(set(steps)) and set(steps) <= set(seqs)
    s = json.loads((out / "summary.json").read_text())
    assert target <= s["samples"] < target + BATCH and s["epochs_done"] >= EPOCHS  # the whole run, once
    assert s["steps"] == len(updates) and s["train_time_s"] > saved["clock"] and s["wall_time_s"] >= s["train_time_s"]
    assert [x["cause"] for x in s["restarts"]] == ["resumed (--resume)"]
