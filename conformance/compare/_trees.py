"""Generated nested state dicts with tensors, DTensors on real meshes, and plain leaves.

Hypothesis draws a *spec* (pure data); every rank builds the same state dict
from it, so all ranks hold identical inputs. Values come from seeded
generators, never from the global RNG.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from conformance._upstream import dtensor, dtensor_placements
from reference_impl import local_piece

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    transposed: bool = False  # a non-contiguous view


@dataclass(frozen=True)
class DTensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    mesh: str
    placements: tuple[dtensor.Placement, ...]


def full_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not dtype.is_floating_point:
        return torch.randint(-100, 100, shape, generator=generator, dtype=dtype)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def placements_for(mesh_name: str, ndim: int) -> list[tuple[dtensor.Placement, ...]]:
    """The placements the design names, that a tensor of ``ndim`` dims can take."""
    if mesh_name == "dp":
        options: list[tuple[dtensor.Placement, ...]] = [(dtensor.Replicate(),)]
        options += [(dtensor.Shard(d),) for d in range(ndim)]
        return options
    if ndim == 0:
        return [(dtensor.Replicate(), dtensor.Replicate())]
    options = [
        (dtensor.Replicate(), dtensor.Shard(0)),
        (dtensor.Shard(0), dtensor.Replicate()),
        (dtensor_placements._StridedShard(0, split_factor=2), dtensor.Shard(0)),
    ]
    if ndim >= 2:
        options.append((dtensor.Shard(0), dtensor.Shard(1)))
    return options


shapes = st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple)
seeds = st.integers(0, 2**31 - 1)


def tensor_specs() -> st.SearchStrategy[TensorSpec]:
    return st.builds(TensorSpec, shapes, st.sampled_from(DTYPES), seeds, st.booleans())


@st.composite
def dtensor_specs(draw: st.DrawFn, meshes: tuple[str, ...]) -> DTensorSpec:
    mesh = draw(st.sampled_from(meshes))
    shape = draw(shapes)
    placements = draw(st.sampled_from(placements_for(mesh, len(shape))))
    return DTensorSpec(shape, draw(st.sampled_from(DTYPES)), draw(seeds), mesh, placements)


@dataclass(frozen=True)
class BytesIOSpec:
    data: bytes


plain_leaves = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=3),
    st.none(),
    st.binary(max_size=3),
    st.builds(BytesIOSpec, st.binary(max_size=3)),
)
keys = st.text(alphabet="abcdefw", min_size=1, max_size=4)


def tree_specs(
    meshes: tuple[str, ...], with_dtensors: bool = True
) -> st.SearchStrategy[dict[str, Any]]:
    """Specs of nested state dicts: dicts, lists and tuples of leaves."""
    leaves = st.one_of(
        tensor_specs(), plain_leaves, *([dtensor_specs(meshes)] if with_dtensors else [])
    )
    children = st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3),
            st.lists(inner, min_size=1, max_size=3).map(tuple),
            st.dictionaries(keys, inner, min_size=1, max_size=3),
        ),
        max_leaves=8,
    )
    return st.dictionaries(keys, children, min_size=1, max_size=4)


class Builder:
    """Builds state dicts from specs on this rank, on the world's meshes."""

    def __init__(self, meshes: dict[str, Any], device: torch.device) -> None:
        self.meshes = meshes
        self.device = device

    def build(self, spec: Any) -> Any:
        if isinstance(spec, TensorSpec):
            value = full_tensor(spec.shape, spec.dtype, spec.seed).to(self.device)
            return value.t() if spec.transposed and value.dim() == 2 else value
        if isinstance(spec, DTensorSpec):
            return self.dtensor(spec)
        if isinstance(spec, dict):
            return {k: self.build(v) for k, v in spec.items()}
        if isinstance(spec, list):
            return [self.build(v) for v in spec]
        if isinstance(spec, tuple):
            return tuple(self.build(v) for v in spec)
        if isinstance(spec, BytesIOSpec):
            return io.BytesIO(spec.data)
        return spec

    def dtensor(self, spec: DTensorSpec) -> torch.Tensor:
        mesh = self.meshes[spec.mesh]
        full = full_tensor(spec.shape, spec.dtype, spec.seed).to(self.device)
        if any(isinstance(p, dtensor_placements._StridedShard) for p in spec.placements):
            # distribute_tensor cannot lay out strided shards; place the piece by hand,
            # in its own memory as distribute_tensor's pieces are (a piece that is a view
            # at an offset is a case of its own: test_upstream_failures' ..._is_a_view).
            piece = local_piece(full, mesh, spec.placements).clone()
            return dtensor.DTensor.from_local(
                piece,
                mesh,
                spec.placements,
                run_check=False,
                shape=full.shape,
                stride=full.stride(),
            )
        return dtensor.distribute_tensor(full, mesh, list(spec.placements))


def world_meshes(world: Any) -> dict[str, Any]:
    """A 1-D mesh over the world, and a 2x(n/2) mesh where the world has 4 ranks."""
    meshes = {"dp": world.mesh(world.size, ("dp",))}
    if world.size == 4:
        meshes["2d"] = world.mesh((2, 2), ("dp", "tp"))
    return meshes
