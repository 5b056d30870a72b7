"""Where FSDP1 keeps each original parameter: its place in a flat parameter and in each shard.

FSDP1 concatenates a module's parameters (flattened, in registration order,
with alignment padding between them under ``use_orig_params``) into one
*flat parameter* of ``U`` elements. A sharded strategy splits it as
``torch.chunk`` does over the ``n`` ranks of its shard group: every rank's
shard has ``ceil(U / n)`` elements, rank ``r`` holding elements
``[r * c, (r + 1) * c)`` of the flat parameter and zeros past its end.
``NO_SHARD`` keeps the whole flat parameter on every rank, unpadded.

The layout is computed from the flat parameter's description (names, shapes,
numels with their padding) and the shard group alone; FSDP1's own per-rank
shard records are never read, so tests can check them against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from reference_impl._fqn import _join, without_wrapper_segments


@dataclass(frozen=True)
class Segment:
    """One original parameter's place in the unsharded flat parameter."""

    fqn: str  # relative to the module FSDP wraps
    shape: torch.Size
    start: int  # offset of its first element in the flat parameter

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.start + self.numel


@dataclass(frozen=True)
class ParamSlice:
    """The part of one original parameter (flattened) that one rank's shard holds."""

    fqn: str
    offset_in_shard: int  # where it starts in the rank's flat shard
    start: int  # its first element's index in the flattened parameter
    numel: int

    @property
    def end(self) -> int:
        return self.start + self.numel


@dataclass(frozen=True)
class FlatLayout:
    """A flat parameter's segments and how its shard group splits it.

    ``shard_count`` is the size of the shard group (1 where nothing is
    sharded: ``NO_SHARD``, or a shard group of one rank).
    """

    segments: tuple[Segment, ...]
    unsharded_numel: int  # including alignment padding, excluding the tail padding
    shard_count: int

    def __post_init__(self) -> None:
        if self.shard_count < 1:
            raise ValueError(f"shard_count must be positive, got {self.shard_count}")
        for segment in self.segments:
            if segment.start < 0 or segment.end > self.unsharded_numel:
                raise ValueError(
                    f"{segment.fqn}: elements [{segment.start}, {segment.end}) lie outside "
                    f"the flat parameter's {self.unsharded_numel}"
                )

    @property
    def shard_numel(self) -> int:
        """Elements in every rank's shard, tail padding included."""
        if self.shard_count == 1:
            return self.unsharded_numel
        return math.ceil(self.unsharded_numel / self.shard_count)

    @property
    def padded_numel(self) -> int:
        """Elements of the flat parameter once padded to divide by the shard count."""
        return self.shard_numel * self.shard_count

    def shard_range(self, shard_rank: int) -> tuple[int, int]:
        """The flat parameter's elements ``[start, end)`` that ``shard_rank`` holds (unpadded)."""
        if not 0 <= shard_rank < self.shard_count:
            raise ValueError(f"shard rank {shard_rank} outside a group of {self.shard_count}")
        start = min(shard_rank * self.shard_numel, self.unsharded_numel)
        return start, min(start + self.shard_numel, self.unsharded_numel)

    def unpadded_shard_numel(self, shard_rank: int) -> int:
        """Real elements of ``shard_rank``'s shard, before its tail padding."""
        start, end = self.shard_range(shard_rank)
        return end - start

    def tail_padding(self, shard_rank: int) -> int:
        """Zeros after the real elements of ``shard_rank``'s shard."""
        return self.shard_numel - self.unpadded_shard_numel(shard_rank)

    def slices(self, shard_rank: int) -> dict[str, ParamSlice]:
        """Per FQN, the part of each parameter ``shard_rank`` holds; absent where none."""
        shard_start, shard_end = self.shard_range(shard_rank)
        held: dict[str, ParamSlice] = {}
        for segment in self.segments:
            first = max(segment.start, shard_start)
            last = min(segment.end, shard_end)
            if first < last:
                held[segment.fqn] = ParamSlice(
                    segment.fqn, first - shard_start, first - segment.start, last - first
                )
        return held


def flat_layout(
    fqns: Sequence[str],
    shapes: Sequence[torch.Size],
    numels_with_padding: Sequence[int],
    is_padding: Sequence[bool],
    shard_count: int,
) -> FlatLayout:
    """The layout of a flat parameter from its description.

    ``numels_with_padding`` lists the parameters and the alignment padding
    between them in flat order; ``is_padding`` marks the padding entries.
    """
    if len(numels_with_padding) != len(is_padding):
        raise ValueError(f"{len(numels_with_padding)} numels but {len(is_padding)} padding flags")
    params = [n for n, padding in zip(numels_with_padding, is_padding, strict=True) if not padding]
    if len(params) != len(fqns) or len(fqns) != len(shapes):
        raise ValueError(
            f"{len(fqns)} names, {len(shapes)} shapes and {len(params)} parameter numels"
        )
    segments: list[Segment] = []
    offset = 0
    names = iter(zip(fqns, shapes, strict=True))
    for numel, padding in zip(numels_with_padding, is_padding, strict=True):
        if not padding:
            fqn, shape = next(names)
            if math.prod(shape) != numel:
                raise ValueError(f"{fqn}: shape {tuple(shape)} but {numel} elements")
            segments.append(Segment(fqn, torch.Size(shape), offset))
        offset += numel
    return FlatLayout(tuple(segments), offset, shard_count)


def layout_of(flat_param: Any, shard_count: int) -> FlatLayout:
    """The layout of an FSDP1 ``FlatParameter`` split over ``shard_count`` ranks.

    Reads the flat parameter's description only (``_fqns``, ``_shapes``,
    ``_numels_with_padding``, ``_is_padding_mask``).
    """
    return flat_layout(
        flat_param._fqns,
        flat_param._shapes,
        flat_param._numels_with_padding,
        flat_param._is_padding_mask,
        shard_count,
    )


@dataclass(frozen=True)
class FlatParamShard:
    """One FSDP1 flat parameter of a model, and this rank's place in its shard group.

    ``prefix`` is the canonical FQN prefix of the module FSDP1 wraps: the
    original parameters' canonical FQNs are ``prefix + segment.fqn``.
    """

    prefix: str
    flat_param: torch.Tensor
    layout: FlatLayout
    shard_rank: int
    group: Any  # the shard group (a ProcessGroup)
    # Where FSDP1 computes and gathers; the flat parameter lives on the host instead when its
    # parameters are offloaded (``CPUOffload(offload_params=True)``).
    compute_device: torch.device
    mesh: Any | None = None  # the DeviceMesh FSDP1 was given, if any
    sharded: bool = True  # False under NO_SHARD (a shard group of one rank is still sharded)

    def canonical(self, fqn: str) -> str:
        """The canonical FQN of a name relative to the wrapped module (checkpoint wrappers and
        compiled units inside it leave their segments in the flat parameter's records)."""
        return self.prefix + without_wrapper_segments(fqn)

    @property
    def fqns(self) -> list[str]:
        """The original parameters' canonical FQNs, in flat order."""
        return [self.canonical(segment.fqn) for segment in self.layout.segments]

    @property
    def shared(self) -> dict[str, str]:
        """Each further canonical FQN of a parameter the flat parameter holds once (tied
        weights), and the canonical FQN it holds it under."""
        infos = getattr(self.flat_param, "_shared_param_infos", None) or ()
        return {
            self.canonical(_join(info.module_name, info.param_name)): self.canonical(
                _join(info.prim_module_name, info.prim_param_name)
            )
            for info in infos
        }

    @property
    def originals(self) -> list[torch.nn.Parameter] | None:
        """The original parameters FSDP1 exposes under ``use_orig_params``; None without."""
        params = self.flat_param._params  # type: ignore[attr-defined]
        return list(params) if params is not None else None

    def unsharded(self, value: torch.Tensor) -> torch.Tensor:
        """A flat-shard-sized ``value`` from every rank of the shard group, joined and unpadded.

        A collective of the shard group where it has several ranks, gathered on the compute
        device as FSDP1 gathers (an offloaded shard is copied there first); for one rank, a
        view of ``value`` itself, wherever it lives.
        """
        layout = self.layout
        if layout.shard_count == 1:
            return value.reshape(-1)[: layout.unsharded_numel]
        if value.numel() != layout.shard_numel:
            raise ValueError(
                f"{self.fqns}: a flat value of {value.numel()} elements; "
                f"the flat shard has {layout.shard_numel}"
            )
        gathered = torch.zeros(layout.padded_numel, dtype=value.dtype, device=self.compute_device)
        dist.all_gather_into_tensor(gathered, value.to(self.compute_device), group=self.group)
        return gathered[: layout.unsharded_numel]


def flat_param_shards(model: torch.nn.Module) -> list[FlatParamShard]:
    """Every FSDP1 flat parameter in ``model``, outermost first.

    The shard group is the FSDP1 instance's process group (the intra-node
    group under ``HYBRID_SHARD``); ``NO_SHARD`` keeps everything everywhere.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    from reference_impl._fqn import ModelNames

    names = ModelNames(model)
    shards = []
    for module in FullyShardedDataParallel.fsdp_modules(model):
        flat_param = module._flat_param
        if flat_param is None:
            continue
        prefix = names.fqn_of_module(module)
        prefix += "." if prefix else ""
        group = module.process_group
        if group is None:
            raise ValueError(f"the FSDP1 module at {prefix or 'the root'} has no process group")
        sharded = module.sharding_strategy != ShardingStrategy.NO_SHARD
        layout = layout_of(flat_param, group.size() if sharded else 1)
        shard_rank = group.rank() if sharded else 0
        mesh = getattr(module, "_device_mesh", None)
        shards.append(
            FlatParamShard(
                prefix,
                flat_param,
                layout,
                shard_rank,
                group,
                module.compute_device or flat_param.device,
                mesh,
                sharded=sharded,
            )
        )
    return shards
