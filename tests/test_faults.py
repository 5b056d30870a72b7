"""Fault injection: hangs, crashes and disagreements never pass and never stop the session.

One inner session runs ``inner/inner_faults.py`` at world sizes 1, 2 and 4;
each fault is followed by a probe that must pass in a fresh world, except a failure of
every rank at the same point of a test, after which the world is kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness._world import FAILED_GRACE_S
from tests._inner import InnerRun, run_inner

pytestmark = pytest.mark.slow

SIZES = (1, 2, 4)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner("inner_faults.py", tmp_path_factory.mktemp("faults"), "--world-sizes", "1,2,4")


def pids(run: InnerRun, name: str, size: int) -> dict[int, str]:
    folder = run.workdir / "pids"
    found = {}
    for rank in range(size):
        path = folder / f"{name}-w{size}-r{rank}"
        if path.exists():
            found[rank] = path.read_text()
    return found


# scenario -> (sizes, {size: (outcome, texts the report must contain)})
def last(size: int) -> int:
    return size - 1


FAULTS = {
    "hang_one_rank": lambda n: (
        "failed",
        [f"rank {last(n)} hung", "did not finish within the 3 s deadline", "in test_hang_one_rank"],
    ),
    "hang_all_ranks": lambda n: (
        "failed",
        [
            f"{'rank' if n == 1 else 'ranks'} {', '.join(map(str, range(n)))} hung",
            "in test_hang_all_ranks",
        ],
    ),
    "exception_one_rank": lambda n: (
        "failed",
        [f"rank {last(n)}: failed", f"ValueError: injected failure on rank {last(n)}"],
    ),
    "exit_one_rank": lambda n: ("failed", [f"rank {last(n)} crashed", "exited with code 13"]),
    "segfault_one_rank": lambda n: ("failed", [f"rank {last(n)} crashed", "killed by SIGSEGV"]),
    "sigkill_one_rank": lambda n: ("failed", [f"rank {last(n)} crashed", "killed by SIGKILL"]),
    # The body passed on every rank; the last rank's clean-up after it hung or died.
    "hang_in_clean_up": lambda n: (
        "failed",
        [
            f"rank {last(n)} hung",
            "did not finish within the 3 s deadline, in clean-up after its test body passed",
            "in clean_up_that_hangs",
        ],
    ),
    "exit_in_clean_up": lambda n: (
        "failed",
        [
            f"rank {last(n)} crashed",
            "exited with code 17 in clean-up after its test body passed",
        ],
    ),
    # A rank killed as its test arranged is no crash: the others' results are the verdict.
    "killed_as_arranged": lambda n: ("passed", []),
    "killed_as_arranged_then_a_survivor_fails": lambda n: (
        "failed",
        ["rank 0: failed", "ValueError: injected failure on rank 0"],
    ),
    # Any other death of a rank that may be killed is a crash.
    "may_be_killed_but_exits": lambda n: (
        "failed",
        [f"rank {last(n)} crashed", "exited with code 13"],
    ),
    "collective_on_some_ranks": lambda n: (
        "failed",
        ["rank 0 hung", "in test_collective_on_some_ranks"],
    ),
    # Cut short once the grace after the failure ran out, long before the 120 s deadline.
    "failure_leaves_peers_waiting": lambda n: (
        "failed",
        [
            f"ValueError: injected failure on rank {last(n)}",
            f"still running {FAILED_GRACE_S:g} s after rank {last(n)} failed",
            "in test_failure_leaves_peers_waiting",
        ],
    ),
    "failure_out_of_step": lambda n: (
        "failed",
        [f"ranks {', '.join(map(str, range(n)))} failed", "ValueError: injected failure on rank 1"],
    ),
}
ONLY_WITH_PEERS = (
    "killed_as_arranged",
    "killed_as_arranged_then_a_survivor_fails",
    "may_be_killed_but_exits",
    "collective_on_some_ranks",
    "failure_out_of_step",
    "failure_leaves_peers_waiting",
)


def fault_cases() -> list[tuple[str, int]]:
    cases = [(name, size) for name in FAULTS for size in SIZES]
    return [c for c in cases if not (c[0] in ONLY_WITH_PEERS and c[1] == 1)]


def fresh_world_cases() -> list[tuple[str, int]]:
    """Every fault but the lone rank's exception: with no peer, that is a failure of every
    rank in step, which keeps the world: see
    ``test_world_is_kept_after_a_failure_of_every_rank_in_step``."""
    return [c for c in fault_cases() if c != ("exception_one_rank", 1)]


@pytest.mark.parametrize(("scenario", "size"), fault_cases())
def test_fault_is_reported_with_rank_and_cause(faults: InnerRun, scenario: str, size: int) -> None:
    outcome, texts = FAULTS[scenario](size)
    name = f"test_{scenario}[w{size}]"
    assert faults.outcome(name) == outcome
    for text in texts:
        assert text in faults.message(name), f"{text!r} not in report of {name}"


@pytest.mark.parametrize(("scenario", "size"), fresh_world_cases())
def test_next_test_passes_in_a_fresh_world(faults: InnerRun, scenario: str, size: int) -> None:
    probe = f"probe_after_{scenario}"
    assert faults.outcome(f"test_{probe}[w{size}]") == "passed"
    before, after = pids(faults, scenario, size), pids(faults, probe, size)
    assert len(after) == size
    assert not set(before.values()) & set(after.values()), "the broken world was reused"


@pytest.mark.parametrize("size", SIZES)
def test_world_is_kept_after_a_failure_of_every_rank_in_step(faults: InnerRun, size: int) -> None:
    """Every rank raised after the same collectives: nothing is left in flight, so the next
    test runs in the same processes, and their collectives still work."""
    name = f"test_failure_on_every_rank_in_step[w{size}]"
    assert faults.outcome(name) == "failed"
    for rank in range(size):
        assert f"ValueError: injected failure on rank {rank}" in faults.message(name)
    probe = "probe_after_failure_on_every_rank_in_step"
    assert faults.outcome(f"test_{probe}[w{size}]") == "passed"
    failed, after = pids(faults, "failure_on_every_rank_in_step", size), pids(faults, probe, size)
    assert len(failed) == size
    assert failed == after


@pytest.mark.parametrize("size", SIZES)
def test_what_a_crashed_rank_printed_is_shown(faults: InnerRun, size: int) -> None:
    """A rank that died sent no result: its capture is read from its file."""
    assert f"rank {last(size)} of {size} exits now" in faults.output


@pytest.mark.parametrize("size", SIZES)
def test_world_is_reused_between_passing_tests(faults: InnerRun, size: int) -> None:
    start, reused = pids(faults, "probe_start", size), pids(faults, "probe_reused", size)
    assert len(start) == size
    assert start == reused


@pytest.mark.parametrize("size", [2, 4])
def test_skip_on_some_ranks_fails_and_names_them(faults: InnerRun, size: int) -> None:
    name = f"test_skip_on_some_ranks[w{size}]"
    assert faults.outcome(name) == "failed"
    assert f"rank {last(size)} skipped" in faults.message(name)
    assert f"rank {last(size)} has nothing to do" in faults.message(name)


def test_skip_agreed_by_the_only_rank_is_a_skip(faults: InnerRun) -> None:
    assert faults.outcome("test_skip_on_some_ranks[w1]") == "skipped"
    assert "rank 0 has nothing to do" in faults.message("test_skip_on_some_ranks[w1]")


def test_every_collected_test_is_in_the_junit_xml(faults: InnerRun) -> None:
    source = Path(__file__).parent / "inner" / "inner_faults.py"
    bodies = source.read_text().count("\ndef test_")
    sizes_2_4_only = source.read_text().count("@pytest.mark.world(2, 4")
    expected = (bodies - sizes_2_4_only) * len(SIZES) + sizes_2_4_only * 2
    assert len(faults.cases) == expected
    assert faults.returncode == 1


@pytest.mark.parametrize("size", [2, 4])
def test_a_rank_killed_as_arranged_is_not_called_crashed(faults: InnerRun, size: int) -> None:
    report = faults.message(f"test_killed_as_arranged_then_a_survivor_fails[w{size}]")
    assert "crashed" not in report
    assert f"rank {last(size)} passed" in report or f", {last(size)} passed" in report


@pytest.mark.parametrize("size", SIZES)
def test_a_fault_of_the_body_is_not_called_one_of_clean_up(faults: InnerRun, size: int) -> None:
    for scenario in ("hang_one_rank", "exit_one_rank"):
        assert "in clean-up" not in faults.message(f"test_{scenario}[w{size}]")
