"""The benchmark regression report: a plot per benchmark, a Markdown and an HTML summary of
times and of peak memory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from pathlib import Path

from ci.bench.memory_stats import PeakComparison, ranks_resolution
from ci.bench.shared_noise import Prior
from ci.bench.stats import CONFIDENCE, POWER, REGRESSION, UNCHANGED, Comparison


@dataclass(frozen=True)
class Builds:
    """What was compared: each side's torch and how its runs were made."""

    baseline: str
    candidate: str
    runs: int
    threshold: float
    memory_threshold: float
    prior: Prior  # the spread of pairs' log ratios the benchmarks share


def plot(comparison: Comparison, path: Path) -> None:
    """Every round of both builds as points, each build's run time as a bar, the ratio and
    the minimum detectable effect in the title."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 2.2))
    for row, runs in enumerate((comparison.baseline, comparison.candidate)):
        values = [value for run in runs for value in run]
        milliseconds = [value * 1000 for value in values]
        axes.scatter(milliseconds, [row] * len(values), alpha=0.5, s=14)
    for row, typical in enumerate((comparison.baseline_time, comparison.candidate_time)):
        axes.plot([typical * 1000] * 2, [row - 0.3, row + 0.3], color="black")
    axes.set_yticks([0, 1], ["baseline", "candidate"])
    axes.set_ylim(-0.6, 1.6)
    axes.set_xlabel("ms per round (slowest rank)")
    axes.set_title(
        f"{comparison.name}: ratio {comparison.ratio:.3f} "
        f"[{comparison.low:.3f}, {comparison.high:.3f}] {comparison.verdict} "
        f"(MDE {comparison.mde:.0%})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _rows(comparisons: list[Comparison]) -> list[list[str]]:
    return [
        [
            c.name,
            f"{c.baseline_time * 1000:.2f}",
            f"{c.candidate_time * 1000:.2f}",
            f"{c.ratio:.3f}",
            f"[{c.low:.3f}, {c.high:.3f}]",
            f"{c.noise:.1%}",
            f"{c.mde:.1%}",
            _verdict(c),
        ]
        for c in comparisons
    ]


def _verdict(comparison: Comparison) -> str:
    if comparison.verdict == REGRESSION:
        return REGRESSION.upper()
    if comparison.verdict == UNCHANGED:
        return f"unchanged (no slowdown above {comparison.mde:.0%})"
    return comparison.verdict


HEADER = [
    "benchmark", "baseline ms", "candidate ms", "ratio", "interval", "noise", "MDE", "verdict",
]  # fmt: skip
PEAK_HEADER = ["benchmark memory", "baseline MiB", "candidate MiB", "ratio", "spread", "verdict"]


def _peak_rows(peaks: list[PeakComparison]) -> list[list[str]]:
    return [
        [
            p.name,
            f"{p.baseline_peak / 2**20:.2f}",
            f"{p.candidate_peak / 2**20:.2f}",
            p.ratio_text,
            f"{p.spread:.1%}",
            REGRESSION.upper() if p.verdict == REGRESSION else p.verdict,
        ]
        for p in peaks
    ]


def _title(comparisons: list[Comparison], peaks: list[PeakComparison], builds: Builds) -> str:
    slower = sum(1 for c in comparisons if c.verdict == REGRESSION)
    larger = sum(1 for p in peaks if p.verdict == REGRESSION)
    verdict = f"{slower} time and {larger} memory regression(s)" if slower or larger else ""
    return (
        f"State-dict benchmark comparison: {verdict or 'no regression'} (thresholds "
        f"{builds.threshold} time, {builds.memory_threshold} memory)"
    )


def _method(builds: Builds) -> str:
    return (
        f"baseline: {builds.baseline}; candidate: {builds.candidate}. {builds.runs} pairs of "
        f"runs, each pair in lockstep (each round of one build next to the same round of the "
        f"other); a pair's ratio is the geometric mean of its rounds' ratios (candidate / "
        f"baseline); ratio = geometric mean of the pairs' ratios; interval = {CONFIDENCE:.1%} "
        f"paired t interval on their logs; noise = spread of the pairs' log ratios, drawn "
        f"toward the spread the benchmarks share ({_shared(builds.prior)}); "
        f"MDE = the slowdown flagged with {POWER:.0%} probability at this noise; a regression "
        f"when the ratio is at least {builds.threshold} and the interval lies above 1. Peak "
        f"memory: one measurement per run on the rank that held the most, over its baseline "
        f"(host, and device on accelerators); ratio = the medians' ratio; spread = the larger "
        f"side's range over its median; a regression when the ratio is at least "
        f"{builds.memory_threshold} and every candidate run is above every baseline run by more "
        f"than the probe's resolution ({ranks_resolution() // 1024} KiB on this machine)."
    )


def _shared(prior: Prior) -> str:
    """The shared spread as the report's method states it."""
    if prior.df == 0:
        return "none: too few benchmarks"
    if math.isinf(prior.df):
        return (
            f"{math.sqrt(prior.variance):.1%}, pooled, on {prior.pooled_df:.0f} degrees of freedom"
        )
    return f"{math.sqrt(prior.variance):.1%}, worth {prior.df:.1f} degrees of freedom"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(
    comparisons: list[Comparison],
    peaks: list[PeakComparison],
    builds: Builds,
    plots: dict[str, str],
) -> str:
    lines = [f"# {_title(comparisons, peaks, builds)}", "", _method(builds), ""]
    lines += _markdown_table(HEADER, _rows(comparisons))
    lines += ["", "## Peak memory", ""]
    lines += _markdown_table(PEAK_HEADER, _peak_rows(peaks))
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({path})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def _html_table(header: list[str], verdicts: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join(
        f'<tr class="{escape(verdict)}">'
        + "".join(f"<td>{escape(cell)}</td>" for cell in row)
        + "</tr>"
        for verdict, row in zip(verdicts, rows, strict=True)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html(
    comparisons: list[Comparison],
    peaks: list[PeakComparison],
    builds: Builds,
    plots: dict[str, str],
) -> str:
    times = _html_table(HEADER, [c.verdict for c in comparisons], _rows(comparisons))
    memory = _html_table(PEAK_HEADER, [p.verdict for p in peaks], _peak_rows(peaks))
    images = "".join(
        f'<figure><img src="{escape(path)}" alt="{escape(name)}"></figure>'
        for name, path in plots.items()
    )
    style = (
        "body{font:14px/1.4 system-ui,sans-serif;margin:2em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
        "tr.regression{background:#ffd7d5}tr.improvement{background:#dafbe1}"
    )
    title = escape(_title(comparisons, peaks, builds))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{style}</style></head><body><h1>{title}</h1><p>{escape(_method(builds))}</p>"
        f"{times}<h2>Peak memory</h2>{memory}<h2>Plots</h2>{images}</body></html>\n"
    )
