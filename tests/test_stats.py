"""Timing statistics: summaries against direct computation, and the bootstrap CI of a ratio of
medians covering a known ratio about 95% of the time (and rarely covering a wrong one)."""

from __future__ import annotations

import numpy as np
import pytest

from audit.evidence.stats import bootstrap_ratio_ci, summarize


def test_summary_of_known_samples():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.min, s.max, s.mean) == (5, 3.0, 1.0, 5.0, 3.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    assert s.samples == [5.0, 1.0, 3.0, 2.0, 4.0]  # raw samples kept, in the order taken
    assert s.to_dict()["iqr"] == 2.0
    with pytest.raises(ValueError):
        summarize([])


def test_bootstrap_is_seeded_and_brackets_the_point_estimate():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(1.0, 0.1, 20), rng.lognormal(0.3, 0.1, 20)
    one, two = bootstrap_ratio_ci(a, b, seed=5), bootstrap_ratio_ci(a, b, seed=5)
    assert (one.low, one.high) == (two.low, two.high)
    assert one.low <= one.ratio <= one.high
    assert one.ratio == pytest.approx(np.median(a) / np.median(b))


def _coverage(true_ratio: float, tested: float, n: int = 15, trials: int = 400) -> float:
    hits = 0
    for t in range(trials):
        rng = np.random.default_rng(10_000 + t)
        base = rng.lognormal(0.0, 0.1, n)  # medians: 1.0 (lognormal, mu 0) and true_ratio
        slow = true_ratio * rng.lognormal(0.0, 0.1, n)
        ci = bootstrap_ratio_ci(slow, base, resamples=2000, seed=t)
        hits += ci.covers(tested)
    return hits / trials


def test_bootstrap_ci_covers_a_known_ratio_about_95_percent():
    cov = _coverage(2.0, 2.0)
    # 400 trials: binomial sd ~1.1%; the percentile bootstrap of a median is slightly off nominal.
    assert 0.90 <= cov <= 0.99, cov


def test_bootstrap_ci_rarely_covers_a_wrong_ratio():
    assert _coverage(2.0, 2.5) < 0.05  # 25% off: about 4 standard errors of the ratio
