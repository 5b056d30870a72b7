"""Messages between the controller and its rank processes.

They travel pickled over an authenticated ``multiprocessing.connection``;
each is a small frozen dataclass so both sides agree on the fields.
"""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from harness._spec import WorldSettings, WorldSpec
from harness.outcomes import RankStatus


def without_delay(conn: Connection) -> Connection:
    """Send each message at once on this loopback TCP connection (no Nagle): a rank sends two
    small messages in a row per test (``BodyEnded``, then ``RankResult``), and the second would
    otherwise wait for the acknowledgement of the first, which Linux delays by 40 ms."""
    with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:  # a dup
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


@dataclass(frozen=True)
class Init:
    """Controller → rank, once: join the world."""

    spec: WorldSpec
    store_host: str
    store_port: int
    settings: WorldSettings


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
class TestRequest:
    """Controller → rank: run one test body, where it lives, with which arguments.

    The arguments travel pickled apart (``of`` pickles them once): a rank unpickles them
    only after it has imported the test module through pytest's assertion rewriting, since
    they may be objects of classes that module defines."""

    __test__ = False  # not a pytest test class

    module_name: str
    module_path: str
    qualname: str
    params: bytes  # pickled dict of parametrize arguments
    tmp_path: str  # created on first use by whichever rank needs it
    timeout_s: float  # the controller's deadline for every rank's result
    # pytest will report any failure as expected and show none of its text (an xfail marker
    # without conditions): a rank formats it in Python's native style, which is cheaper
    failure_expected: bool = False
    nodeid: str = ""  # the pytest node id, under which a tracing rank files what it executed

    @classmethod
    def of(
        cls,
        *,
        module_name: str,
        module_path: str,
        qualname: str,
        params: dict[str, Any],
        tmp_path: str,
        timeout_s: float,
        failure_expected: bool = False,
        nodeid: str = "",
    ) -> TestRequest:
        pickled = pickle.dumps(params)
        return cls(
            module_name,
            module_path,
            qualname,
            pickled,
            tmp_path,
            timeout_s,
            failure_expected,
            nodeid,
        )


@dataclass(frozen=True)
class BodyEnded:
    """Rank → controller: the test body ended with ``status``; the rank now cleans up after
    it (destroys the test's process groups) and then sends its ``RankResult``. A rank that
    hangs or dies after this message did so in clean-up, and its report says so."""

    rank: int
    status: RankStatus


@dataclass(frozen=True)
class MayBeKilled:
    """Rank → controller, during a test body: this rank may be killed (SIGKILL) before it
    reports, as its test arranges (``WorldContext.may_be_killed``). Its death by SIGKILL is
    then its part of the test, not a crash."""

    rank: int


@dataclass(frozen=True)
class RankResult:
    """Rank → controller: how one test body ended on one rank.

    ``pg_count`` is the rank's process-group counter after cleanup;
    ``collectives`` the collective sequence numbers of the default group and of each
    mesh kept for the next test, read before cleanup (None where the backend does not
    count). The controller keeps the world only when ranks agree on them, and no rank
    asked for a fresh one (``respawn``): see ``WorldOutcome.world_is_reusable``.
    """

    rank: int
    status: RankStatus
    longrepr: str = ""
    pg_count: int = 0
    collectives: tuple[int, ...] | None = None
    headline: str = ""  # the exception in a few lines, for reports; longrepr has the rest
    captured: dict[str, str] = field(default_factory=dict)  # stream -> what the test wrote
    respawn: bool = False  # the test asked for a fresh world after it (respawn_after_test)


@dataclass(frozen=True)
class Shutdown:
    """Controller → rank: leave the process group and exit."""
