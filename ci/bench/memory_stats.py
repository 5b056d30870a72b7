"""A/B comparison of benchmark peak memory: the ratio of the builds' typical peaks, their
run-to-run spread, and the verdict.

A run measures each benchmark's peak once, on the rank that held the most. Memory is nearly
deterministic (the spread of most benchmarks between runs is below 1%), so a regression is
a typical ratio at or above the threshold whose runs stand apart: every candidate run above
every baseline run by more than the probe's resolution in the rank processes
(``ranks_resolution``), so that a small peak's change is judged only when it is larger than
what the probe can miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from ci.bench.stats import IMPROVEMENT, REGRESSION, UNCHANGED
from harness.machine import rank_threads
from harness.memory import host_resolution_bytes


@dataclass(frozen=True)
class PeakComparison:
    """One benchmark's peaks on both builds, one per run, in bytes."""

    name: str
    baseline: tuple[int, ...]
    candidate: tuple[int, ...]
    ratio: float  # the candidate's median over the baseline's; above 1 holds more
    spread: float  # the larger side's (max - min) / median
    verdict: str

    @property
    def baseline_peak(self) -> float:
        return float(median(self.baseline))

    @property
    def candidate_peak(self) -> float:
        return float(median(self.candidate))

    @property
    def ratio_text(self) -> str:
        """The ratio, or "below resolution" when both typical peaks are within what the probe
        can miss: a ratio of near-zero peaks (4096.000 for 0 against 4 KiB) means nothing."""
        if max(self.baseline_peak, self.candidate_peak) <= ranks_resolution():
            return "below resolution"
        return f"{self.ratio:.3f}"


def _spread(peaks: tuple[int, ...]) -> float:
    middle = median(peaks)
    return (max(peaks) - min(peaks)) / middle if middle else 0.0


def ranks_resolution() -> int:
    """The probe's resolution in the benchmarks' rank processes, which measured the peaks."""
    return host_resolution_bytes(rank_threads())


def compare_peaks(
    name: str, baseline: tuple[int, ...], candidate: tuple[int, ...], threshold: float
) -> PeakComparison:
    """A regression when the candidate's typical peak is at least ``threshold`` times the
    baseline's and every candidate run is above every baseline run by more than the probe's
    resolution; an improvement likewise below."""
    if not baseline or not candidate:
        raise ValueError(f"{name}: both sides need at least one peak")
    if threshold <= 1:
        raise ValueError(f"the threshold is a ratio above 1, got {threshold}")
    ratio = median(candidate) / max(median(baseline), 1)
    verdict = UNCHANGED
    resolution = ranks_resolution()
    if ratio >= threshold and min(candidate) - max(baseline) > resolution:
        verdict = REGRESSION
    elif ratio <= 1 / threshold and min(baseline) - max(candidate) > resolution:
        verdict = IMPROVEMENT
    spread = max(_spread(baseline), _spread(candidate))
    return PeakComparison(name, baseline, candidate, ratio, spread, verdict)
