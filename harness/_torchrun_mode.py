"""Torchrun mode: every rank runs pytest itself over the same collection; a world test's body
runs here, and the ranks agree its outcome through the store, rank 0 reporting it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from harness import _messages as msg
from harness import outcomes
from harness._context import WorldContext
from harness._items import deadline, failure_properties, item_size
from harness._options import WorldOptions
from harness._outcome import describe_exception
from harness._spawn_mode import safe_name
from harness._torchrun import HangWatchdog, TorchrunWorld

# How long past a test's deadline ranks wait for each other's results.
HANG_REPORT_GRACE_S = 30.0


class TorchrunMode:
    """World tests run on the world torchrun launched, one pytest session per rank."""

    def __init__(self, options: WorldOptions, config: pytest.Config) -> None:
        self.options = options
        self.world = TorchrunWorld(options.backend, options.device_type, options.ranks_per_device)
        if self.world.is_reporter:
            self.world.report_when_stopped()
        else:
            # Rank 0 alone prints and writes the junit XML.
            config.option.xmlpath = None
            config.pluginmanager.set_blocked("terminalreporter")

    def sizes(self) -> set[int] | None:
        return {self.world.spec.size}

    def fixture(self, request: pytest.FixtureRequest, size: int) -> WorldContext:
        return self.world.context(safe_name(request.node.nodeid))

    def run_body(self, item: pytest.Function) -> bool | None:
        return None  # the body runs here, as pytest runs any test

    @contextlib.contextmanager
    def watch(self, item: pytest.Item) -> Iterator[None]:
        """Past the deadline, publish this rank's stacks and, on rank 0, report the hang."""
        if item_size(item) is None:
            yield
            return
        limit = deadline(item, self.options).seconds
        with HangWatchdog(limit, lambda stacks: self._hung(item, stacks)):
            yield

    def _hung(self, item: pytest.Item, stacks: str) -> None:
        timeout = deadline(item, self.options).seconds
        result = msg.RankResult(
            rank=self.world.rank,
            status=outcomes.HUNG,
            longrepr=f"did not finish within the {timeout:g} s deadline; stacks:\n{stacks}",
        )
        if not self.world.is_reporter:
            self.world.publish(result)
            self.world.finish()  # exiting sooner would let torchrun stop rank 0 mid-report
            return
        outcome = self.world.agree(result, timeout_s=HANG_REPORT_GRACE_S)
        report = pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords=dict.fromkeys(item.keywords, 1),
            outcome="failed",
            longrepr=outcome.failure_report(),
            when="call",
        )
        item.ihook.pytest_runtest_logreport(report=report)
        item.session.shouldfail = "a world test hung under torchrun"
        item.config.hook.pytest_sessionfinish(session=item.session, exitstatus=1)
        self.world.finish()  # the other ranks may exit now

    def agree(
        self, item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]
    ) -> pytest.TestReport:
        """This rank's report of a world test's call, turned into the ranks' agreed one."""
        if call.when != "call" or item_size(item) is None:
            return report
        local = _local_result(self.world.rank, report, call)
        # Wait past the deadline, so that a hung rank's watchdog can publish its stacks.
        wait_s = deadline(item, self.options).seconds + HANG_REPORT_GRACE_S
        outcome = self.world.agree(local, timeout_s=wait_s)
        lost = outcome.ranks_lost
        if lost:
            # The launched world cannot be replaced: stop here, on every rank, and report.
            item.session.shouldstop = (
                f"rank(s) {', '.join(map(str, lost))} crashed or hung under torchrun"
            )
        verdict = outcome.verdict
        if verdict == outcomes.FAILED:
            report.outcome, report.longrepr = "failed", outcome.failure_report()
            report.user_properties.extend(failure_properties(outcome))
        elif verdict == outcomes.SKIPPED and report.outcome != "skipped":
            report.outcome, report.longrepr = "skipped", (str(item.path), 0, outcome.reason)
        return report

    def session_finishing(self) -> None:
        self.world.reports_begun = True  # a SIGTERM from now on must not cut them

    def close(self) -> None:
        # No rank may exit before rank 0 has written its reports: torchrun stops every rank
        # as soon as one of them exits with an error.
        self.world.finish()


def _local_result(
    rank: int, report: pytest.TestReport, call: pytest.CallInfo[None]
) -> msg.RankResult:
    if hasattr(report, "wasxfail"):
        return msg.RankResult(rank=rank, status=outcomes.XFAILED, longrepr=report.wasxfail)
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return msg.RankResult(rank=rank, status=outcomes.SKIPPED, longrepr=reason)
    if report.passed:
        return msg.RankResult(rank=rank, status=outcomes.PASSED)
    text = str(report.longrepr or "")
    for name, content in report.sections:
        text += f"\n{'-' * 10} {name} {'-' * 10}\n{content}"
    summary = describe_exception(call.excinfo.value) if call.excinfo else ""
    return msg.RankResult(rank=rank, status=outcomes.FAILED, longrepr=text, headline=summary)
