"""DCP's public helpers for custom planners and storages, and its metadata classes.

A custom planner plans with ``create_default_local_save_plan``, reads with
``create_read_items_for_chunk_list`` and looks pieces up with ``find_state_dict_object``; a
storage builds and pickles the metadata classes. Each is in its module's ``__all__``, so its
results are its contract:

- **Local save plans.** At 2 and 4 ranks, on the coordinator and off it, one write per value
  the rank holds: a plain tensor whole, a plain value as bytes, each local shard of a
  ``ShardedTensor`` and a DTensor's piece of uneven rows at its offset, each with its chunk,
  dtype and global size.
- **Read items.** For chunk lists that tile a tensor (saved and local pieces of every layout
  of upstream's cases, and uneven ones in 1-D, 2-D and 3-D), the items are exactly one per
  (local chunk, saved chunk) pair that overlap: the destination and storage indices name the
  chunks' offsets and positions, and the offsets and lengths are the overlap's. Carrying out
  the reads on the pieces of a tensor rebuilds each local piece.
- **Lookups.** ``find_state_dict_object`` finds a plain tensor by its name (and by offset
  zero), a plain value by its name, each of a rank's several ``ShardedTensor`` shards by its
  offset whatever the index hint (right, wrong, out of range, none), and a DTensor's local
  tensor. It refuses with ``ValueError``, naming the key, a name the state lacks, an offset
  into a plain value or a tensor, a ``ShardedTensor`` lookup without an offset, and an offset
  no shard starts at.
- **Metadata.** ``ChunkStorageMetadata``, ``TensorStorageMetadata``, ``BytesStorageMetadata``,
  ``Metadata`` and ``MetadataIndex`` build from their original fields alone (a field added
  without a default breaks every checkpoint reader that builds them), and each pickles back
  equal. A checkpoint whose ``.metadata`` pickles ShardedTensor's ``TensorProperties`` (as
  releases before DCP's own class wrote it; saved with that class patched in, as upstream
  does) loads.
"""

from __future__ import annotations

import itertools
import pickle
from typing import Any
from unittest import mock

import pytest
import torch

from conformance._upstream import (
    dcp,
    dcp_default_planner,
    dcp_metadata,
    dcp_planner_helpers,
    dcp_utils,
    dtensor,
    sharded_tensor,
    sharded_tensor_metadata,
)

Chunk = tuple[tuple[int, ...], tuple[int, ...]]  # offsets, sizes


def _tiling(size: tuple[int, ...], cuts: tuple[tuple[int, ...], ...]) -> list[Chunk]:
    """The chunks a grid of ``cuts`` (each dim's inner boundaries) makes of ``size``."""
    edges = [(0, *dim_cuts, extent) for dim_cuts, extent in zip(cuts, size, strict=True)]
    spans = [list(itertools.pairwise(dim_edges)) for dim_edges in edges]
    return [
        (tuple(start for start, _ in box), tuple(end - start for start, end in box))
        for box in itertools.product(*spans)
    ]


# (size, the saved pieces' cuts, the local pieces' cuts): upstream's cases (a piece spanning
# two saved ones, half of one, a 4 -> 3 reshard) and uneven ones in more dims.
LAYOUTS: dict[
    str, tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]
] = {
    "spans_two": ((8,), ((2, 4, 6),), ((4,),)),
    "half_of_one": ((8,), ((4,),), ((2, 4, 6),)),
    "four_to_three": ((12,), ((3, 6, 9),), ((4, 8),)),
    "uneven_rows": ((10, 3), ((3, 6, 9), ()), ((5,), ())),
    "grid_to_columns": ((6, 6), ((2, 4), (3,)), ((), (1, 5))),
    "cube": ((4, 5, 6), ((2,), (3,), (1, 4)), ((1, 3), (), (3,))),
    "whole_to_pieces": ((5, 4), ((), ()), ((1, 2), (2,))),
    "scalar": ((), (), ()),
}


def _chunk(dcp_chunk: Chunk) -> Any:
    offsets, sizes = dcp_chunk
    return dcp_metadata.ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def _overlaps(local: list[Chunk], saved: list[Chunk]) -> set[tuple[Any, ...]]:
    """Each overlapping pair as (dest offsets, dest index, storage offsets, storage index,
    offsets into the local piece, offsets into the saved piece, lengths)."""
    found = set()
    for (li, (lo, ls)), (si, (so, ss)) in itertools.product(enumerate(local), enumerate(saved)):
        starts = [max(a, b) for a, b in zip(lo, so, strict=True)]
        ends = [min(a + x, b + y) for a, x, b, y in zip(lo, ls, so, ss, strict=True)]
        if any(end <= start for start, end in zip(starts, ends, strict=True)):
            continue
        found.add(
            (
                tuple(lo),
                li,
                tuple(so),
                si,
                tuple(s - o for s, o in zip(starts, lo, strict=True)),
                tuple(s - o for s, o in zip(starts, so, strict=True)),
                tuple(e - s for s, e in zip(starts, ends, strict=True)),
            )
        )
    return found


def _described(fqn: str, item: Any) -> tuple[Any, ...]:
    assert item.dest_index.fqn == fqn, f"{fqn}: a read into {item.dest_index}"
    assert item.storage_index.fqn == fqn, f"{fqn}: a read from {item.storage_index}"
    return (
        tuple(item.dest_index.offset),
        item.dest_index.index,
        tuple(item.storage_index.offset),
        item.storage_index.index,
        tuple(item.dest_offsets),
        tuple(item.storage_offsets),
        tuple(item.lengths),
    )


def _piece(tensor: torch.Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, sizes, strict=True)):
        tensor = tensor.narrow(dim, start, length)
    return tensor


@pytest.mark.world(1)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_read_items_are_the_overlaps_of_local_and_saved_chunks(world, layout):
    size, saved_cuts, local_cuts = LAYOUTS[layout]
    saved, local = _tiling(size, saved_cuts), _tiling(size, local_cuts)
    properties = dcp_metadata.TensorProperties(dtype=torch.float32)
    checkpoint = dcp_metadata.TensorStorageMetadata(
        properties=properties, size=torch.Size(size), chunks=[_chunk(c) for c in saved]
    )
    items = dcp_planner_helpers.create_read_items_for_chunk_list(
        "w", checkpoint, [_chunk(c) for c in local]
    )
    described = [_described("w", item) for item in items]
    assert len(described) == len(set(described)), f"{layout}: an item is planned twice"
    assert set(described) == _overlaps(local, saved), (
        f"{layout}: planned {sorted(described)}, the overlaps are {sorted(_overlaps(local, saved))}"
    )

    whole = torch.arange(float(torch.Size(size).numel())).reshape(size)
    pieces = [_piece(whole, *chunk).clone() for chunk in saved]
    loaded = [torch.full(sizes, -1.0) for _, sizes in local]
    for item in items:
        source = _piece(pieces[item.storage_index.index], item.storage_offsets, item.lengths)
        _piece(loaded[item.dest_index.index], item.dest_offsets, item.lengths).copy_(source)
    for (offsets, sizes), got in zip(local, loaded, strict=True):
        assert torch.equal(got, _piece(whole, offsets, sizes)), (
            f"{layout}: the reads rebuild the piece at {offsets} as {got.tolist()}"
        )


def _index(fqn: str, offset: tuple[int, ...] | None = None, hint: int | None = None) -> Any:
    return dcp_metadata.MetadataIndex(
        fqn=fqn, offset=None if offset is None else torch.Size(offset), index=hint
    )


def _two_shards(rows: int) -> Any:
    """A ``ShardedTensor`` of ``2 * rows`` rows whose one rank holds both halves."""
    shards = [
        sharded_tensor.Shard.from_tensor_and_offsets(
            torch.full((rows, 3), float(half)), [half * rows, 0], rank=0
        )
        for half in (0, 1)
    ]
    return sharded_tensor.init_from_local_shards(shards, 2 * rows, 3)


@pytest.mark.world(1)
def test_find_state_dict_object_finds_each_piece_by_its_offset_whatever_the_hint(world):
    plain = torch.arange(4.0)
    sharded = _two_shards(2)
    mesh = world.mesh(1)
    distributed = dtensor.distribute_tensor(torch.arange(6.0), mesh, [dtensor.Shard(0)])
    state = {"plain": plain, "value": {"lr": 0.1}, "sharded": sharded, "distributed": distributed}
    find = dcp_utils.find_state_dict_object
    assert find(state, _index("plain")) is plain
    assert find(state, _index("plain", (0,))) is plain
    assert find(state, _index("value")) == {"lr": 0.1}
    for half, offset in enumerate(((0, 0), (2, 0))):
        expected = sharded.local_shards()[half].tensor
        for hint in (half, 1 - half, 5, None):
            found = find(state, _index("sharded", offset, hint))
            assert found is expected, f"the shard at {offset} with hint {hint} is another tensor"
    found = find(state, _index("distributed", (0,)))
    assert torch.equal(found, distributed.to_local()), f"the DTensor's piece is {found.tolist()}"


# What each refused lookup asks for (the key, and an offset or None) and the error's words.
REFUSALS: dict[str, tuple[str, tuple[int, ...] | None, str]] = {
    "unknown_name": ("absent", None, "Could not find FQN: 'absent'"),
    "offset_into_a_value": ("value", (0,), "'value' is not a ShardedTensor"),
    "offset_into_a_tensor": ("plain", (2,), "'plain' is not a ShardedTensor"),
    "sharded_without_offset": ("sharded", None, "Cannot lookup sharded"),
    "no_shard_starts_there": ("sharded", (1, 0), "shard at .*sharded"),
}


@pytest.mark.world(1)
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_find_state_dict_object_refuses_what_is_not_there_naming_the_key(world, refusal):
    state = {"plain": torch.arange(4.0), "value": {"lr": 0.1}, "sharded": _two_shards(2)}
    key, offset, message = REFUSALS[refusal]
    with pytest.raises(ValueError, match=message):
        dcp_utils.find_state_dict_object(state, _index(key, offset))


@pytest.mark.world(1)
def test_metadata_classes_build_from_their_original_fields_and_pickle_back_equal(world):
    chunk = dcp_metadata.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3]))
    tensor = dcp_metadata.TensorStorageMetadata(
        properties=dcp_metadata.TensorProperties(dtype=torch.bfloat16),
        size=torch.Size([2, 3]),
        chunks=[chunk],
    )
    opaque = dcp_metadata.BytesStorageMetadata()
    metadata = dcp_metadata.Metadata(state_dict_metadata={"w": tensor, "step": opaque})
    index = dcp_metadata.MetadataIndex(fqn="w")
    assert (index.offset, index.index) == (None, None), f"a bare index holds {index}"
    for built in (chunk, tensor, opaque, metadata, index):
        again = pickle.loads(pickle.dumps(built))
        assert again == built, f"{type(built).__name__} pickles back as {again}"


@pytest.mark.world(1)
def test_a_checkpoint_whose_metadata_pickles_sharded_tensor_properties_loads(world):
    """Releases before DCP had its own ``TensorProperties`` pickled ShardedTensor's into
    ``.metadata``; as upstream does, a save with that class in its place writes such a
    checkpoint, and a load must still read every value of it."""
    legacy = sharded_tensor_metadata.TensorProperties
    path = world.tmp_path / "legacy-properties"
    saved = {"a": torch.arange(16.0).reshape(4, 4), "step": 3}
    with mock.patch(f"{dcp_metadata.path}.TensorProperties", legacy):
        dcp.save(saved, checkpoint_id=str(path))
    pickled = (path / ".metadata").read_bytes()
    assert sharded_tensor_metadata.path.encode() in pickled, (
        "the patched save did not pickle ShardedTensor's TensorProperties"
    )
    loaded = {"a": torch.zeros(4, 4), "step": 0}
    dcp.load(loaded, checkpoint_id=str(path))
    assert torch.equal(loaded["a"], saved["a"]), f"loaded {loaded['a'].tolist()}"
    assert loaded["step"] == 3, f"loaded step {loaded['step']}"


def _chunk_rows(total: int, ranks: int, rank: int) -> tuple[int, int]:
    """The rows ``Shard(0)`` gives ``rank``: ``torch.chunk``'s pieces, ``ceil(total / ranks)``
    long, the last ones shorter or empty."""
    rows = -(-total // ranks)
    start = min(rank * rows, total)
    return start, min(rows, total - start)


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("coordinator", [True, False], ids=["coordinator", "other"])
def test_a_local_save_plan_writes_each_value_the_rank_holds(world, coordinator):
    """``create_default_local_save_plan`` plans on every rank one write per value: a whole
    plain tensor (``TENSOR`` at offset zero), a plain value (``BYTE_IO``), each local shard of a
    ``ShardedTensor`` and a DTensor's local piece (``SHARD`` at its offset), each with its
    chunk, dtype and global size; the coordinator dedups later, so both plan alike."""
    rank, size = world.rank, world.size
    plain = torch.rand(10, dtype=torch.float64)
    shards = [
        sharded_tensor.Shard.from_tensor_and_offsets(torch.rand(3), [3 * (2 * rank + k)], rank=rank)
        for k in (0, 1)
    ]
    sharded = sharded_tensor.init_from_local_shards(shards, 6 * size)
    distributed = dtensor.distribute_tensor(
        torch.zeros(5, 3, dtype=torch.bfloat16), world.mesh(size), [dtensor.Shard(0)]
    )
    state = {"plain": plain, "value": [1, 2, 3], "sharded": sharded, "distributed": distributed}
    plan = dcp_default_planner.create_default_local_save_plan(state, coordinator)
    start, rows = _chunk_rows(5, size, rank)
    expected = {
        ("plain", "TENSOR", (0,), (0,), (10,), torch.float64, (10,)),
        ("value", "BYTE_IO", None, None, None, None, None),
        *(
            (
                "sharded",
                "SHARD",
                (3 * (2 * rank + k),),
                (3 * (2 * rank + k),),
                (3,),
                torch.float32,
                (6 * size,),
            )
            for k in (0, 1)
        ),
        ("distributed", "SHARD", (start, 0), (start, 0), (rows, 3), torch.bfloat16, (5, 3)),
    }
    planned = [_write(item) for item in plan.items]
    assert len(planned) == len(set(planned)), f"rank {rank}: a write is planned twice: {planned}"
    assert set(planned) == expected, (
        f"rank {rank}: planned {sorted(map(str, planned))}, expected {sorted(map(str, expected))}"
    )


def _write(item: Any) -> tuple[Any, ...]:
    """A write item as (fqn, type, index offset, chunk offsets, chunk sizes, dtype, size)."""
    index = item.index
    offset = None if index.offset is None else tuple(index.offset)
    data = item.tensor_data
    if data is None:
        return (index.fqn, item.type.name, offset, None, None, None, None)
    return (
        index.fqn,
        item.type.name,
        offset,
        tuple(data.chunk.offsets),
        tuple(data.chunk.sizes),
        data.properties.dtype,
        tuple(data.size),
    )
