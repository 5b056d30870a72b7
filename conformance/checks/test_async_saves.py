"""Asynchronous saves write what ``dcp.save`` writes: the state at the call, each save its own.

Judged against a synchronous ``dcp.save`` of the same state and against the single-process
run, never against the oracle alone. Every rank reads each checkpoint back whole
(``dcp_to_torch_save``). It is compared key by key, bit for bit, with the one ``dcp.save``
wrote at the same moment. Each save goes through ``dcp.async_save`` with a checkpointer and a
staging choice. The checkpointer is a thread, or a process per rank that lives as long as the
rank. The staging is the build's own, the storage writer's, or ``BlockingAsyncStager``, cached
or not. Or it is a ``DefaultStager`` with all ``StagingOptions`` flags off, each flag on alone,
or all on. Or it is a ``DefaultStager`` the caller keeps. Choices that need pinned memory or
non-blocking copies skip where the machine has no accelerator, saying so. A choice the
release lacks skips, naming it.

- **The state at the call.** The write of every async save is held: the storage writer waits
  for a file the test creates. Meanwhile training takes a step, zeroes the gradients and
  changes every parameter, buffer and optimizer state tensor in place. Only then may the write
  go on, so the race is decided, never timed. The checkpoint must still equal ``dcp.save``'s
  at the call. Where the build returns a ``Future``, the state may change once ``async_save``
  returns. Where it returns an ``AsyncSaveResponse`` (``DefaultStager`` staging in the
  background), the state may change once staging completes. The test keeps the promise the
  build made. The ranks agree that staging completed before any of them trains on. The
  build's own staging runs on every cell. It runs with AdamW under a StepLR scheduler at the
  smallest world size above one and at 4, with each checkpointer. It runs with Adam at the
  smallest size, with the thread checkpointer. Every other staging choice runs with each
  checkpointer at 4 ranks, on the cells that stage each kind of tensor. Those are the
  cells of the ``staging`` role: plain tensors, DTensors on 1-D and 2-D meshes, FSDP1's
  ShardedTensors and its DTensors on a device mesh. A failure names the keys and both
  values. It also says whether the async checkpoint holds the state after the call.
- **Each save its own.** Three saves in a row, with a step between each: each checkpoint
  equals ``dcp.save``'s at its own moment. The saves use the build's own staging for each
  save, or one stager kept across them (``DefaultStager``, ``BlockingAsyncStager`` or the
  writer's, caching). They run one at a time, and also with each still writing (held) when
  the next has reached its checkpointer. A failure says which other moment a checkpoint holds.
  These run at 4 ranks on the staging cells. Saves in flight together use a process
  checkpointer on DDP alone. They do not use a caching writer at all (one writer, aimed by each
  save at its directory).
- **Resharded, training goes on.** One cell saves a checkpoint asynchronously at 4 ranks. Or
  FSDP2 saves it at 2 ranks with the thread checkpointer (a process checkpointer keeps the
  group of its first save). Another cell, or the same, loads it at 4, 2 or 1 ranks and trains
  two more steps. The full state equals the single-process run's (within the tensor-parallel
  tolerances). Every other load of an async checkpoint is judged through the ``dcp.save``
  checkpoint it equals bit for bit, by ``test_resuming_commutes_with_training.py``.

The thread checkpointer's saves run their collectives on a gloo group of their own, one per
save in flight. Otherwise DCP's collectives from the training thread and from upload threads,
on one group, may pair up across ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from conformance.cells import PARALLELISMS, SubWorld, loaders_of, reshards, with_role
from conformance.models.common import train
from conformance.training import (
    CHECKPOINTERS,
    STAGINGS,
    Gate,
    Hold,
    PendingSave,
    Stagers,
    Training,
    Unheld,
    change_every_value,
    contents,
    differences,
    differing_keys,
    resume_on_the_first_ranks,
    save_checkpoint,
    skip_unless_checkpointer,
    start_async_save,
    trained,
    training_state,
    tree_leaves,
)

SAVED_AFTER = 2  # training steps before the first save
RECIPES = ("adam", "adamw_step_lr")
RECIPE = "adamw_step_lr"  # where one recipe is enough: Adam's state and a scheduler's


def _cases() -> list[tuple[str, str, str, str]]:
    cases = [
        (cell, recipe, checkpointer, "default")
        for cell in sorted(PARALLELISMS)
        for checkpointer in CHECKPOINTERS
        for recipe in (RECIPES if checkpointer == "thread" else (RECIPE,))
    ]
    cases += [
        (cell, RECIPE, checkpointer, staging)
        for cell in with_role("staging")
        for staging in STAGINGS
        if staging != "default"
        for checkpointer in CHECKPOINTERS
    ]
    return cases


def _where_the_case_runs(size: int, cell: str, recipe: str, staging: str, **_: Any) -> bool:
    """The build's own staging on every cell at its first size and at 4 (Adam at the first
    size only: AdamW under a scheduler holds everything Adam does, and more); the other
    staging choices at 4 ranks."""
    parallelism = PARALLELISMS[cell]
    if staging != "default":
        sizes: tuple[int, ...] = (4,)
    elif recipe == RECIPE:
        sizes = (parallelism.first_size, 4)
    else:
        sizes = (parallelism.first_size,)
    return parallelism.supports(size) and size in sizes


def _step(training: Training, step: int) -> None:
    model, optimizer, scheduler = training
    train(model, optimizer, 1, scheduler, start=step)


@contextmanager
def _stagers(staging: str, cue: Any) -> Iterator[Stagers]:
    choice = STAGINGS[staging]
    choice.skip_unless_available()
    made = Stagers(choice, cue)
    try:
        yield made
    finally:
        made.close()


def _keys_holding(
    written: dict[str, Any], expected: dict[str, Any], other: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The keys where ``written`` differs from ``expected``, and those of them where it holds
    ``other``'s value instead."""
    keys = differing_keys(written, expected)
    held = [
        key
        for key in keys
        if key in other and not differing_keys({key: written[key]}, {key: other[key]})
    ]
    return keys, held


class _Moment:
    """One moment of training saved twice: by ``dcp.save``, then by ``async_save``."""

    def __init__(
        self,
        world: Any,
        training: Training,
        name: str,
        checkpointer: str,
        stagers: Stagers,
        group: Any,
    ) -> None:
        self.world, self.name = world, name
        self.sync_path = world.tmp_path / f"{name}-sync"
        self.async_path = world.tmp_path / f"{name}-async"
        model, optimizer, scheduler = training
        save_checkpoint(model, optimizer, str(self.sync_path), scheduler=scheduler)
        self.gate = Gate(self.async_path, world.rank)
        writer, stager = stagers.for_save(self.async_path)
        state = training_state(model, optimizer, scheduler)
        self.pending: PendingSave = start_async_save(
            state, self.async_path, writer, checkpointer, group, stager
        )

    def _read(self, kind: str) -> dict[str, Any]:
        path = self.async_path if kind == "async" else self.sync_path
        scratch = self.world.tmp_path / f"{self.name}-r{self.world.rank}.{kind}.pt"
        return tree_leaves(contents(path, scratch))

    def holding(self, other: _Moment) -> str:
        """Where this moment's async checkpoint differs from its own moment, how many of those
        keys hold ``other``'s moment instead (empty where none)."""
        keys, held = _keys_holding(self._read("async"), self._read("sync"), other._read("sync"))
        return f"{len(held)} of those {len(keys)} keys hold {other.name}'s state" if held else ""

    def assert_written_as_at_its_call(self, later: Training | None = None) -> None:
        """The async checkpoint equals ``dcp.save``'s; where not, say whether it holds the
        state of ``later`` (the training objects now), saved for the comparison."""
        written, expected = self._read("async"), self._read("sync")
        found = differences(written, expected, ("async_save", "dcp.save at the call"))
        if not found:
            return
        note = "" if later is None else self._note_on_later_state(written, expected, later)
        raise AssertionError(
            f"{self.name}: the async checkpoint (the state may change "
            f"{self.pending.promise}) differs from dcp.save's at the call:\n  "
            + "\n  ".join(found)
            + note
        )

    def _note_on_later_state(
        self, written: dict[str, Any], expected: dict[str, Any], later: Training
    ) -> str:
        path = self.world.tmp_path / f"{self.name}-later"
        model, optimizer, scheduler = later
        save_checkpoint(model, optimizer, str(path), scheduler=scheduler)
        scratch = self.world.tmp_path / f"{self.name}-r{self.world.rank}.later.pt"
        keys, seen = _keys_holding(written, expected, tree_leaves(contents(path, scratch)))
        if not seen:
            return ""
        return (
            f"\n{len(seen)} of the {len(keys)} differing keys hold the state after the call "
            f"(the write read the live state): {seen[:6]}"
        )


def _finish(world: Any, checkpointer: str, *moments: _Moment) -> None:
    """Release every moment's write and wait for each save; raise the first error. A process
    checkpointer whose save failed may be left unfit for another: the next test gets a fresh
    world."""
    for moment in moments:
        moment.gate.release()
    errors = [error for moment in moments if (error := moment.pending.error()) is not None]
    if errors and checkpointer == "process":
        world.respawn_after_test()
    if errors:
        raise errors[0]


@pytest.mark.world(2, 4, applies=_where_the_case_runs)
@pytest.mark.parametrize(("cell", "recipe", "checkpointer", "staging"), _cases())
def test_an_async_save_writes_the_state_at_its_call(world, cell, recipe, checkpointer, staging):
    skip_unless_checkpointer(checkpointer)
    with _stagers(staging, Hold(world.rank)) as stagers:
        training = trained(PARALLELISMS[cell], world, recipe, SAVED_AFTER)
        group = dist.new_group(backend="gloo")
        moment = _Moment(world, training, "call", checkpointer, stagers, group)
        try:
            moment.pending.staged_on_every_rank()
            change_every_value(training, SAVED_AFTER)
        finally:
            _finish(world, checkpointer, moment)
    moment.assert_written_as_at_its_call(later=training)


ROW = 3  # saves in a row
STAGERS_IN_A_ROW = ("default", "stager_kept", "blocking_cached", "writer_cached")


def _saves_in_a_row(
    world: Any, training: Training, checkpointer: str, stagers: Stagers, in_flight: bool
) -> list[_Moment]:
    """``ROW`` saves with a step between each. One at a time: each save finishes before the
    next step. In flight: each save's write is held until the next save has reached the
    checkpointer (its write held, in a thread; its request handed over, to a process, which
    writes one save at a time), and only then released."""
    groups = [dist.new_group(backend="gloo") for _ in range(ROW)]
    moments: list[_Moment] = []
    try:
        for index, group in enumerate(groups):
            if index:
                _step(training, SAVED_AFTER + index - 1)
            moment = _Moment(world, training, f"save{index}", checkpointer, stagers, group)
            moments.append(moment)
            moment.pending.staged_on_every_rank()
            if not in_flight:
                _finish(world, checkpointer, moment)
                continue
            if index:
                moment.gate.wait_until_reached(checkpointer)
                moments[index - 1].gate.release()
            moment.gate.wait_until_held(checkpointer)
    finally:
        _finish(world, checkpointer, *moments)
    return moments


def _assert_each_holds_its_own_moment(moments: list[_Moment]) -> None:
    """Each async checkpoint equals ``dcp.save``'s at its own moment; where not, say which
    other moment it holds."""
    failures = []
    for moment in moments:
        try:
            moment.assert_written_as_at_its_call()
        except AssertionError as failure:
            notes = [
                note for other in moments if other is not moment and (note := moment.holding(other))
            ]
            failures.append("\n".join([str(failure), *notes]))
    assert not failures, "\n".join(failures)


def _rows() -> list[tuple[str, str, str, str]]:
    """(cell, checkpointer, stager, overlap) of the saves in a row: each staging cell with
    each stager, one at a time, and in flight with a thread checkpointer. In flight, a
    process checkpointer runs on DDP alone (the way to the process is the same for every
    cell; a save it fails may leave the world to be respawned), and a caching writer not at
    all (one writer, aimed by each save at its directory, cannot write two at once)."""
    rows = []
    for cell in with_role("staging"):
        for checkpointer in CHECKPOINTERS:
            for stager in STAGERS_IN_A_ROW:
                rows.append((cell, checkpointer, stager, "one_at_a_time"))
                thread_or_ddp = checkpointer == "thread" or cell == "ddp"
                if thread_or_ddp and stager != "writer_cached":
                    rows.append((cell, checkpointer, stager, "in_flight"))
    return rows


@pytest.mark.world(4)
@pytest.mark.parametrize(("cell", "checkpointer", "stager", "overlap"), _rows())
def test_async_saves_in_a_row_each_hold_their_own_moment(
    world, cell, checkpointer, stager, overlap
):
    """A fresh stager for each save (``default``: the build's own), or one kept across them."""
    skip_unless_checkpointer(checkpointer)
    with _stagers(stager, Hold(world.rank)) as stagers:
        training = trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER)
        moments = _saves_in_a_row(world, training, checkpointer, stagers, overlap == "in_flight")
    _assert_each_holds_its_own_moment(moments)


def _async_checkpoint(world: Any, training: Training, checkpointer: str, group: Any) -> Path:
    """Where ``training``'s state was saved by ``async_save``, staged by the storage writer
    (every release's way, and one that stages every kind of tensor)."""
    path = world.tmp_path / "checkpoint"
    with _stagers("writer", Unheld()) as stagers:
        writer, stager = stagers.for_save(path)
        state = training_state(*training)
        start_async_save(state, path, writer, checkpointer, group, stager).finish()
    return path


RESHARDS = reshards("async")  # saved by (at 4 ranks), resumed by, at how many ranks


@pytest.mark.world(4)
@pytest.mark.parametrize("checkpointer", CHECKPOINTERS)
@pytest.mark.parametrize(("saved_by", "resumed_by", "size"), RESHARDS)
def test_an_async_checkpoint_resumes_under_another_cell_as_one_process(
    world, saved_by, resumed_by, size, checkpointer
):
    """Saved asynchronously at 4 ranks after two steps, resumed by another cell (or the same)
    at ``size`` ranks, two more steps: the full state is the single process's after four."""
    skip_unless_checkpointer(checkpointer)
    for name in (saved_by, resumed_by):
        if name in PARALLELISMS:
            PARALLELISMS[name].skip_unless_runnable(world.device)
    training = trained(PARALLELISMS[saved_by], world, RECIPE, SAVED_AFTER)
    path = _async_checkpoint(world, training, checkpointer, dist.new_group(backend="gloo"))
    resume_on_the_first_ranks(world, size, (saved_by, resumed_by), str(path), SAVED_AFTER, RECIPE)


@pytest.mark.world(4)
@pytest.mark.parametrize("resumed_by", loaders_of("fsdp2", "async_grow"))
def test_an_async_checkpoint_of_two_ranks_resumes_at_four_as_one_process(world, resumed_by):
    """Saved asynchronously by FSDP2 on ranks 0 and 1, resumed at 4 ranks. The thread
    checkpointer only: a process checkpointer keeps the process group of the first save it
    served (here the world's) for every later save."""
    for name in ("fsdp2", resumed_by):
        PARALLELISMS[name].skip_unless_runnable(world.device)
    savers = SubWorld(world, 2)
    group = dist.new_group(list(range(savers.size)), backend="gloo")
    path = world.tmp_path / "checkpoint"
    if savers.member:
        training = trained(PARALLELISMS["fsdp2"], savers, RECIPE, SAVED_AFTER)
        _async_checkpoint(world, training, "thread", group)
    world.barrier()
    resume_on_the_first_ranks(world, 4, ("fsdp2", resumed_by), str(path), SAVED_AFTER, RECIPE)
