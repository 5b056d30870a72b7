"""What the plugin reads off a collected world test: its marker, world size and deadline, and
what a failed one carries into reports. Shared by both launch modes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness._options import WorldOptions
from harness._outcome import WorldOutcome

MARKER = "world"
# Runs a world test in a world started for it and closed after it, under a deadline of at
# most ``timeout`` seconds: for tests that may hang or crash (a lifted skip of the manifest).
ALONE_MARKER = "world_alone"
# Names of the user properties (junit XML <property> elements) a failed world test carries.
FAILING_RANKS = "failing_ranks"  # e.g. "1,3"
FIRST_FAILURE = "first_failure"  # the lowest failing rank and its exception in a few lines


def item_size(item: pytest.Item) -> int | None:
    """The world size of a world test's id; None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker(MARKER) is None:
        return None
    size: int = callspec.params["world"]
    return size


@dataclass(frozen=True)
class Deadline:
    """How long a world test's ranks get: ``seconds``; where those are fitted to a duration
    recorded on another machine (``fitted``), what the test gets without them."""

    seconds: float
    unfitted_s: float

    @property
    def fitted(self) -> bool:
        """Shorter than the test's own limit for a recorded duration's sake: a cut there
        says nothing of a hang on this machine."""
        return self.seconds < self.unfitted_s


def deadline(item: pytest.Item, options: WorldOptions) -> Deadline:
    """The marker's ``timeout``, else a deadline fitted to the test's recorded duration, else
    ``--world-timeout``; at most the ``world_alone`` marker's timeout."""
    marker = item.get_closest_marker(MARKER)
    timeout = marker.kwargs.get("timeout") if marker else None
    alone = item.get_closest_marker(ALONE_MARKER)
    cap = alone.kwargs.get("timeout") if alone else None

    def capped(seconds: float) -> float:
        return seconds if cap is None else min(seconds, float(cap))

    if timeout is not None:
        return Deadline(capped(float(timeout)), capped(float(timeout)))
    return Deadline(capped(options.deadline_s(item.nodeid)), capped(options.timeout_s))


def failure_is_expected(item: pytest.Item) -> bool:
    """Whether pytest will report any failure of ``item`` as an expected one, keeping only the
    xfail reason: an xfail marker with no condition and no ``raises`` that runs the test, and
    no ``--runxfail``. Conditions are not evaluated: a conditional marker counts as not."""
    if item.config.getoption("runxfail", False):
        return False
    return any(
        not mark.args
        and mark.kwargs.get("run", True)
        and not {"condition", "raises"} & mark.kwargs.keys()
        for mark in item.iter_markers(name="xfail")
    )


def failure_properties(outcome: WorldOutcome) -> list[tuple[str, str]]:
    """The junit properties of a failed world test: its failing ranks and first failure."""
    ranks = ",".join(map(str, outcome.failing_ranks))
    return [(FAILING_RANKS, ranks), (FIRST_FAILURE, outcome.first_failure)]
