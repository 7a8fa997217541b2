"""The fit of ``t = c (b + k)`` in :mod:`omnilearn.control.fixed_cost` that the report, the what-if and the
simulator's replay use (the controller's posterior is tested with its model, ``test_dynamic_controller``):
c profiled out, each kind's k from exact and from noisy times, and the k model it says it took."""

from __future__ import annotations

import numpy as np
import pytest

from omnilearn.control.fixed_cost import ONE_K, PER_KIND, Medians, fit_fixed_cost, profile_log_c

C = np.array([0.004, 0.002, 0.001, 0.003])  # seconds per sample of four workers, one level each
K = np.array([4.0, 4.0, 24.0, 24.0])  # workers 0-1 of one kind, 2-3 of another
BATCHES = [16, 24, 40]


def medians(noise: float = 0.0, batches: list[list[int]] | None = None, seed: int = 0) -> Medians:
    """Every worker timed 10 steps at each of its batches: the medians, the steps behind them, the scatter."""
    rng = np.random.default_rng(seed)
    rows, devs = [], []
    for j, (c, k) in enumerate(zip(C, K, strict=True)):
        for b in (batches[j] if batches else BATCHES):
            logs = np.log(c * (b + k)) + noise * rng.standard_normal(10)
            rows.append((j, b, float(np.median(logs)), 10))
            devs += [(j, x - float(np.median(logs))) for x in logs]
    return Medians(cell=np.array([r[0] for r in rows]), b=np.array([r[1] for r in rows], float),
                   log_t=np.array([r[2] for r in rows]), n=np.array([r[3] for r in rows], float),
                   dev=np.array([d[1] for d in devs]), dev_cell=np.array([d[0] for d in devs]), cells=len(C))


def test_c_profiled_out_is_each_workers_weighted_mean() -> None:
    """Every worker's log c at each k is the weighted mean of its ``log t - log(b + k)``: the many-worker
    form gives each worker's one-worker form; unit weights give the plain mean the ASP controller takes."""
    data, grid = medians(noise=0.1), np.array([0.0, 3.0, 50.0])
    weight = np.arange(1.0, len(data.b) + 1)
    together = profile_log_c(data.b, data.log_t, grid, weight, data.cell, data.cells)
    for j in range(data.cells):
        mine = data.cell == j
        alone = profile_log_c(data.b[mine], data.log_t[mine], grid, weight[mine])[0]
        assert together[j] == pytest.approx(alone, rel=1e-12)
        y = data.log_t[mine][:, None] - np.log(data.b[mine][:, None] + grid[None, :])
        assert np.array_equal(profile_log_c(data.b[mine], data.log_t[mine], grid)[0], y.mean(axis=0))
    # at the true k, exact times give the true c
    exact = medians()
    assert np.exp(exact.of([2]).profile(np.array([24.0]))[1][0, 0]) == pytest.approx(C[2], rel=1e-12)


def test_exact_times_give_each_kinds_k_and_c() -> None:
    fit = fit_fixed_cost(medians(), [(1.0,), (1.0,), (2.0,), (2.0,)], 128)
    assert fit.model == PER_KIND and fit.why == ""
    assert fit.k == pytest.approx(K, rel=1e-6) and np.exp(fit.log_c) == pytest.approx(C, rel=1e-6)
    assert {g: f.status for g, f in fit.fits.items()} == {(1.0,): "fitted", (2.0,): "fitted"}
    job = fit.mean(np.array([1.0, 1.0, 1.0, 1.0]))
    assert job.k == pytest.approx(14.0, rel=1e-6) and job.status == "fitted"


def test_noisy_times_give_each_kinds_k_within_its_standard_error() -> None:
    fit = fit_fixed_cost(medians(noise=0.03, seed=1), [(1.0,), (1.0,), (2.0,), (2.0,)], 128)
    assert fit.model == PER_KIND
    for kind, k in (((1.0,), 4.0), ((2.0,), 24.0)):
        f = fit.fits[kind]
        assert f.status == "fitted" and f.se is not None and abs(f.k - k) < 4 * f.se and f.se < k / 2


def test_one_k_where_the_kinds_cannot_each_be_told() -> None:
    """One kind, a kind not reported, or a kind whose workers each ran one batch size: one k for the job,
    and why where the workers are not all of one reported kind."""
    one = fit_fixed_cost(medians(), [(1.0,)] * 4, 128)
    assert one.model == ONE_K and one.why == "" and list(one.fits) == [None]
    unreported = fit_fixed_cost(medians(), [(1.0,), (1.0,), None, (2.0,)], 128)
    assert unreported.model == ONE_K and unreported.why == "not every worker reports its kind"
    still = fit_fixed_cost(medians(batches=[BATCHES, BATCHES, [32], [32]]), [(1.0,), (1.0,), (2.0,), (2.0,)], 128,
                           name=lambda g: f"{g[0]:g} threads")
    assert still.model == ONE_K and still.why == "the data do not tell the k of 2 threads (not identified)"
    # the one k is the moving workers' own; the others' c is read at the one batch they ran
    assert still.k == pytest.approx([4.0] * 4, rel=1e-6) and still.fits[None].status == "fitted"
    assert np.exp(still.log_c[2]) * (32 + 4.0) == pytest.approx(C[2] * (32 + 24.0), rel=1e-9)


def test_no_batch_spread_leaves_k_at_its_prior() -> None:
    fit = fit_fixed_cost(medians(batches=[[32]] * 4), [(1.0,)] * 4, 128)
    assert fit.fits[None].k == 0.0 and fit.fits[None].status == "not identified" and fit.fits[None].se is None
