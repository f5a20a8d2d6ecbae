"""Bootstrap intervals (components/evaluation/intervals.py) and their use by evaluate: the
interval of a proportion against the binomial one, a paired difference of a run with itself
is exactly 0, pairing narrows a difference of two correlated runs, margins resample by image."""

from __future__ import annotations

import numpy as np
import pytest

from components.evaluation.intervals import (
    binomial_interval,
    fmt,
    margin_interval,
    mean_interval,
    paired_margin_difference,
    paired_mean_difference,
)


@pytest.mark.parametrize("p,n", [(0.3, 2000), (0.85, 5000), (0.5, 400)])
def test_a_proportions_interval_matches_the_binomial_one(p: float, n: int) -> None:
    hits = np.zeros(n)
    hits[: round(p * n)] = 1
    iv = mean_interval(hits)
    low, high = binomial_interval(p, n)
    assert iv.value == pytest.approx(p)
    half = (high - low) / 2
    assert iv.low == pytest.approx(low, abs=0.15 * half)
    assert iv.high == pytest.approx(high, abs=0.15 * half)
    assert iv.se == pytest.approx(np.sqrt(p * (1 - p) / n), rel=0.1)


def test_a_run_against_itself_differs_by_exactly_zero() -> None:
    rng = np.random.default_rng(1)
    hits = rng.random(500) < 0.7
    d = paired_mean_difference(hits, hits)
    assert (d.value, d.low, d.high, d.se) == (0.0, 0.0, 0.0, 0.0)
    t, n = rng.normal(0.8, 0.1, 500), rng.normal(0.5, 0.1, 500)
    m = paired_margin_difference((t, n), (t, n))
    assert (m.value, m.low, m.high) == (0.0, 0.0, 0.0)
    assert not d.excludes_zero()


def test_pairing_sees_a_small_consistent_gain_that_unpaired_intervals_miss() -> None:
    """Run B gets right everything A does plus 2 % more images: the unpaired intervals
    overlap, the paired difference excludes 0."""
    rng = np.random.default_rng(2)
    a = rng.random(3000) < 0.6
    b = a.copy()
    b[np.flatnonzero(~a)[:60]] = True
    ia, ib = mean_interval(a), mean_interval(b)
    assert ia.high > ib.low  # overlapping
    d = paired_mean_difference(b, a)
    assert d.value == pytest.approx(0.02) and d.excludes_zero() and d.low > 0.01
    with pytest.raises(ValueError, match="the same images: 3000 vs 10 values"):
        paired_mean_difference(a, a[:10])


def test_margin_interval_and_edge_cases() -> None:
    rng = np.random.default_rng(3)
    t, n = rng.normal(0.8, 0.05, 1000), rng.normal(0.6, 0.05, 1000)
    iv = margin_interval(t, n)
    assert iv.value == pytest.approx(np.median(t) - np.median(n))
    assert iv.low < iv.value < iv.high and iv.high - iv.low < 0.02
    const = mean_interval(np.ones(50))  # every image right: no spread to resample
    assert (const.value, const.low, const.high, const.se) == (1.0, 1.0, 1.0, 0.0)
    assert fmt(mean_interval(np.array([]))) == "—"
    assert fmt(const) == "100.0 [100.0, 100.0]"
