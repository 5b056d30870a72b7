"""What a gate report says, as plain data: the Markdown and HTML renderers only format it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ci.gate.results import GateResults, TestResult
from harness.outcomes import OUTCOMES, Outcome

# Cell symbols in OUTCOMES' order, most severe first: a cell's colour follows its most
# severe outcome.
SYMBOLS: dict[Outcome, str] = dict(zip(OUTCOMES, ("✘", "E", "XP", "✔", "xf", "s"), strict=True))
LEGEND = (
    "✘ failed, E error, XP passed though expected to fail (strict), ✔ passed, "
    "xf failed as the manifest expects, s skipped"
)

CELLS_NOTE = (
    "Test ids per parallelism and world size; n/a: ids not collected because the cell does "
    "not exist at that size (never counted as skips)."
)


@dataclass(frozen=True)
class Cell:
    text: str
    worst: Outcome | None  # the most severe outcome in the cell; None when empty


@dataclass(frozen=True)
class ReportContent:
    title: str
    passed: bool
    target_rows: list[tuple[str, str]]
    totals: list[tuple[str, int]]
    not_applicable: int  # ids not collected: their cell does not exist at their world size
    sizes: list[int]
    cells_rows: list[tuple[str, list[str]]]  # per parallelism, per size: "run (n/a not applicable)"
    checks: list[str]
    matrix_rows: list[tuple[str, list[Cell]]]
    failures: list[TestResult]
    causes: list[tuple[str, int]]  # the failures' first lines (ranks left out), most ids first
    expected_failures: list[tuple[str, int]]  # reason, number of test ids
    manifests: list[str]
    inferred: list[str]  # entries applied by their release range alone (unrecorded release)
    unused_entries: list[str]
    slowest: list[TestResult]
    plots: list[str]  # pictures the checks drew, relative to the report


TIERS = {
    "whole": "whole: every test id",
    "quick": "quick: the per-commit subset of ci/gate/quick-tier.txt (every mutant killed)",
    "families": "families: the subset of ci/gate/families-tier.txt (every arc within each pair "
    "of families)",
    "changed": "changed: the ids that execute what the build changed, and the quick tier "
    "(changed.md)",
    "changed-whole": "changed: every test id, for what the build changed (changed.md)",
}


def cell(counts: Counter[str]) -> Cell:
    """``✔12 xf3 s5``: the non-zero counts of a matrix cell, most severe first."""
    present = [outcome for outcome in SYMBOLS if counts[outcome]]
    text = " ".join(f"{SYMBOLS[outcome]}{counts[outcome]}" for outcome in present)
    return Cell(text, present[0] if present else None)


def cells_rows(results: GateResults) -> list[tuple[str, list[str]]]:
    """Per parallelism and world size: the ids run, and those not collected because the cell
    does not exist there (``12 (+3 n/a)``; ``-`` where none ran)."""
    run, absent = results.cells(), results.not_applicable
    rows = []
    for parallelism in sorted(set(run) | set(absent)):
        texts = []
        for size in results.target.world_sizes:
            ran, missing = (
                run.get(parallelism, {}).get(size, 0),
                absent.get(parallelism, {}).get(size, 0),
            )
            texts.append((str(ran) if ran else "-") + (f" (+{missing} n/a)" if missing else ""))
        rows.append((parallelism, texts))
    return rows


def content(
    results: GateResults, slowest: int = 10, plots: list[str] | None = None
) -> ReportContent:
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
            ("backend", f"{target.backend} on {target.device_type}"),
            (
                "device",
                target.device
                + (f" ({target.device_count} visible)" if target.device_count else ""),
            ),
            (
                "machine",
                "; ".join(machine.describe() for machine in target.machines) or "not recorded",
            ),
            ("world sizes", ", ".join(map(str, target.world_sizes)) or "none"),
            ("tier", TIERS.get(results.tier, results.tier)),
            (
                "known divergences",
                results.release.describe() if results.release else "no manifest applied",
            ),
            ("suite commit", target.suite_commit),
            ("python / host", f"{target.python_version} / {target.host}"),
            ("date", target.date),
            (
                "duration",
                f"{results.duration_s / 60:.1f} min, pytest exit status {results.exit_status}",
            ),
        ],
        totals=[(outcome, totals[outcome]) for outcome in SYMBOLS],
        not_applicable=sum(sum(by_size.values()) for by_size in results.not_applicable.values()),
        sizes=list(results.target.world_sizes),
        cells_rows=cells_rows(results),
        checks=checks,
        matrix_rows=[
            (parallelism, [cell(by_check.get(check, Counter())) for check in checks])
            for parallelism, by_check in matrix.items()
        ],
        failures=failures,
        causes=Counter(test.cause for test in failures).most_common(),
        expected_failures=Counter(
            test.reason for test in results.tests if test.outcome == "xfailed"
        ).most_common(),
        manifests=results.manifests,
        inferred=list(results.release.inferred) if results.release else [],
        unused_entries=[f"{entry.source}: {entry.pattern}" for entry in results.unused_entries],
        slowest=sorted(results.tests, key=lambda t: -t.duration_s)[:slowest],
        plots=list(plots or []),
    )
