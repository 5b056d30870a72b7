"""Messages between the controller and its rank processes.

They travel pickled over an authenticated ``multiprocessing.connection``;
each is a small frozen dataclass so both sides agree on the fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness._spec import WorldSpec
from harness.outcomes import RankStatus


@dataclass(frozen=True)
class Init:
    """Controller → rank, once: join the world."""

    spec: WorldSpec
    rank: int
    store_host: str
    store_port: int
    sys_path: list[str]
    rootdir: str
    inifile: str | None
    verbosity: int
    pg_timeout_s: float


@dataclass(frozen=True)
class Ready:
    """Rank → controller: the process group is up."""

    rank: int


@dataclass(frozen=True)
class InitFailed:
    """Rank → controller: joining the world failed; the text says why."""

    rank: int
    traceback: str


@dataclass(frozen=True)
class TestCall:
    """Controller → rank: run one test body."""

    __test__ = False  # not a pytest test class

    module_name: str
    module_path: str
    qualname: str
    params: bytes  # pickled dict of parametrize arguments
    tmp_path: str  # created on first use by whichever rank needs it


@dataclass(frozen=True)
class RankResult:
    """Rank → controller: how one test body ended on one rank.

    ``pg_count`` is the rank's process-group counter after cleanup;
    ``world_collectives`` the default group's collective sequence number (None
    where the backend does not count). The controller keeps the world only
    when ranks agree on them, and no rank asked for a fresh one (``respawn``): see
    ``WorldOutcome.world_is_reusable``.
    """

    rank: int
    status: RankStatus
    longrepr: str = ""
    pg_count: int = 0
    world_collectives: int | None = None
    headline: str = ""  # the exception in a few lines, for reports; longrepr has the rest
    captured: dict[str, str] = field(default_factory=dict)  # stream -> what the test wrote
    respawn: bool = False  # the test asked for a fresh world after it (respawn_after_test)


@dataclass(frozen=True)
class Shutdown:
    """Controller → rank: leave the process group and exit."""
