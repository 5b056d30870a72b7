"""The report files of a gate run: ``report.md`` and ``report.html`` made from its results."""

from __future__ import annotations

from pathlib import Path

from ci.gate import report_html, report_markdown
from ci.gate.report_content import content
from ci.gate.results import GateResults


def write_reports(results: GateResults, out: Path) -> list[Path]:
    """``report.md`` and ``report.html`` of ``results`` in ``out``."""
    report = content(results)
    markdown, html = out / "report.md", out / "report.html"
    markdown.write_text(report_markdown.render(report))
    html.write_text(report_html.render(report))
    return [markdown, html]
