"""Timing statistics: robust summaries and seeded percentile-bootstrap CIs of ratios of medians.

Pure Python + numpy; no torch. Used by bench and the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Summary:
    """Of one backend's raw samples (seconds or milliseconds, whatever was given)."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    samples: list[float] = field(default_factory=list)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_dict(self) -> dict:
        return {"n": self.n, "median": self.median, "q1": self.q1, "q3": self.q3,
                "iqr": self.iqr, "min": self.min, "max": self.max, "mean": self.mean,
                "samples": list(self.samples)}


def summarize(samples) -> Summary:
    x = np.asarray(list(samples), dtype=np.float64)
    if x.size == 0:
        raise ValueError("summarize: no samples")
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return Summary(int(x.size), float(med), float(q1), float(q3), float(x.min()), float(x.max()),
                   float(x.mean()), [float(v) for v in x])


@dataclass
class RatioCI:
    """ratio = median(numerator) / median(denominator), with a percentile-bootstrap interval."""

    ratio: float
    low: float
    high: float
    confidence: float
    resamples: int
    seed: int

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "ci_low": self.low, "ci_high": self.high,
                "confidence": self.confidence, "resamples": self.resamples, "seed": self.seed,
                "method": "percentile bootstrap of the ratio of medians, samples resampled "
                          "independently per backend"}


def bootstrap_ratio_ci(numerator, denominator, confidence: float = 0.95, resamples: int = 4000,
                       seed: int = 0) -> RatioCI:
    """Speedup of B over A is bootstrap_ratio_ci(times_A, times_B): median(A)/median(B)."""
    a = np.asarray(list(numerator), dtype=np.float64)
    b = np.asarray(list(denominator), dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_ratio_ci: empty sample")
    if not (0 < confidence < 1):
        raise ValueError("bootstrap_ratio_ci: confidence must be in (0, 1)")
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    ratios = ra / rb
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(ratios, [100 * alpha, 100 * (1 - alpha)])
    return RatioCI(float(np.median(a) / np.median(b)), float(low), float(high), confidence,
                   resamples, seed)
