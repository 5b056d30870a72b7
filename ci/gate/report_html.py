"""The gate report as one self-contained HTML page: opens in a browser without a server."""

from __future__ import annotations

from html import escape

from ci.gate.report_content import CELLS_NOTE, LEGEND, Cell, ReportContent

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1.passed { color: #1a7f37; } h1.failed { color: #cf222e; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.failed, td.error, td.xpassed { background: #ffd7d5; }
td.passed { background: #dafbe1; } td.xfailed { background: #fff1c2; }
td.skipped { background: #f0f0f0; color: #666; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; white-space: pre-wrap; }
code { font-size: 13px; }
"""


def table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _matrix_cell(cell: Cell) -> str:
    return f'<td class="{cell.worst or ""}">{escape(cell.text)}</td>'


def _failure(nodeid: str, outcome: str, ranks: str, first: str, rerun: str) -> str:
    return (
        f"<h3><code>{escape(nodeid)}</code></h3>"
        f"<p>outcome: {escape(outcome)}; ranks: {escape(ranks)}</p>"
        f"<p>first difference:</p><pre>{escape(first)}</pre>"
        f"<p>rerun alone:</p><pre>{escape(rerun)}</pre>"
    )


def render(report: ReportContent) -> str:
    verdict = "passed" if report.passed else "failed"
    matrix_head = "".join(f"<th>{escape(check)}</th>" for check in ["parallelism", *report.checks])
    matrix_rows = "".join(
        f"<tr><th>{escape(name)}</th>{''.join(_matrix_cell(c) for c in cells)}</tr>"
        for name, cells in report.matrix_rows
    )
    failures = (
        "".join(
            _failure(
                t.nodeid,
                t.outcome,
                ", ".join(map(str, t.failing_ranks)) or "the controller",
                t.first_failure,
                t.rerun,
            )
            for t in report.failures
        )
        or "<p>None.</p>"
    )
    manifests = [f"applied: {path}" for path in report.manifests] or ["none applied"]
    manifests += [f"inferred for this unrecorded release: {entry}" for entry in report.inferred]
    manifests += [f"matches no test: {entry}" for entry in report.unused_entries]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(report.title)}</title><style>{STYLE}</style></head><body>",
        f'<h1 class="{verdict}">{escape(report.title)}</h1>',
        "<h2>Execution target</h2>",
        table(["field", "value"], [[name, value] for name, value in report.target_rows]),
        "<h2>Totals</h2>",
        table([name for name, _ in report.totals], [[str(n) for _, n in report.totals]]),
        f"<p>Not applicable (not collected): {report.not_applicable}.</p>",
        "<h2>Cells by world size</h2>",
        f"<p>{escape(CELLS_NOTE)}</p>",
        table(
            ["parallelism", *(f"w{size}" for size in report.sizes)],
            [[name, *texts] for name, texts in report.cells_rows],
        ),
        "<h2>Matrix: parallelism by check</h2>",
        f"<p>{escape(LEGEND)}</p>",
        f'<table id="matrix"><tr>{matrix_head}</tr>{matrix_rows}</table>',
        f'<h2 id="failures">Failures ({len(report.failures)})</h2>',
        table(["test ids", "cause"], [[str(n), c] for c, n in report.causes])
        if report.causes
        else "",
        failures,
        "<h2>Expected failures (manifest)</h2>",
        table(["test ids", "reason"], [[str(n), r] for r, n in report.expected_failures]),
        "<h2>Manifests</h2>",
        "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in manifests) + "</ul>",
        "<h2>Slowest test ids</h2>",
        table(["seconds", "test id"], [[f"{t.duration_s:.1f}", t.nodeid] for t in report.slowest]),
        *(["<h2>Plots</h2>"] if report.plots else []),
        *(f'<img alt="{escape(plot)}" src="{escape(plot)}">' for plot in report.plots),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
