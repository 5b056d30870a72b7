"""Resharding at tensor level: a DCP checkpoint saved under one placement loads under another.

A state dict holds tensors of every shape a model has: rows and columns that divide by neither
2 nor 4, a vector, a 3-D tensor, a bfloat16 and an int64 tensor. It is saved by ``dcp.save``
under one layout, and loaded by ``dcp.load`` into templates of another. The templates are
filled with NaN (or -1), so that a piece the load leaves unread shows. The layouts:

- a plain tensor on every rank;
- a DTensor on a 1-D mesh as ``Replicate``, and as ``Shard`` on the first and on the last
  dimension;
- a ShardedTensor chunked by rows (ranks past the rows hold no shard);
- at 4 ranks, on a 2 x 2 mesh: ``(Shard(first), Shard(last))``, ``(Replicate, Shard(first))``,
  ``(Shard(first), Shard(first))``, ``(Replicate, Replicate)`` and ``(Shard(first), Replicate)``;
- at 4 ranks, the ``(_StridedShard(first), Shard(first))`` of FSDP2 + TP, which orders the
  same rows the other way round.

Every saved layout loads into every layout at 1, 2 and 4 ranks. A checkpoint saved at 4 ranks
loads on 2 ranks and on 1 (``no_dist``) into every layout there. The DTensor layouts on 1-D
and 2-D meshes also go through sharded safetensors (``HuggingFaceStorageWriter`` with
``save_distributed``, read by ``HuggingFaceStorageReader``), each into every other. What each
rank holds afterwards is compared with its piece of the saved tensor, key by key, bit for bit.

The mutant ``resharding_reads_matrices_only`` is a resharding read that intersects chunks on
their first two dimensions only, as a planner written for matrices would. Only the 3-D tensor
here sees it: no model of the matrix has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dtensor, dtensor_placements, sharded_tensor, with_parameters
from conformance.cells import SubWorld
from conformance.compare import assert_state_dict_equal
from conformance.training import load_options_for
from reference_impl import local_piece

SHAPES: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "rows_10x7": ((10, 7), torch.float32),
    "wide_5x10": ((5, 10), torch.float32),
    "vector_13": ((13,), torch.float32),
    "cube_3x4x6": ((3, 4, 6), torch.float32),
    "bf16_6x5": ((6, 5), torch.bfloat16),
    "int64_9x3": ((9, 3), torch.int64),
}
SEED = 4321

Placements = Callable[[int], tuple[Any, ...]]  # by the tensor's number of dimensions


@dataclass(frozen=True)
class Layout:
    """How a tensor lies across the ranks: plain, a ShardedTensor by rows, or a DTensor with
    ``placements`` on a mesh of ``mesh_dims`` dimensions."""

    name: str
    mesh_dims: int = 0  # 0: no mesh (a plain tensor or a ShardedTensor)
    placements: Placements | None = None
    sharded_tensor: bool = False

    def exists_at(self, size: int) -> bool:
        return self.mesh_dims < 2 or size == 4


def _last(ndim: int) -> Any:
    """``Shard`` on a tensor's last dimension (its only one for a vector)."""
    return dtensor.Shard(max(ndim - 1, 0))


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("plain"),
        Layout("rows_sharded_tensor", sharded_tensor=True),
        Layout("replicate", 1, lambda n: (dtensor.Replicate(),)),
        Layout("shard_first", 1, lambda n: (dtensor.Shard(0),)),
        Layout("shard_last", 1, lambda n: (_last(n),)),
        Layout("2d_shard_first_shard_last", 2, lambda n: (dtensor.Shard(0), _last(n))),
        Layout("2d_replicate_shard_first", 2, lambda n: (dtensor.Replicate(), dtensor.Shard(0))),
        Layout("2d_shard_first_twice", 2, lambda n: (dtensor.Shard(0), dtensor.Shard(0))),
        Layout("2d_replicate_twice", 2, lambda n: (dtensor.Replicate(), dtensor.Replicate())),
        Layout("2d_shard_first_replicate", 2, lambda n: (dtensor.Shard(0), dtensor.Replicate())),
        Layout(
            "2d_strided",
            2,
            lambda n: (dtensor_placements._StridedShard(0, split_factor=2), dtensor.Shard(0)),
        ),
    )
}


def _full(name: str) -> torch.Tensor:
    shape, dtype = SHAPES[name]
    generator = torch.Generator().manual_seed(SEED + sorted(SHAPES).index(name))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-100, 100, shape, generator=generator, dtype=dtype)


def _unread(full: torch.Tensor) -> torch.Tensor:
    """A template's filling: NaN, or -1 where the dtype has no NaN."""
    return torch.full_like(full, float("nan") if full.dtype.is_floating_point else -1)


def _rows_of(full: torch.Tensor, rank: int, size: int) -> tuple[int, int]:
    """The rows ``[start, start + count)`` of ``rank``'s chunk (``torch.chunk``'s split)."""
    per_rank = -(-full.shape[0] // size)
    start = min(rank * per_rank, full.shape[0])
    return start, min(per_rank, full.shape[0] - start)


class Placer:
    """Lays tensors out on one world (or sub-world) of ranks; every rank makes the same
    calls. Its meshes are made once, on first use: a mesh made per tensor would make process
    groups by the dozen."""

    def __init__(self, world: Any, group: Any = None) -> None:
        self.world = world
        self.group = group  # the ShardedTensors' process group; None: the default one
        self._meshes: dict[int, Any] = {}

    def mesh(self, dims: int) -> Any:
        if dims not in self._meshes:
            shape = self.world.size if dims == 1 else (2, self.world.size // 2)
            self._meshes[dims] = self.world.mesh(shape, ("x", "y")[:dims])
        return self._meshes[dims]

    def piece(self, layout: Layout, full: torch.Tensor) -> Any:
        """What this rank holds of ``full`` laid out as ``layout``: the whole tensor, its
        DTensor piece, or its ShardedTensor shards by offset."""
        if layout.sharded_tensor:
            start, count = _rows_of(full, self.world.rank, self.world.size)
            offsets = (start,) + (0,) * (full.dim() - 1)
            return {offsets: full.narrow(0, start, count)} if count else {}
        if layout.placements is None:
            return full
        return local_piece(full, self.mesh(layout.mesh_dims), layout.placements(full.dim()))

    def place(self, layout: Layout, full: torch.Tensor) -> Any:
        """``full`` laid out on this rank as ``layout`` says."""
        piece = self.piece(layout, full)
        if layout.sharded_tensor:
            return self._sharded_tensor(full, piece)
        if layout.placements is None:
            return piece.clone().to(self.world.device)
        return dtensor.DTensor.from_local(
            piece.clone().to(self.world.device),
            self.mesh(layout.mesh_dims),
            layout.placements(full.dim()),
            run_check=False,
            shape=full.shape,
            stride=full.stride(),
        )

    def _sharded_tensor(
        self, full: torch.Tensor, shards_by_offset: dict[tuple[int, ...], torch.Tensor]
    ) -> Any:
        rank, device = self.world.rank, self.world.device
        shards = [
            sharded_tensor.Shard(
                shard.clone().to(device),
                sharded_tensor.ShardMetadata(
                    list(offsets),
                    list(shard.shape),
                    f"rank:{rank}/{device}",
                ),
            )
            for offsets, shard in shards_by_offset.items()
        ]
        return sharded_tensor.init_from_local_shards(
            shards, list(full.shape), process_group=self.group
        )

    def state(self, layout: Layout, fill: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        """The state dict of every shape in ``SHAPES``, each tensor ``fill(full)``."""
        return {"layer": {name: self.place(layout, fill(_full(name))) for name in SHAPES}}


def _pieces(value: Any) -> Any:
    """What this rank holds of a loaded value: its local tensor, or its shards by offset."""
    if isinstance(value, sharded_tensor.ShardedTensor):
        return {tuple(s.metadata.shard_offsets): s.tensor.cpu() for s in value.local_shards()}
    if isinstance(value, dtensor.DTensor):
        return value.to_local().cpu()
    return value.cpu()


def _save(layout: Layout, placer: Placer, path: str) -> None:
    dcp.save(placer.state(layout, lambda full: full), checkpoint_id=path)


def _dcp_load(path: str, **load: Any) -> Callable[[Any], None]:
    return lambda template: dcp.load(template, checkpoint_id=path, **load)


def _load_and_check(layout: Layout, placer: Placer, read: Callable[[Any], None]) -> None:
    """``read`` into ``layout``'s templates; each rank holds its piece of each tensor."""
    template = placer.state(layout, _unread)
    read(template)
    try:
        assert_state_dict_equal(
            {name: _pieces(value) for name, value in template["layer"].items()},
            {name: placer.piece(layout, _full(name)) for name in SHAPES},
        )
    except AssertionError as error:
        rank = placer.world.rank
        raise AssertionError(f"rank {rank}, loaded as {layout.name}: {error}") from None


def _applies(size: int, saved: str, loaded: str) -> bool:
    return LAYOUTS[saved].exists_at(size) and LAYOUTS[loaded].exists_at(size)


@pytest.mark.world(1, 2, 4, applies=_applies)
@pytest.mark.parametrize("loaded", sorted(LAYOUTS))
@pytest.mark.parametrize("saved", sorted(LAYOUTS))
def test_a_checkpoint_loads_under_another_placement(world, saved, loaded):
    path = str(world.tmp_path / "checkpoint")
    placer = Placer(world)
    _save(LAYOUTS[saved], placer, path)
    _load_and_check(LAYOUTS[loaded], placer, _dcp_load(path))


@pytest.mark.world(4)
@pytest.mark.parametrize("load_size", [2, 1])
@pytest.mark.parametrize("saved", sorted(LAYOUTS))
def test_a_checkpoint_saved_at_4_ranks_loads_at_fewer_under_every_placement(
    world, saved, load_size
):
    loaders = SubWorld(world, load_size)
    load = load_options_for(loaders)
    path = str(world.tmp_path / "checkpoint")
    _save(LAYOUTS[saved], Placer(world), path)
    try:
        if loaders.member:
            placer = Placer(loaders, loaders.group)
            for layout in LAYOUTS.values():
                if layout.exists_at(load_size):
                    _load_and_check(layout, placer, _dcp_load(path, **load))
    finally:
        world.barrier()


# The DTensor layouts a sharded Hugging Face save takes, on 1-D and 2-D meshes.
SAFETENSORS_LAYOUTS = (
    "shard_first",
    "shard_last",
    "2d_shard_first_shard_last",
    "2d_replicate_shard_first",
)


def _safetensors_save(layout: Layout, placer: Placer, path: str) -> None:
    writer = with_parameters(dcp.HuggingFaceStorageWriter, "save_distributed")
    dcp.save(
        placer.state(layout, lambda full: full), storage_writer=writer(path, save_distributed=True)
    )


@pytest.mark.world(2, 4, applies=_applies)
@pytest.mark.parametrize("loaded", SAFETENSORS_LAYOUTS)
@pytest.mark.parametrize("saved", SAFETENSORS_LAYOUTS)
def test_sharded_safetensors_load_under_another_placement(world, saved, loaded):
    """Every rank's pieces saved as safetensors (``HuggingFaceStorageWriter`` with
    ``save_distributed``, not joined) load through ``HuggingFaceStorageReader`` under every
    other placement, 1-D and 2-D, ranks without a piece of the 3-D tensor included."""
    pytest.importorskip("safetensors")
    path = str(world.tmp_path / "sharded-safetensors")
    placer = Placer(world)
    _safetensors_save(LAYOUTS[saved], placer, path)
    world.barrier()
    reader = dcp.HuggingFaceStorageReader(path)
    _load_and_check(
        LAYOUTS[loaded], placer, lambda template: dcp.load(template, storage_reader=reader)
    )
