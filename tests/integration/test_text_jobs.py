"""GPT-2 trained by a whole BSP job of two processes."""

from __future__ import annotations

from pathlib import Path


def test_gpt2_trains_in_bsp_with_two_processes(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "omnilearn", "run", "--config", "configs/gpt2.yaml", "--workers", "2",
                        "--epochs", "3", "--hl", "HL2", "--set", "data.max_bytes=40000", "--set", "data.seq_len=32",
                        "--set", "train.lr=0.003", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics" / "rank-0.jsonl").read_text().splitlines()
             if '"kind":"step"' in line]
    first, last = steps[0]["loss"], sum(st["loss"] for st in steps[-5:]) / 5
    assert first > 5.0 and last < first - 1.5, (first, last)
    assert s["final_perplexity"] is not None and s["final_perplexity"] < 60
    assert s["model"] == "gpt2" and sum(s["batch_sizes"]) == 128
