"""FSDP1's sharded form of a full tensor: chunks along dim 0, one per rank of the shard group.

``torch.chunk`` rules: chunks of ``ceil(rows / n)`` rows, the last one
shorter, ranks past the last chunk hold nothing. Without a device mesh the
result is a ShardedTensor whose metadata lists every chunk (placements by
global rank); with one, a DTensor sharded on the mesh's last dim
(``[Shard(0)]``, or ``[Replicate(), Shard(0)]`` for hybrid sharding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import Shard as LocalShard
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)
from torch.distributed.tensor import DTensor, Replicate, Shard

from reference_impl._devices import default_device, device_count
from reference_impl._gather import local_piece


def chunk_rows(rows: int, count: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each dim-0 chunk ``torch.chunk(count)`` makes of ``rows`` rows."""
    if rows == 0:
        return [(0, 0)]
    per = -(-rows // count)
    return [(start, min(per, rows - start)) for start in range(0, rows, per)]


def chunk_like_fsdp(tensor: torch.Tensor, group: Any, mesh: Any | None) -> Any:
    """``tensor`` (the same full value on every rank) as FSDP1 shards it for a state dict."""
    if mesh is not None:
        placements = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
        return DTensor.from_local(
            local_piece(tensor, mesh, placements).clone(),
            mesh,
            placements,
            run_check=False,
            shape=tensor.shape,
            stride=tensor.stride(),
        )
    return _chunked_sharded_tensor(tensor, group)


def _chunked_sharded_tensor(tensor: torch.Tensor, group: Any) -> ShardedTensor:
    chunks = chunk_rows(tensor.size(0), group.size())
    local = None
    if group.rank() < len(chunks):
        start, length = chunks[group.rank()]
        local = tensor[start : start + length].clone()
    return sharded_tensor_of_row_chunks(local, chunks, tensor.shape, tensor, group)


def sharded_tensor_of_row_chunks(
    local: torch.Tensor | None,
    chunks: list[tuple[int, int]],
    shape: torch.Size,
    like: torch.Tensor,
    group: Any,
    placements: list[str] | None = None,
) -> ShardedTensor:
    """A ShardedTensor of ``shape`` whose group rank ``r`` holds the rows ``chunks[r]``.

    ``chunks`` are ``(start, length)`` along dim 0, one per rank from rank 0
    (ranks past the list hold nothing); ``local`` is this rank's piece, kept
    as it is (no copy). ``like`` gives the dtype, layout, pinning and
    ``requires_grad`` the metadata records. ``placements`` name where each
    chunk lives; None places them as FSDP1's sharded state dict does, by
    global rank on the group's default device type, without communication.
    """
    tail = [0] * (len(shape) - 1)
    shards = []
    if local is not None:
        start = chunks[group.rank()][0]
        placement = f"rank:{group.rank()}/{local.device}"
        metadata = ShardMetadata([start, *tail], list(local.shape), placement)
        shards.append(LocalShard(local, metadata))
    if placements is None:
        device_type = default_device(group).type
        placements = [
            _placement(dist.get_global_rank(group, r), device_type) for r in range(len(chunks))
        ]
    everyones = [
        ShardMetadata([start, *tail], [length, *shape[1:]], placement)
        for (start, length), placement in zip(chunks, placements, strict=True)
    ]
    properties = TensorProperties(
        dtype=like.dtype,
        layout=like.layout,
        requires_grad=like.requires_grad,
        memory_format=torch.contiguous_format,
        pin_memory=like.is_pinned(),
    )
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, ShardedTensorMetadata(everyones, shape, properties), process_group=group
    )


def gathered_placements(local: torch.Tensor | None, group: Any) -> list[str]:
    """Where each group rank's piece lives, learnt from every rank as ``init_from_local_shards``
    learns it (a collective of ``group``): ``rank:r/device`` by group rank, for the ranks that
    hold a piece, which are the first ones."""
    devices: list[str | None] = [None] * group.size()
    dist.all_gather_object(devices, None if local is None else str(local.device), group=group)
    return [f"rank:{r}/{device}" for r, device in enumerate(devices) if device is not None]


def _placement(global_rank: int, device_type: str) -> str:
    if device_type == "cpu":
        return f"rank:{global_rank}/cpu"
    return f"rank:{global_rank}/{device_type}:{global_rank % device_count(device_type)}"
