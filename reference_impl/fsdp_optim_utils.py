"""Models ``torch/distributed/fsdp/_optim_utils.py``: FSDP1 optimizer state, keyed by FQN.

An optimizer over an FSDP1 model holds state for what FSDP1 gave it: one
*flat parameter* per wrapped module (``use_orig_params=False``), each state
tensor the rank's flat shard; or the original parameters
(``use_orig_params=True``), each state tensor the rank's flattened slice of
that parameter, empty or absent where the rank holds none of it. Both become
per-parameter state keyed by canonical FQN: tensor state is gathered over
the shard group and cut back into each parameter's shape (see
``reference_impl._flat_layout``); zero-dim tensor state and other values are
taken as they are. ``fsdp_optim_state_dict_to_load`` goes the other way.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from reference_impl._flat_layout import FlatParamShard, flat_param_shards
from reference_impl._fqn import ModelNames
from reference_impl._fsdp_chunks import chunk_like_fsdp
from reference_impl._fsdp_optim_load import fsdp_optim_state_dict_to_load
from reference_impl._optim_flat import PARAM_GROUPS, PARAMS, STATE, StateDict

__all__ = ["fsdp_optim_state_dict", "fsdp_optim_state_dict_to_load"]


@dataclass
class _StateInfo:
    """What one rank's optimizer holds for one parameter, sent to the other ranks."""

    tensors: dict[str, tuple[torch.Size, torch.dtype]] = field(default_factory=dict)
    zero_dim: dict[str, torch.Tensor] = field(default_factory=dict)  # on the CPU
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, state: dict[str, Any]) -> _StateInfo:
        info = cls()
        for name, value in sorted(state.items()):
            if not isinstance(value, torch.Tensor):
                info.other[name] = value
            elif value.dim() == 0:
                info.zero_dim[name] = value.detach().cpu()
            else:
                info.tensors[name] = (value.shape, value.dtype)
        return info


@dataclass(frozen=True)
class _Options:
    to_save: bool
    shard_state: bool
    cpu_offload: bool


def fsdp_optim_state_dict(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rank0_only: bool = False,
    shard_state: bool = False,
    cpu_offload: bool = False,
) -> StateDict:
    """Models ``_optim_state_dict`` (``FSDP.optim_state_dict``): FQN-keyed optimizer state.

    Full state on every rank, on rank 0 only (``rank0_only``; ``{}``
    elsewhere), or sharded (``shard_state``: each tensor chunked along dim 0
    over the shard group, as FSDP1's sharded model state dicts are).
    Parameters without state on any rank are left out, as
    ``Optimizer.state_dict`` leaves them out. Every rank must call it.
    """
    if rank0_only and shard_state:
        raise ValueError("rank0_only and shard_state exclude each other")
    options = _Options(not rank0_only or dist.get_rank() == 0, shard_state, cpu_offload)
    names = ModelNames(model)
    shards = flat_param_shards(model)
    infos = _gather_state_infos(optimizer, shards)
    state: StateDict = {}
    for index, shard in enumerate(shards):
        state.update(_convert_flat_param_state(optimizer, shard, infos, index, options))
    managed = _fsdp_managed(shards)
    for param, param_state in optimizer.state.items():
        if id(param) not in managed and options.to_save:
            state[names.fqn_of_param(param)] = _offloaded(copy.copy(param_state), cpu_offload)
    if not options.to_save:
        return {}
    groups = _param_groups(optimizer, names, shards)
    return {STATE: _in_upstream_order(state, groups, shards), PARAM_GROUPS: groups}


def _in_upstream_order(
    state: StateDict, groups: list[dict[str, Any]], shards: list[FlatParamShard]
) -> StateDict:
    """Sorted by FQN under ``use_orig_params`` (ranks merge their keys); else optimizer order."""
    if any(shard.originals is not None for shard in shards):
        return dict(sorted(state.items()))
    position = {fqn: i for i, fqn in enumerate(f for g in groups for f in g[PARAMS])}
    return dict(sorted(state.items(), key=lambda item: position.get(item[0], len(position))))


def _fsdp_managed(shards: list[FlatParamShard]) -> set[int]:
    managed = {id(shard.flat_param) for shard in shards}
    for shard in shards:
        managed.update(id(p) for p in shard.originals or ())
    return managed


def _local_states(optimizer: torch.optim.Optimizer, shard: FlatParamShard) -> dict[str, Any]:
    """This rank's optimizer state per original FQN (relative), or under ``""`` for the flat one."""
    originals = shard.originals
    if originals is None:
        flat_state = optimizer.state.get(shard.flat_param)
        return {} if flat_state is None else {"": flat_state}
    return {
        segment.fqn: optimizer.state[param]
        for segment, param in zip(shard.layout.segments, originals, strict=True)
        if param in optimizer.state
    }


def _gather_state_infos(
    optimizer: torch.optim.Optimizer, shards: list[FlatParamShard]
) -> list[list[dict[str, _StateInfo]]]:
    """Per rank, per flat parameter: what that rank's optimizer holds (one collective)."""
    mine = [
        {fqn: _StateInfo.of(state) for fqn, state in _local_states(optimizer, shard).items()}
        for shard in shards
    ]
    everyones: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyones, mine)
    return everyones


def _convert_flat_param_state(
    optimizer: torch.optim.Optimizer,
    shard: FlatParamShard,
    infos: list[list[dict[str, _StateInfo]]],
    index: int,
    options: _Options,
) -> StateDict:
    group_infos = [infos[r][index] for r in dist.get_process_group_ranks(shard.group)]
    if shard.originals is None:
        return _convert_flat(optimizer, shard, group_infos, options)
    return _convert_originals(optimizer, shard, group_infos, options)


def _convert_flat(
    optimizer: torch.optim.Optimizer,
    shard: FlatParamShard,
    group_infos: list[dict[str, _StateInfo]],
    options: _Options,
) -> StateDict:
    """A flat parameter's state: gathered, then one entry per original parameter."""
    holders = [bool(info) for info in group_infos]
    if not any(holders):
        return {}
    if not all(holders):
        raise ValueError(f"{shard.fqns}: optimizer state on some ranks of the shard group only")
    flat_state = dict(sorted(optimizer.state[shard.flat_param].items()))
    tensors = {n: shard.unsharded(v) for n, v in flat_state.items() if _positive_dim(v)}
    zero_dim = {
        n: _offloaded(v.detach().clone(), options.cpu_offload)
        for n, v in flat_state.items()
        if isinstance(v, torch.Tensor) and v.dim() == 0
    }
    others = {n: v for n, v in flat_state.items() if not isinstance(v, torch.Tensor)}
    result: StateDict = {}
    for segment in shard.layout.segments:
        entry: dict[str, Any] = {
            name: _finish(flat[segment.start : segment.end].view(segment.shape), shard, options)
            for name, flat in tensors.items()
        }
        result[shard.canonical(segment.fqn)] = {**entry, **zero_dim, **others}
    return result


def _positive_dim(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _convert_originals(
    optimizer: torch.optim.Optimizer,
    shard: FlatParamShard,
    group_infos: list[dict[str, _StateInfo]],
    options: _Options,
) -> StateDict:
    """Original parameters' slices of state: gathered into one flat buffer per state name."""
    local = _local_states(optimizer, shard)
    with_state = [s for s in shard.layout.segments if any(s.fqn in info for info in group_infos)]
    names = sorted({n for info in group_infos for i in info.values() for n in i.tensors})
    full: dict[str, torch.Tensor] = {}
    for name in names:
        buffer = torch.zeros(
            shard.layout.shard_numel,
            dtype=_dtype_of(name, group_infos),
            device=shard.flat_param.device,
        )
        for fqn, held in shard.layout.slices(shard.shard_rank).items():
            value = local.get(fqn, {}).get(name)
            if value is not None:
                buffer[held.offset_in_shard : held.offset_in_shard + held.numel] = value.reshape(-1)
        full[name] = shard.unsharded(buffer)
    result: StateDict = {}
    for segment in with_state:
        infos = [info[segment.fqn] for info in group_infos if segment.fqn in info]
        entry: dict[str, Any] = {}
        for info in _holding(infos):
            entry.update(info.other)
            entry.update({k: _offloaded(v, options.cpu_offload) for k, v in info.zero_dim.items()})
        for name in names:
            if any(name in i.tensors for i in infos):
                piece = full[name][segment.start : segment.end].view(segment.shape)
                entry[name] = _finish(piece, shard, options)
        result[shard.canonical(segment.fqn)] = entry
    return result


def _dtype_of(name: str, group_infos: list[dict[str, _StateInfo]]) -> torch.dtype:
    return next(
        i.tensors[name][1] for info in group_infos for i in info.values() if name in i.tensors
    )


def _holding(infos: list[_StateInfo]) -> Iterator[_StateInfo]:
    """The ranks whose zero-dim and other values count: those holding tensor state, if any."""
    nonempty = [i for i in infos if any(shape.numel() for shape, _ in i.tensors.values())]
    yield from nonempty or infos


def _finish(piece: torch.Tensor, shard: FlatParamShard, options: _Options) -> Any:
    """A full per-parameter tensor as the result holds it: chunked, copied, offloaded."""
    if options.shard_state:
        return chunk_like_fsdp(piece, shard.group, shard.mesh)
    return _offloaded(piece.clone(), options.cpu_offload)


def _offloaded(value: Any, cpu_offload: bool) -> Any:
    if isinstance(value, dict):
        return {k: _offloaded(v, cpu_offload) for k, v in value.items()}
    return value.cpu() if cpu_offload and isinstance(value, torch.Tensor) else value


def _param_groups(
    optimizer: torch.optim.Optimizer, names: ModelNames, shards: list[FlatParamShard]
) -> list[dict[str, Any]]:
    """The optimizer's groups with each parameter named by FQN (a flat one by all of its)."""
    flat_fqns = {id(shard.flat_param): shard.fqns for shard in shards}
    groups = []
    for saved, live in zip(
        optimizer.state_dict()[PARAM_GROUPS], optimizer.param_groups, strict=True
    ):
        fqns = [
            fqn
            for param in live[PARAMS]
            for fqn in flat_fqns.get(id(param)) or [names.fqn_of_param(param)]
        ]
        hyperparameters = {k: copy.deepcopy(v) for k, v in saved.items() if k != PARAMS}
        groups.append({**hyperparameters, PARAMS: fqns})
    return groups
