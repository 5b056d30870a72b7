"""Which part of a global tensor each mesh coordinate holds, from placements alone.

A layout is, for each tensor dim, the global indices a coordinate holds,
in local order. It is computed from the placements by the rules that DTensor
documents, not by DTensor's own helpers, so the oracle can check them:

- ``Shard(d)`` on a mesh dim of size ``n``: dim ``d`` is split as by
  ``torch.chunk`` into pieces of ``ceil(len / n)``; coordinate ``c`` takes
  piece ``c`` (empty when the pieces run out).
- ``_StridedShard(d, split_factor=f)``: dim ``d`` is first split into ``f``
  pieces as above; each piece is split into ``n`` as above; coordinate ``c``
  takes its part of every piece, in piece order. FSDP2 uses it on top of TP.
- ``Replicate()``: every coordinate holds everything.

Placements apply in mesh-dim order, each to what the earlier ones left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import Partial, Placement, Replicate, Shard

try:
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # pragma: no cover - builds without strided sharding
    _StridedShard = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Layout:
    """The global indices held along each tensor dim (local order)."""

    indices: tuple[torch.Tensor, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(i) for i in self.indices)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def index(self) -> tuple[slice, ...] | tuple[torch.Tensor, ...]:
        """Index into the full tensor: slices if every dim holds a range, else broadcast indices."""
        ranges = [_as_slice(idx) for idx in self.indices]
        if all(r is not None for r in ranges):
            return tuple(r for r in ranges if r is not None)
        ndim = len(self.indices)
        return tuple(
            idx.view([-1 if d == dim else 1 for d in range(ndim)])
            for dim, idx in enumerate(self.indices)
        )


def _as_slice(indices: torch.Tensor) -> slice | None:
    if len(indices) == 0:
        return slice(0, 0)
    start = int(indices[0])
    if bool((indices == torch.arange(start, start + len(indices))).all()):
        return slice(start, start + len(indices))
    return None


def chunk_of(indices: torch.Tensor, parts: int, which: int) -> torch.Tensor:
    """Piece ``which`` of ``indices`` split into ``parts`` as ``torch.chunk`` does (maybe empty)."""
    size = -(-len(indices) // parts) if len(indices) else 0
    start = min(which * size, len(indices))
    return indices[start : min(start + size, len(indices))]


def layout_of(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coordinate: Sequence[int],
) -> Layout:
    """The part of a tensor of ``global_shape`` that mesh ``coordinate`` holds."""
    if not (len(mesh_shape) == len(placements) == len(coordinate)):
        raise ValueError(
            f"mesh shape {tuple(mesh_shape)}, placements {tuple(placements)} and "
            f"coordinate {tuple(coordinate)} must have one entry per mesh dim"
        )
    indices = [torch.arange(size) for size in global_shape]
    for mesh_size, placement, coord in zip(mesh_shape, placements, coordinate, strict=True):
        if _StridedShard is not None and isinstance(placement, _StridedShard):
            dim = _tensor_dim(placement.dim, len(indices), placement)
            pieces = [
                chunk_of(indices[dim], int(placement.split_factor), p)
                for p in range(int(placement.split_factor))
            ]
            indices[dim] = torch.cat([chunk_of(piece, mesh_size, coord) for piece in pieces])
        elif isinstance(placement, Shard):
            dim = _tensor_dim(placement.dim, len(indices), placement)
            indices[dim] = chunk_of(indices[dim], mesh_size, coord)
        elif isinstance(placement, Partial):
            raise NotImplementedError(
                "a Partial placement holds unreduced values; state dicts never hold them"
            )
        elif not isinstance(placement, Replicate):
            raise NotImplementedError(f"unknown placement {placement!r}")
    return Layout(tuple(indices))


def _tensor_dim(dim: int, ndim: int, placement: Placement) -> int:
    resolved = dim + ndim if dim < 0 else dim
    if not 0 <= resolved < ndim:
        raise ValueError(f"{placement!r} shards dim {dim} of a {ndim}-dim tensor")
    return resolved
