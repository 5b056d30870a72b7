"""The report files of a gate run: ``report.md`` and ``report.html`` made from its results,
showing the plots its checks left in ``plots/`` beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

from ci.gate import report_html, report_markdown
from ci.gate.report_content import content
from ci.gate.results import GateResults

PLOTS = "plots"  # the folder beside a report where checks leave their plots
PLOTS_DIR_ENV = "GATE_PLOTS_DIR"  # how a gate run tells its checks that folder


def plots_in(out: Path) -> list[str]:
    """The plots in ``out``'s plots folder, as paths relative to ``out``."""
    return sorted(f"{PLOTS}/{path.name}" for path in (out / PLOTS).glob("*.png"))


def gather_plots(directories: list[Path], out: Path) -> None:
    """Copy the plots of the runs in ``directories`` (shards, jobs) into ``out``'s."""
    for directory in directories:
        for path in (directory / PLOTS).glob("*.png"):
            (out / PLOTS).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / PLOTS / path.name)


def write_reports(results: GateResults, out: Path) -> list[Path]:
    """``report.md`` and ``report.html`` of ``results`` in ``out``."""
    report = content(results, plots=plots_in(out))
    markdown, html = out / "report.md", out / "report.html"
    markdown.write_text(report_markdown.render(report))
    html.write_text(report_html.render(report))
    return [markdown, html]
