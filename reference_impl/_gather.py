"""Full tensors from DTensors and ShardedTensors, assembled from every rank's local piece.

The oracle does not ask DTensor to redistribute itself: it computes each
rank's layout from the placements (``_layout``), all-gathers the raw bytes
of the local pieces along each mesh dim, and writes every piece where its
layout says it belongs. Bytes travel as ``uint8``, so every dtype works on
every backend.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from reference_impl._devices import group_device
from reference_impl._layout import Layout, layout_of

Coordinate = tuple[int, ...]


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


_all_gather_into_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather_bytes(
    payload: torch.Tensor, sizes: Sequence[int], group: dist.ProcessGroup | None
) -> list[torch.Tensor]:
    """Every group member's ``payload`` (of known byte ``sizes``), in group-rank order.

    One collective into one buffer; payloads shorter than the longest are padded.
    """
    longest = max(sizes)
    if longest == 0:
        return [payload.new_empty(0) for _ in sizes]
    if payload.numel() != longest:
        padded = payload.new_zeros(longest)
        padded[: payload.numel()] = payload
        payload = padded
    received = payload.new_empty(len(sizes) * longest)
    _all_gather_into_one(received, payload, group=group)
    return [received[i * longest : i * longest + size] for i, size in enumerate(sizes)]


@dataclass(frozen=True)
class _MeshFacts:
    """What a gather needs to know about a mesh: its shape, this rank's place, its groups."""

    shape: tuple[int, ...]
    coordinate: Coordinate
    groups: tuple[dist.ProcessGroup | None, ...]  # per mesh dim; None where the dim has size 1
    positions: tuple[tuple[int, ...], ...]  # per mesh dim: each group member's index on it
    row_group: dist.ProcessGroup | None  # a 1-D mesh's group when its ranks are in mesh order


_facts_by_mesh: dict[int, tuple[weakref.ref[DeviceMesh], _MeshFacts]] = {}


def _facts_of(mesh: DeviceMesh) -> _MeshFacts:
    """``mesh``'s facts, kept while that very mesh object lives.

    Looking groups up costs more than gathering a small tensor, so they are
    kept; by identity, not equality: an equal mesh built later may stand on
    newer process groups.
    """
    key = id(mesh)
    known = _facts_by_mesh.get(key)
    if known is not None and known[0]() is mesh:
        return known[1]
    ranks = mesh.mesh
    coordinate_of = {
        int(ranks[coord]): coord for coord in itertools.product(*(range(n) for n in ranks.shape))
    }
    groups = tuple(mesh.get_group(dim) if n > 1 else None for dim, n in enumerate(ranks.shape))
    positions = tuple(
        tuple(coordinate_of[r][dim] for r in dist.get_process_group_ranks(group))
        if group is not None
        else (0,)
        for dim, group in enumerate(groups)
    )
    in_order = len(groups) == 1 and positions[0] == tuple(range(ranks.shape[0]))
    facts = _MeshFacts(
        shape=tuple(ranks.shape),
        coordinate=tuple(mesh.get_coordinate() or ()),
        groups=groups,
        positions=positions,
        row_group=groups[0] if in_order else None,
    )
    _facts_by_mesh[key] = (weakref.ref(mesh, lambda _: _facts_by_mesh.pop(key, None)), facts)
    return facts


_ROW_SHARDED = (Shard(0),)


def _even_row_blocks(value: DTensor, facts: _MeshFacts) -> dist.ProcessGroup | None:
    """The group over which ``value``'s pieces are equal dim-0 blocks in group order, if so.

    Then gathering the pieces back to back in group order is the full tensor.
    """
    if facts.row_group is None or value.numel() == 0 or value.placements != _ROW_SHARDED:
        return None
    if value.shape[0] % facts.shape[0] != 0 or not value.to_local().is_contiguous():
        return None
    return facts.row_group


def full_tensor_of_dtensor(value: DTensor) -> torch.Tensor:
    """The global tensor of ``value``, on every rank of its mesh, on the mesh's device type.

    Models the gather in upstream ``_gather_state_dict`` (redistribute to
    ``Replicate`` on every mesh dim, then ``to_local``).
    """
    mesh = value.device_mesh
    placements = tuple(value.placements)
    local = value.to_local()
    if local.device.type != mesh.device_type:
        local = local.to(mesh.device_type)
    device = local.device
    if all(isinstance(p, Replicate) for p in placements) or mesh.size() == 1:
        return local  # every rank already holds the whole tensor, as upstream returns it
    facts = _facts_of(mesh)
    blocks_group = _even_row_blocks(value, facts)
    if blocks_group is not None:
        full = torch.empty(value.shape, dtype=value.dtype, device=device)
        _all_gather_into_one(_as_bytes(full), _as_bytes(local), group=blocks_group)
        return full
    layouts = _all_layouts(tuple(value.shape), facts.shape, placements)
    expected = layouts[facts.coordinate].shape
    if tuple(local.shape) != expected:
        raise ValueError(
            f"local shard of shape {tuple(local.shape)} does not match placements "
            f"{placements} of a {tuple(value.shape)} tensor (expected {expected})"
        )
    element = local.element_size()
    pieces: dict[Coordinate, torch.Tensor] = {facts.coordinate: _as_bytes(local)}
    for dim, group in enumerate(facts.groups):
        if group is None:
            continue
        mine = sorted(pieces)

        def held_by(
            position: int, mine: list[Coordinate] = mine, dim: int = dim
        ) -> list[Coordinate]:
            return [(*key[:dim], position, *key[dim + 1 :]) for key in mine]

        members = facts.positions[dim]
        sizes = [sum(layouts[k].numel for k in held_by(p)) * element for p in members]
        payload = pieces[mine[0]] if len(mine) == 1 else torch.cat([pieces[k] for k in mine])
        for position, buffer in zip(members, _all_gather_bytes(payload, sizes, group), strict=True):
            offset = 0
            for key in held_by(position):
                length = layouts[key].numel * element
                pieces[key] = buffer[offset : offset + length]
                offset += length
    return _assemble(value.shape, value.dtype, device, layouts, pieces)


@functools.lru_cache(maxsize=4096)
def _all_layouts(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple[Placement, ...]
) -> dict[Coordinate, Layout]:
    """Every mesh coordinate's layout; state dicts repeat the same few shapes, so cached."""
    return {
        coord: layout_of(shape, mesh_shape, placements, coord)
        for coord in itertools.product(*(range(n) for n in mesh_shape))
    }


def _assemble(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    layouts: dict[Coordinate, Layout],
    pieces: dict[Coordinate, torch.Tensor],
) -> torch.Tensor:
    full = torch.empty(tuple(shape), dtype=dtype, device=device)
    for coord, raw in pieces.items():
        layout = layouts[coord]
        if layout.numel:
            full[layout.index()] = raw.view(dtype).view(layout.shape)
    return full


def full_tensor_of_sharded_tensor(
    value: ShardedTensor,
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The global tensor of ``value`` on every rank, on its local shards' device (else CPU).

    Models upstream ``_all_gather_sharded_tensor``, but places each shard by
    its metadata (offsets and sizes) instead of assuming dim-0 chunks.
    """
    shards = value.metadata().shards_metadata
    local = {tuple(s.metadata.shard_offsets): s.tensor for s in value.local_shards()}
    home = next(iter(local.values())).device if local else torch.device("cpu")
    comm_device = group_device(group, device or home)
    element = torch.empty(0, dtype=value.dtype).element_size()
    world = dist.get_world_size(group)
    by_rank: list[list[int]] = [[] for _ in range(world)]
    for index, shard in enumerate(shards):
        owner = shard.placement.rank() if shard.placement is not None else None
        if owner is None:
            raise ValueError(f"shard {index} of the ShardedTensor has no placement rank")
        by_rank[owner if group is None else dist.get_group_rank(group, owner)].append(index)
    sizes = [sum(_numel(shards[i].shard_sizes) for i in held) * element for held in by_rank]
    mine = by_rank[dist.get_rank(group)]
    payload = torch.cat(
        [_as_bytes(local[tuple(shards[i].shard_offsets)]).to(comm_device) for i in mine]
        or [torch.empty(0, dtype=torch.uint8, device=comm_device)]
    )
    full = torch.empty(tuple(value.size()), dtype=value.dtype, device=comm_device)
    for held, buffer in zip(by_rank, _all_gather_bytes(payload, sizes, group), strict=True):
        offset = 0
        for i in held:
            sizes_i = tuple(shards[i].shard_sizes)
            length = _numel(sizes_i) * element
            region = tuple(
                slice(o, o + n) for o, n in zip(shards[i].shard_offsets, sizes_i, strict=True)
            )
            full[region] = buffer[offset : offset + length].view(value.dtype).view(sizes_i)
            offset += length
    return full.to(home)


def _numel(sizes: Sequence[int]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count


def local_piece(
    full: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]
) -> torch.Tensor:
    """The part of ``full`` that this rank holds on ``mesh`` under ``placements``."""
    coordinate = tuple(mesh.get_coordinate() or ())
    return full[layout_of(full.shape, tuple(mesh.shape), tuple(placements), coordinate).index()]
