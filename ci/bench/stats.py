"""A/B statistics of benchmark timings: the ratio of the builds' times, its interval, the
verdict, and the smallest slowdown the comparison would have caught.

The builds' runs come in pairs run in lockstep (``ci.bench.lockstep``): round ``r`` of one
run is next in time to round ``r`` of the other, so a slow moment of the machine falls on
both. A pair's log ratio is the mean over its rounds of ``log(candidate_r / baseline_r)``,
and the pairs are the independent samples of a paired t interval: rounds of one pair share
its processes' luck (memory layout, where the ranks ran), pairs do not.

Of the summaries tried on the same runs (the ratio of the runs' medians, of their fastest
rounds, of their means, the median of the rounds' ratios), the mean of the rounds' log
ratios varied least from pair to pair (``ci/bench/sample-report/README.md``).

``compare_all`` judges a comparison's benchmarks together: each one's variance of pairs'
log ratios is drawn toward the variance they share (``ci.bench.shared_noise``), which
gives its interval more degrees of freedom than its own pairs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ci.bench.shared_noise import NO_PRIOR, Prior, prior_of

# Two-sided. With the threshold also to pass, the 58 default benchmarks in each of three
# comparisons of a build with itself should flag none.
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
    df: float  # degrees of freedom: pairs less one, and the prior's


@dataclass(frozen=True)
class Comparison:
    """One benchmark's timings on both builds: the rounds of each run, run ``i`` of each
    build in lockstep with the other's."""

    name: str
    baseline: Runs
    candidate: Runs
    ratio: float  # above 1 is slower
    low: float  # the ratio's interval at CONFIDENCE
    high: float
    verdict: str
    mde: float  # the slowdown (0.1 = 10%) flagged with probability POWER
    noise: float  # spread of the pairs' log ratios, drawn toward the shared spread

    @property
    def baseline_time(self) -> float:
        """The baseline's run time: the geometric mean of its runs' median rounds."""
        return float(np.exp(np.mean(log_run_times(self.baseline))))

    @property
    def candidate_time(self) -> float:
        return float(np.exp(np.mean(log_run_times(self.candidate))))


def log_run_times(runs: Runs) -> np.ndarray:
    """Each run's typical time, its median round, as a log."""
    return np.log([float(np.median(run)) for run in runs])


def pair_log_ratios(baseline: Runs, candidate: Runs) -> np.ndarray:
    """Each pair's log ratio: the mean of ``log(candidate_r / baseline_r)`` over the rounds
    both runs timed (a short case's runs may time a few rounds more on one side)."""
    ratios = []
    for base, cand in zip(baseline, candidate, strict=True):
        common = min(len(base), len(cand))
        ratios.append(float(np.mean(np.log(cand[:common]) - np.log(base[:common]))))
    return np.array(ratios)


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


def paired(baseline: Runs, candidate: Runs) -> np.ndarray:
    """The pairs' log ratios, once the runs are seen to come in pairs of timed runs."""
    if len(baseline) != len(candidate):
        raise ValueError(
            f"runs come in pairs: {len(baseline)} of the baseline, {len(candidate)} of the "
            "candidate"
        )
    if len(baseline) < 2 or not all(baseline) or not all(candidate):
        raise ValueError("both sides need at least two runs of at least one timing")
    return pair_log_ratios(baseline, candidate)


def ratio_interval(baseline: Runs, candidate: Runs, prior: Prior = NO_PRIOR) -> Interval:
    """The ratio of the builds' times (candidate / baseline: the geometric mean of the
    pairs' ratios) and its paired t interval at ``CONFIDENCE``; run ``i`` of each side form
    pair ``i``. The pairs' variance is drawn toward ``prior``'s."""
    return _interval_of(paired(baseline, candidate), prior)


def _interval_of(pairs: np.ndarray, prior: Prior) -> Interval:
    """``ratio_interval`` of the pairs' log ratios."""
    variance, df = prior.moderated(float(pairs.var(ddof=1)), float(pairs.size - 1))
    log_se = math.sqrt(variance / pairs.size)
    half = t_quantile(1 - (1 - CONFIDENCE) / 2, df) * log_se
    diff = float(pairs.mean())
    return Interval(math.exp(diff), math.exp(diff - half), math.exp(diff + half), log_se, df)


def minimum_detectable_effect(interval: Interval, threshold: float) -> float:
    """The slowdown that ``compare`` flags with probability ``POWER`` given this noise: the
    ratio must reach the threshold and its interval must clear 1."""
    critical = t_quantile(1 - (1 - CONFIDENCE) / 2, interval.df) * interval.log_se
    needed = max(math.log(threshold), critical)
    return math.exp(needed + t_quantile(POWER, interval.df) * interval.log_se) - 1


def compare(
    name: str, baseline: Runs, candidate: Runs, threshold: float, prior: Prior = NO_PRIOR
) -> Comparison:
    """One benchmark's verdict: a regression when the candidate is slower by at least
    ``threshold`` (e.g. 1.05) and the interval lies wholly above 1, an improvement likewise
    below; else unchanged, which means no change larger than the minimum detectable effect."""
    return _judged(name, baseline, candidate, threshold, ratio_interval(baseline, candidate, prior))


def _judged(
    name: str, baseline: Runs, candidate: Runs, threshold: float, interval: Interval
) -> Comparison:
    """``compare``'s verdict on the benchmark's ``interval``."""
    if threshold < 1:
        raise ValueError(f"the threshold is a slowdown ratio of at least 1, got {threshold}")
    verdict = UNCHANGED
    if interval.low > 1 and interval.ratio >= threshold:
        verdict = REGRESSION
    elif interval.high < 1 and interval.ratio <= 1 / threshold:
        verdict = IMPROVEMENT
    noise = interval.log_se * math.sqrt(len(baseline))
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


def compare_all(
    baseline: Mapping[str, Runs], candidate: Mapping[str, Runs], threshold: float
) -> tuple[Prior, list[Comparison]]:
    """Every benchmark's verdict, each one's noise drawn toward what the benchmarks share
    (``ci.bench.shared_noise``), and that prior; both sides name the same benchmarks, with
    as many pairs."""
    if set(baseline) != set(candidate):
        raise ValueError(f"benchmarks of one side only: {sorted(set(baseline) ^ set(candidate))}")
    pairs = {name: paired(baseline[name], candidate[name]) for name in baseline}
    counts = {values.size for values in pairs.values()}
    if len(counts) > 1:
        raise ValueError(f"benchmarks ran in different numbers of pairs: {sorted(counts)}")
    df = float(counts.pop() - 1) if counts else 0.0
    prior = prior_of([float(values.var(ddof=1)) for values in pairs.values()], df)
    return prior, [
        _judged(name, baseline[name], candidate[name], threshold, _interval_of(ratios, prior))
        for name, ratios in pairs.items()
    ]
