"""The release map as data: each known divergence of upstream's manifest by release, from
gate runs' results, with each release's totals and runtime.

Rendered by ``ci.releases.render``; made by ``python -m ci.releases``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from ci.gate.results import GateResults, TestResult
from conformance import UPSTREAM_MANIFEST, Entry, parse, release_of

# How a divergence showed in one release's run: its tests failed (expected there or not),
# all passed (fixed there, or not yet broken), were not run (a skip entry: a hang or a crash
# the gate will not risk), or none of them ran.
Showing = Literal["fails", "passes", "not run", "-"]


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


@dataclass(frozen=True)
class Row:
    """One known divergence and how it showed in each release."""

    pattern: str
    reason: str
    link: str
    releases: str  # the entry's recorded range
    showing: list[Showing]


@dataclass
class ReleaseMap:
    runs: list[ReleaseRun] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)


def showing(entry: Entry, tests: list[TestResult]) -> Showing:
    """How ``entry`` showed among one run's ``tests``."""
    matched = [test for test in tests if entry.matches(test.nodeid)]
    if not matched:
        return "-"
    if all(test.outcome == "skipped" for test in matched):
        return "not run"
    if any(test.outcome in ("failed", "error", "xfailed") for test in matched):
        return "fails"
    return "passes"


def _run(requirement: str, results: GateResults, entries: list[Entry]) -> ReleaseRun:
    unexplained = Counter(
        test.cause
        for test in results.tests
        if test.is_failure and not any(entry.matches(test.nodeid) for entry in entries)
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
    )


def release_map(runs: list[tuple[str, GateResults]]) -> ReleaseMap:
    """The map of ``runs`` (requirement, results), oldest release first."""
    entries = parse(UPSTREAM_MANIFEST).entries
    ordered = sorted(runs, key=lambda run: release_of(run[1].target.torch_version))
    return ReleaseMap(
        runs=[_run(requirement, results, entries) for requirement, results in ordered],
        rows=[
            Row(
                entry.pattern,
                entry.reason,
                entry.link,
                entry.releases,
                [showing(entry, results.tests) for _, results in ordered],
            )
            for entry in entries
        ],
    )
