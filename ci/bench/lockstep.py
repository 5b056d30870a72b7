"""Two builds' benchmark runs in lockstep: each step of one run (a case's set-up, a round)
is followed by the same step of the other, so that a slow moment of the machine falls on
both builds' rounds alike and their ratio cancels it.

The two runs are two pytest processes started together (``run_in_lockstep``).
They pass one turn between them through two named pipes in a directory they share: rank 0 of
a run's world takes the turn before a step and gives it to the other run after it, while the
other run's ranks sleep (``step``). A run that has ended gives up its turns for good: the
controller marks it done, and the other run goes on alone.

A case's timed rounds (``timed_rounds``) go on until the runs have enough of them, and a slower
build would have enough sooner. So the turn byte also carries the decision to stop: both runs
time as many rounds as the one that wants more, and round ``r`` of one build stays next to
round ``r`` of the other to the end of the run.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TURNS_ENV = "GATE_BENCH_TURNS"  # DIRECTORY:SIDE, SIDE 0 or 1: the run takes turns there
WAIT_S = 1.0  # how often a waiting run looks whether the other has ended
TURN_TIMEOUT_S = 1800.0  # a turn not given back within this means the other run is stuck

# What a turn's byte says. Side 0 decides whether both runs time another round of a case
# (ROUND or STOP); side 1 follows, and tells whether it wants another (MORE or ENOUGH).
TURN, ROUND, STOP, MORE, ENOUGH = b"t", b"r", b"s", b"m", b"e"


def _pipe(directory: Path, side: int) -> Path:
    return directory / f"turn-{side}"


def _done(directory: Path, side: int) -> Path:
    return directory / f"done-{side}"


class Turns:
    """One run's side of the turn, held by rank 0 of its world (``step``)."""

    def __init__(self, directory: Path, side: int) -> None:
        if side not in (0, 1):
            raise ValueError(f"{TURNS_ENV}: the side is 0 or 1, not {side}")
        self.directory = directory
        self.side = side
        # Read and write ends both open on each pipe, so neither open blocks and no byte is
        # lost while the other run is between steps.
        self._mine = os.open(_pipe(directory, side), os.O_RDWR)
        self._theirs = os.open(_pipe(directory, 1 - side), os.O_RDWR)

    def take(self) -> bytes | None:
        """Wait for the turn and return the other run's byte, or None once the other run has
        ended."""
        waited = 0.0
        while not _done(self.directory, 1 - self.side).exists():
            ready, _, _ = select.select([self._mine], [], [], WAIT_S)
            if ready:
                return os.read(self._mine, 1)
            waited += WAIT_S
            if waited > TURN_TIMEOUT_S:
                raise TimeoutError(
                    f"lockstep: the other run held the turn for {TURN_TIMEOUT_S:.0f} s"
                )
        return None

    def give(self, word: bytes = TURN) -> None:
        os.write(self._theirs, word)


_TURNS: dict[str, Turns] = {}


def _turns(value: str) -> Turns:
    """The turns that ``TURNS_ENV``'s value names, opened once per process."""
    if value not in _TURNS:
        directory, _, side = value.rpartition(":")
        _TURNS[value] = Turns(Path(directory), int(side))
    return _TURNS[value]


@contextmanager
def step(world: Any) -> Iterator[None]:
    """One step of a benchmark, in lockstep with the other run where ``TURNS_ENV`` names
    one: rank 0 takes the turn, the ranks line up, and rank 0 gives it back once every rank
    has finished the block. The other ranks never open the pipes."""
    value = os.environ.get(TURNS_ENV)
    if not value:
        yield
        return
    turns = _turns(value) if world.rank == 0 else None
    if turns is not None:
        turns.take()
    world.barrier()
    try:
        yield
    finally:
        world.barrier()
        if turns is not None:
            turns.give()


def another_round(side: int, wanted: bool, heard: bytes | None) -> bool:
    """Whether a run in lockstep times another round of a case, by its own wish and the byte
    ``heard`` with the turn: side 0 when it wants one or side 1 said MORE, side 1 when it
    wants one or side 0 timed one (ROUND). Side 0 stops only once side 1 has said ENOUGH, so
    in step both time the same rounds. A run alone (``heard`` None), or one that hears
    another step's byte, goes by its own wish, never below it."""
    return wanted or heard == (MORE if side == 0 else ROUND)


def word_after_round(side: int, timed: bool, wants_more: bool) -> bytes:
    """The byte that ends a run's turn in its rounds: side 0's decision, side 1's wish."""
    if side == 0:
        return ROUND if timed else STOP
    return MORE if wants_more else ENOUGH


def timed_rounds(world: Any, wanted: Callable[[], bool]) -> Generator[None, None, None]:
    """Yield once per timed round of a case, for as long as ``wanted()``; in lockstep one
    step per round, for as long as either run wants another (``another_round``). Every rank
    iterates it alike: alone, each rank asks ``wanted``, which must then agree across
    ranks; in lockstep, rank 0 asks, decides and tells the others. A round that raises ends
    its run's rounds, and its byte says so (STOP or ENOUGH): the other run goes on by its own
    wish. Close it (``contextlib.closing``) so that such a round gives the turn back at once."""
    value = os.environ.get(TURNS_ENV)
    if not value:
        while wanted():
            yield
        return
    turns = _turns(value) if world.rank == 0 else None
    while True:
        timed = False
        if turns is not None:
            timed = another_round(turns.side, wanted(), turns.take())
        timed = _rank_0_says(world, timed)
        ended = not timed
        try:
            if timed:
                yield
        except BaseException:
            ended = True
            raise
        finally:
            world.barrier()
            if turns is not None:
                turns.give(word_after_round(turns.side, not ended, not ended and wanted()))
        if ended:
            return


def _rank_0_says(world: Any, decision: bool) -> bool:
    """Rank 0's ``decision``, on every rank; it also lines the ranks up behind rank 0."""
    if world.size == 1:
        return decision
    import torch
    import torch.distributed as dist

    said = torch.tensor([int(decision)], dtype=torch.uint8, device=world.device)
    dist.broadcast(said, src=0)
    return bool(said.item())


def run_in_lockstep(
    commands: tuple[list[str], list[str]],
    envs: tuple[dict[str, str], dict[str, str]],
    directory: Path,
    cwd: Path,
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """Run the two commands together, the first taking the first turn; each one's outcome
    with its output. A run that exits marks itself done, so the other never waits on it."""
    directory.mkdir(parents=True, exist_ok=True)
    for side in (0, 1):
        _done(directory, side).unlink(missing_ok=True)
        _pipe(directory, side).unlink(missing_ok=True)
        os.mkfifo(_pipe(directory, side))
    held = [os.open(_pipe(directory, side), os.O_RDWR) for side in (0, 1)]
    try:
        os.write(held[0], TURN)
        logs = [directory / f"output-{side}.txt" for side in (0, 1)]
        processes = []
        for side in (0, 1):
            with logs[side].open("w") as log:
                processes.append(
                    subprocess.Popen(
                        commands[side],
                        cwd=cwd,
                        env={**envs[side], TURNS_ENV: f"{directory}:{side}"},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
        running = {0, 1}
        while running:
            for side in sorted(running):
                if processes[side].poll() is not None:
                    _done(directory, side).touch()
                    running.discard(side)
            time.sleep(0.2)
        return tuple(  # type: ignore[return-value]
            subprocess.CompletedProcess(
                commands[side], processes[side].returncode, logs[side].read_text(), ""
            )
            for side in (0, 1)
        )
    finally:
        for fd in held:
            os.close(fd)
