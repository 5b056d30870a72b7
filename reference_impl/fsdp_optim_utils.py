"""Models ``torch/distributed/fsdp/_optim_utils.py``: FSDP1 optimizer state, keyed by FQN.

An optimizer over an FSDP1 model holds state for what FSDP1 gave it: one
*flat parameter* per wrapped module (``use_orig_params=False``), each state
tensor the rank's flat shard; or the original parameters
(``use_orig_params=True``), each state tensor the rank's flattened slice of
that parameter, empty or absent where the rank holds none of it. Both become
per-parameter state keyed by canonical FQN: tensor state is gathered over
the shard group and cut back into each parameter's shape (see
``reference_impl._flat_layout``); zero-dim tensor state and other values are
taken as they are, each parameter with its own copy of a flat parameter's.
``fsdp_optim_state_dict_to_load`` goes the other way.
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
from reference_impl._fsdp_optim_rekey import fsdp_rekey_optim_state_dict
from reference_impl._optim_flat import PARAM_GROUPS, PARAMS, STATE, StateDict
from reference_impl._optim_keys import ParamKey, is_named, parameter_keys

__all__ = [
    "fsdp_optim_state_dict",
    "fsdp_optim_state_dict_to_load",
    "fsdp_rekey_optim_state_dict",
]


Held = dict[torch.Tensor, dict[str, Any]]  # this rank's optimizer state per parameter


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
    use_dtensor: bool


def fsdp_optim_state_dict(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    optim_state_dict: StateDict | None = None,
    *,
    rank0_only: bool = False,
    shard_state: bool = False,
    cpu_offload: bool = False,
    use_dtensor: bool = True,
    group: dist.ProcessGroup | None = None,
) -> StateDict:
    """Models ``_optim_state_dict`` (``FSDP.optim_state_dict``): FQN-keyed optimizer state.

    Converts ``optim_state_dict`` (default: ``optimizer.state_dict()``;
    keyed by parameter IDs or, NamedOptimizer-style, by parameter names) to
    full state on every rank, on rank 0 of ``group`` only (``rank0_only``;
    ``{}`` elsewhere), or sharded (``shard_state``: each tensor chunked
    along dim 0 over the shard group, as FSDP1's sharded model state dicts
    are: a DTensor where the FSDP1 module has a device mesh, else, or
    without ``use_dtensor`` as the legacy ``sharded_optim_state_dict``
    gives, a ShardedTensor). Parameters without state on any rank are left out, as
    ``Optimizer.state_dict`` leaves them out; keys that name no parameter
    (user state) are kept as they are, last; ``param_groups`` only if the
    input has them. Every rank of ``group`` (default: the world) must call it.
    """
    if rank0_only and shard_state:
        raise ValueError("rank0_only and shard_state exclude each other")
    source = optimizer.state_dict() if optim_state_dict is None else optim_state_dict
    if STATE not in source:
        raise ValueError('the optimizer state dict has no "state"')
    to_save = not rank0_only or dist.get_rank(group) == 0
    options = _Options(to_save, shard_state, cpu_offload, use_dtensor)
    key_of = parameter_keys(model, optimizer, is_named(source))
    param_of = {key: param for param, key in key_of.items()}
    held = {param_of[key]: s for key, s in source[STATE].items() if key in param_of}
    names = ModelNames(model)
    shards = flat_param_shards(model)
    fqns_of = _fqns_by_key(key_of, names, shards)
    order = [fqn for key, fqns in fqns_of.items() if key in source[STATE] for fqn in fqns]
    infos, first_ranks_order = _gather_state_infos(held, shards, order, group)
    state: StateDict = {}
    for index, shard in enumerate(shards):
        state.update(_convert_flat_param_state(held, shard, infos, index, options))
    managed = _fsdp_managed(shards)
    for param, param_state in held.items():
        if id(param) not in managed and options.to_save:
            state[names.fqn_of_param(param)] = _offloaded(copy.copy(param_state), cpu_offload)
    if not options.to_save:
        return {}
    result: StateDict = {STATE: _in_upstream_order(state, first_ranks_order, shards)}
    for key, value in source[STATE].items():
        if key not in param_of:
            result[STATE][key] = value  # user state, not tied to a parameter
    if PARAM_GROUPS in source:
        result[PARAM_GROUPS] = [_named_group(g, fqns_of) for g in source[PARAM_GROUPS]]
    return result


def _fqns_by_key(
    key_of: dict[torch.Tensor, ParamKey], names: ModelNames, shards: list[FlatParamShard]
) -> dict[ParamKey, list[str]]:
    """Each parameter key's FQNs: a flat parameter's are all of its originals'."""
    flat_fqns = {id(shard.flat_param): shard.fqns for shard in shards}
    return {
        key: flat_fqns.get(id(param)) or [names.fqn_of_param(param)]
        for param, key in key_of.items()
    }


def _named_group(group: dict[str, Any], fqns_of: dict[ParamKey, list[str]]) -> dict[str, Any]:
    """A param group with its parameters named by FQN (a flat one by all of its originals')."""
    unknown = [key for key in group[PARAMS] if key not in fqns_of]
    if unknown:
        raise ValueError(f"param_groups: {unknown} name no parameter of the optimizer")
    named = [fqn for key in group[PARAMS] for fqn in fqns_of[key]]
    return {k: named if k == PARAMS else copy.deepcopy(v) for k, v in group.items()}  # same order


def _in_upstream_order(
    state: StateDict, first_ranks_order: list[str], shards: list[FlatParamShard]
) -> StateDict:
    """Under ``use_orig_params`` (ranks merge their keys): by FQN, each flat parameter's
    keys together where its first key falls, after the keys FSDP1 does not manage. Else in
    the order of the group's first rank's optimizer (it tells the others which keys come)."""
    if any(shard.originals is not None for shard in shards):
        unit_of = {fqn: index for index, shard in enumerate(shards) for fqn in shard.fqns}
        by_unit: dict[int | None, list[str]] = {None: []}
        for fqn in sorted(state):
            by_unit.setdefault(unit_of.get(fqn), []).append(fqn)
        return {fqn: state[fqn] for fqns in by_unit.values() for fqn in fqns}
    position = {fqn: i for i, fqn in enumerate(first_ranks_order)}
    return dict(sorted(state.items(), key=lambda item: position.get(item[0], len(position))))


def _fsdp_managed(shards: list[FlatParamShard]) -> set[int]:
    managed = {id(shard.flat_param) for shard in shards}
    for shard in shards:
        managed.update(id(p) for p in shard.originals or ())
    return managed


def _local_states(held: Held, shard: FlatParamShard) -> dict[str, Any]:
    """This rank's optimizer state per original FQN (relative), or under ``""`` for the flat one."""
    originals = shard.originals
    if originals is None:
        flat_state = held.get(shard.flat_param)
        return {} if flat_state is None else {"": flat_state}
    return {
        segment.fqn: held[param]
        for segment, param in zip(shard.layout.segments, originals, strict=True)
        if param in held
    }


def _gather_state_infos(
    held: Held, shards: list[FlatParamShard], order: list[str], group: dist.ProcessGroup | None
) -> tuple[dict[int, list[dict[str, _StateInfo]]], list[str]]:
    """Per global rank in ``group``, per flat parameter: what its optimizer holds; and the
    first rank's ``order`` of FQNs with state (one gather)."""
    mine = [
        {fqn: _StateInfo.of(state) for fqn, state in _local_states(held, shard).items()}
        for shard in shards
    ]
    everyones: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyones, (mine, order), group=group)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    infos = {rank: rank_infos for rank, (rank_infos, _) in zip(ranks, everyones, strict=True)}
    return infos, everyones[0][1]


def _convert_flat_param_state(
    held: Held,
    shard: FlatParamShard,
    infos: dict[int, list[dict[str, _StateInfo]]],
    index: int,
    options: _Options,
) -> StateDict:
    try:
        group_infos = [infos[r][index] for r in dist.get_process_group_ranks(shard.group)]
    except KeyError as missing:
        raise ValueError(
            f"{shard.fqns}: rank {missing.args[0]} of the shard group is not in the group given"
        ) from None
    if shard.originals is None:
        return _convert_flat(held, shard, group_infos, options)
    return _convert_originals(held, shard, group_infos, options)


def _convert_flat(
    held: Held,
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
    flat_state = dict(sorted(held[shard.flat_param].items()))
    tensors = {n: shard.unsharded(v) for n, v in flat_state.items() if _positive_dim(v)}
    zero_dim = {n: v for n, v in flat_state.items() if isinstance(v, torch.Tensor) and v.dim() == 0}
    others = {n: v for n, v in flat_state.items() if not isinstance(v, torch.Tensor)}
    result: StateDict = {}
    for segment in shard.layout.segments:
        entry: dict[str, Any] = {
            name: _finish(flat[segment.start : segment.end].view(segment.shape), shard, options)
            for name, flat in tensors.items()
        }
        # Each parameter owns its copy: an optimizer that loads the entries for separate
        # parameters steps each one, and a shared ``step`` would count every step N times.
        owned = {
            n: _offloaded(v.detach().clone(), options.cpu_offload) for n, v in zero_dim.items()
        }
        result[shard.canonical(segment.fqn)] = {**entry, **owned, **others}
    return result


def _positive_dim(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _convert_originals(
    held: Held,
    shard: FlatParamShard,
    group_infos: list[dict[str, _StateInfo]],
    options: _Options,
) -> StateDict:
    """Original parameters' slices of state: gathered into one flat buffer per state name."""
    local = _local_states(held, shard)
    with_state = [s for s in shard.layout.segments if any(s.fqn in info for info in group_infos)]
    names = sorted({n for info in group_infos for i in info.values() for n in i.tensors})
    full: dict[str, torch.Tensor] = {}
    for name in names:
        buffer = torch.zeros(
            shard.layout.shard_numel,
            dtype=_dtype_of(name, group_infos),
            device=shard.flat_param.device,
        )
        for fqn, held_slice in shard.layout.slices(shard.shard_rank).items():
            value = local.get(fqn, {}).get(name)
            if value is not None:
                start = held_slice.offset_in_shard
                buffer[start : start + held_slice.numel] = value.reshape(-1)
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
        return chunk_like_fsdp(piece, shard.group, shard.mesh if options.use_dtensor else None)
    return _offloaded(piece.clone(), options.cpu_offload)


def _offloaded(value: Any, cpu_offload: bool) -> Any:
    if isinstance(value, dict):
        return {k: _offloaded(v, cpu_offload) for k, v in value.items()}
    return value.cpu() if cpu_offload and isinstance(value, torch.Tensor) else value
