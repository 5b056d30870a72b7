"""Verdicts: a test passes only if every rank passed; skips and xfails need agreement."""

from __future__ import annotations

import pytest

from harness import WorldOutcome, WorldSpec
from harness._messages import RankResult
from harness._outcome import describe_exception, describe_exit

SPEC = WorldSpec("gloo", 3, "cpu")


def outcome(*statuses: str, pg_counts: tuple[int, ...] = (0, 0, 0)) -> WorldOutcome:
    results = {
        r: RankResult(
            rank=r, status=s, longrepr=f"text of rank {r}" if s != "passed" else "", pg_count=c
        )
        for r, (s, c) in enumerate(zip(statuses, pg_counts, strict=False))
    }
    return WorldOutcome(spec=SPEC, results=results)


@pytest.mark.parametrize(
    ("statuses", "verdict"),
    [
        (("passed", "passed", "passed"), "passed"),
        (("passed", "failed", "passed"), "failed"),
        (("skipped", "skipped", "skipped"), "skipped"),
        (("skipped", "passed", "passed"), "failed"),
        (("xfailed", "xfailed", "xfailed"), "xfailed"),
        (("xfailed", "skipped", "xfailed"), "failed"),
        (("passed", "passed", "crashed"), "failed"),
        (("hung", "passed", "passed"), "failed"),
        (("passed", "passed"), "failed"),  # a rank reported nothing at all
    ],
)
def test_verdict(statuses: tuple[str, ...], verdict: str) -> None:
    assert outcome(*statuses).verdict == verdict


def test_failure_report_names_every_rank_and_shows_non_passing_ones() -> None:
    report = outcome("passed", "crashed", "failed").failure_report()
    assert report.splitlines()[0] == "gloo/cpu x3: rank 1 crashed, rank 2 failed, rank 0 passed"
    assert "rank 1: crashed" in report
    assert "text of rank 1" in report
    assert "rank 2: failed" in report
    assert "text of rank 2" in report
    assert "rank 0:" not in report


def test_notes_appear_in_the_failure_report() -> None:
    result = outcome("failed", "passed", "passed")
    result.notes.append("the world was respawned: between tests rank 1 exited with code 3")
    assert "between tests rank 1 exited with code 3" in result.failure_report()


def test_agreed_skip_reason_is_given_once() -> None:
    result = WorldOutcome(
        spec=SPEC, results={r: RankResult(r, "skipped", "no GPU") for r in range(3)}
    )
    assert result.reason == "no GPU"


@pytest.mark.parametrize(
    ("statuses", "pg_counts", "reusable"),
    [
        (("passed",) * 3, (2, 2, 2), True),
        (("skipped",) * 3, (0, 0, 0), True),
        (("xfailed",) * 3, (1, 1, 1), True),
        (("passed",) * 3, (2, 3, 2), False),  # ranks made different process groups
        (("passed", "failed", "passed"), (0, 0, 0), False),
        (("passed", "skipped", "passed"), (0, 0, 0), False),
        (("passed", "hung", "passed"), (0, 0, 0), False),
        (("crashed",) * 3, (0, 0, 0), False),
    ],
)
def test_world_reuse_needs_clean_agreeing_ranks(
    statuses: tuple[str, ...], pg_counts: tuple[int, ...], reusable: bool
) -> None:
    assert outcome(*statuses, pg_counts=pg_counts).world_is_reusable is reusable


def test_a_rank_that_asks_for_a_fresh_world_gets_one() -> None:
    asked = {r: RankResult(rank=r, status="passed", respawn=r == 2) for r in range(3)}
    assert not WorldOutcome(spec=SPEC, results=asked).world_is_reusable


def ended_everywhere(
    collectives: tuple[tuple[int, ...] | None, ...],
    status: str = "failed",
    device_type: str = "cpu",
) -> WorldOutcome:
    spec = WorldSpec("gloo" if device_type == "cpu" else "nccl", 3, device_type)
    results = {
        r: RankResult(rank=r, status=status, longrepr="boom", collectives=c)
        for r, c in enumerate(collectives)
    }
    return WorldOutcome(spec=spec, results=results)


@pytest.mark.parametrize(
    ("collectives", "device_type", "reusable"),
    [
        (((4,),) * 3, "cpu", True),  # every rank failed at the same point
        (((5,), (4,), (4,)), "cpu", False),  # rank 0 ran a collective (a send) the others never met
        (((4, 2, 7),) * 3, "cpu", True),  # and as many on each kept mesh's groups
        (((4, 2, 7), (4, 2, 7), (4, 3, 7)), "cpu", False),  # rank 2 ran one more on a mesh
        ((None, None, None), "cpu", False),  # the backend does not count: no proof of step
        (((4,),) * 3, "cuda", False),  # a device error may outlive the test
    ],
)
def test_a_failure_keeps_the_world_only_with_every_rank_in_step_on_cpu(
    collectives: tuple[tuple[int, ...] | None, ...], device_type: str, reusable: bool
) -> None:
    assert ended_everywhere(collectives, "failed", device_type).world_is_reusable is reusable


@pytest.mark.parametrize("status", ["skipped", "xfailed"])
@pytest.mark.parametrize(
    ("collectives", "reusable"),
    [
        (((4, 2),) * 3, True),
        (((4, 2), (4, 2), (4, 3)), False),  # stopped on a kept mesh with data in flight
        ((None, None, None), True),  # uncounted: the ranks destroyed the kept meshes
    ],
)
def test_a_skip_or_xfail_keeps_the_world_with_every_rank_in_step(
    status: str, collectives: tuple[tuple[int, ...] | None, ...], reusable: bool
) -> None:
    assert ended_everywhere(collectives, status, "cuda").world_is_reusable is reusable


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (0, "exited with code 0"),
        (13, "exited with code 13"),
        (-11, "killed by SIGSEGV (exit status -11)"),
        (-9, "killed by SIGKILL (exit status -9)"),
        (-200, "killed by signal 200 (exit status -200)"),
    ],
)
def test_describe_exit(status: int, text: str) -> None:
    assert describe_exit(status) == text


@pytest.mark.parametrize(
    ("statuses", "failing"),
    [
        (("passed", "passed", "passed"), []),
        (("passed", "failed", "crashed"), [1, 2]),
        (("hung", "passed", "passed"), [0]),
        (("passed", "passed"), [2]),  # a rank reported nothing at all
        (("skipped", "passed", "passed"), [0]),  # disagreement: the ranks that did not pass
    ],
)
def test_failing_ranks(statuses: tuple[str, ...], failing: list[int]) -> None:
    assert outcome(*statuses).failing_ranks == failing


def test_first_failure_is_the_lowest_failing_ranks_headline() -> None:
    results = {
        0: RankResult(rank=0, status="passed"),
        1: RankResult(rank=1, status="failed", longrepr="long", headline="AssertionError: k: 1"),
        2: RankResult(rank=2, status="crashed", longrepr="rank 2 killed by SIGKILL\nmore"),
    }
    world = WorldOutcome(spec=SPEC, results=results)
    assert world.first_failure == "rank 1 failed: AssertionError: k: 1"
    del results[1]
    assert world.first_failure == "rank 1: no result"
    results[1] = RankResult(rank=1, status="passed")
    assert world.first_failure == "rank 2 crashed: rank 2 killed by SIGKILL"


def test_describe_exception_keeps_the_first_lines() -> None:
    message = "\n".join(f"line {i}" for i in range(20))
    text = describe_exception(AssertionError(message))
    assert text.startswith("AssertionError: line 0\nline 1")
    assert text.endswith("line 7 ...")
