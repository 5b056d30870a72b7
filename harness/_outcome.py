"""Outcome of one test in one world: the ranks' results and the verdict they add up to.

A test passes only if every rank passed; a skip or an xfail counts only when
every rank agrees on it; anything else is a failure whose message names
each rank and what happened to it.
"""

from __future__ import annotations

import signal
import traceback
from dataclasses import dataclass, field

from harness import _messages as msg
from harness import outcomes
from harness._spec import WorldSpec
from harness.outcomes import RankStatus

_SEVERITY = (outcomes.CRASHED, outcomes.HUNG, outcomes.FAILED)

HEADLINE_MAX_LINES = 8
HEADLINE_MAX_CHARS = 1000


def describe_exception(exc: BaseException) -> str:
    """The exception's type and message, cut to a size a report can show beside hundreds of
    others: its first lines name the key and the values."""
    lines = "".join(traceback.format_exception_only(exc)).strip().splitlines()
    text = "\n".join(lines[:HEADLINE_MAX_LINES])
    if len(lines) > HEADLINE_MAX_LINES or len(text) > HEADLINE_MAX_CHARS:
        text = text[:HEADLINE_MAX_CHARS] + " ..."
    return text


def describe_exit(returncode: int) -> str:
    """A human description of a process exit status (negative = signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (exit status {returncode})"
    return f"exited with code {returncode}"


@dataclass
class WorldOutcome:
    """Everything the controller learnt about one test in one world."""

    spec: WorldSpec
    results: dict[int, msg.RankResult]
    captures: dict[int, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # worlds replaced before the test ran
    rerun_because: str = ""  # why this is the outcome of the test's second run

    @property
    def verdict(self) -> RankStatus:
        """passed, failed, skipped or xfailed: the test's single outcome."""
        statuses = {self.results[r].status for r in self.ranks}
        if len(self.results) < self.spec.size or statuses & set(_SEVERITY):
            return outcomes.FAILED
        if len(statuses) == 1:
            return statuses.pop()
        return outcomes.FAILED  # ranks disagree on skip / xfail / pass

    @property
    def ranks(self) -> list[int]:
        return sorted(self.results)

    @property
    def world_is_reusable(self) -> bool:
        """True when the next test can run in this world as in a fresh one.

        Every rank must have ended the same way and made the same process groups, and no
        rank asked for a fresh world. A test that did not pass keeps it only when every rank
        ran as many collectives on the default group and on each kept mesh's groups: a rank
        that stopped short would leave data in flight for the next test. A failure keeps it
        only in a CPU world (a device error may poison the process), and only where the
        backend counts collectives.
        """
        results = [self.results[r] for r in self.ranks]
        statuses = {result.status for result in results}
        if len(results) < self.spec.size or len(statuses) != 1:
            return False
        if any(result.respawn for result in results):
            return False
        status = statuses.pop()
        if status in (outcomes.CRASHED, outcomes.HUNG):
            return False
        if len({result.pg_count for result in results}) != 1:
            return False
        if status == outcomes.PASSED:
            return True
        counts = {result.collectives for result in results}
        if status != outcomes.FAILED:
            return len(counts) == 1  # uncounted everywhere: the kept meshes went
        return self.spec.device_type == "cpu" and len(counts) == 1 and None not in counts

    @property
    def cut_at_deadline(self) -> bool:
        """Whether the test was cut only for missing its deadline: a rank hung, and none
        failed or crashed first (its peers are then cut as hung too, but for its failure)."""
        statuses = {self.results[rank].status for rank in self.ranks}
        missing = len(self.results) < self.spec.size
        return (outcomes.HUNG in statuses or missing) and not statuses & {
            outcomes.FAILED,
            outcomes.CRASHED,
        }

    @property
    def ranks_lost(self) -> list[int]:
        """The ranks that crashed, hung or sent no result: their process is gone or stuck."""
        lost = (outcomes.CRASHED, outcomes.HUNG)
        return [
            rank
            for rank in range(self.spec.size)
            if rank not in self.results or self.results[rank].status in lost
        ]

    @property
    def reason(self) -> str:
        """The agreed skip or xfail reason (one line per distinct reason)."""
        reasons = dict.fromkeys(self.results[r].longrepr for r in self.ranks)
        return "\n".join(reasons)

    @property
    def failing_ranks(self) -> list[int]:
        """The ranks that failed, crashed, hung or sent no result; when ranks merely disagree
        on skip, xfail or pass, every rank that did not pass."""
        severe = [
            rank
            for rank in range(self.spec.size)
            if rank not in self.results or self.results[rank].status in _SEVERITY
        ]
        if severe or self.verdict != outcomes.FAILED:
            return severe
        return [rank for rank in self.ranks if self.results[rank].status != outcomes.PASSED]

    @property
    def first_failure(self) -> str:
        """The lowest failing rank and its exception in a few lines: a report's one cell."""
        ranks = self.failing_ranks
        if not ranks:
            return ""
        rank = ranks[0]
        result = self.results.get(rank)
        if result is None:
            return f"rank {rank}: no result"
        text = result.headline or (result.longrepr.strip().splitlines() or [""])[0]
        return f"rank {rank} {result.status}: {text}"

    def failure_report(self) -> str:
        """The failure text: a summary line, then each non-passing rank's report."""
        lines = [f"{self.spec.label}: " + ", ".join(self._rank_summaries())]
        lines += self.notes
        if self.rerun_because:
            lines.append(f"run twice: {self.rerun_because}")
        for rank in self.ranks:
            result = self.results[rank]
            if result.status != outcomes.PASSED:
                lines.append(f"{'=' * 20} rank {rank}: {result.status} {'=' * 20}")
                lines.append(result.longrepr.rstrip())
        return "\n".join(lines)

    def _rank_summaries(self) -> list[str]:
        by_status: dict[str, list[int]] = {}
        for rank in self.ranks:
            by_status.setdefault(self.results[rank].status, []).append(rank)
        order = [*_SEVERITY, outcomes.SKIPPED, outcomes.XFAILED, outcomes.PASSED]
        return [
            f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))} {status}"
            for status in order
            if (ranks := by_status.get(status))
        ]
