"""What a save plans and records: plan caching writes what a fresh plan writes, and a
checkpoint's ``.metadata`` describes what was saved, each piece written once.

**Plan caching.** ``DefaultSavePlanner(enable_plan_caching=True)`` keeps each rank's local
plan, the global plan and the metadata between saves, and reuses them while the plans stay
the same: a save then sends only what changed. The golden cell of each family trains a
step, then saves at each of ``MOMENTS`` twice, once with a caching planner and once with a
fresh default one:

- ``first``: the cache is empty and is filled;
- ``trained``: a step later, the values changed and every plan is the same (the cached global
  plan and metadata are reused);
- ``extra``: the last rank alone adds a tensor of its own (its plan changes; the others'
  cached plans are merged with it);
- ``resized``: that tensor grows (the rank's plan changes again);
- ``again``: a step later with the resized tensor (the plans are the cached ones again).

Each cached save must hold what the fresh one holds, bit for bit, read back whole, and its
``.metadata`` must record the same keys, sizes, dtypes and chunks. The caching planner is a
class of its own per test: the caches are kept per planner class, for the life of the
process, and a persistent rank process runs many tests.

**Plans refused.** A custom planner's local plan that claims rows its rank does not hold
(overlapping the previous rank's, past the tensor's end, or leaving a row no piece holds) is
refused by the global plan's validation on every rank, naming the key, and no ``.metadata``
is written.

**Metadata.** A save of the cell's model and optimizer state through ``FileSystemWriter``:

- every key any rank saved is recorded, a tensor with its global size and dtype, any other
  value as bytes;
- a tensor's chunks lie within it, do not overlap and cover it;
- each chunk is stored once: the data files hold exactly the bytes ``storage_data`` points at,
  so a value every rank holds (DDP's parameters) is not written by every rank;
- each chunk's place is found by a ``MetadataIndex`` made anew with a list offset and a
  wrong index hint (equality and hashing take the offset as a ``torch.Size`` and ignore
  the hint);
- the ``version`` a load's planner reads (loading the model's part back) is the writer's
  ``CURRENT_DCP_VERSION``;
- ``storage_meta`` names the checkpoint, the coordinator writer's ``save_id`` and the
  reader's ``load_id``.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dcp_filesystem, dcp_metadata, dtensor
from conformance.cells import PARALLELISMS, exists_at_size, first_size_and_four, with_role
from conformance.compare import every_rank
from conformance.models.common import train
from conformance.training import read_whole, refusal_of, trained, training_state
from conformance.training._trajectory import differences

CELLS = with_role("golden")
RECIPE = "adam"
MOMENTS = ("first", "trained", "extra", "resized", "again")
EXTRA = "extra_of_the_last_rank"
EXTRA_SIZES = {"extra": 3, "resized": 5, "again": 5}


def _trained(world: Any, cell: str) -> tuple[Any, Any]:
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    model, optimizer, _ = trained(parallelism, world, RECIPE, 1)
    return model, optimizer


def _state_at(world: Any, model: Any, optimizer: Any, moment: str) -> dict[str, Any]:
    """What the run saves at ``moment``: its training state, and on the last rank from
    ``extra`` on a tensor of its own."""
    state = training_state(model, optimizer, None)
    size = EXTRA_SIZES.get(moment)
    if size is not None and world.rank == world.size - 1:
        state[EXTRA] = torch.arange(size, dtype=torch.float32) + MOMENTS.index(moment)
    return state


def _caching_planner_class() -> type:
    """A caching planner of a class no other test uses: the caches are keyed by class name."""
    return type(f"CachingPlanner_{uuid.uuid4().hex}", (dcp.DefaultSavePlanner,), {})


@pytest.mark.world(2, 4, applies=first_size_and_four("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_saves_with_plan_caching_write_what_fresh_plans_write(world, cell):
    model, optimizer = _trained(world, cell)
    caching = _caching_planner_class()
    for step, moment in enumerate(MOMENTS):
        if moment in ("trained", "again"):
            train(model, optimizer, 1, start=1 + step)
        state = _state_at(world, model, optimizer, moment)
        dcp.save(
            state,
            checkpoint_id=str(world.tmp_path / f"cached-{moment}"),
            planner=caching(enable_plan_caching=True),
        )
        dcp.save(state, checkpoint_id=str(world.tmp_path / f"fresh-{moment}"))
        world.barrier()
        found = differences(
            read_whole(world, f"cached-{moment}"),
            read_whole(world, f"fresh-{moment}"),
            ("saved with cached plans", "with fresh ones"),
        )
        assert not found, f"rank {world.rank}, {moment}: {found}"
        cached, fresh = (
            _recorded(world.tmp_path / f"{kind}-{moment}") for kind in ("cached", "fresh")
        )
        assert cached == fresh, (
            f"rank {world.rank}, {moment}: the cached plans' .metadata records "
            f"{_first_difference(cached, fresh)}"
        )


def _recorded(checkpoint: Path) -> dict[str, Any]:
    """What ``.metadata`` records of each key: its kind, size, dtype and chunks."""
    metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    return {key: _described(value) for key, value in metadata.state_dict_metadata.items()}


def _described(value: Any) -> Any:
    if not hasattr(value, "chunks"):
        return "bytes"
    chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in value.chunks)
    return tuple(value.size), value.properties.dtype, chunks


def _first_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    key = next(k for k in sorted({*ours, *theirs}) if ours.get(k) != theirs.get(k))
    return f"{key}: {ours.get(key)}, the fresh plans' {theirs.get(key)}"


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_checkpoints_metadata_describes_what_was_saved_each_piece_once(world, cell):
    model, optimizer = _trained(world, cell)
    state = training_state(model, optimizer, None)
    path = world.tmp_path / "checkpoint"
    writer = dcp.FileSystemWriter(str(path))
    dcp.save(state, storage_writer=writer)
    saved = _merged(every_rank(_what_is_saved(state)))
    reader = dcp.FileSystemReader(str(path))
    metadata = reader.read_metadata()
    recorded = metadata.state_dict_metadata
    assert sorted(recorded) == sorted(saved), (
        f"rank {world.rank}: .metadata records {sorted(set(recorded) ^ set(saved))} "
        "that the ranks did not save, or lacks them"
    )
    for key, expected in saved.items():
        assert _kind_of(recorded[key]) == expected, (
            f"rank {world.rank}: {key} is saved as {expected}, recorded as "
            f"{_kind_of(recorded[key])}"
        )
        if expected != "bytes":
            _assert_chunks_tile(key, recorded[key])
    _assert_each_piece_stored_once(path, metadata)
    _assert_storage_meta(world, path, writer, reader, metadata)
    planner = dcp.DefaultLoadPlanner()
    model_only = {"model": training_state(model, optimizer, None)["model"]}
    dcp.load(model_only, checkpoint_id=str(path), planner=planner)
    assert planner.metadata.version == dcp_filesystem.CURRENT_DCP_VERSION, (
        f"rank {world.rank}: the load's planner reads version {planner.metadata.version}, "
        f"the writer writes {dcp_filesystem.CURRENT_DCP_VERSION}"
    )


def _what_is_saved(tree: Any, path: str = "") -> dict[str, Any]:
    """The keys DCP records for this rank's ``tree``: each tensor's global size and dtype,
    any other leaf as bytes. Dicts are flattened with dots; a list is taken item by item
    where it holds a tensor or a container that does, else it is one value."""
    if isinstance(tree, dict):
        items: Any = tree.items()
    elif isinstance(tree, list) and not _is_one_value(tree):
        items = enumerate(tree)
    elif isinstance(tree, torch.Tensor):
        return {path: (tuple(tree.shape), tree.dtype)}
    else:
        return {path: "bytes"}
    found: dict[str, Any] = {}
    for key, value in items:
        found.update(_what_is_saved(value, f"{path}.{key}" if path else str(key)))
    return found


def _is_one_value(items: list[Any]) -> bool:
    return not any(
        isinstance(item, (torch.Tensor, dict))
        or (isinstance(item, list) and not _is_one_value(item))
        for item in items
    )


def _kind_of(recorded: Any) -> Any:
    if not hasattr(recorded, "chunks"):
        return "bytes"
    return tuple(recorded.size), recorded.properties.dtype


def _merged(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for rank, saved in enumerate(per_rank):
        for key, kind in saved.items():
            assert merged.setdefault(key, kind) == kind, (
                f"{key}: rank {rank} saves {kind}, an earlier rank {merged[key]}"
            )
    return merged


def _assert_chunks_tile(key: str, recorded: Any) -> None:
    """The chunks lie within the tensor, none overlaps another, and together they cover it."""
    size = tuple(recorded.size)
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in recorded.chunks]
    for offsets, sizes in boxes:
        assert all(o >= 0 and o + s <= n for o, s, n in zip(offsets, sizes, size, strict=True)), (
            f"{key}: the chunk at {offsets} of {sizes} lies outside {size}"
        )
    for (a, a_sizes), (b, b_sizes) in combinations(boxes, 2):
        overlap = all(
            max(x, y) < min(x + xs, y + ys)
            for x, xs, y, ys in zip(a, a_sizes, b, b_sizes, strict=True)
        )
        assert not overlap, f"{key}: the chunks at {a} and {b} overlap"
    covered = sum(math.prod(sizes) for _, sizes in boxes)
    assert covered == math.prod(size), f"{key}: chunks cover {covered} of {math.prod(size)}"


def _assert_each_piece_stored_once(path: Path, metadata: Any) -> None:
    """Each chunk has one place in ``storage_data``, and the data files hold those places'
    bytes and no more: a value more than one rank holds is written by one."""
    chunks = {
        (key, tuple(chunk.offsets))
        for key, value in metadata.state_dict_metadata.items()
        if hasattr(value, "chunks")
        for chunk in value.chunks
    }
    stored = {
        (index.fqn, tuple(index.offset))
        for index in metadata.storage_data
        if index.offset is not None
    }
    assert stored == chunks, (
        f"chunks without a stored place, or places of no chunk: {stored ^ chunks}"
    )
    for key, offsets in chunks:
        # Found by a key of a list offset and a wrong hint: equality and hashing take the
        # offset as a torch.Size and ignore the hint.
        looked_up = dcp_metadata.MetadataIndex(key, list(offsets), index=len(chunks) + 1)
        assert looked_up in metadata.storage_data, (
            f"{key} at {offsets}: MetadataIndex({key!r}, {list(offsets)}, index=...) finds no "
            "stored place"
        )
    referenced = sum(info.length for info in metadata.storage_data.values())
    written = sum(file.stat().st_size for file in path.glob("*.distcp"))
    assert written == referenced, (
        f"the data files hold {written} bytes, .metadata points at {referenced}: a piece is "
        "written more than once, or something beside the pieces is"
    )


def _assert_storage_meta(world: Any, path: Path, writer: Any, reader: Any, metadata: Any) -> None:
    meta = metadata.storage_meta
    assert meta is not None, f"rank {world.rank}: .metadata records no storage_meta"
    assert str(meta.checkpoint_id) == str(path), (
        f"rank {world.rank}: storage_meta names {meta.checkpoint_id}, saved at {path}"
    )
    assert meta.load_id == reader.load_id, (
        f"rank {world.rank}: storage_meta's load_id {meta.load_id}, the reader's {reader.load_id}"
    )
    coordinator_save_id = every_rank(writer.save_id)[0]
    assert meta.save_id == coordinator_save_id, (
        f"rank {world.rank}: storage_meta's save_id {meta.save_id}, the coordinator "
        f"writer's {coordinator_save_id}"
    )


# How the last rank's planner spoils its piece of ``SPOILED``: rows moved onto the previous
# rank's, past the tensor's end, or a row fewer (a row no piece holds).
PLAN_SPOILS = ("overlapping", "out_of_bounds", "a_row_missing")
SPOILED = "rows"


def _spoiling_planner(spoil: str, last: bool) -> Any:
    """A ``DefaultSavePlanner`` whose local plan, on the last rank, claims other rows of
    ``SPOILED`` than the rank holds: what a custom planner's bug gives."""

    class Spoiling(dcp.DefaultSavePlanner):  # type: ignore[misc,name-defined]
        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            if not last:
                return plan
            return dataclasses.replace(plan, items=[_spoiled(item, spoil) for item in plan.items])

    return Spoiling()


def _spoiled(item: Any, spoil: str) -> Any:
    if item.index.fqn != SPOILED:
        return item
    chunk = item.tensor_data.chunk
    row, rows = chunk.offsets[0], chunk.sizes[0]
    if spoil == "overlapping":
        row -= 1
    elif spoil == "out_of_bounds":
        row += 2
    else:
        rows -= 1
    moved = dataclasses.replace(
        chunk,
        offsets=torch.Size([row, *chunk.offsets[1:]]),
        sizes=torch.Size([rows, *chunk.sizes[1:]]),
    )
    data = dataclasses.replace(item.tensor_data, chunk=moved)
    return dataclasses.replace(
        item, index=dataclasses.replace(item.index, offset=moved.offsets), tensor_data=data
    )


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("spoil", PLAN_SPOILS)
def test_a_plan_whose_pieces_overlap_or_leave_a_gap_is_refused(world, spoil):
    """Each rank holds two rows of an ``(2 * size, 3)`` DTensor; the last rank's planner
    spoils its piece. The global plan's validation must refuse the save on every rank, naming
    the key, before any ``.metadata`` is written."""
    mesh = world.mesh(world.size)
    state = {
        SPOILED: dtensor.distribute_tensor(
            torch.arange(6.0 * world.size).reshape(2 * world.size, 3), mesh, [dtensor.Shard(0)]
        )
    }
    path = world.tmp_path / f"spoiled-{spoil}"
    planner = _spoiling_planner(spoil, world.rank == world.size - 1)
    refused = refusal_of(lambda: dcp.save(state, checkpoint_id=str(path), planner=planner))
    assert refused is not None, f"rank {world.rank}: the {spoil} plan was saved"
    assert "Failed to validate global plan" in str(refused), f"rank {world.rank}: {refused}"
    assert f"key:{SPOILED}" in str(refused), f"rank {world.rank}: the error names no key"
    world.barrier()
    assert not (path / ".metadata").exists(), f"rank {world.rank}: the refused save wrote .metadata"
