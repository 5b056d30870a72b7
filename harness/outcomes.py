"""The words for how a test ended, defined once for the harness, the gate, its reports and
the mutation runner.

A rank's status is what one rank made of one test body; a test's outcome is what pytest (and
so the gate) records for the whole test id.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

RankStatus = Literal["passed", "failed", "skipped", "xfailed", "crashed", "hung"]
PASSED: Final = "passed"
FAILED: Final = "failed"
SKIPPED: Final = "skipped"
XFAILED: Final = "xfailed"
CRASHED: Final = "crashed"  # set by the controller: the rank died
HUNG: Final = "hung"  # set by the controller: the rank missed its deadline

Outcome = Literal["failed", "error", "xpassed", "passed", "xfailed", "skipped"]
# Worst first: the order of the report's columns and of a matrix cell's colour.
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
_FAILURES: Final[frozenset[Outcome]] = frozenset({"failed", "error", "xpassed"})


def is_failure(outcome: Outcome) -> bool:
    """Whether ``outcome`` fails the gate: a failure, an error, or a strict xfail that passed."""
    return outcome in _FAILURES
