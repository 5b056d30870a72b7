"""A save killed part way, as a preemption or the OOM killer kills it, is reported by every
rank that survives, loses no earlier checkpoint, and leaves nothing that loads as one.

A cell trains and saves a checkpoint (``previous``), trains a step more and saves again into
another folder. The second save is killed with SIGKILL at a phase (``conformance.stores``'
``PHASES``): as its writer begins (the plans made and exchanged), after ``AT_BYTE`` bytes of
its data file, once its data is written (before ``.metadata``), or after ``AT_BYTE`` bytes of
``.metadata``. What dies is the process that writes for the last rank, or for rank 0 in
``.metadata``, which only rank 0 writes: the rank itself with ``dcp.save`` and the thread
checkpointer, its checkpointer process with the process checkpointer. The writer kills its
own process at that point, every run, and stages what it saves (every kind of tensor, in
every release). Every cell of the golden role (one per family) runs at 2 ranks; DDP runs
at 4, where some survivors hang (see the manifest).

On every rank that survives:

- its save raises within the test's deadline (an async save within its checkpointer's
  limit);
- ``previous`` reads exactly as it did before the save (each rank reads it whole, alone);
- the torn checkpoint is refused by a read, with an error that names its folder.

And, judged once per kind of save and world size, the survivors' errors name the killed
rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import pytest
import torch.distributed as dist

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, with_role
from conformance.stores import PHASES, Phase, SaveKill, killed_writer
from conformance.training import (
    Training,
    differences,
    last_words,
    read_whole,
    skip_unless_checkpointer,
    start_async_save,
    trained_after_a_checkpoint,
    training_state,
)

Save = Literal["dcp", "thread", "process"]
SAVES: tuple[Save, ...] = ("dcp", "thread", "process")
RECIPE = "adam"
SAVED_AFTER = 2


def _every_family_at_two_ddp_at_four(size: int, cell: str, **_: Any) -> bool:
    parallelism = PARALLELISMS[cell]
    return parallelism.supports(size) and (size == 2 or parallelism.family == "ddp")


@pytest.mark.world(2, 4, applies=_every_family_at_two_ddp_at_four)
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("cell", with_role("golden"))
def test_a_save_killed_midway_is_reported_and_loses_nothing(world, cell, save, phase):
    previous, target, kill, _ = _killed_save(world, cell, save, phase)
    after = read_whole(world, "previous")
    killed = _killed(save, SaveKill.victim(phase, world.size))
    changed = differences(after, previous, ("after the killed save", "before it"))
    assert not changed, (
        f"rank {world.rank}: the previous checkpoint changed when {killed} was killed "
        f"{kill.words}: " + "; ".join(changed)
    )
    torn = _refusal_or_leaves(world, target)
    assert isinstance(torn, BaseException), (
        f"rank {world.rank}: {target}, torn when {killed} was killed {kill.words}, reads as a "
        f"checkpoint of {len(torn)} values"
    )
    assert str(target) in str(torn), (
        f"rank {world.rank}: reading {target}, torn when {killed} was killed {kill.words}, "
        f"failed without naming it: {type(torn).__name__}: {last_words(torn)}"
    )


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("save", SAVES)
def test_the_survivors_of_a_killed_save_name_the_killed_rank(world, save):
    """How a survivor learns of the death depends on the save's kind and the world's size,
    not on the cell or the phase: DDP, killed as its writer begins."""
    _, _, kill, refused = _killed_save(world, "ddp", save, "planned")
    victim = SaveKill.victim(kill.phase, world.size)
    if save == "process" and world.rank == victim:
        return  # its own checkpointer process died: it need not be told which rank it is
    assert f"rank {victim}" in str(refused), (
        f"rank {world.rank}: the save failed once {_killed(save, victim)} was killed "
        f"{kill.words}, without naming rank {victim}: {type(refused).__name__}: "
        f"{last_words(refused)}"
    )


def _killed_save(
    world: Any, cell: str, save: Save, phase: Phase
) -> tuple[dict[str, Any], Path, SaveKill, BaseException]:
    """``cell`` trained with a previous checkpoint, then its next save killed at ``phase``:
    on the ranks that survive, the previous checkpoint as read before the save, the torn
    checkpoint's folder, the kill, and the error the save ended with."""
    victim = SaveKill.victim(phase, world.size)
    _arrange_the_kill(world, save, victim)
    training = trained_after_a_checkpoint(world, cell, RECIPE, SAVED_AFTER)
    previous = read_whole(world, "previous")
    kill = SaveKill(phase, spared_pid=os.getpid() if save == "process" else None)
    target = world.tmp_path / "torn"
    writer = killed_writer(target, kill if world.rank == victim else None)
    refused = _save(training, target, writer, save)
    assert save == "process" or world.rank != victim, (
        f"rank {victim} was to be killed {kill.words}, and its save ended first, with "
        + ("success" if refused is None else f"{type(refused).__name__}: {last_words(refused)}")
    )
    assert refused is not None, (
        f"rank {world.rank}: the save succeeded, though {_killed(save, victim)} was killed "
        f"{kill.words}"
    )
    return previous, target, kill, refused


def _killed(save: Save, victim: int) -> str:
    return f"rank {victim}'s {'checkpointer process' if save == 'process' else 'process'}"


def _arrange_the_kill(world: Any, save: Save, victim: int) -> None:
    """Tell the harness what dies: the victim rank, or (process checkpointer) a checkpointer
    process the build would keep dead for later saves. Either way the world goes after the
    test; torchrun, which cannot replace it, skips."""
    if save == "process":
        skip_unless_checkpointer("process")
        arranged = world.respawn_after_test()
    else:
        arranged = world.may_be_killed(victim)
    if not arranged:
        pytest.skip("a killed rank or checkpointer process needs a world the harness replaces")


def _save(training: Training, target: Path, writer: Any, save: Save) -> BaseException | None:
    """Save ``training``'s state through ``writer`` as ``save`` says: the error it ended with
    on this rank, or None."""
    state = training_state(*training)
    try:
        if save == "dcp":
            dcp.save(state, storage_writer=writer)
            return None
        group = dist.new_group(backend="gloo")
        return start_async_save(state, target, writer, save, group).error()
    except BaseException as refused:  # CheckpointException is a BaseException
        return refused


def _refusal_or_leaves(world: Any, folder: Path) -> Any:
    """What reading ``folder`` whole gives this rank: its values, or the error."""
    try:
        return read_whole(world, folder.name)
    except (Exception, dcp.CheckpointException) as refused:  # the latter: a BaseException
        return refused
