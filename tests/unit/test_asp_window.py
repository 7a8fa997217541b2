"""The ASP controller's windows: what they keep up to date push by push equals the plain computation, bit for bit."""

from __future__ import annotations

import math
import statistics

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from omnilearn.control.asp_window import ScatterPool, Worker, median_sorted, pooled_medians, shrunk

# A worker's life: each event records a time at a batch, restarts its window, or changes k.
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("record"), st.sampled_from([2, 3, 8, 16]), st.floats(1e-3, 2.0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0.0)),
    st.tuples(st.just("k"), st.just(0), st.floats(0.0, 20.0)),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(EVENTS)
def test_a_workers_window_reads_as_its_times(events: list[tuple[str, int, float]]) -> None:
    w, k = Worker(5), 1.0
    for kind, batch, x in events:
        if kind == "record":
            w.record(batch, x)
        elif kind == "restart" and w.times:
            w.restart()
        elif kind == "k":
            k = x
        assert len(w.times) <= 5
        assert w.per_sample(k) == sorted(t / (b + k) for b, t in w.times)
        for b in (2, 3, 8, 16):
            assert w.only_batch(b) == all(bb == b for bb, _ in w.times)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([4, 8]), st.floats(1e-3, 2.0)), max_size=120))
def test_the_pooled_scatter_is_the_median_of_every_workers(pushes: list[tuple[int, int, float]]) -> None:
    workers = [Worker(6) for _ in range(6)]
    pool = ScatterPool(6)
    for i, b, t in pushes:
        if t > 1.9 and workers[i].times:
            workers[i].restart()  # a change of speed: the window keeps its last time
        workers[i].record(b, t)
        about = [x for w in workers for x in w.scatter()]
        assert pool.median(workers) == (float(np.median(about)) if len(about) >= 3 else None)


def test_the_median_of_a_sorted_list_is_statistics() -> None:
    for v in ([1.0], [1.0, 2.0], [0.5, 1.5, 4.0], [1.0, 1.0, 3.0, 7.0]):
        assert median_sorted(v) == statistics.median(v)


def test_shrinking_follows_numpys_variance() -> None:
    rng = np.random.default_rng(5)
    for n, unmeasured in [(n, u) for n in (3, 4, 9, 64) for u in (0, 1)]:
        x, var = rng.normal(size=n), rng.gamma(2.0, 0.01, size=n)
        var[:unmeasured] = np.inf
        known = np.isfinite(var)
        w = np.where(known, var[known].min() / var, 0.0)
        mean = float((w * np.where(known, x, 0.0)).sum() / w.sum())
        between = max(float(np.var(x[known], ddof=1) - var[known].mean()), 0.0)
        assert shrunk(x, var).tolist() == np.where(known, mean + between / (between + var) * (x - mean), mean).tolist()


def test_pooled_medians_of_short_and_empty_windows() -> None:
    samples = np.asarray([[1.0, 3.0, np.nan], [2.0, np.nan, np.nan], [np.nan] * 3])
    centres, within = pooled_medians(samples, 0.5, 1e-6)
    assert within == 2.0  # (1 - 2)² + (3 - 2)² over one degree of freedom
    assert math.isfinite(centres[2])  # no window: the others' mean
