"""A checkpoint written to a store through fsspec holds, and loads, what one written to the
local disk does.

Large runs save through DCP's ``FsspecWriter`` and load through its ``FsspecReader``: to
object stores, to memory, to ``file://`` URLs. Each store of ``conformance.stores`` is
judged against ``dcp.save``'s ``FileSystemWriter`` on the local disk, at the same moment of
the same training:

- **Saved.** Every cell saves its trained model and optimizer state both ways. The store
  holds the local checkpoint's files and no other: no temporary ``.metadata`` is left
  behind. Each data file is equal byte for byte. Its ``.metadata`` describes the same
  checkpoint in every field but ``storage_meta`` (where it was written, and a save id).
  ``dcp.load`` reads both checkpoints into templates of the cell's state, and the two
  agree bit for bit. (That a load restores the saved state is
  ``test_dcp_round_trips.py``'s.)
- **Resharded.** A cell saves at 4 ranks to the store and to the local disk; each partner
  the DCP round trips try (``reshards("dcp")``) loads both at its size. The loads agree bit
  for bit.
- **Saved asynchronously.** ``async_save`` to the store, with the thread checkpointer on
  every cell and with the process checkpointer on one cell of each family (the golden
  cells), writes what ``dcp.save`` wrote locally, as above.
- **Found by its URL.** ``dcp.save`` and ``dcp.load`` given the store's URL alone (fsspec's
  defaults configured for it, as users do) fall back to fsspec's writer and reader, and
  write and load as above; a URL no storage accepts (``abc://``) is refused by both.
- **A failed stream.** A data file whose write the store fails (``ENOSPC`` after
  ``AT_BYTE`` bytes, on the last rank) fails the save on every rank and is removed: the
  store keeps the other ranks' whole files and no part of that one. A load whose reads the
  store fails fails, and leaves every file of the checkpoint as it was.
- **Saved over.** ``FsspecWriter(overwrite=True)`` over a checkpoint in the store replaces
  it; ``overwrite=False`` is refused on every rank, saying it exists, and changes no file.

The optimizer state is saved flattened (keyed by parameter name) on every cell, so that no
load meets the nested form's known failure on a rank without local shards (FSDP1 at 4
ranks; the manifest's ``load-planner-drops-sharded-tensors-without-local-shards``): what
is judged here is the store.

The ``file`` and ``s3`` stores are judged at 2 and 4 ranks. ``s3`` is a real S3 server on
loopback (moto's), one per world, spoken to through s3fs. ``memory`` is fsspec's in-memory
file system, which each process holds alone. Another rank's writes, or a checkpointer
process's, land in that process's memory. So ``memory`` is judged at one rank, with the
thread checkpointer, and never resharded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec.config
import pytest
import torch
import torch.distributed as dist

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, SubWorld, reshards, with_role
from conformance.models.common import train
from conformance.stores import STORES, OpenStore, StreamFault, with_fault, with_read_fault
from conformance.training import (
    CHECKPOINTERS,
    differences,
    load_checkpoint,
    load_options_for,
    model_and_adam,
    save_checkpoint,
    skip_unless_checkpointer,
    start_async_save,
    training_state,
    tree_leaves,
)

SAVED_AFTER = 2
AT_BYTE = 1000  # bytes a failing data file takes before the store fails its write
METADATA = ".metadata"
SHARED_STORES = tuple(name for name, store in STORES.items() if store.shared)


def _runs_at(size: int, store: str, cell: str, checkpointer: str = "thread", **_: Any) -> bool:
    """A store every process sees at 2 and 4 ranks; one a process holds alone at one rank,
    written by the trainer's own process (the thread checkpointer)."""
    if not PARALLELISMS[cell].supports(size):
        return False
    if STORES[store].shared:
        return size in (2, 4)
    return size == 1 and checkpointer == "thread"


def _async_cases() -> list[tuple[str, str]]:
    """The thread checkpointer on every cell, the process checkpointer on the golden ones."""
    golden = with_role("golden")
    return [
        (checkpointer, cell)
        for checkpointer in CHECKPOINTERS
        for cell in sorted(PARALLELISMS)
        if checkpointer == "thread" or cell in golden
    ]


@pytest.mark.world(1, 2, 4, applies=_runs_at)
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_checkpoint_in_a_store_holds_and_loads_what_local_disk_does(world, store, cell):
    opened = STORES[store].open(world)
    _, _, state, local = _trained_and_saved_locally(world, cell)
    dcp.save(state, storage_writer=opened.writer("checkpoint"))
    _assert_holds_the_local_files(world, opened, "checkpoint", local)
    from_store = _loaded(cell, world, None, storage_reader=opened.reader("checkpoint"))
    _assert_loads_as_local_disk(world, cell, local, from_store, opened.url("checkpoint"))


@pytest.mark.world(4)
@pytest.mark.parametrize(("saved_by", "loaded_by", "load_size"), reshards("dcp"))
@pytest.mark.parametrize("store", SHARED_STORES)
def test_a_resharded_load_from_a_store_equals_one_from_local_disk(
    world, store, saved_by, loaded_by, load_size
):
    for name in (saved_by, loaded_by):
        if name in PARALLELISMS:
            PARALLELISMS[name].skip_unless_runnable(world.device)
    opened = STORES[store].open(world)
    model, optimizer = model_and_adam(saved_by, world)
    train(model, optimizer, steps=SAVED_AFTER)
    local = str(world.tmp_path / "local")
    save_checkpoint(model, optimizer, local, flatten=True)
    save_checkpoint(
        model, optimizer, None, flatten=True, storage_writer=opened.writer("checkpoint")
    )
    world.barrier()
    loaders = SubWorld(world, load_size)
    load = load_options_for(loaders)
    if loaders.member:
        from_local = _loaded(loaded_by, loaders, local, **load)
        from_store = _loaded(
            loaded_by, loaders, None, storage_reader=opened.reader("checkpoint"), **load
        )
        wrong = differences(from_store, from_local, (f"loaded from {store}", "from local disk"))
        assert not wrong, (
            f"rank {world.rank}: {saved_by} at 4 ranks, loaded by {loaded_by} at "
            f"{load_size}: " + "; ".join(wrong)
        )
    world.barrier()


@pytest.mark.world(1, 2, 4, applies=_runs_at)
@pytest.mark.parametrize(("checkpointer", "cell"), _async_cases())
@pytest.mark.parametrize("store", sorted(STORES))
def test_an_async_save_to_a_store_writes_what_dcp_save_writes_locally(
    world, store, checkpointer, cell
):
    skip_unless_checkpointer(checkpointer)
    opened = STORES[store].open(world)
    _, _, state, local = _trained_and_saved_locally(world, cell)
    group = dist.new_group(backend="gloo")
    writer = opened.writer("async")
    start_async_save(state, None, writer, checkpointer, group).finish()
    _assert_holds_the_local_files(world, opened, "async", local)
    world.barrier()


def _trained_and_saved_locally(world: Any, cell: str) -> tuple[Any, Any, dict[str, Any], Path]:
    """``cell`` trained ``SAVED_AFTER`` steps: its model and optimizer, their state (the
    optimizer's flattened) and the local folder ``dcp.save`` wrote it to."""
    PARALLELISMS[cell].skip_unless_runnable(world.device)
    model, optimizer = model_and_adam(cell, world)
    train(model, optimizer, SAVED_AFTER)
    state = training_state(model, optimizer, None, flatten=True)
    local = world.tmp_path / "local"
    dcp.save(state, checkpoint_id=str(local))
    return model, optimizer, state, local


def _loaded(name: str, world: Any, path: str | None, **load: Any) -> dict[str, Any]:
    """Fresh objects of ``name`` after loading the checkpoint: their state's leaves."""
    model, optimizer = model_and_adam(name, world)
    load_checkpoint(model, optimizer, path, flatten=True, **load)
    return tree_leaves(training_state(model, optimizer, None, flatten=True))


def _assert_loads_as_local_disk(
    world: Any, cell: str, local: Path, from_store: dict[str, Any], where: str
) -> None:
    """Fresh objects of ``cell`` loaded from the store hold what fresh ones loaded from the
    local checkpoint hold; every rank has loaded before the next test's saves."""
    from_local = _loaded(cell, world, str(local))
    wrong = differences(from_store, from_local, ("from the store", "from local disk"))
    assert not wrong, f"rank {world.rank}: {where}: " + "; ".join(wrong)
    world.barrier()


def _assert_holds_the_local_files(world: Any, opened: OpenStore, name: str, local: Path) -> None:
    """Once every rank has saved: rank 0 finds the store's checkpoint ``name`` made of the
    files of the local one, each data file byte for byte, its ``.metadata`` describing the
    same checkpoint."""
    world.barrier()
    if world.rank != 0:
        return
    stored = opened.files(name)
    written = {
        str(file.relative_to(local)): file.read_bytes()
        for file in sorted(local.rglob("*"))
        if file.is_file()
    }
    where = opened.url(name)
    assert sorted(stored) == sorted(written), (
        f"{where} holds the files {sorted(stored)}; the local checkpoint {sorted(written)}"
    )
    unequal = [file for file in written if file != METADATA and stored[file] != written[file]]
    assert not unequal, (
        f"{where}: the data files {unequal} differ from the local checkpoint's "
        f"({[len(stored[f]) for f in unequal]} bytes against {[len(written[f]) for f in unequal]})"
    )
    fields = _metadata_fields_that_differ(stored[METADATA], written[METADATA])
    assert not fields, f"{where}/{METADATA} differs from the local checkpoint's in {fields}"


def _metadata_fields_that_differ(stored: bytes, written: bytes) -> list[str]:
    """The fields of two pickled DCP ``Metadata`` that differ, ``storage_meta`` aside."""
    ours, theirs = pickle.loads(stored), pickle.loads(written)
    return [
        field.name
        for field in dataclasses.fields(ours)
        if field.name != "storage_meta" and getattr(ours, field.name) != getattr(theirs, field.name)
    ]


@contextlib.contextmanager
def _url_alone_reaches(opened: OpenStore) -> Iterator[None]:
    """fsspec's defaults for the store's protocol set to its options while the block runs, as
    a user configures them, so that a URL alone reaches the store."""
    protocol = opened.root.split("://", 1)[0]
    before = fsspec.config.conf.get(protocol)
    if opened.storage_options:
        fsspec.config.conf[protocol] = dict(opened.storage_options)
    try:
        yield
    finally:
        if before is None:
            fsspec.config.conf.pop(protocol, None)
        else:
            fsspec.config.conf[protocol] = before


@pytest.mark.world(1, 2, 4, applies=_runs_at)
@pytest.mark.parametrize("cell", ["fsdp2"])
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_store_url_alone_picks_fsspec_to_save_and_load(world, store, cell):
    """``dcp.save`` and ``dcp.load`` given a store's URL as ``checkpoint_id`` and no storage
    fall back from the local file system's writer and reader to fsspec's: the checkpoint
    holds the local one's files and loads as it does."""
    opened = STORES[store].open(world)
    _, _, state, local = _trained_and_saved_locally(world, cell)
    with _url_alone_reaches(opened):
        dcp.save(state, checkpoint_id=opened.url("by-url"))
        _assert_holds_the_local_files(world, opened, "by-url", local)
        from_store = _loaded(cell, world, opened.url("by-url"))
    _assert_loads_as_local_disk(world, cell, local, from_store, opened.url("by-url"))


@pytest.mark.world(1)
@pytest.mark.parametrize("call", ["save", "load"])
def test_a_url_no_storage_accepts_is_refused(world, call):
    state = {"w": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="Cannot detect which StorageReader or StorageWriter"):
        getattr(dcp, call)(state, checkpoint_id="abc://abc.abc")


@pytest.mark.world(1, 2, 4, applies=_runs_at)
@pytest.mark.parametrize("cell", ["ddp"])
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_save_over_a_checkpoint_in_a_store_replaces_it_only_where_allowed(world, store, cell):
    """``FsspecWriter(overwrite=True)`` over a checkpoint replaces it (it then holds what a
    local save of the later state holds); ``overwrite=False`` is refused on every rank,
    saying the checkpoint exists, and leaves the store's files as they were."""
    opened = STORES[store].open(world)
    model, optimizer, state, _ = _trained_and_saved_locally(world, cell)
    dcp.save(state, storage_writer=opened.writer("again", overwrite=False))
    train(model, optimizer, 1, start=SAVED_AFTER)
    later = training_state(model, optimizer, None, flatten=True)
    local = world.tmp_path / "later"
    dcp.save(later, checkpoint_id=str(local))
    dcp.save(later, storage_writer=opened.writer("again", overwrite=True))
    _assert_holds_the_local_files(world, opened, "again", local)
    world.barrier()
    files = opened.files("again")
    with pytest.raises(dcp.CheckpointException, match="already exists"):
        dcp.save(later, storage_writer=opened.writer("again", overwrite=False))
    world.barrier()
    assert opened.files("again") == files, f"rank {world.rank}: the refused save changed files"


@pytest.mark.world(1, 2, 4, applies=lambda size, store: _runs_at(size, store, "ddp"))
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_stream_the_store_fails_is_removed_and_one_read_is_kept(world, store):
    """Each rank saves a tensor of its own (so each writes a data file of its own) whole, then
    again with the last rank's data file failing after ``AT_BYTE`` bytes; then a load whose
    data reads fail."""
    opened = STORES[store].open(world)
    state = {f"rank{world.rank}": torch.arange(4096, dtype=torch.float32) + world.rank}
    dcp.save(state, storage_writer=opened.writer("whole"))
    world.barrier()
    whole = opened.files("whole")
    full_disk = StreamFault(errno.ENOSPC, "data", AT_BYTE)
    failing = full_disk if world.rank == world.size - 1 else None
    with pytest.raises(dcp.CheckpointException):
        dcp.save(state, storage_writer=with_fault(opened.writer("failed"), failing))
    world.barrier()
    left = opened.files("failed")
    kept = {name: data for name, data in whole.items() if name in left}
    left_out = sorted(set(whole) - set(left))
    assert left == kept, (
        f"rank {world.rank}: after the failed save the store holds {sorted(left)} of sizes "
        f"{[len(data) for data in left.values()]}, not the whole save's files of those names"
    )
    assert len(left_out) == 2, (
        f"rank {world.rank}: the failed save left out {left_out} of {sorted(whole)}: "
        "the struck data file and .metadata should be missing, no more"
    )
    failed_read = StreamFault(errno.EIO, "data", 0)
    template = {key: torch.zeros_like(value) for key, value in state.items()}
    with pytest.raises(dcp.CheckpointException, match=os.strerror(errno.EIO)):
        dcp.load(template, storage_reader=with_read_fault(opened.reader("whole"), failed_read))
    world.barrier()
    assert opened.files("whole") == whole, f"rank {world.rank}: a failed load changed files"
