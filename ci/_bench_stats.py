"""A/B statistics of benchmark timings: ratio of medians, its bootstrap interval, verdict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000
REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"


@dataclass(frozen=True)
class Comparison:
    """One benchmark's timings on both builds, pooled over the interleaved runs."""

    name: str
    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    ratio: float  # median(candidate) / median(baseline): above 1 is slower
    low: float  # the ratio's confidence interval
    high: float
    verdict: str

    @property
    def baseline_median(self) -> float:
        return float(np.median(self.baseline))

    @property
    def candidate_median(self) -> float:
        return float(np.median(self.candidate))


def ratio_interval(
    baseline: list[float], candidate: list[float], seed: int = 0
) -> tuple[float, float, float]:
    """median(candidate) / median(baseline) and its percentile-bootstrap interval at
    ``CONFIDENCE``, each side resampled on its own (seeded: the same data give the same
    interval)."""
    if not baseline or not candidate:
        raise ValueError("both sides need at least one timing")
    a, b = np.asarray(baseline), np.asarray(candidate)
    rng = np.random.default_rng(seed)
    a_medians = np.median(a[rng.integers(0, a.size, (RESAMPLES, a.size))], axis=1)
    b_medians = np.median(b[rng.integers(0, b.size, (RESAMPLES, b.size))], axis=1)
    ratios = b_medians / a_medians
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.median(b) / np.median(a)), float(low), float(high)


def compare(
    name: str, baseline: list[float], candidate: list[float], threshold: float
) -> Comparison:
    """The comparison of one benchmark: a regression when even the interval's lower bound
    exceeds ``threshold`` (e.g. 1.05), an improvement when its upper bound is below
    ``1 / threshold``."""
    if threshold < 1:
        raise ValueError(f"the threshold is a slowdown ratio of at least 1, got {threshold}")
    ratio, low, high = ratio_interval(baseline, candidate)
    verdict = UNCHANGED
    if low > threshold:
        verdict = REGRESSION
    elif high < 1 / threshold:
        verdict = IMPROVEMENT
    return Comparison(name, tuple(baseline), tuple(candidate), ratio, low, high, verdict)
