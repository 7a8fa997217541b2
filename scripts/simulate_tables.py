"""The simulator's two tables from finished ``omnilearn run --hl HLk --compare`` folders.

    python scripts/simulate_tables.py RUNS_DIR OUT_DIR

RUNS_DIR holds one compare folder per level (RUNS_DIR/HL2/{uniform,dynamic}, ...). Prints, as
Markdown: predicted against measured seconds per epoch of every run (each run replayed from its own
measurements, and each policy predicted from the other policy's run), then the simulated speed-up of
dynamic over uniform against the number of workers (both policies replayed from the dynamic run's
models, which saw several batch sizes per worker).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omnilearn.simulate import simulate

WORKERS = (4, 8, 16, 32, 100, 1000)


def main(runs: Path, out: Path) -> None:
    levels = sorted(p.name for p in runs.iterdir() if (p / "dynamic" / "summary.json").is_file())
    print("| level | policy | measured s/epoch | predicted from itself | error | predicted from the other policy's run | error |")
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        for policy, other in (("uniform", "dynamic"), ("dynamic", "uniform")):
            real = json.loads((runs / level / policy / "summary.json").read_text())
            measured = real["train_time_s"] / real["epochs_done"]
            own = simulate(runs / level / policy, out / level / f"{policy}-self", figures=False)["epoch_time_s"]
            cross = simulate(runs / level / other, out / level / f"{policy}-from-{other}", policy=policy,
                             figures=False)["epoch_time_s"]
            print(f"| {level} | {policy} | {measured:.2f} | {own:.2f} | {own / measured - 1:+.1%} | {cross:.2f} | "
                  f"{cross / measured - 1:+.1%} |")
    print()
    print("| level | " + " | ".join(f"N={n}" for n in WORKERS) + " |")
    print("|---|" + "---|" * len(WORKERS))
    decision = {}
    for level in levels:
        cells = []
        for n in WORKERS:
            u = simulate(runs / level / "dynamic", out / level / f"n{n}-uniform", workers=n, policy="uniform",
                         figures=False)
            d = simulate(runs / level / "dynamic", out / level / f"n{n}-dynamic", workers=n, figures=False)
            cells.append(f"{d['samples_per_s'] / u['samples_per_s']:.2f}x")
            decision[(level, n)] = d["decision_ms"]
        print(f"| {level} | " + " | ".join(cells) + " |")
    print()
    print("controller decision, mean ms: " + ", ".join(f"{lv} N={n}: {ms}" for (lv, n), ms in decision.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
