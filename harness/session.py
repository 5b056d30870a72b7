"""What the world plugin keeps for a pytest session, for other plugins (the gate's recorder)
to read: its resolved options, the ids left out as not applicable, and the names of the
report properties it adds.
"""

from __future__ import annotations

import pytest

from harness._items import ALONE_MARKER, FAILING_RANKS, FIRST_FAILURE, MARKER
from harness._launch import LaunchMode
from harness._options import WorldOptions

__all__ = [
    "ALONE_MARKER",
    "FAILING_RANKS",
    "FIRST_FAILURE",
    "MARKER",
    "NOT_APPLICABLE",
    "WorldOptions",
    "launch_mode",
    "world_options",
]

# (node id, world size) of each id the marker's ``applies`` left out: cells that do not exist
# at that world size.
NOT_APPLICABLE = pytest.StashKey[list[tuple[str, int]]]()
MODE = pytest.StashKey[LaunchMode]()


def launch_mode(config: pytest.Config) -> LaunchMode | None:
    """The session's launch mode; None in a rank process, which launches nothing."""
    return config.stash.get(MODE, None)


def world_options(config: pytest.Config) -> WorldOptions:
    """The session's world options, backend and device type resolved: what other plugins
    read instead of resolving the raw options a second time."""
    return config.stash[MODE].options
