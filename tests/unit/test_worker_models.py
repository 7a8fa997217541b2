"""Per-worker models ``t = c_i (b + k)`` fitted over several runs, and the ideal and fidelity they give.

Step records are generated here from known ``c_i`` and ``k`` (log-normal noise, a few outliers), in
the trainers' record format; the run folders for :func:`compare` and the bench's rows are written
like ``tests/test_simulate.py``'s, no process is started.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from omnilearn import config
from omnilearn.control.fixed_cost import ONE_K, PER_KIND
from omnilearn.emulator.spec.plan import build_plan
from omnilearn.jobfile import JobSpec, new_job_id
from omnilearn.metrics import MetricsWriter, metrics_path
from omnilearn.report.fidelity import level_speeds
from omnilearn.report.ideal import balanced_time, describe_source, expected_slowest, group_ideal
from omnilearn.report.results import build_rows
from omnilearn.report.summary import compare, summarize
from omnilearn.report.worker_models import fit_worker_models

C = [0.004, 0.002, 0.001]  # seconds per sample of worker1..3 at level SKEW: 1 : 2 : 4
K = 8.0  # the workload's fixed cost, samples
B = 96
SYNC_S = 0.010
STEPS = 30  # 3 epochs of 10
UNIFORM = [[32, 32, 32]] * STEPS
STATIC = [[14, 27, 55]] * STEPS  # by CPU share 1:2:4, blind to k
DYNAMIC = [[32, 32, 32]] * 4 + [[20, 30, 46]] * 8 + [[10, 27, 59]] * 18  # two decisions
BALANCED = [[9, 26, 61]] * STEPS  # b_i + 8 in proportion to 1 / c_i: 9.14, 26.29, 60.57, in integers


def step_times(batch: list[int], c: list[float], k: float | list[float], rng: random.Random, noise: float,
               outliers: float = 0.0) -> list[float]:
    out = []
    ks = [k] * len(c) if isinstance(k, float) else k
    for b, ci, ki in zip(batch, c, ks, strict=True):
        t = ci * (b + ki) * (rng.lognormvariate(0.0, noise) if noise else 1.0)
        out.append(t * 5 if rng.random() < outliers else t)
    return out


def records(splits: list[list[int]], c: list[float] = C, k: float | list[float] = K, noise: float = 0.0, seed: int = 0,
            outliers: float = 0.0, fixed: float | None = None, transient: tuple[int, int, float] | None = None,
            threads: list[int] | None = None) -> list[list[dict[str, Any]]]:
    """Per-rank step records of one BSP run (``k``: one for all, or each rank's); ``fixed``: every step
    takes that long, whatever the batch; ``transient``: (rank, steps, factor): that rank's first steps
    take ``factor`` times as long; ``threads``: each rank's threads, in every step (None: not reported)."""
    rng = random.Random(seed)
    per_rank: list[list[dict[str, Any]]] = [[] for _ in c]
    clock = 100.0
    for j, batch in enumerate(splits):
        times = [fixed] * len(c) if fixed is not None else step_times(batch, c, k, rng, noise, outliers)
        if transient is not None and j < transient[1]:
            times[transient[0]] *= transient[2]
        clock += max(times) + SYNC_S
        for r, steps in enumerate(per_rank):
            steps.append({"kind": "step", "step": j + 1, "epoch": j // 10, "batch": batch[r], "global_batch": sum(batch),
                          "compute_ms": times[r] * 1e3, "sync_ms": (max(times) - times[r] + SYNC_S) * 1e3,
                          "level": "SKEW", "time": clock, **({} if threads is None else {"threads": threads[r]})})
    return per_rank


def test_the_fit_over_three_runs_recovers_c_and_k() -> None:
    runs = [records(s, noise=0.05, seed=i, outliers=0.03) for i, s in enumerate([UNIFORM, STATIC, DYNAMIC])]
    models = fit_worker_models(runs, ["uniform", "static", "dynamic"])
    assert models.k_status == "fitted" and models.k_se is not None
    # 5% noise on ~80 steps per worker: k within 25% (and within 4 of its standard errors), c within 5%
    assert models.k == pytest.approx(K, rel=0.25) and abs(models.k - K) < 4 * models.k_se
    assert models.k_se < K / 2
    for rank, c in enumerate(C):
        assert models.c[(rank, "SKEW")] == pytest.approx(c, rel=0.05)
    assert [r["run"] for r in models.runs] == ["uniform", "static", "dynamic"]
    assert models.runs[2]["steps"] == STEPS - 2  # the first step after each of the two decisions left out


def test_exact_times_give_the_exact_model() -> None:
    models = fit_worker_models([records(UNIFORM), records(STATIC)])
    assert models.k == pytest.approx(K, rel=1e-6)
    assert all(models.c[(r, "SKEW")] == pytest.approx(c, rel=1e-6) for r, c in enumerate(C))


def test_one_batch_size_cannot_identify_k_and_says_so() -> None:
    models = fit_worker_models([records(UNIFORM, noise=0.05)])
    assert models.k == 0.0 and models.k_status == "not identified" and models.k_se is None
    # k = 0: c is the time per sample at the one batch
    assert models.c[(0, "SKEW")] == pytest.approx(C[0] * (32 + K) / 32, rel=0.05)


KINDS_K = [4.0, 4.0, 24.0]
"""Each rank's k: ranks 0 and 1 on one thread, rank 2 on two (a core on two threads has the larger k)."""
THREADS = [1, 1, 2]


def test_workers_of_two_kinds_get_each_kinds_k() -> None:
    """The fit tells the kinds apart by the threads the steps report, as the controller does; with the
    threads left out, one k for the job falls between the kinds' and misreads the two-thread worker."""
    runs = [records(s, k=KINDS_K, noise=0.03, seed=i, threads=THREADS) for i, s in enumerate([UNIFORM, STATIC, DYNAMIC])]
    models = fit_worker_models(runs, ["uniform", "static", "dynamic"])
    assert models.k_model == PER_KIND and models.k_why == "" and models.k_status == "fitted"
    by = {g["threads"]: g for g in models.k_by_kind}
    assert by[1]["workers"] == ["rank0@SKEW", "rank1@SKEW"] and by[2]["workers"] == ["rank2@SKEW"]
    for threads, k in ((1, 4.0), (2, 24.0)):
        assert by[threads]["k_status"] == "fitted" and abs(by[threads]["k"] - k) < 4 * by[threads]["k_se"]
        assert by[threads]["k"] == pytest.approx(k, rel=0.25)
    assert [models.k_of(r, "SKEW") for r in range(3)] == pytest.approx([by[1]["k"], by[1]["k"], by[2]["k"]], abs=1e-3)
    assert all(models.c[(r, "SKEW")] == pytest.approx(c, rel=0.05) for r, c in enumerate(C))
    assert models.time(2, "SKEW", 40) == pytest.approx(C[2] * (40 + 24), rel=0.05)
    # the job's k: the kinds' mean over their steps (two workers of one kind, one of the other)
    assert models.k == pytest.approx((2 * by[1]["k"] + by[2]["k"]) / 3, rel=1e-3)
    assert "one k per kind of worker: 1 thread k = " in describe_source(models.provenance())
    blind = fit_worker_models([[[{f: v for f, v in r.items() if f != "threads"} for r in steps] for steps in run]
                               for run in runs])
    assert blind.k_model == ONE_K and blind.k_why == "the workers do not report their kinds" and not blind.k_by_kind
    assert 4.0 < blind.k < 24.0 and blind.c[(2, "SKEW")] > 1.2 * C[2]


def test_a_kind_whose_k_the_data_cannot_tell_leaves_one_k_for_the_job() -> None:
    """The two-thread worker ran one batch size in every run: its kind's k is not told, so the fit takes
    one k for the job from the one-thread workers' moves, and says why."""
    splits = [[[32, 32, 32]] * STEPS, [[20, 44, 32]] * STEPS]
    models = fit_worker_models([records(s, k=KINDS_K, noise=0.02, seed=i, threads=THREADS) for i, s in enumerate(splits)])
    assert models.k_model == ONE_K and not models.k_by_kind
    assert models.k_why == "the data do not tell the k of 2 threads (not identified)"
    assert models.k_status == "fitted" and models.k == pytest.approx(4.0, rel=0.25)
    assert "one k for the job's workers (the data do not tell the k of 2 threads" in describe_source(models.provenance())


def test_the_balanced_split_takes_each_workers_k() -> None:
    """``b_i + k_i`` in proportion to ``1 / c_i``: 96 + 32 samples split 1 : 2 : 4, every worker's time
    equal; one k given for every worker is the one k, to the bit."""
    c, k = [0.004, 0.002, 0.001], [4.0, 4.0, 24.0]
    assert balanced_time(c, k, 96, 1, 96) == pytest.approx(0.004 * 128 / 7, rel=1e-12)
    assert balanced_time(c, [K] * 3, 96, 1, 96) == balanced_time(c, K, 96, 1, 96)


def test_a_job_whose_time_does_not_grow_with_its_batch_is_not_a_40_to_1_host() -> None:
    """Equal workers, every step 0.5 s whatever its batch; a controller moved the batches to 78:2."""
    splits = [[40, 40]] * 4 + [[78, 2]] * 26
    speeds = level_speeds(records(splits, c=[1.0, 1.0], fixed=0.5))["SKEW"]
    assert speeds["k_status"] == "upper bound"
    assert speeds["measured_ratio"] == pytest.approx(1.0, abs=0.01)
    assert speeds["measured_ratio_raw"] > 30  # b / t at their own batches: the ratio of the batches
    # read at the mean local batch: 40 samples in 0.5 s, what the job can reach
    assert speeds["samples_per_s"] == pytest.approx([80.0, 80.0], rel=0.01)


def test_level_speeds_read_the_models_at_the_mean_local_batch() -> None:
    speeds = level_speeds(records(DYNAMIC, noise=0.02, seed=3))["SKEW"]
    assert speeds["speed_batch"] == pytest.approx(32)
    want = [32 / (c * (32 + K)) for c in C]
    assert speeds["samples_per_s"] == pytest.approx(want, rel=0.1)
    assert speeds["measured_ratio"] == pytest.approx(4.0, rel=0.1)


def make_run(folder: Path, policy: str, splits: list[list[int]], noise: float, seed: int,
             transient: tuple[int, int, float] | None = None, k: float | list[float] = K,
             threads: tuple[int, ...] = (1, 1, 1)) -> Path:
    """A finished 3-worker BSP run folder of ``policy`` whose steps ran ``splits`` (``k``: one for all, or
    each rank's; ``threads``: each rank's)."""
    cfg = config.build(None, [("workers", 3), ("model.name", "smallcnn"), ("data.name", "synthetic"),
                              ("data.synthetic_size", B * 10), ("train.epochs", 3), ("train.global_batch", B),
                              ("control.policy", policy), ("emulation.allocation", "quota"),
                              ("emulation.hl", "SKEW"), ("emulation.levels", {"SKEW": [0.5, 1.0, 2.0]})])
    job = JobSpec(job_id=new_job_id(), config=cfg, plan=build_plan(cfg, host=[0, 1]), out_dir=folder,
                  backend="synthetic")
    job.save()
    steps = records(splits, k=k, noise=noise, seed=seed, transient=transient)
    start, end = 100.0, steps[0][-1]["time"]
    for r in range(3):
        w = MetricsWriter(metrics_path(folder, r))
        w.write("start", rank=r, world=3, target=f"worker{r + 1}", policy="uniform", params=1000,
                train_samples=B * 10, steps_per_epoch=10, time=start)
        w.write("hl_change", step=0, from_level=None, level="SKEW", epoch=0.0, status="applied", time=start)
        w.write("batch_change", step=0, batch=splits[0], reason="initial", time=start)
        for rec in steps[r]:
            w.write("step", **{f: v for f, v in rec.items() if f != "kind"}, cpus=[0.5, 1.0, 2.0][r], threads=threads[r])
        if r == 0:
            w.write("eval", epoch=3, step=STEPS, accuracy=0.5, loss=1.0, elapsed_s=end - start, time=end)
        w.write("end", wall_time_s=end - start + 1.0, train_time_s=end - start, samples=B * STEPS, steps=STEPS,
                batch=splits[-1], level="SKEW", epochs=3.0, time=end + 1.0)
        w.close()
    summarize(folder)
    return folder


POLICIES = {"uniform": UNIFORM, "static": STATIC, "dynamic": BALANCED}


@pytest.fixture(params=[0.0, 0.04], ids=["exact", "noisy"])
def group(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, Path], float]:
    noise = request.param
    runs = {p: make_run(tmp_path / "seed-1" / p, p, s, noise, i) for i, (p, s) in enumerate(POLICIES.items())}
    return tmp_path, runs, noise


def test_a_balanced_policy_gets_all_of_the_ideal_and_never_more(group: tuple[Path, dict[str, Path], float]) -> None:
    out, runs, noise = group
    result = compare(out, runs)
    balanced = result["policies"]["dynamic"]["fraction_of_ideal"]
    # exact times: the integer split is 1% off the real-number balance; noise makes the slowest of three
    # equal workers slower on each step (the max of three noisy times), never faster on the whole
    assert 0.97 <= balanced <= 1.0 + 1e-3 if noise == 0 else 0.9 <= balanced <= 1.02, result
    assert result["policies"]["static"]["fraction_of_ideal"] < balanced
    source = result["ideal_from"]
    assert [r["run"] for r in source["runs"]] == ["uniform", "static", "dynamic"]
    assert source["reference"] == "uniform" and source["reference_steps"] == STEPS
    assert source["k_status"] == "fitted" and source["k"] == pytest.approx(K, rel=0.25)
    assert result["ideal_speedup_uniform_run"] and result["ideal_compute_speedup_uniform_run"]
    # the fidelity table's speeds come from the same models: the workers are 1 : 2 : 4; the balanced
    # run alone ran one batch per worker, cannot tell k and reads its batches' ratio into the speeds
    assert result["level_speeds"]["SKEW"]["measured_ratio"] == pytest.approx(4.0, rel=0.05)
    alone = result["runs"]["dynamic"]["level_speeds"]["SKEW"]
    synthetic = alone["measured_ratio"]  # from the records written above, not from this host
    assert alone["k_status"] == "not identified" and synthetic > 6
    # a compare's settle records are balanced under the group's k; each run's own summary under its own fit
    grouped = result["runs"]["dynamic"]["settle_k"]
    assert grouped["runs"] == ["uniform", "static", "dynamic"] and grouped["fitted"] == source["k"]
    assert grouped["k"] == pytest.approx(max(source["k"] - 2 * source["k_se"], 0.0), abs=1e-3)
    own = json.loads((runs["dynamic"] / "summary.json").read_text())["settle_k"]
    assert own["k"] == 0.0 and own["k_status"] == "not identified" and own["runs"] == ["this run"]
    written = json.loads((out / "compare.json").read_text())
    assert written["ideal_speedup"] == result["ideal_speedup"]
    assert "fraction_of_ideal_uniform_run" in written["policies"]["static"]


def test_every_policy_of_a_group_is_judged_against_the_same_ideal(group: tuple[Path, dict[str, Path], float]) -> None:
    out, runs, _ = group
    cells = [{"mode": "bsp", "group": "SKEW", "policy": p, "seed": 1, "path": f"seed-1/{p}"} for p in runs]
    rows = build_rows(out, cells)
    ideals = {r["ideal_speedup"] for r in rows}
    assert len(ideals) == 1 and None not in ideals
    assert {r["ideal_from"] for r in rows} == {"uniform+static+dynamic"}
    # the same runs in another order give the same models and the same ideal
    again = group_ideal(dict(reversed(list(runs.items()))))
    assert again is not None and again["ideal_speedup"] == pytest.approx(ideals.pop(), abs=1e-4)
    by = {r["policy"]: r for r in rows}
    assert by["dynamic"]["fraction_of_ideal"] <= 1.02
    assert by["uniform"]["ideal_speedup_uniform_run"] == by["static"]["ideal_speedup_uniform_run"]


def test_a_run_balanced_for_two_kinds_of_worker_gets_all_of_the_ideal_and_never_more(tmp_path: Path) -> None:
    """The two-thread worker's step costs 24 samples, the others' 4 (exact times): the policy that split
    the batch for those ks reaches the ideal up to its integer split. One k for the job (5.7, between
    the kinds') would make the ideal 1.78x, which that policy beats (1.03 of it)."""
    splits = {"uniform": UNIFORM, "static": STATIC, "dynamic": [[14, 33, 49]] * STEPS}  # b_i + k_i: 1 : 2 : 4
    runs = {p: make_run(tmp_path / p, p, s, 0.0, i, k=KINDS_K, threads=tuple(THREADS))
            for i, (p, s) in enumerate(splits.items())}
    result = compare(tmp_path, runs)
    assert result["ideal_from"]["k_model"] == PER_KIND
    assert [g["k"] for g in result["ideal_from"]["k_by_kind"]] == pytest.approx([4.0, 24.0], abs=1e-3)
    assert 0.98 <= result["policies"]["dynamic"]["fraction_of_ideal"] <= 1.0 + 1e-3, result
    # 96 + 32 samples split 1 : 2 : 4 in b + k: the slowest worker's 128 / 7 samples at 4 ms against 36 at uniform
    assert result["ideal_compute_speedup"] == pytest.approx(0.004 * 36 / (0.004 * 128 / 7), rel=1e-3)


def test_a_transient_in_the_uniform_run_moves_the_old_figure_not_the_ideal(tmp_path: Path) -> None:
    """The fastest worker of the uniform run is 3x slower over its first 12 steps (a busy host): uniform's
    time is the slowest worker's and does not change, but the heterogeneity its speeds show does. The
    ideal from uniform's speeds alone drops, and the balanced policy beats it; the models fitted over
    all three runs (medians per batch size) see through the transient."""
    runs = {"uniform": make_run(tmp_path / "uniform", "uniform", UNIFORM, 0.02, 0, transient=(2, 12, 3.0)),
            "static": make_run(tmp_path / "static", "static", STATIC, 0.02, 1),
            "dynamic": make_run(tmp_path / "dynamic", "dynamic", BALANCED, 0.02, 2)}
    result = compare(tmp_path, runs)
    balanced = result["policies"]["dynamic"]
    assert balanced["fraction_of_ideal_uniform_run"] > 1.05, result
    assert 0.9 <= balanced["fraction_of_ideal"] <= 1.02, result


def test_each_workers_own_scatter_leaves_the_hosts_out() -> None:
    """A host that slows whole steps (sd 0.3, every worker alike) is no worker's scatter; a worker that
    scatters on its own (sd 0.2 against 0.02) is told apart."""
    rng = random.Random(4)
    runs = [records(s, noise=0.02, seed=i) for i, s in enumerate([UNIFORM, STATIC])]
    for per_rank in runs:
        for j in range(len(per_rank[0])):
            host = rng.lognormvariate(0.0, 0.3)
            for r, steps in enumerate(per_rank):
                steps[j]["compute_ms"] *= host * (rng.lognormvariate(0.0, 0.2) if r == 2 else 1.0)
    spread = fit_worker_models(runs).spread
    assert spread[(2, "SKEW")] == pytest.approx(0.2, rel=0.35)
    assert spread[(0, "SKEW")] < 0.06 and spread[(1, "SKEW")] < 0.06, spread


def test_the_slowest_of_noisy_times_is_their_expected_maximum() -> None:
    """The integral behind the ideal at the workers' scatter gives what a Monte Carlo of the step gives;
    no scatter, the slowest time."""
    gen = random.Random(5)
    times, sd = [0.070, 0.060, 0.064, 0.062], [0.02, 0.3, 0.05, 0.1]
    draws = [max(t * gen.lognormvariate(0.0, s) for t, s in zip(times, sd, strict=True)) for _ in range(100_000)]
    assert expected_slowest(times, sd) == pytest.approx(sum(draws) / len(draws), rel=3e-3)
    assert expected_slowest(times, [0.0] * 4) == pytest.approx(0.070, rel=1e-4)


def test_a_balanced_run_reaches_the_ideal_at_its_workers_scatter(tmp_path: Path) -> None:
    """Every step of a balanced run waits for the slowest of three noisy times (sd 0.04 each): it falls
    short of the ideal without scatter and reaches the ideal with it."""
    runs = {p: make_run(tmp_path / p, p, s, 0.04, i) for i, (p, s) in enumerate(POLICIES.items())}
    result = compare(tmp_path, runs)
    balanced = result["policies"]["dynamic"]
    assert result["ideal_speedup_at_scatter"] < result["ideal_speedup"]
    assert balanced["fraction_of_ideal"] < balanced["fraction_of_ideal_at_scatter"]
    assert 0.97 <= balanced["fraction_of_ideal_at_scatter"] <= 1.03, result


def test_omnilearn_report_redoes_a_compare_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``omnilearn report OUT`` on a ``--compare`` folder recomputes its ``compare.json`` from the runs
    (an older record lacks a figure) and prints it; a compare whose run folder is gone is refused by name."""
    import argparse

    from omnilearn.cli.manage import cmd_report
    from omnilearn.errors import UserError

    runs = {p: make_run(tmp_path / p, p, s, 0.02, i) for i, (p, s) in enumerate(POLICIES.items())}
    old = compare(tmp_path, runs)
    del old["ideal_speedup_at_scatter"]
    (tmp_path / "compare.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert cmd_report(argparse.Namespace(out=str(tmp_path))) == 0
    again = json.loads((tmp_path / "compare.json").read_text())
    assert list(again["runs"]) == ["uniform", "static", "dynamic"] and again["ideal_speedup_at_scatter"]
    assert "speed-up of dynamic over uniform" in capsys.readouterr().out
    (runs["static"] / "job.json").unlink()
    with pytest.raises(UserError, match="static"):
        cmd_report(argparse.Namespace(out=str(tmp_path)))


def _start_up(sizes: list[int], times_ms: list[float]) -> dict:
    return {"kind": "start_up", "sizes": sizes, "times_ms": times_ms, "cpu": False, "level": "HL8"}


def test_start_up_k_from_every_workers_two_sizes() -> None:
    from omnilearn.report.worker_models import start_up_k

    lines = [(0.010, 3.0), (0.0025, 3.0)]  # (c, k): every worker's t = c (b + k)
    per_rank = [[_start_up([8, 16], [c * (b + k) * 1e3 for b in (8, 16)])] for c, k in lines]
    fit = start_up_k(per_rank)
    assert fit is not None and fit.k == pytest.approx(3.0, rel=1e-6)
    assert start_up_k([per_rank[0], []]) is None  # one worker without a pass: nothing told
    flat = [[_start_up([8, 16], [5.0, 5.0])] for _ in range(2)]
    assert start_up_k(flat) is None  # time does not grow with the batch: k at its upper bound, no reading
