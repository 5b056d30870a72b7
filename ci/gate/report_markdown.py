"""The gate report in Markdown: for a CI job summary, a pull request comment, or a terminal."""

from __future__ import annotations

from pathlib import Path

from ci.gate.report_content import CELLS_NOTE, LEGEND, ReportContent


def _escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_escape(cell) for cell in row) + " |" for row in rows]
    return lines


def _fence(text: str) -> list[str]:
    fence = "````" if "```" in text else "```"
    return [fence, text, fence]


def render(report: ReportContent) -> str:
    lines = [f"# {report.title}", "", "## Execution target", ""]
    lines += table(["field", "value"], [[name, value] for name, value in report.target_rows])
    lines += ["", "## Totals", ""]
    lines += table([name for name, _ in report.totals], [[str(n) for _, n in report.totals]])
    lines += ["", f"Not applicable (not collected): {report.not_applicable}."]
    lines += ["", "## Cells by world size", "", CELLS_NOTE, ""]
    lines += table(
        ["parallelism", *(f"w{size}" for size in report.sizes)],
        [[name, *texts] for name, texts in report.cells_rows],
    )
    lines += ["", "## Matrix: parallelism by check", "", LEGEND, ""]
    lines += table(
        ["parallelism", *report.checks],
        [[name, *(cell.text for cell in cells)] for name, cells in report.matrix_rows],
    )
    lines += ["", f"## Failures ({len(report.failures)})", ""]
    if report.causes:
        lines += ["By cause (the first line of each failure, ranks left out):", ""]
        lines += table(["test ids", "cause"], [[str(n), c] for c, n in report.causes])
        lines.append("")
    if not report.failures:
        lines.append("None.")
    for test in report.failures:
        ranks = ", ".join(map(str, test.failing_ranks)) or "the controller"
        lines += ["", f"### `{test.nodeid}`", "", f"- outcome: {test.outcome}; ranks: {ranks}"]
        lines += ["- first difference:", "", *_fence(test.first_failure), ""]
        lines += ["- rerun alone:", "", *_fence(test.rerun)]
    lines += ["", "## Expected failures (manifest)", ""]
    lines += table(["test ids", "reason"], [[str(n), r] for r, n in report.expected_failures])
    lines += ["", "## Manifests", ""]
    lines += [f"- applied: `{path}`" for path in report.manifests] or ["- none applied"]
    lines += [f"- inferred for this unrecorded release: `{entry}`" for entry in report.inferred]
    lines += [f"- matches no test: `{entry}`" for entry in report.unused_entries]
    lines += ["", "## Slowest test ids", ""]
    slowest = [[f"{test.duration_s:.1f}", test.nodeid] for test in report.slowest]
    lines += table(["seconds", "test id"], slowest)
    if report.plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(plot).stem}]({plot})" for plot in report.plots]
    return "\n".join(lines) + "\n"
