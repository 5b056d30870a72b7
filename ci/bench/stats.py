"""A/B statistics of benchmark timings: the ratio of the builds' typical run, its interval,
the verdict, and the smallest slowdown the comparison would have caught.

Runs are the independent samples: rounds of one run share that process's luck (memory
layout, where the scheduler put its ranks), so each run is summarised by its fastest round,
and the builds are compared on the logs of those run times with Welch's interval.

The fastest round, not the median: timing noise on a shared machine only ever adds time, and
the fastest of 20 rounds varied least from run to run of every summary measured (median,
mean, lower quartile; ``ci/bench/sample-report/README.md``). Its blind spot: a regression
that slows only some calls (an occasional stall) moves it less than the median.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

# Two-sided. The 60 default benchmarks in each of three comparisons of a build with itself
# should flag none: at 0.1% a side, about one comparison in six flags one, before the
# threshold.
CONFIDENCE = 0.998
POWER = 0.8  # the minimum detectable effect is the slowdown caught this often
REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"


Runs = tuple[tuple[float, ...], ...]  # each run's rounds, in seconds


@dataclass(frozen=True)
class Interval:
    """The candidate / baseline ratio of the builds' run times, its interval, and its noise."""

    ratio: float
    low: float
    high: float
    log_se: float  # standard error of the log ratio
    df: float  # Welch's degrees of freedom


@dataclass(frozen=True)
class Comparison:
    """One benchmark's timings on both builds: the rounds of each interleaved run."""

    name: str
    baseline: Runs
    candidate: Runs
    ratio: float  # above 1 is slower
    low: float  # the ratio's interval at CONFIDENCE
    high: float
    verdict: str
    mde: float  # the slowdown (0.1 = 10%) flagged with probability POWER
    noise: float  # spread of the log run times, both sides pooled

    @property
    def baseline_time(self) -> float:
        """The baseline's run time: the geometric mean of its runs' fastest rounds."""
        return float(np.exp(np.mean(log_run_times(self.baseline))))

    @property
    def candidate_time(self) -> float:
        return float(np.exp(np.mean(log_run_times(self.candidate))))


def log_run_times(runs: Runs) -> np.ndarray:
    """Each run's time: its fastest round (see the module's docstring), as a log."""
    return np.log([min(run) for run in runs])


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile from the normal one (Abramowitz and Stegun 26.7.5; within 1% of
    the tables from 4 degrees of freedom at the confidences used here)."""
    x = NormalDist().inv_cdf(p)
    terms = (
        (x**3 + x) / 4,
        (5 * x**5 + 16 * x**3 + 3 * x) / 96,
        (3 * x**7 + 19 * x**5 + 17 * x**3 - 15 * x) / 384,
        (79 * x**9 + 776 * x**7 + 1482 * x**5 - 1920 * x**3 - 945 * x) / 92160,
    )
    return x + sum(term / df ** (power + 1) for power, term in enumerate(terms))


def ratio_interval(baseline: Runs, candidate: Runs) -> Interval:
    """The ratio of the geometric means of the run times (candidate / baseline) and its
    Welch interval at ``CONFIDENCE``."""
    if len(baseline) < 2 or len(candidate) < 2 or not all(baseline) or not all(candidate):
        raise ValueError("both sides need at least two runs of at least one timing")
    logs_b, logs_c = log_run_times(baseline), log_run_times(candidate)
    var_b, var_c = logs_b.var(ddof=1) / logs_b.size, logs_c.var(ddof=1) / logs_c.size
    total = var_b + var_c
    log_se = math.sqrt(total)
    df = (
        total**2 / (var_b**2 / (logs_b.size - 1) + var_c**2 / (logs_c.size - 1))
        if total > 0
        else float(logs_b.size + logs_c.size - 2)
    )
    half = t_quantile(1 - (1 - CONFIDENCE) / 2, df) * log_se
    diff = float(logs_c.mean() - logs_b.mean())
    return Interval(math.exp(diff), math.exp(diff - half), math.exp(diff + half), log_se, df)


def minimum_detectable_effect(interval: Interval, threshold: float) -> float:
    """The slowdown that ``compare`` flags with probability ``POWER`` given this noise: the
    ratio must reach the threshold and its interval must clear 1."""
    critical = t_quantile(1 - (1 - CONFIDENCE) / 2, interval.df) * interval.log_se
    needed = max(math.log(threshold), critical)
    return math.exp(needed + t_quantile(POWER, interval.df) * interval.log_se) - 1


def compare(name: str, baseline: Runs, candidate: Runs, threshold: float) -> Comparison:
    """One benchmark's verdict: a regression when the candidate is slower by at least
    ``threshold`` (e.g. 1.05) and the interval lies wholly above 1, an improvement likewise
    below; else unchanged, which means no change larger than the minimum detectable effect."""
    if threshold < 1:
        raise ValueError(f"the threshold is a slowdown ratio of at least 1, got {threshold}")
    interval = ratio_interval(baseline, candidate)
    verdict = UNCHANGED
    if interval.low > 1 and interval.ratio >= threshold:
        verdict = REGRESSION
    elif interval.high < 1 and interval.ratio <= 1 / threshold:
        verdict = IMPROVEMENT
    logs = (log_run_times(baseline), log_run_times(candidate))
    pooled = np.concatenate([side - side.mean() for side in logs])
    noise = float(np.sqrt(np.sum(pooled**2) / (pooled.size - 2)))
    return Comparison(
        name,
        baseline,
        candidate,
        interval.ratio,
        interval.low,
        interval.high,
        verdict,
        minimum_detectable_effect(interval, threshold),
        noise,
    )
