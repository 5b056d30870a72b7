"""The release map in Markdown, HTML and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape

from ci.gate import report_html, report_markdown
from ci.gate.node_ids import name_of
from ci.releases.table import ReleaseMap

TITLE = "Known divergences of upstream's state-dict code, by torch release"
LEGEND = (
    "fails: the divergence's tests fail in that release; passes: they pass (fixed there, or "
    "not broken yet); not run: a skip entry (a hang or crash the gate will not risk); "
    "-: none of its tests ran there"
)


def _run_rows(release_map: ReleaseMap) -> tuple[list[str], list[list[str]]]:
    header = [
        "release",
        "installed",
        "torch",
        "exit",
        "minutes",
        "passed",
        "xfailed",
        "failed",
        "skipped",
        "not applicable",
        "suite",
    ]
    rows = [
        [
            run.release,
            run.requirement,
            run.torch_version,
            str(run.exit_status),
            f"{run.duration_min:g}",
            str(run.totals.get("passed", 0)),
            str(run.totals.get("xfailed", 0)),
            str(sum(run.totals.get(o, 0) for o in ("failed", "error", "xpassed"))),
            str(run.totals.get("skipped", 0)),
            str(run.not_applicable),
            run.suite_commit,
        ]
        for run in release_map.runs
    ]
    return header, rows


def _divergence_rows(release_map: ReleaseMap) -> tuple[list[str], list[list[str]]]:
    releases = [run.release for run in release_map.runs]
    header = ["divergence", "range", "fitted from these runs", *releases, "link"]
    rows = [
        [f"{row.reason} ({row.id})", row.releases, row.fitted, *row.showing, row.link]
        for row in release_map.rows
    ]
    return header, rows


GOLDEN_LEGEND = (
    "each golden set (a release's checkpoints, python -m ci.gate.golden) as the release of "
    "each run loaded it: the load checks that failed, expected by a manifest or not"
)


def _golden_rows(release_map: ReleaseMap) -> list[list[str]]:
    return [
        [
            run.release,
            loads.written_by,
            f"{len(loads.failed)} of {loads.checks}",
            ", ".join(name_of(nodeid) for nodeid in loads.failed) or "all load",
        ]
        for run in release_map.runs
        for loads in run.golden
    ]


GOLDEN_HEADER = ["loaded by", "written by", "failed", "which"]


def _unexplained(release_map: ReleaseMap) -> list[list[str]]:
    return [
        [run.release, str(count), cause]
        for run in release_map.runs
        for cause, count in run.unexplained
    ]


def markdown(release_map: ReleaseMap) -> str:
    lines = [f"# {TITLE}", "", "## Runs", ""]
    lines += report_markdown.table(*_run_rows(release_map))
    lines += ["", "## Divergences", "", LEGEND, ""]
    lines += report_markdown.table(*_divergence_rows(release_map))
    lines += ["", "## Failures no entry expects, by cause", ""]
    unexplained = _unexplained(release_map)
    lines += (
        report_markdown.table(["release", "test ids", "cause"], unexplained)
        if unexplained
        else ["None."]
    )
    golden = _golden_rows(release_map)
    if golden:
        lines += ["", "## Golden checkpoints loaded", "", GOLDEN_LEGEND, ""]
        lines += report_markdown.table(GOLDEN_HEADER, golden)
    return "\n".join(lines) + "\n"


def html(release_map: ReleaseMap) -> str:
    unexplained = _unexplained(release_map)
    parts = [
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(TITLE)}</title>',
        f"<style>{report_html.STYLE}</style></head><body>",
        f"<h1>{escape(TITLE)}</h1>",
        "<h2>Runs</h2>",
        report_html.table(*_run_rows(release_map)),
        "<h2>Divergences</h2>",
        f"<p>{escape(LEGEND)}</p>",
        report_html.table(*_divergence_rows(release_map)),
        "<h2>Failures no entry expects, by cause</h2>",
        report_html.table(["release", "test ids", "cause"], unexplained)
        if unexplained
        else "<p>None.</p>",
    ]
    golden = _golden_rows(release_map)
    if golden:
        parts += [
            "<h2>Golden checkpoints loaded</h2>",
            f"<p>{escape(GOLDEN_LEGEND)}</p>",
            report_html.table(GOLDEN_HEADER, golden),
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def as_json(release_map: ReleaseMap) -> str:
    return json.dumps(asdict(release_map), indent=1) + "\n"
