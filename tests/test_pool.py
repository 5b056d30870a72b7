"""WorldPool: reuse by spec, least-recently-used eviction, respawn of dead worlds; each with
ranks forked from templates and with ranks spawned as fresh interpreters."""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ForkServers, TestRequest, WorldPool, WorldSettings, WorldSpec

pytestmark = pytest.mark.slow

BODIES = Path(__file__).parent / "inner" / "inner_pool_bodies.py"


def settings() -> WorldSettings:
    return WorldSettings(sys_path=list(sys.path), rootdir=str(BODIES.parent), inifile=None)


@pytest.fixture(params=["fork", "spawn"])
def pool_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[list[WorldPool], ForkServers | None]]:
    """Pools to close after the test, and the templates their ranks fork from (fork) or
    None (spawn)."""
    templates = None
    if request.param == "fork":
        modules = (("inner_pool_bodies", str(BODIES)),)
        templates = ForkServers(tmp_path / "templates", settings(), modules)
    pools: list[WorldPool] = []
    yield pools, templates
    for pool in pools:
        pool.close()  # and the templates it was given


def new_pool(factory: tuple[list[WorldPool], ForkServers | None], max_alive: int) -> WorldPool:
    pools, templates = factory
    pool = WorldPool(settings(), max_alive=max_alive, templates=templates)
    pools.append(pool)
    return pool


def run(
    pool: WorldPool, spec: WorldSpec, tmp_path: Path, body: str = "test_report_pid"
) -> dict[int, int]:
    """Run a pid-reporting body; return each rank's pid."""
    return run_with_notes(pool, spec, tmp_path, body)[0]


def run_with_notes(
    pool: WorldPool, spec: WorldSpec, tmp_path: Path, body: str = "test_report_pid"
) -> tuple[dict[int, int], list[str]]:
    """Run a pid-reporting body; return each rank's pid and the outcome's notes."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    request = TestRequest.of(
        module_name="inner_pool_bodies",
        module_path=str(BODIES),
        qualname=body,
        params={},
        tmp_path=str(tmp_path),
        timeout_s=60,
    )
    outcome = pool.run(spec, request)
    assert outcome.verdict == "passed", outcome.failure_report()
    pids = {r: int((tmp_path / f"pid{r}").read_text()) for r in range(spec.size)}
    return pids, outcome.notes


def wait_until_dead(pid: int) -> None:
    """Wait until ``pid`` (the pool's child, or a template's) has ended, without reaping it
    (its parent will). A killed multithreaded process ends once all its threads are gone."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], 10)
        assert ready, f"process {pid} did not die"
    finally:
        os.close(fd)


ONE = WorldSpec("gloo", 1, "cpu")
TWO = WorldSpec("gloo", 2, "cpu")


def test_max_alive_one_closes_the_previous_world(
    pool_factory: tuple[list[WorldPool], ForkServers | None], tmp_path: Path
) -> None:
    pool = new_pool(pool_factory, max_alive=1)
    first = run(pool, ONE, tmp_path / "a")
    run(pool, TWO, tmp_path / "b")
    assert pool.alive() == [TWO]
    again = run(pool, ONE, tmp_path / "c")
    assert again != first
    assert pool.spawned == 3


def test_least_recently_used_world_is_evicted(
    pool_factory: tuple[list[WorldPool], ForkServers | None], tmp_path: Path
) -> None:
    pool = new_pool(pool_factory, max_alive=2)
    one = run(pool, ONE, tmp_path / "a")
    run(pool, TWO, tmp_path / "b")
    assert run(pool, ONE, tmp_path / "c") == one  # reused, and now most recent
    assert pool.alive() == [TWO, ONE]
    run(pool, WorldSpec("gloo", 3, "cpu"), tmp_path / "d")
    assert pool.alive() == [ONE, WorldSpec("gloo", 3, "cpu")]
    assert pool.spawned == 3


def test_rank_dying_between_tests_is_noticed_and_the_world_respawned(
    pool_factory: tuple[list[WorldPool], ForkServers | None], tmp_path: Path
) -> None:
    pool = new_pool(pool_factory, max_alive=1)
    before = run(pool, TWO, tmp_path / "a")
    os.kill(before[1], signal.SIGKILL)
    wait_until_dead(before[1])
    after, notes = run_with_notes(pool, TWO, tmp_path / "b")
    assert set(after.values()).isdisjoint(before.values())
    assert notes == [
        "the world was respawned: between tests rank 1 killed by SIGKILL (exit status -9)"
    ]


def test_a_test_that_asks_for_a_fresh_world_leaves_the_next_one_a_new_world(
    pool_factory: tuple[list[WorldPool], ForkServers | None], tmp_path: Path
) -> None:
    pool = new_pool(pool_factory, max_alive=1)
    first = run(pool, TWO, tmp_path / "a")
    asking = run(pool, TWO, tmp_path / "b", body="test_ask_for_a_fresh_world")
    assert asking == first  # it ran in the world it found
    after = run(pool, TWO, tmp_path / "c")
    assert set(after.values()).isdisjoint(asking.values())
    assert pool.spawned == 2


def test_ranks_send_their_messages_to_the_controller_at_once(
    pool_factory: tuple[list[WorldPool], ForkServers | None], tmp_path: Path
) -> None:
    """A rank sends two small messages per test; with Nagle's algorithm on, the second waits
    40 ms for the first's delayed acknowledgement."""
    pool = new_pool(pool_factory, max_alive=1)
    run(pool, TWO, tmp_path, body="test_check_the_controller_connection_sends_at_once")


def test_max_alive_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_alive must be at least 1"):
        WorldPool(settings(), max_alive=0)
