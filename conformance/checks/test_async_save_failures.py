"""A failed asynchronous save is an error on every rank, and loses nothing.

Judged against the checkpoint saved before it, not against the oracle. A cell trains two
steps and saves asynchronously into one directory, which every rank reads back whole. It
trains a step more and saves into another directory, through a storage writer that raises on
the last rank as its write begins. With the process checkpointer, the writer instead ends that
rank's checkpointer process there (SIGKILL). Both saves are staged by the writer: that way
exists in every release, and it stages every kind of tensor.

The second save must end in an error on every rank. Each rank's future raises within its
limit: none succeeds, none hangs. The error says what failed. Where the write raised, every
rank gives the injected write error. Where the checkpointer process died, the rank that lost
it says that process is dead, and the others give an error of DCP or its collectives. The
first checkpoint must then read exactly as before. The second must not have been committed
(DCP writes a checkpoint's ``.metadata`` last). After a failed write the checkpointer must
save again: the next save succeeds.

Every cell runs at its smallest world size above one and at 4, with each checkpointer. The
dead checkpointer process is tested on DDP alone. That test leaves its world to be respawned,
because the build keeps a dead process as its checkpointer for every later save.

A staging that fails is an error too. Take a caller's stager whose staging has already failed
when ``async_save`` looks at it. Then ``async_save`` must fail the staging completion (the
promise that the state may change) and the save. It must fail both on every rank, with each
checkpointer.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

import pytest
import torch.distributed as dist

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, first_size_and_four
from conformance.models.common import train
from conformance.training import (
    CHECKPOINTERS,
    STAGINGS,
    Cue,
    Die,
    Fail,
    Stagers,
    Training,
    Unheld,
    differences,
    read_whole,
    skip_unless_checkpointer,
    start_async_save,
    trained,
    training_state,
)

RECIPE = "adamw_step_lr"
SAVED_AFTER = 2


def _save(
    world: Any, training: Training, name: str, checkpointer: str, cue: Cue
) -> BaseException | None:
    """An async save of ``training``'s state to ``name`` through a writer with ``cue``,
    staged by the writer (every release's way, and one that stages every kind of tensor):
    the error it ended with on this rank, or None."""
    path = world.tmp_path / name
    stagers = Stagers(STAGINGS["writer"], cue)
    try:
        writer, stager = stagers.for_save(path)
        group = dist.new_group(backend="gloo")
        state = training_state(*training)
        return start_async_save(state, path, writer, checkpointer, group, stager).error()
    finally:
        stagers.close()


def _assert_failed_everywhere(error: BaseException | None, world: Any, says: str | None) -> None:
    """Every rank's save raised; this rank's error says ``says``, or, where None, is one of
    the errors DCP and its collectives raise (``CheckpointException``, ``RuntimeError``)."""
    raised = [False] * world.size
    dist.all_gather_object(raised, error is not None)
    assert all(raised), (
        f"the failed save raised on ranks {[r for r, seen in enumerate(raised) if seen]} only; "
        f"it succeeded on ranks {[r for r, seen in enumerate(raised) if not seen]}"
    )
    what = f"{type(error).__name__}: {str(error)[:600]}"
    if says is not None:
        assert says in str(error), f"rank {world.rank}'s error does not say {says!r}: {what}"
    else:
        kinds = (dcp.CheckpointException, RuntimeError)
        assert isinstance(error, kinds), f"rank {world.rank} raised an unexpected kind: {what}"


def _assert_nothing_lost(world: Any, before: dict[str, Any], failed: str) -> None:
    after = read_whole(world, "first")
    found = differences(after, before, ("after the failed save", "before it"))
    assert not found, "the first checkpoint changed:\n  " + "\n  ".join(found)
    assert not (world.tmp_path / failed / ".metadata").exists(), (
        f"the failed save committed a checkpoint: {failed}/.metadata exists"
    )


def _assert_a_failed_save_loses_nothing(
    world: Any, training: Training, checkpointer: str, cue: Cue, says: str | None
) -> None:
    """A first save, a second through ``cue`` that fails on every rank, and the first still
    reads as it did."""
    model, optimizer, scheduler = training
    first = _save(world, training, "first", checkpointer, Unheld())
    if first is not None:
        raise first
    before = read_whole(world, "first")
    train(model, optimizer, 1, scheduler, start=SAVED_AFTER)
    error = _save(world, training, "second", checkpointer, cue)
    _assert_failed_everywhere(error, world, says)
    _assert_nothing_lost(world, before, "second")


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("checkpointer", CHECKPOINTERS)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
def test_a_write_that_fails_on_one_rank_fails_the_save_on_every_rank(world, cell, checkpointer):
    """And the checkpointer saves again: the next save succeeds."""
    skip_unless_checkpointer(checkpointer)
    training = trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER)
    last = world.size - 1
    says = f"injected write failure on rank {last}"
    cue = Fail(rank=last, writer_rank=world.rank)
    _assert_a_failed_save_loses_nothing(world, training, checkpointer, cue, says)
    after = _save(world, training, "third", checkpointer, Unheld())
    if after is not None:
        world.respawn_after_test()  # a checkpointer process that stopped serving stays so
        raise AssertionError(f"after a failed save, the next save fails: {after!r}") from after


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("cell", ["ddp"])
def test_a_checkpointer_process_that_dies_fails_the_save_on_every_rank(world, cell):
    """The last rank's checkpointer process is killed (SIGKILL) as its write begins: that
    rank's error says its checkpointer process is dead; the others' come from DCP or its
    collectives, which lost a peer."""
    skip_unless_checkpointer("process")
    if not world.respawn_after_test():
        pytest.skip(
            "a dead checkpointer process stays the build's for every later save, and "
            "torchrun cannot respawn the ranks that keep it"
        )
    last = world.size - 1
    cue = Die(rank=last, writer_rank=world.rank, trainer_pid=os.getpid())
    says = "dead" if world.rank == last else None
    _assert_a_failed_save_loses_nothing(
        world, trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER), "process", cue, says
    )


class InjectedStagingError(RuntimeError):
    """What the failing stager's staging ended with."""


class _StagingThatFailed:
    """A caller's stager whose staging failed at once: ``stage`` hands back a future that holds
    the error, as a stager staging in the background does when its copy fails."""

    _synchronize_after_execute = False
    should_synchronize_after_execute = False

    def stage(self, state_dict: Any) -> Future[Any]:
        failed: Future[Any] = Future()
        failed.set_exception(InjectedStagingError("injected staging failure"))
        return failed

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("checkpointer", CHECKPOINTERS)
def test_a_staging_that_failed_fails_its_completion_and_the_save(world, checkpointer):
    """Staging in the background that failed before ``async_save`` returned: the staging
    completion (the promise that the state may change) and the save both raise its error,
    on every rank. DDP's state, and the writer that does not stage."""
    skip_unless_checkpointer(checkpointer)
    training = trained(PARALLELISMS["ddp"], world, RECIPE, SAVED_AFTER)
    path = world.tmp_path / "checkpoint"
    stagers = Stagers(STAGINGS["default"], Unheld())
    writer, _ = stagers.for_save(path)
    group = dist.new_group(backend="gloo")
    state = training_state(*training)
    pending = start_async_save(state, path, writer, checkpointer, group, _StagingThatFailed())
    staging_error: BaseException | None = None
    try:
        pending.staged()
    except BaseException as raised:
        staging_error = raised
    says = "injected staging failure"
    _assert_failed_everywhere(pending.error(), world, says)
    assert staging_error is not None, (
        f"staging failed, yet its completion ({pending.promise}) reported it complete"
    )
    assert says in str(staging_error), (
        f"the staging completion raised another error: {staging_error!r}"
    )
