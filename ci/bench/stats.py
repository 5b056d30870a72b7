"""A/B statistics of benchmark timings: ratio of medians, its bootstrap interval, verdict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.99  # 44 benchmarks at 95% would give about two false verdicts a comparison
RESAMPLES = 4000
REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"


Runs = tuple[tuple[float, ...], ...]  # each run's rounds, in seconds


@dataclass(frozen=True)
class Comparison:
    """One benchmark's timings on both builds: the rounds of each interleaved run."""

    name: str
    baseline: Runs
    candidate: Runs
    ratio: float  # median(candidate) / median(baseline), rounds pooled: above 1 is slower
    low: float  # the ratio's confidence interval
    high: float
    verdict: str

    @property
    def baseline_median(self) -> float:
        return float(np.median(np.concatenate(self.baseline)))

    @property
    def candidate_median(self) -> float:
        return float(np.median(np.concatenate(self.candidate)))


def _bootstrap_medians(runs: Runs, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``RESAMPLES`` two-level resamples: runs with replacement, then each
    picked run's rounds with replacement. Rounds of one run share that run's state of the
    machine, so the runs, not the rounds, are the independent samples."""
    arrays = [np.asarray(run) for run in runs]
    medians = np.empty(RESAMPLES)
    for index in range(RESAMPLES):
        picked = (arrays[i] for i in rng.integers(0, len(arrays), len(arrays)))
        medians[index] = np.median(
            np.concatenate([run[rng.integers(0, run.size, run.size)] for run in picked])
        )
    return medians


def ratio_interval(baseline: Runs, candidate: Runs, seed: int = 0) -> tuple[float, float, float]:
    """median(candidate) / median(baseline) over all rounds, and its two-level bootstrap
    interval at ``CONFIDENCE`` (seeded: the same timings give the same interval)."""
    if not all(baseline) or not all(candidate) or not baseline or not candidate:
        raise ValueError("both sides need at least one run of at least one timing")
    rng = np.random.default_rng(seed)
    ratios = _bootstrap_medians(candidate, rng) / _bootstrap_medians(baseline, rng)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    point = np.median(np.concatenate(candidate)) / np.median(np.concatenate(baseline))
    return float(point), float(low), float(high)


def compare(name: str, baseline: Runs, candidate: Runs, threshold: float) -> Comparison:
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
    return Comparison(name, baseline, candidate, ratio, low, high, verdict)
