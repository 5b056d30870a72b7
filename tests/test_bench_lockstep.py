"""Two runs in lockstep take strict turns, step by step, and a run that ends early never
keeps the other waiting."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

from ci.bench.lockstep import TURNS_ENV, run_in_lockstep, step

# A run of STEPS steps, each logged with its start and end; rank 0 of a one-rank world.
RUN = """
import sys, time
from ci.bench.lockstep import step

class OneRank:
    rank = 0
    def barrier(self):
        pass

log, steps = sys.argv[1], int(sys.argv[2])
for index in range(steps):
    with step(OneRank()):
        start = time.monotonic()
        time.sleep(0.02)
        with open(log, "a") as out:
            out.write(f"{index} {start} {time.monotonic()}\\n")
"""


def _run(tmp_path: Path, steps: tuple[int, int]) -> list[list[tuple[int, float, float]]]:
    script = tmp_path / "run.py"
    script.write_text(RUN)
    logs = [tmp_path / f"log-{side}" for side in (0, 1)]
    commands = tuple(
        [sys.executable, str(script), str(logs[side]), str(steps[side])] for side in (0, 1)
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


def test_the_runs_alternate_step_by_step_and_never_overlap(tmp_path: Path) -> None:
    first, second = _run(tmp_path, (6, 6))
    merged = sorted(
        [(start, end, 0, index) for index, start, end in first]
        + [(start, end, 1, index) for index, start, end in second]
    )
    assert [(side, index) for _, _, side, index in merged] == [
        (side, index) for index in range(6) for side in (0, 1)
    ]
    for (_, end, _, _), (start, _, _, _) in pairwise(merged):
        assert end <= start


def test_a_run_that_ends_first_leaves_the_other_to_go_on_alone(tmp_path: Path) -> None:
    first, second = _run(tmp_path, (2, 7))
    assert [index for index, _, _ in first] == [0, 1]
    assert [index for index, _, _ in second] == list(range(7))


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
