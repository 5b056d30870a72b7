"""The pytest plugin of a gate run: records every test id's result, shows progress, and
writes the results file (``--gate-results PATH``).

Loaded with ``-p ci.gate.recorder`` by ``ci.gate``; it only reads what the suite and the world
plugin report (outcomes, durations, the ``failing_ranks`` and ``first_failure`` properties
of failed world tests), so it changes no test's outcome.
"""

from __future__ import annotations

import functools
import os
import shlex
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ci.gate.node_ids import module_of, name_of, parallelisms_of, path_of
from ci.gate.results import (
    NO_PARALLELISM,
    GateResults,
    ReleaseResolution,
    TestResult,
    UnusedEntry,
    count_by_parallelism_and_size,
)
from ci.gate.target import detect, suite_commit
from conformance.divergences import Resolution
from harness.outcomes import OUTCOMES, Outcome, is_failure
from harness.session import (
    FAILING_RANKS,
    FIRST_FAILURE,
    NOT_APPLICABLE,
    WorldOptions,
    world_options,
)

PROGRESS_EVERY_S = 60.0
# How pytest reports a test marked xfail(strict=True) that passed: a failed call.
STRICT_XPASS = "[XPASS(strict)]"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("gate").addoption(
        "--gate-results", metavar="PATH", default=None, help="write the gate's results (JSON)"
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("gate_results")
    if path is not None:
        config.pluginmanager.register(GateRecorder(config, Path(path)), "gate-recorder")


def classify(nodeid: str, parallelisms: frozenset[str]) -> tuple[str, str]:
    """(check, parallelism) of a test id: the module without ``test_``, and the first
    parameter that names a parallelism of the matrix."""
    check = module_of(nodeid).removeprefix("test_")
    named = parallelisms_of(nodeid, parallelisms)
    return check, named[0] if named else NO_PARALLELISM


def _release(resolution: Resolution) -> ReleaseResolution:
    return ReleaseResolution(
        release=str(resolution.release),
        recorded=resolution.recorded,
        newest_recorded=str(resolution.newest_recorded or "none"),
        inferred=tuple(f"{d.source}: {' '.join(d.tests)}" for d in resolution.inferred),
        predates_the_suite=resolution.predates_the_suite,
        lies_between=" and ".join(map(str, resolution.lies_between or ())),
    )


def _known_parallelisms() -> frozenset[str]:
    from conformance import PARALLELISMS

    return frozenset(PARALLELISMS)


class _Record:
    """One test id's phases, merged into its single outcome."""

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.duration_s = 0.0
        self.reason = ""
        self.failing_ranks: tuple[int, ...] = ()
        self.first_failure = ""

    def add(self, report: pytest.TestReport) -> None:
        self.duration_s += report.duration
        if report.failed:
            self._add_failure(report)
        elif report.skipped and self.outcome in (None, "passed"):
            xfailed = hasattr(report, "wasxfail")
            self.outcome = "xfailed" if xfailed else "skipped"
            self.reason = report.wasxfail if xfailed else _skip_reason(report)
            if xfailed:  # how the expected failure failed: a hang costs its deadline again
                self._note_failing_ranks(report)
        elif report.passed and report.when == "call":
            self.outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"

    def _add_failure(self, report: pytest.TestReport) -> None:
        if self.outcome in ("failed", "error", "xpassed"):
            return  # the first failure is the one to show
        if _is_strict_xpass(report):  # a known divergence that this build fixed
            self.outcome = "xpassed"
            self.first_failure = str(report.longrepr)
            return
        self.outcome = "failed" if report.when == "call" else "error"
        self._note_failing_ranks(report)
        self.first_failure = self.first_failure or _crash_message(report)

    def _note_failing_ranks(self, report: pytest.TestReport) -> None:
        """The failing ranks and first failure a world test's report carries, if any."""
        properties = dict(report.user_properties)
        ranks = str(properties.get(FAILING_RANKS, ""))
        self.failing_ranks = tuple(int(rank) for rank in ranks.split(",") if rank)
        self.first_failure = str(properties.get(FIRST_FAILURE, ""))


def _is_strict_xpass(report: pytest.TestReport) -> bool:
    """Whether pytest failed this call because a strict xfail passed: it reports those as
    failures whose whole representation is ``[XPASS(strict)] reason``."""
    return report.when == "call" and str(report.longrepr).startswith(STRICT_XPASS)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _crash_message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    return lines[0] if lines else f"{report.when} failed"


class GateRecorder:
    """Collects the results of one session and writes them when it ends."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.started = time.monotonic()
        self.last_progress = self.started
        self.suite_commit = suite_commit()  # the tree under test, before anyone edits it
        self.records: dict[str, _Record] = {}
        self.sizes: dict[str, int | None] = {}
        self.current_size: int | None = None
        self.not_applicable: list[tuple[str, int]] = []  # (parallelism, size) of each id
        self.collected: list[str] = []  # every id collected, before any was left out
        self.final: GateResults  # set when the session finishes

    # ----- hooks ------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> Iterator[None]:
        self.collected = [item.nodeid for item in items]
        return (yield)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        parallelisms = _known_parallelisms()
        for nodeid, size in session.config.stash.get(NOT_APPLICABLE, []):
            self.not_applicable.append((classify(nodeid, parallelisms)[1], size))
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            world = callspec.params.get("world") if callspec else None
            self.sizes[item.nodeid] = world if isinstance(world, int) else None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.records.setdefault(report.nodeid, _Record()).add(report)
        size = self.sizes.get(report.nodeid)
        if report.when == "teardown":
            self._maybe_show_progress(size, changed_world=size != self.current_size)
            self.current_size = size

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.final = self.results(int(exitstatus))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.final.save(self.path)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        # The terminal reporter calls this after every pytest_sessionfinish has run.
        terminalreporter.section("gate summary")
        for line in summary_table(self.final):
            terminalreporter.line(line)

    # ----- results ----------------------------------------------------------

    def results(self, exit_status: int) -> GateResults:
        sizes = tuple(sorted({s for s in self.sizes.values() if s is not None}))
        parallelisms = _known_parallelisms()
        target = detect(
            self._world_kind.backend, self._world_kind.device_type, sizes, self.suite_commit
        )
        resolution = self._known_divergences()
        return GateResults(
            target=target,
            exit_status=exit_status,
            duration_s=time.monotonic() - self.started,
            manifests=[str(path) for path in resolution.manifests] if resolution else [],
            release=_release(resolution) if resolution else None,
            unused_entries=self._unused(resolution) if resolution else [],
            tests=[
                self._test_result(nodeid, record, parallelisms)
                for nodeid, record in self.records.items()
            ],
            not_applicable=count_by_parallelism_and_size(self.not_applicable),
        )

    def _test_result(
        self, nodeid: str, record: _Record, parallelisms: frozenset[str]
    ) -> TestResult:
        check, parallelism = classify(nodeid, parallelisms)
        outcome = record.outcome or "error"  # a test id that never reported a phase
        return TestResult(
            nodeid=nodeid,
            outcome=outcome,
            duration_s=round(record.duration_s, 3),
            check=check,
            parallelism=parallelism,
            world_size=self.sizes.get(nodeid),
            failing_ranks=record.failing_ranks,
            first_failure=record.first_failure,
            reason=record.reason,
            rerun=self._rerun_command(nodeid) if is_failure(outcome) else "",
        )

    @functools.cached_property
    def _world_kind(self) -> WorldOptions:
        """The worlds' backend and device type, as the world plugin resolved them."""
        return world_options(self.config)

    def _known_divergences(self) -> Resolution | None:
        """The resolution of the manifests the suite applied, as the session made it; none
        where the suite applies no manifest (its conftest adds the --manifest option)."""
        if not hasattr(self.config.option, "manifest"):
            return None
        from conformance import resolution

        return resolution(self.config)

    def _unused(self, resolution: Resolution) -> list[UnusedEntry]:
        from conformance import judges_staleness

        if not judges_staleness(self.config):
            return []
        unused = resolution.unused(self.collected, self.config.rootpath)
        return [UnusedEntry(known.source, " ".join(known.tests)) for known in unused]

    def _rerun_command(self, nodeid: str) -> str:
        """The command that reruns ``nodeid`` alone, with the options that change its outcome."""
        # Node ids are relative to the rootdir; the command runs where the gate's pytest ran.
        invoked_in = self.config.invocation_params.dir
        where = os.path.relpath(self.config.rootpath / path_of(nodeid), invoked_in)
        args = ["python", "-m", "pytest", f"{where}::{name_of(nodeid)}", "-p", "harness.plugin"]
        args.append(f"--world-backend={self._world_kind.backend}")
        args.append(f"--world-device={self._world_kind.device_type}")
        manifests = self.config.getoption("manifest", None) or []
        args += [f"--manifest={manifest}" for manifest in manifests]
        if self._world_kind.require_devices:
            args.append("--world-require-devices")
        return shlex.join(args)

    # ----- progress ---------------------------------------------------------

    def _maybe_show_progress(self, size: int | None, changed_world: bool) -> None:
        now = time.monotonic()
        if not changed_world and now - self.last_progress < PROGRESS_EVERY_S:
            return
        self.last_progress = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        done = len(self.records)
        failed = sum(
            1 for record in self.records.values() if record.outcome and is_failure(record.outcome)
        )
        world = f"{self._world_kind.backend} w{size}" if size else "controller"
        reporter.write("\n")  # pytest's progress dots may be mid-line
        reporter.write_line(
            f"[gate] {done}/{len(self.sizes)} tests done, {failed} failed, "
            f"world {world}, {now - self.started:.0f} s"
        )


def summary_table(results: GateResults) -> list[str]:
    """Outcome counts per check, as aligned text lines, totals last."""
    columns = OUTCOMES
    rows: dict[str, Counter[str]] = {}
    for test in results.tests:
        rows.setdefault(test.check, Counter())[test.outcome] += 1
    rows["total"] = results.totals()
    width = max(len(name) for name in rows)
    lines = [f"{'check':<{width}}  " + "  ".join(f"{c:>7}" for c in columns)]
    for name, counts in rows.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{counts[c]:>7}" for c in columns))
    return lines
