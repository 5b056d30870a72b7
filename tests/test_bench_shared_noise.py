"""The comparison's shared noise: the special functions, the empirical Bayes prior, and
what judging benchmarks together does to false flags and to the slowdowns caught."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ci.bench.shared_noise import (
    NO_PRIOR,
    Prior,
    digamma,
    prior_of,
    tetragamma,
    trigamma,
    trigamma_inverse,
)
from ci.bench.stats import CONFIDENCE, REGRESSION, UNCHANGED, Runs, compare, compare_all

EULER_GAMMA = 0.5772156649015329
APERY = 1.2020569031595942  # zeta(3)


@pytest.mark.parametrize(
    ("function", "x", "value"),
    [
        (digamma, 1.0, -EULER_GAMMA),
        (digamma, 0.5, -EULER_GAMMA - 2 * math.log(2)),
        (digamma, 10.0, 2.251752589066721),
        (trigamma, 1.0, math.pi**2 / 6),
        (trigamma, 0.5, math.pi**2 / 2),
        (trigamma, 20.0, 0.05127082293520312),
        (tetragamma, 1.0, -2 * APERY),
        (tetragamma, 0.5, -14 * APERY),
    ],
)
def test_the_special_functions_match_their_known_values(function, x: float, value: float) -> None:
    assert function(x) == pytest.approx(value, rel=1e-9)


@pytest.mark.parametrize("y", [1e-8, 0.01, 0.3, 1.6449, 5.0, 300.0, 1e8])
def test_trigamma_inverse_inverts_trigamma(y: float) -> None:
    assert trigamma(trigamma_inverse(y)) == pytest.approx(y, rel=1e-5)


def _variances(rng: np.random.Generator, prior: Prior, df: int, count: int) -> np.ndarray:
    """Sample variances on ``df`` degrees of freedom of benchmarks whose true variances
    follow ``prior``'s scaled inverse chi-square law."""
    true = prior.df * prior.variance / rng.chisquare(prior.df, count)
    return true * rng.chisquare(df, count) / df


def test_the_prior_is_recovered_from_benchmarks_that_follow_it() -> None:
    truth = Prior(variance=0.06**2, df=6.0)
    found = prior_of(_variances(np.random.default_rng(3), truth, df=7, count=20000).tolist(), 7)
    assert found.variance == pytest.approx(truth.variance, rel=0.05)
    assert found.df == pytest.approx(truth.df, rel=0.15)


def test_benchmarks_of_one_true_variance_pool_it() -> None:
    rng = np.random.default_rng(4)
    alike = 0.05**2 * rng.chisquare(7, 4000) / 7
    found = prior_of(alike.tolist(), 7)
    assert found.df > 200
    assert found.variance == pytest.approx(0.05**2, rel=0.05)


def test_too_few_spreads_give_no_prior() -> None:
    assert prior_of([0.01, 0.02], 7) == NO_PRIOR
    assert prior_of([0.01, 0.0, 0.0], 7) == NO_PRIOR  # most benchmarks did not vary at all
    assert prior_of([0.01, 0.02, 0.03], 0) == NO_PRIOR


def test_a_nearly_constant_benchmark_only_weakens_the_prior() -> None:
    """A spread far below the others' counts as 1e-5 of their median, however small: its log
    stays finite, and the prior it joins is worth fewer degrees of freedom, so every
    interval is wider, never narrower."""
    rng = np.random.default_rng(5)
    alike = (0.05**2 * rng.chisquare(7, 50) / 7).tolist()
    assert prior_of([*alike, 1e-30], 7) == prior_of([*alike, 1e-12], 7)
    assert 0 < prior_of([*alike, 1e-30], 7).df < prior_of(alike, 7).df


def test_moderation_weighs_the_prior_and_the_benchmark_by_their_degrees_of_freedom() -> None:
    assert Prior(0.04, 7.0).moderated(0.01, 7.0) == pytest.approx((0.025, 14.0))
    assert Prior(0.04, 7.0, pooled_df=10.0).moderated(0.01, 7.0) == pytest.approx((0.025, 10.0))
    assert Prior(0.04, math.inf, pooled_df=21.0).moderated(0.01, 7.0) == (0.04, 21.0)
    assert NO_PRIOR.moderated(0.01, 7.0) == (0.01, 7.0)


PAIRS, ROUNDS = 8, 8


def _comparison(
    rng: np.random.Generator, noises: np.ndarray, slowdown: float
) -> tuple[dict[str, Runs], dict[str, Runs]]:
    """Both sides' runs of benchmarks whose rounds' log ratios spread by ``noises`` times
    the square root of the rounds (so a pair's mean spreads by ``noises``), the candidate
    ``slowdown`` slower."""
    baseline: dict[str, Runs] = {}
    candidate: dict[str, Runs] = {}
    for number, noise in enumerate(noises):
        spread = noise * math.sqrt(ROUNDS / 2)
        shape = (PAIRS, ROUNDS)
        baseline[f"b{number}"] = tuple(map(tuple, np.exp(spread * rng.standard_normal(shape))))
        slower = (1 + slowdown) * np.exp(spread * rng.standard_normal(shape))
        candidate[f"b{number}"] = tuple(map(tuple, slower))
    return baseline, candidate


def _measured_noises(rng: np.random.Generator, count: int) -> np.ndarray:
    """Spreads of pairs' log ratios like those of 8 pairs of the default benchmarks (from 3%
    to 15%, median about 7%), and two far noisier ones."""
    return np.concatenate([np.exp(rng.uniform(math.log(0.03), math.log(0.15), count)), [0.3, 0.4]])


@pytest.mark.slow
def test_a_build_compared_with_itself_is_rarely_flagged_when_judged_together() -> None:
    """Many comparisons of 58 benchmarks, each two builds alike, judged by the interval alone
    (a threshold of 1): the share of the 56 benchmarks of common noise flagged either way
    stays within what the confidence promises, give or take. The two far noisier ones are
    judged with narrower intervals than their own pairs give, and flagged more often (in
    400 such comparisons, 0.75% of the time): within ten times the confidence here."""
    rng = np.random.default_rng(21)
    common = noisy = 0
    comparisons = 150
    for _ in range(comparisons):
        _, judged = compare_all(*_comparison(rng, _measured_noises(rng, 56), 0.0), 1.0)
        flagged = [comparison.verdict != UNCHANGED for comparison in judged]
        common += sum(flagged[:56])
        noisy += sum(flagged[56:])
    assert common / (56 * comparisons) < 1.75 * (1 - CONFIDENCE)  # 17 expected, give or take 4
    assert noisy / (2 * comparisons) < 10 * (1 - CONFIDENCE)


def test_judging_together_catches_more_of_a_ten_percent_slowdown() -> None:
    """The same runs, judged alone and together: benchmarks whose pairs spread by 6% are
    caught far more often when they lend each other their spread."""
    rng = np.random.default_rng(22)
    baseline, candidate = _comparison(rng, np.full(400, 0.06), 0.10)
    alone = [compare(name, baseline[name], candidate[name], 1.05) for name in baseline]
    _, together = compare_all(baseline, candidate, 1.05)
    caught_alone = np.mean([comparison.verdict == REGRESSION for comparison in alone])
    caught_together = np.mean([comparison.verdict == REGRESSION for comparison in together])
    assert caught_alone < 0.6
    assert caught_together > 0.8


def test_benchmarks_judged_together_need_the_same_benchmarks_and_pairs() -> None:
    two = ((1.0,), (1.1,))
    with pytest.raises(ValueError, match=r"benchmarks of one side only: \['b'\]"):
        compare_all({"a": two, "b": two}, {"a": two}, 1.05)
    with pytest.raises(ValueError, match=r"different numbers of pairs: \[2, 3\]"):
        compare_all({"a": two, "b": (*two, (1.0,))}, {"a": two, "b": (*two, (1.0,))}, 1.05)
