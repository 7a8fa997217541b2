"""Paired differences between cells of one `omnilearn bench` folder, across its modes.

    python scripts/paired_runs.py DIR --cells asp-push/dynamic asp-reference/dynamic asp-reference/uniform \
        --levels HL8 HL1

For each level and seed, every named cell's run (DIR/<mode>/<level>/<policy>/seed-<s>) is read: its final
held-out metric, and its metric at equal time (its last evaluation at or before the end of the quickest of
the named runs of that seed and level). Printed: each cell's mean, then every pair's difference paired by
seed, mean ± the standard error of the paired difference. The metric is perplexity where the runs record
it, else accuracy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path


def evaluations(run: Path) -> list[dict]:
    """A run's evaluation records, in order (the ASP server's snapshots, or a BSP run's rank 0)."""
    eval_file = run / "metrics" / "eval.jsonl"
    source = eval_file if eval_file.is_file() else run / "metrics" / "rank-0.jsonl"
    return [r for r in map(json.loads, source.read_text().splitlines()) if r.get("kind") == "eval"]


def metric(record: dict) -> float:
    return record["perplexity"] if record.get("perplexity") is not None else record["accuracy"]


def mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):+.3f} ± {se:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cells", nargs="+", required=True, help="mode/policy")
    parser.add_argument("--levels", nargs="+", required=True)
    args = parser.parse_args()
    for level in args.levels:
        finals: dict[str, list[float]] = {c: [] for c in args.cells}
        equal: dict[str, list[float]] = {c: [] for c in args.cells}
        seeds = sorted(p.name for p in (args.folder / args.cells[0].split("/")[0] / level
                                        / args.cells[0].split("/")[1]).glob("seed-*"))
        for seed in seeds:
            runs = {c: evaluations(args.folder / c.split("/")[0] / level / c.split("/")[1] / seed) for c in args.cells}
            end = min(r[-1]["elapsed_s"] for r in runs.values())
            for c, r in runs.items():
                finals[c].append(metric(r[-1]))
                equal[c].append(metric([e for e in r if e["elapsed_s"] <= end + 1e-9][-1]))
        print(f"{level} ({len(seeds)} seeds)")
        for c in args.cells:
            print(f"  {c}: final {mean_se(finals[c])}, at equal time {statistics.fmean(equal[c]):.3f}")
        for a, b in itertools.combinations(args.cells, 2):
            df = [x - y for x, y in zip(finals[a], finals[b], strict=True)]
            de = [x - y for x, y in zip(equal[a], equal[b], strict=True)]
            print(f"  {a} - {b}: final {mean_se(df)}, at equal time {mean_se(de)}")


if __name__ == "__main__":
    main()
