"""The release map as data: each holding of upstream's known divergences by release, from
gate runs' results, with each release's totals and runtime.

Rendered by ``ci.releases.render``; made by ``python -m ci.releases``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from packaging.version import Version

from ci.gate.results import GateResults, TestResult
from conformance import UPSTREAM_MANIFEST
from conformance.divergences import Known, Showing, fit_range, load, release_of


@dataclass(frozen=True)
class ReleaseRun:
    """One release's gate run, as the map needs it."""

    requirement: str  # what was installed, e.g. torch==2.15.0
    torch_version: str
    release: str
    suite_commit: str
    duration_min: float
    exit_status: int
    totals: dict[str, int]
    not_applicable: int
    unexplained: list[tuple[str, int]]  # failures no entry expects: cause, test ids
    golden: list[GoldenLoads] = field(default_factory=list)  # by the release that wrote a set


@dataclass(frozen=True)
class GoldenLoads:
    """How one golden set loaded into a release: ``written_by`` wrote it; the load checks'
    count and the ids that failed (``conformance/checks/test_golden_checkpoints.py``)."""

    written_by: str
    checks: int
    failed: list[str]


@dataclass(frozen=True)
class Row:
    """One holding of a known divergence (its tests over a range of releases) and how it
    showed in each release."""

    id: str
    reason: str
    link: str
    releases: str  # the holding's range
    showing: list[Showing]  # by release, oldest first
    fitted: str  # the range these runs give (conformance.divergences.fit_range), or why none


@dataclass
class ReleaseMap:
    runs: list[ReleaseRun] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)


def showing(known: Known, tests: list[TestResult]) -> Showing:
    """How a holding showed among one run's ``tests``: its tests failed (expected there or
    not), all passed (fixed there, or not yet broken), were not run (a skip: a hang or a crash
    the gate will not risk), or none of them ran."""
    matched = [test for test in tests if known.matches(test.nodeid)]
    if not matched:
        return "-"
    if all(test.outcome == "skipped" for test in matched):
        return "not run"
    if any(test.outcome in ("failed", "error", "xfailed") for test in matched):
        return "fails"
    return "passes"


GOLDEN_CHECKS = "conformance/checks/test_golden_checkpoints.py::"
# A golden check's id: the world size, then the release that wrote the set it loads.
_WRITTEN_BY = re.compile(r"\[w\d+-(?P<release>[^-\]]+)[-\]]")


def golden_loads(tests: list[TestResult]) -> list[GoldenLoads]:
    """The golden checks among one run's ``tests``, by the release that wrote each set: a
    failure is an outcome the build did not meet, whether a manifest expected it or not."""
    by_writer: dict[str, list[TestResult]] = {}
    for test in tests:
        found = _WRITTEN_BY.search(test.nodeid)
        if test.nodeid.startswith(GOLDEN_CHECKS) and found is not None:
            by_writer.setdefault(found["release"], []).append(test)
    return [
        GoldenLoads(
            written_by,
            len(checks),
            [t.nodeid for t in checks if t.outcome in ("failed", "error", "xfailed")],
        )
        for written_by, checks in sorted(by_writer.items(), key=lambda item: Version(item[0]))
    ]


def _run(requirement: str, results: GateResults, holdings: list[Known]) -> ReleaseRun:
    unexplained = Counter(
        test.cause
        for test in results.tests
        if test.is_failure and not any(known.matches(test.nodeid) for known in holdings)
    )
    target = results.target
    return ReleaseRun(
        requirement=requirement,
        torch_version=target.torch_version,
        release=str(release_of(target.torch_version)),
        suite_commit=target.suite_commit,
        duration_min=round(results.duration_s / 60, 1),
        exit_status=results.exit_status,
        totals=dict(results.totals()),
        not_applicable=sum(sum(by_size.values()) for by_size in results.not_applicable.values()),
        unexplained=unexplained.most_common(),
        golden=golden_loads(results.tests),
    )


def release_map(
    runs: list[tuple[str, GateResults]], lifted: dict[str, GateResults] | None = None
) -> ReleaseMap:
    """The map of ``runs`` (requirement, results), oldest release first; ``lifted`` holds,
    by requirement, a run of the skip records' tests with their skips lifted, which shows
    how those divergences stand where the gate does not run them."""
    lifted = lifted or {}
    holdings = [
        Known(divergence, holding)
        for divergence in load(UPSTREAM_MANIFEST).divergences
        for holding in divergence.holdings
    ]
    ordered = sorted(runs, key=lambda run: release_of(run[1].target.torch_version))
    releases = [release_of(results.target.torch_version) for _, results in ordered]
    shown = [
        results.tests + (lifted[requirement].tests if requirement in lifted else [])
        for requirement, results in ordered
    ]
    return ReleaseMap(
        runs=[_run(requirement, results, holdings) for requirement, results in ordered],
        rows=[
            _row(known, releases, [showing(known, tests) for tests in shown]) for known in holdings
        ],
    )


def _row(known: Known, releases: list[Version], showings: list[Showing]) -> Row:
    try:
        fitted = fit_range(dict(zip(releases, showings, strict=True)))
    except ValueError as error:
        fitted = f"none: {error}"
    return Row(known.id, known.reason, known.link, known.releases, showings, fitted)
