"""A save that its store fails is refused on every rank, naming the cause, and leaves no
checkpoint claimed that was not written.

A store fails a save in ways no training code controls: a disk fills (``ENOSPC``) or fails
(``EIO``) in the middle of a file, a target cannot be made, a save lands on a checkpoint
already there, two jobs save into one directory. The store layer (``conformance.stores``)
injects each fault at a chosen byte of a chosen file on one rank, the same on every run.
Each cell that writes the golden checkpoints (one per family) trains and saves through
``dcp.save`` at its smallest size above one; a checkpoint saved one step earlier at another
path is the previous one.

- **A save the store fails.** The faults: ``enospc_data`` and ``eio_data`` (the last
  rank's data file fails after ``AT_BYTE`` bytes), ``enospc_metadata`` (``.metadata`` fails
  after ``AT_BYTE`` bytes), ``unwritable_target`` (the checkpoint's folder lies under a
  file). ``dcp.save`` raises on every rank. Each rank's error names the cause, in the
  system's words for the ``errno``. No ``.metadata`` is left in the target: a
  ``.metadata`` claims a whole checkpoint. Every file of the previous checkpoint is as it
  was.
- **A failed save over a checkpoint** (``overwrite=True``, every release's default): the
  last rank's data file fails after ``AT_BYTE`` bytes while the save replaces a checkpoint
  of the same training one step earlier. Afterwards the folder loads the previous
  checkpoint's values exactly, or holds no ``.metadata``: never another state under the old
  claim.
- **Two saves racing into one folder.** An async save (thread checkpointer) of one moment
  is held on the last rank before its write, while a ``dcp.save`` of the next moment fills
  the same folder; then the held write goes on. Either one of the saves fails on every rank,
  or the folder loads one moment whole: never some ranks' files of one and some of the
  other under one ``.metadata``.

What upstream fails of these is recorded in the manifest; a fork that fixes one passes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Literal

import pytest
import torch.distributed as dist

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, first_size_only, with_role
from conformance.models.common import train
from conformance.stores import StreamFault, failing_writer
from conformance.training import (
    HOLD_LIMIT_S,
    CuedWriter,
    Gate,
    Hold,
    Unheld,
    differences,
    file_hashes,
    fresh_training,
    last_words,
    start_async_save,
    trained,
    trained_after_a_checkpoint,
    training_state,
    tree_leaves,
    wait_for,
)

Fault = Literal["enospc_data", "eio_data", "enospc_metadata", "unwritable_target"]
FAULTS: tuple[Fault, ...] = ("enospc_data", "eio_data", "enospc_metadata", "unwritable_target")
AT_BYTE = 1000  # bytes a failing file takes before its write fails
RECIPE = "adam"
SAVED_AFTER = 2
METADATA = ".metadata"


def _stream_fault(fault: Fault) -> StreamFault | None:
    if fault == "enospc_data":
        return StreamFault(errno.ENOSPC, "data", AT_BYTE)
    if fault == "eio_data":
        return StreamFault(errno.EIO, "data", AT_BYTE)
    if fault == "enospc_metadata":
        return StreamFault(errno.ENOSPC, "metadata", AT_BYTE)
    return None


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("cell", with_role("golden"))
def test_a_save_the_store_fails_is_refused_everywhere_and_claims_nothing(world, cell, fault):
    model, optimizer, _ = trained_after_a_checkpoint(world, cell, RECIPE, SAVED_AFTER)
    previous = file_hashes(world.tmp_path / "previous")
    state = training_state(model, optimizer, None)
    target = world.tmp_path / "checkpoint"
    stream_fault = _stream_fault(fault)
    if stream_fault is None:  # unwritable_target
        if world.rank == 0:
            (world.tmp_path / "a-file").write_text("not a folder")
        world.barrier()
        target = world.tmp_path / "a-file" / "checkpoint"
        cause = os.strerror(errno.ENOTDIR)
    else:
        cause = stream_fault.cause
    failing = stream_fault if _fails_here(world, stream_fault) else None
    refused = _refusal_of(lambda: dcp.save(state, storage_writer=failing_writer(target, failing)))
    world.barrier()
    assert refused is not None, f"rank {world.rank}: the save with {fault} succeeded"
    assert cause in str(refused), (
        f"rank {world.rank}: refused without naming {cause!r}: {str(refused)[-600:]}"
    )
    assert not (target / METADATA).exists(), (
        f"rank {world.rank}: the failed save ({fault}) left {target / METADATA}, which claims "
        "a whole checkpoint"
    )
    assert file_hashes(world.tmp_path / "previous") == previous, (
        f"rank {world.rank}: a failed save ({fault}) changed the previous checkpoint's files"
    )
    world.barrier()


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", with_role("golden"))
def test_a_failed_save_over_a_checkpoint_leaves_it_or_no_claim(world, cell):
    model, optimizer, _ = trained_after_a_checkpoint(world, cell, RECIPE, SAVED_AFTER)
    folder = world.tmp_path / "previous"
    previous = tree_leaves(_loaded_state(world, cell, folder))
    state = training_state(model, optimizer, None)
    fault = StreamFault(errno.ENOSPC, "data", AT_BYTE)
    failing = fault if _fails_here(world, fault) else None
    writer = failing_writer(folder, failing, overwrite=True)
    refused = _refusal_of(lambda: dcp.save(state, storage_writer=writer))
    world.barrier()
    assert refused is not None, f"rank {world.rank}: the save with a full disk succeeded"
    if not (folder / METADATA).exists():
        return
    loaded = _refusal_or_leaves(world, cell, folder)
    assert not isinstance(loaded, str), (
        f"rank {world.rank}: after a failed save over it, {folder} still holds a {METADATA} "
        f"but no longer loads: {loaded}"
    )
    wrong = differences(loaded, previous, ("loaded", "the previous checkpoint's"))
    assert not wrong, (
        f"rank {world.rank}: after a failed save over it, {folder}'s {METADATA} still claims "
        "the previous checkpoint, whose values it no longer loads: " + "; ".join(wrong)
    )


@pytest.mark.world(2, 4)
def test_two_saves_racing_into_one_folder_leave_one_moment_or_fail(world):
    cell = "fsdp2"
    PARALLELISMS[cell].skip_unless_runnable(world.device)
    model, optimizer, scheduler = trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER)
    folder = world.tmp_path / "checkpoint"
    first = training_state(model, optimizer, None)
    first_leaves = tree_leaves(first)
    last = world.size - 1
    held = world.rank == last
    writer = _MarksItsWrite(folder, Hold(last) if held else Unheld(), world.rank)
    pending = start_async_save(first, folder, writer, "thread", dist.new_group(backend="gloo"))
    if held:
        Gate(folder, last).wait_until_held("thread")
    else:
        wait_for(writer.written, f"rank {world.rank} never wrote the first save", HOLD_LIMIT_S)
    world.barrier()
    train(model, optimizer, 1, scheduler, start=SAVED_AFTER)
    second = training_state(model, optimizer, None)
    second_leaves = tree_leaves(second)
    second_refused = _refusal_of(lambda: dcp.save(second, checkpoint_id=str(folder)))
    if held:
        Gate(folder, last).release()
    first_refused = pending.error()
    world.barrier()
    if first_refused is not None or second_refused is not None:
        return
    loaded = _refusal_or_leaves(world, cell, folder)
    assert not isinstance(loaded, str), (
        f"rank {world.rank}: two saves into {folder} both succeeded, and it does not load: "
        + loaded
    )
    as_first = differences(loaded, first_leaves, ("loaded", "the first save's"), limit=1)
    as_second = differences(loaded, second_leaves, ("loaded", "the second save's"), limit=1)
    agreed: list[Any] = [None] * world.size
    dist.all_gather_object(agreed, (not as_first, not as_second))
    ranks_of = {
        moment: [rank for rank, holds in enumerate(agreed) if holds[index]]
        for index, moment in enumerate(("first", "second"))
    }
    assert world.size in (len(ranks_of["first"]), len(ranks_of["second"])), (
        f"two saves racing into {folder} both succeeded and left a mix of their moments: "
        f"ranks loading the first save's state {ranks_of['first']}, the second's "
        f"{ranks_of['second']}; rank {world.rank}: " + "; ".join(as_first + as_second)
    )


class _MarksItsWrite(CuedWriter):
    """A ``CuedWriter`` that marks (``written``) when this rank's data files are written."""

    def __init__(self, path: Path, cue: Any, rank: int) -> None:
        super().__init__(path, cue)
        self.written = path.with_name(f"{path.name}.written.{rank}")

    def write_data(self, plan: Any, planner: Any) -> Any:
        done = super().write_data(plan, planner)
        self.written.touch()
        return done


def _fails_here(world: Any, fault: StreamFault | None) -> bool:
    """Data files fail on the last rank; ``.metadata``, which rank 0 writes, there."""
    if fault is None:
        return False
    return world.rank == (0 if fault.kind == "metadata" else world.size - 1)


def _loaded_state(world: Any, cell: str, folder: Path) -> dict[str, Any]:
    """What ``dcp.load`` reads from ``folder`` into fresh objects of ``cell``."""
    model, optimizer, _ = fresh_training(PARALLELISMS[cell], world, RECIPE)
    template = training_state(model, optimizer, None)
    dcp.load(template, checkpoint_id=str(folder))
    return template


def _refusal_or_leaves(world: Any, cell: str, folder: Path) -> Any:
    """The leaves ``folder`` loads into fresh objects of ``cell``, or the refusal's words."""
    try:
        return tree_leaves(_loaded_state(world, cell, folder))
    except dcp.CheckpointException as refused:
        return last_words(refused)


def _refusal_of(call: Any) -> BaseException | None:
    try:
        call()
    except (dcp.CheckpointException, OSError) as refused:
        return refused
    return None
