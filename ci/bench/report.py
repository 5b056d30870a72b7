"""The benchmark regression report: a plot per benchmark, a Markdown and an HTML summary."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

from ci.bench.stats import CONFIDENCE, REGRESSION, Comparison


@dataclass(frozen=True)
class Builds:
    """What was compared: each side's torch and how its runs were made."""

    baseline: str
    candidate: str
    runs: int
    threshold: float


def plot(comparison: Comparison, path: Path) -> None:
    """Every round of both builds as points, their medians as bars, the ratio in the title."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 2.2))
    for row, runs in enumerate((comparison.baseline, comparison.candidate)):
        values = [value for run in runs for value in run]
        milliseconds = [value * 1000 for value in values]
        axes.scatter(milliseconds, [row] * len(values), alpha=0.5, s=14)
        median = sorted(milliseconds)[len(milliseconds) // 2]
        axes.plot([median, median], [row - 0.3, row + 0.3], color="black")
    axes.set_yticks([0, 1], ["baseline", "candidate"])
    axes.set_ylim(-0.6, 1.6)
    axes.set_xlabel("ms per round (slowest rank)")
    axes.set_title(
        f"{comparison.name}: ratio {comparison.ratio:.3f} "
        f"[{comparison.low:.3f}, {comparison.high:.3f}] {comparison.verdict}",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _rows(comparisons: list[Comparison]) -> list[list[str]]:
    return [
        [
            c.name,
            f"{c.baseline_median * 1000:.2f}",
            f"{c.candidate_median * 1000:.2f}",
            f"{c.ratio:.3f}",
            f"[{c.low:.3f}, {c.high:.3f}]",
            c.verdict.upper() if c.verdict == REGRESSION else c.verdict,
        ]
        for c in comparisons
    ]


HEADER = ["benchmark", "baseline ms", "candidate ms", "ratio", "interval", "verdict"]


def _title(comparisons: list[Comparison], builds: Builds) -> str:
    regressions = sum(1 for c in comparisons if c.verdict == REGRESSION)
    verdict = f"{regressions} regression(s)" if regressions else "no regression"
    return f"State-dict benchmark comparison: {verdict} (threshold {builds.threshold})"


def _method(builds: Builds) -> str:
    return (
        f"baseline: {builds.baseline}; candidate: {builds.candidate}. {builds.runs} interleaved "
        f"runs per build after a warm-up; ratio = candidate median / baseline median over all "
        f"rounds; interval = {CONFIDENCE:.0%} percentile bootstrap resampling runs, then rounds "
        f"within them; a regression when the interval's lower bound exceeds "
        f"{builds.threshold}."
    )


def markdown(comparisons: list[Comparison], builds: Builds, plots: dict[str, str]) -> str:
    lines = [f"# {_title(comparisons, builds)}", "", _method(builds), ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(comparisons)]
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({path})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def html(comparisons: list[Comparison], builds: Builds, plots: dict[str, str]) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in HEADER)
    body = "".join(
        f'<tr class="{escape(row[-1].lower())}">'
        + "".join(f"<td>{escape(cell)}</td>" for cell in row)
        + "</tr>"
        for row in _rows(comparisons)
    )
    images = "".join(
        f'<figure><img src="{escape(path)}" alt="{escape(name)}"></figure>'
        for name, path in plots.items()
    )
    style = (
        "body{font:14px/1.4 system-ui,sans-serif;margin:2em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
        "tr.regression{background:#ffd7d5}tr.improvement{background:#dafbe1}"
    )
    title = escape(_title(comparisons, builds))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{style}</style></head><body><h1>{title}</h1><p>{escape(_method(builds))}</p>"
        f"<table><tr>{head}</tr>{body}</table><h2>Plots</h2>{images}</body></html>\n"
    )
