"""What a comparison's benchmarks say together of one benchmark's noise.

Five pairs of runs (the default) give each benchmark's spread four degrees of freedom, and a
99.8% t quantile of 7.2 where a known spread would need 3.1. The benchmarks of one comparison ran
on the same machine in the same hour, and their spreads are alike: each benchmark's
variance of pairs' log ratios is drawn toward the variance most of them share, by an
empirical Bayes prior (Smyth 2004, "Linear models and empirical Bayes methods for assessing
differential expression in microarray experiments", the moderated t statistic of limma).

The prior is a scaled inverse chi-square law of the benchmarks' variances: ``variance``,
what they share, and ``df``, how many degrees of freedom of evidence it is worth. Both come
from the mean and the spread of the logs of the benchmarks' variances. Benchmarks whose
variances differ more than their own degrees of freedom explain give a small ``df``, and
little is drawn; alike ones a large ``df``, up to their pooled variance. As in limma, a
benchmark's degrees of freedom with the prior never exceed all the benchmarks' together, and
a variance far below the others' counts as 1e-5 of their median.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_BENCHMARKS = 3  # fewer spreads say nothing of their law: no prior
SMALLEST_VARIANCE = 1e-5  # of the median: the floor of a variance, so that its log is finite
_SHIFT = 6.0  # the series below are accurate to about 4e-10 from here on up


@dataclass(frozen=True)
class Prior:
    """The variance a comparison's benchmarks share, its degrees of freedom (0: none,
    infinite: every benchmark has it), and the degrees of freedom of all the benchmarks'
    variances together, which no benchmark's exceed."""

    variance: float
    df: float
    pooled_df: float = math.inf

    def moderated(self, variance: float, df: float) -> tuple[float, float]:
        """A benchmark's ``variance`` on ``df`` degrees of freedom, drawn toward the prior:
        the posterior variance, and its degrees of freedom."""
        if math.isinf(self.df):
            return self.variance, self.pooled_df
        weight = self.df + df
        return (self.df * self.variance + df * variance) / weight, min(weight, self.pooled_df)


NO_PRIOR = Prior(variance=0.0, df=0.0)


def prior_of(variances: Sequence[float], df: float) -> Prior:
    """The prior of benchmarks' ``variances``, each on ``df`` degrees of freedom; none for
    fewer than ``MIN_BENCHMARKS`` or a median variance of zero."""
    values = np.array(variances, dtype=float)
    if values.size < MIN_BENCHMARKS or df <= 0 or float(np.median(values)) <= 0:
        return NO_PRIOR
    values = np.maximum(values, SMALLEST_VARIANCE * float(np.median(values)))
    pooled_df = df * values.size
    # log s^2 = log sigma^2 + log(chi2_d / d): remove that term's mean, then its variance.
    corrected = np.log(values) - digamma(df / 2) + math.log(df / 2)
    mean = float(corrected.mean())
    spread = float(corrected.var(ddof=1)) - trigamma(df / 2)
    if spread <= 0:  # no more spread than sampling alone gives: one pooled variance
        return Prior(variance=float(values.mean()), df=math.inf, pooled_df=pooled_df)
    prior_df = 2 * trigamma_inverse(spread)
    variance = math.exp(mean + digamma(prior_df / 2) - math.log(prior_df / 2))
    return Prior(variance=variance, df=prior_df, pooled_df=pooled_df)


def digamma(x: float) -> float:
    """The logarithmic derivative of the gamma function, for ``x > 0``."""
    shifted = 0.0
    while x < _SHIFT:
        shifted -= 1 / x
        x += 1
    inverse = 1 / (x * x)
    series = inverse * (1 / 12 - inverse * (1 / 120 - inverse * (1 / 252 - inverse / 240)))
    return shifted + math.log(x) - 1 / (2 * x) - series


def trigamma(x: float) -> float:
    """The derivative of ``digamma``, for ``x > 0``."""
    shifted = 0.0
    while x < _SHIFT:
        shifted += 1 / (x * x)
        x += 1
    inverse = 1 / (x * x)
    series = inverse * (1 / 6 - inverse * (1 / 30 - inverse * (1 / 42 - inverse / 30)))
    return shifted + 1 / x + inverse / 2 + series / x


def tetragamma(x: float) -> float:
    """The derivative of ``trigamma``, for ``x > 0``."""
    shifted = 0.0
    while x < _SHIFT:
        shifted -= 2 / (x * x * x)
        x += 1
    inverse = 1 / (x * x)
    series = inverse * inverse * (1 / 2 - inverse * (1 / 6 - inverse * (1 / 6 - inverse * 3 / 10)))
    return shifted - inverse - inverse / x - series


def trigamma_inverse(y: float) -> float:
    """The ``x`` with ``trigamma(x) == y``, for ``y > 0``: Newton's method from Smyth's
    starting point, above the root, from which every step goes down to it."""
    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        value = trigamma(x)
        step = value * (1 - value / y) / tetragamma(x)
        x += step
        if -step / x < 1e-8:
            return x
    raise ArithmeticError(f"trigamma_inverse({y}) did not converge")
