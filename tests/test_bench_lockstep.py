"""Two runs in lockstep take strict turns, step by step, time as many rounds of a case as the
run that wants more, and a run that ends early never keeps the other waiting."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

from ci.bench.lockstep import (
    ENOUGH,
    MORE,
    ROUND,
    STOP,
    TURN,
    TURNS_ENV,
    another_round,
    run_in_lockstep,
    step,
    timed_rounds,
    word_after_round,
)

# Rank 0 of a one-rank world that logs each step it takes with its start and end.
ONE_RANK = """
import os, sys, time
from ci.bench.lockstep import step, timed_rounds

class OneRank:
    rank = 0
    size = 1
    def barrier(self):
        pass

def logged(index):
    start = time.monotonic()
    time.sleep(0.02)
    with open(sys.argv[1], "a") as out:
        out.write(f"{index} {start} {time.monotonic()}\\n")
"""

# A run of ARG steps.
RUN = (
    ONE_RANK
    + """
for index in range(int(sys.argv[2])):
    with step(OneRank()):
        logged(index)
"""
)

# A case: its set-up step (-1), rounds while fewer than ARG are timed, then one more step;
# with a second ARG, the run exits at once after that many rounds.
RUN_ROUNDS = (
    ONE_RANK
    + """
wanted, exit_after = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else -1
with step(OneRank()):
    logged(-1)
timed = []
for _ in timed_rounds(OneRank(), lambda: len(timed) < wanted):
    logged(len(timed))
    timed.append(len(timed))
    if len(timed) == exit_after:
        os._exit(0)
with step(OneRank()):
    logged(len(timed))
"""
)


def _run(
    tmp_path: Path,
    args: tuple[tuple[int, ...], tuple[int, ...]],
    runs: tuple[str, str] = (RUN, RUN),
) -> list[list[tuple[int, float, float]]]:
    scripts = [tmp_path / f"run-{side}.py" for side in (0, 1)]
    for script, run in zip(scripts, runs, strict=True):
        script.write_text(run)
    logs = [tmp_path / f"log-{side}" for side in (0, 1)]
    commands = tuple(
        [sys.executable, str(scripts[side]), str(logs[side]), *map(str, args[side])]
        for side in (0, 1)
    )
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    completed = run_in_lockstep(commands, (env, env), tmp_path / "turns", tmp_path)  # type: ignore[arg-type]
    for outcome in completed:
        assert outcome.returncode == 0, outcome.stdout
    return [
        [
            (int(i), float(a), float(b))
            for i, a, b in (line.split() for line in log.read_text().splitlines())
        ]
        for log in logs
    ]


def _sides_in_time(
    first: list[tuple[int, float, float]], second: list[tuple[int, float, float]]
) -> list[tuple[int, int]]:
    """The two runs' steps in the order they ran, as (side, index), checked not to overlap."""
    merged = sorted(
        [(start, end, 0, index) for index, start, end in first]
        + [(start, end, 1, index) for index, start, end in second]
    )
    for (_, end, _, _), (start, _, _, _) in pairwise(merged):
        assert end <= start
    return [(side, index) for _, _, side, index in merged]


def test_the_runs_alternate_step_by_step_and_never_overlap(tmp_path: Path) -> None:
    first, second = _run(tmp_path, ((6,), (6,)))
    assert _sides_in_time(first, second) == [(side, index) for index in range(6) for side in (0, 1)]


def test_a_run_that_ends_first_leaves_the_other_to_go_on_alone(tmp_path: Path) -> None:
    first, second = _run(tmp_path, ((2,), (7,)))
    assert [index for index, _, _ in first] == [0, 1]
    assert [index for index, _, _ in second] == list(range(7))


@pytest.mark.parametrize("wanted", [(3, 6), (6, 3), (4, 4)])
def test_both_runs_time_as_many_rounds_as_the_one_that_wants_more(
    tmp_path: Path, wanted: tuple[int, int]
) -> None:
    """Round r of one run stays next to round r of the other, and the step after the
    rounds too, whichever side wants more."""
    first, second = _run(tmp_path, ((wanted[0],), (wanted[1],)), (RUN_ROUNDS, RUN_ROUNDS))
    most = max(wanted)
    assert _sides_in_time(first, second) == [
        (side, index) for index in range(-1, most + 1) for side in (0, 1)
    ]


@pytest.mark.parametrize("rounds_side", [0, 1])
def test_rounds_go_by_their_own_wish_once_the_other_run_has_ended(
    tmp_path: Path, rounds_side: int
) -> None:
    """The other run ends after one step: the run with rounds times the 5 it wants."""
    runs = (RUN_ROUNDS, RUN) if rounds_side == 0 else (RUN, RUN_ROUNDS)
    args = ((5,), (1,)) if rounds_side == 0 else ((1,), (5,))
    logged = _run(tmp_path, args, runs)
    assert [index for index, _, _ in logged[rounds_side]] == [-1, 0, 1, 2, 3, 4, 5]
    assert [index for index, _, _ in logged[1 - rounds_side]] == [0]


@pytest.mark.parametrize("exiting_side", [0, 1])
def test_a_run_that_exits_in_its_rounds_leaves_the_other_to_its_own_wish(
    tmp_path: Path, exiting_side: int
) -> None:
    """The exiting run wants 3 rounds, the other 6; the one exits in its second round's
    turn, without giving the turn back: the other goes on to its 6, alone."""
    args = [(6,), (6,)]
    args[exiting_side] = (3, 2)
    logged = _run(tmp_path, (args[0], args[1]), (RUN_ROUNDS, RUN_ROUNDS))
    assert [index for index, _, _ in logged[exiting_side]] == [-1, 0, 1]
    assert [index for index, _, _ in logged[1 - exiting_side]] == [-1, 0, 1, 2, 3, 4, 5, 6]


# (side, own wish, byte heard with the turn) -> whether the run times another round.
DECISIONS = [
    (0, True, None, True),
    (0, False, None, False),
    (0, False, MORE, True),
    (0, False, ENOUGH, False),
    (0, True, ENOUGH, True),
    (0, False, TURN, False),  # side 1's byte from the step before the rounds
    (1, False, ROUND, True),
    (1, True, ROUND, True),
    (1, False, STOP, False),
    (1, True, STOP, True),  # out of step: never below its own wish
    (1, True, None, True),
    (1, False, None, False),
    (1, False, MORE, False),  # another step's byte: its own wish
]


@pytest.mark.parametrize(("side", "wanted", "heard", "timed"), DECISIONS)
def test_another_round_is_side_0s_decision_and_never_below_a_runs_own_wish(
    side: int, wanted: bool, heard: bytes | None, timed: bool
) -> None:
    assert another_round(side, wanted, heard) is timed


def test_the_byte_after_a_round_is_side_0s_decision_and_side_1s_wish() -> None:
    assert [
        word_after_round(0, timed, wants) for timed in (True, False) for wants in (True, False)
    ] == [ROUND, ROUND, STOP, STOP]
    assert [
        word_after_round(1, timed, wants) for timed in (True, False) for wants in (True, False)
    ] == [MORE, ENOUGH, MORE, ENOUGH]


def test_outside_lockstep_rounds_go_while_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TURNS_ENV, raising=False)
    timed: list[int] = []
    for _ in timed_rounds(_Rank(0), lambda: len(timed) < 5):
        timed.append(len(timed))
    assert timed == [0, 1, 2, 3, 4]


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1


def test_only_rank_0_holds_the_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank other than 0 lines up with its world and never opens the pipes, which here do
    not exist; rank 0 opens them and fails to."""
    monkeypatch.setenv(TURNS_ENV, f"{tmp_path / 'absent'}:0")
    other = _Rank(1)
    with step(other):
        pass
    assert other.barriers == 2
    with pytest.raises(FileNotFoundError), step(_Rank(0)):
        pass
