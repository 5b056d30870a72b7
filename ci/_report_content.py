"""What a gate report says, as plain data: the Markdown and HTML renderers only format it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ci._gate_results import GateResults, TestResult

# Cell symbols, most severe first: a cell's colour follows its most severe outcome.
SYMBOLS = {
    "failed": "✘",
    "error": "E",
    "xpassed": "XP",
    "passed": "✔",
    "xfailed": "xf",
    "skipped": "s",
}
LEGEND = (
    "✘ failed, E error, XP passed though expected to fail (strict), ✔ passed, "
    "xf failed as the manifest expects, s skipped"
)


@dataclass(frozen=True)
class Cell:
    text: str
    worst: str  # the most severe outcome in the cell, "" when empty


@dataclass(frozen=True)
class ReportContent:
    title: str
    passed: bool
    target_rows: list[tuple[str, str]]
    totals: list[tuple[str, int]]
    checks: list[str]
    matrix_rows: list[tuple[str, list[Cell]]]
    failures: list[TestResult]
    expected_failures: list[tuple[str, int]]  # reason, number of test ids
    manifests: list[str]
    unused_entries: list[str]
    slowest: list[TestResult]


def cell(counts: Counter[str]) -> Cell:
    """``✔12 xf3 s5``: the non-zero counts of a matrix cell, most severe first."""
    present = [outcome for outcome in SYMBOLS if counts[outcome]]
    text = " ".join(f"{SYMBOLS[outcome]}{counts[outcome]}" for outcome in present)
    return Cell(text, present[0] if present else "")


def content(results: GateResults, slowest: int = 10) -> ReportContent:
    """The report of ``results``."""
    failures = results.failures
    passed = results.exit_status == 0 and not failures
    verdict = "PASSED" if passed else f"FAILED ({len(failures)} failing test ids)"
    totals = results.totals()
    checks = results.checks()
    matrix = results.matrix()
    target = results.target
    return ReportContent(
        title=f"State-dict conformance gate: {verdict}",
        passed=passed,
        target_rows=[
            ("torch", f"{target.torch_version} (git {target.torch_git_hash})"),
            ("CUDA / NCCL", f"{target.cuda_version or 'none'} / {target.nccl_version or 'none'}"),
            ("backend", target.backend),
            (
                "device",
                target.device
                + (f" ({target.device_count} visible)" if target.device_count else ""),
            ),
            ("world sizes", ", ".join(map(str, target.world_sizes)) or "none"),
            ("suite commit", target.suite_commit),
            ("python / host", f"{target.python_version} / {target.host}"),
            ("date", target.date),
            (
                "duration",
                f"{results.duration_s / 60:.1f} min, pytest exit status {results.exit_status}",
            ),
        ],
        totals=[(outcome, totals[outcome]) for outcome in SYMBOLS],
        checks=checks,
        matrix_rows=[
            (parallelism, [cell(by_check.get(check, Counter())) for check in checks])
            for parallelism, by_check in matrix.items()
        ],
        failures=failures,
        expected_failures=Counter(
            test.reason for test in results.tests if test.outcome == "xfailed"
        ).most_common(),
        manifests=results.manifests,
        unused_entries=[f"{entry.source}: {entry.pattern}" for entry in results.unused_entries],
        slowest=sorted(results.tests, key=lambda t: -t.duration_s)[:slowest],
    )
