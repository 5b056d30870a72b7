"""What the plugin reads off a collected world test: its marker, world size and deadline, and
what a failed one carries into reports. Shared by both launch modes."""

from __future__ import annotations

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


def deadline(item: pytest.Item, options: WorldOptions) -> float:
    """The marker's ``timeout``, else a deadline fitted to the test's recorded duration, else
    ``--world-timeout``; at most the ``world_alone`` marker's timeout."""
    marker = item.get_closest_marker(MARKER)
    timeout = marker.kwargs.get("timeout") if marker else None
    fitted = float(timeout) if timeout is not None else options.deadline_s(item.nodeid)
    alone = item.get_closest_marker(ALONE_MARKER)
    cap = alone.kwargs.get("timeout") if alone else None
    return fitted if cap is None else min(fitted, float(cap))


def deadline_is_fitted(item: pytest.Item, options: WorldOptions) -> bool:
    """Whether ``deadline`` is one fitted to the test's recorded duration, shorter than
    ``--world-timeout``: recorded on another machine, it says nothing of a hang on this one."""
    marker = item.get_closest_marker(MARKER)
    explicit = marker is not None and marker.kwargs.get("timeout") is not None
    fitted = options.deadline_s(item.nodeid)
    return not explicit and fitted < options.timeout_s and deadline(item, options) == fitted


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
