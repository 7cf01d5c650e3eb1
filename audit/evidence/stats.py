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
    method: str = ("percentile bootstrap of the ratio of medians, samples resampled independently "
                   "per backend")

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "ci_low": self.low, "ci_high": self.high,
                "confidence": self.confidence, "resamples": self.resamples, "seed": self.seed,
                "method": self.method}


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


def bootstrap_total_ratio_ci(ref_parts, core_parts, confidence: float = 0.95, resamples: int = 4000,
                             seed: int = 0) -> RatioCI:
    """Speedup of a job made of summed parts (the DiT steps, the VAE decode): each part is a list
    of samples and `(samples, "sum" | "median")` says how it adds to the job's time (the steps sum,
    the repeated decode counts once, as its median). Every sample set is resampled on its own.

    ratio = total(ref_parts) / total(core_parts).
    """
    if not (0 < confidence < 1):
        raise ValueError("bootstrap_total_ratio_ci: confidence must be in (0, 1)")
    rng = np.random.default_rng(seed)

    def totals(parts):
        point, boot = 0.0, np.zeros(resamples)
        for samples, how in parts:
            x = np.asarray(list(samples), dtype=np.float64)
            if x.size == 0:
                raise ValueError("bootstrap_total_ratio_ci: empty sample")
            if how not in ("sum", "median"):
                raise ValueError(f"bootstrap_total_ratio_ci: unknown part kind {how!r}")
            pick = x[rng.integers(0, x.size, size=(resamples, x.size))]
            point += float(x.sum() if how == "sum" else np.median(x))
            boot += pick.sum(axis=1) if how == "sum" else np.median(pick, axis=1)
        return point, boot

    ref_point, ref_boot = totals(ref_parts)
    core_point, core_boot = totals(core_parts)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(ref_boot / core_boot, [100 * alpha, 100 * (1 - alpha)])
    return RatioCI(ref_point / core_point, float(low), float(high), confidence, resamples, seed,
                   "percentile bootstrap of the ratio of job times (steps summed, the decode's "
                   "median added), every sample set resampled independently")
