"""FQN-keyed optimizer state back into what an optimizer over an FSDP1 model holds.

The reverse of ``fsdp_optim_state_dict``: full or sharded (ShardedTensor,
DTensor) per-parameter state becomes, on each rank, a flat parameter's flat
shard of state (the originals' flattened values laid out as the flat
parameter is, zeros for padding, cut to the rank's shard), or, under
``use_orig_params``, each original parameter's flattened slice. The result
is keyed as the rank's optimizer keys its state (IDs, or names), ready for
``Optimizer.load_state_dict``; each parameter's state is in name order.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from reference_impl._flat_layout import FlatParamShard, flat_param_shards
from reference_impl._fqn import ModelNames
from reference_impl._optim_flat import PARAM_GROUPS, PARAMS, STATE, StateDict
from reference_impl._optim_keys import ParamKey, parameter_keys
from reference_impl._tree_broadcast import broadcast_tree
from reference_impl.state_dict_utils import gather_state_dict


def fsdp_optim_state_dict_to_load(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    optim_state_dict: StateDict | None,
    *,
    rank0_only: bool = False,
    is_named_optimizer: bool = False,
    group: dist.ProcessGroup | None = None,
) -> StateDict:
    """Models ``FSDP.optim_state_dict_to_load``: FQN-keyed state to this rank's optimizer's.

    With ``rank0_only`` only rank 0 of ``group`` (default: the world) reads
    ``optim_state_dict`` and broadcasts it (``scatter_full_optim_state_dict``);
    the others may pass None. Every rank must call it (sharded state is
    gathered). Keys are the optimizer's parameter IDs or, with
    ``is_named_optimizer``, the parameters' names in ``model`` (an original
    parameter without a slice on this rank then keeps the optimizer's own
    state). State for parameters the optimizer does not hold is dropped;
    keys that name no parameter or buffer of the model are kept as they are.
    ``ValueError`` names the FQNs where a flat parameter's originals disagree
    (state names, zero-dim values) or a value has the wrong shape.
    """
    if rank0_only:
        optim_state_dict = broadcast_tree(optim_state_dict, _compute_device(model), group)
    if optim_state_dict is None or STATE not in optim_state_dict:
        raise ValueError('the optimizer state dict has no "state"')
    saved: StateDict = optim_state_dict[STATE]
    names = ModelNames(model)
    keys = parameter_keys(model, optimizer, is_named_optimizer)
    fqn_keys: dict[str, ParamKey] = {}
    state: dict[Any, Any] = {}
    claimed: set[str] = set()
    for shard in flat_param_shards(model):
        fqns = shard.fqns
        claimed.update(fqns)
        originals = shard.originals
        if originals is None:
            if shard.flat_param in keys:
                fqn_keys.update(dict.fromkeys(fqns, keys[shard.flat_param]))
                flat = _flat_state(shard, [saved.get(fqn) for fqn in fqns], fqns)
                if flat:
                    state[keys[shard.flat_param]] = flat
            continue
        for segment, param, fqn in zip(shard.layout.segments, originals, fqns, strict=True):
            if param in keys:
                fqn_keys[fqn] = keys[param]
                sliced = _slice_state(shard, segment.fqn, saved.get(fqn))
                if sliced:
                    state[keys[param]] = sliced
                elif is_named_optimizer and param in optimizer.state:
                    state[keys[param]] = copy.deepcopy(optimizer.state[param])
    for held, key in keys.items():
        fqn = names.fqn_of_param(held)
        if fqn not in claimed:
            fqn_keys[fqn] = key
            if fqn in saved:
                state[key] = copy.copy(saved[fqn])
            claimed.add(fqn)
    for key, value in saved.items():
        if key not in claimed and names.key_of(key) is None:
            state[key] = copy.copy(value)  # user state not tied to a parameter
    result: StateDict = {STATE: state}
    if PARAM_GROUPS in optim_state_dict:
        result[PARAM_GROUPS] = [
            {**copy.deepcopy(group), PARAMS: sorted({fqn_keys[f] for f in group[PARAMS]})}
            for group in optim_state_dict[PARAM_GROUPS]
        ]
    return result


def _compute_device(model: nn.Module) -> torch.device:
    """Where FSDP1 computes (its flat parameters live on the host when offloaded)."""
    shards = flat_param_shards(model)
    if not shards:
        raise ValueError("the model has no FSDP1 module with parameters")
    return shards[0].compute_device


def _full(shard: FlatParamShard, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every DTensor and ShardedTensor gathered, on the flat parameter's device."""
    device = shard.flat_param.device
    gathered: dict[str, Any] = gather_state_dict(state, pg=shard.group, device=device)
    return {
        name: value.to(device) if isinstance(value, torch.Tensor) and value.dim() else value
        for name, value in gathered.items()
    }


def _slice_state(shard: FlatParamShard, fqn: str, state: dict[str, Any] | None) -> StateDict:
    """One original parameter's state cut to the slice this rank holds (whole if unsharded)."""
    if not state:
        return {}
    full = dict(sorted(_full(shard, state).items()))
    held = shard.layout.slices(shard.shard_rank).get(fqn)
    if held is None:
        return {}
    if shard.layout.shard_count == 1:
        return full
    return {
        name: value.flatten()[held.start : held.end].clone()
        if isinstance(value, torch.Tensor) and value.dim() > 0
        else value
        for name, value in full.items()
    }


def _flat_state(
    shard: FlatParamShard, states: list[dict[str, Any] | None], fqns: list[str]
) -> StateDict:
    """The flat shard of state of a flat parameter whose originals hold ``states``."""
    present = [(fqn, _full(shard, s)) for fqn, s in zip(fqns, states, strict=True) if s]
    if not present:
        return {}
    state_names = {frozenset(s) for _, s in present}
    if len(state_names) != 1:
        raise ValueError(
            f"{fqns}: differing optimizer state names {sorted(map(sorted, state_names))}"
        )
    by_fqn = dict(present)
    flat: StateDict = {}
    for name in sorted(next(iter(state_names))):
        values = [by_fqn[fqn][name] if fqn in by_fqn else None for fqn in fqns]
        flat[name] = _flatten_one(shard, name, values, fqns)
    return flat


def _flatten_one(shard: FlatParamShard, name: str, values: list[Any], fqns: list[str]) -> Any:
    known = [v for v in values if v is not None]
    if not known:
        return None  # a value that is None for every original stays None
    if all(isinstance(v, torch.Tensor) and v.dim() > 0 for v in known):
        return _flat_tensor(shard, name, values, fqns)
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in known):
        numbers = {(v.item(), v.dtype) for v in known}
        if len(known) != len(values) or len(numbers) != 1:
            raise ValueError(f"{fqns}: {name} must be one zero-dim value for all, got {numbers}")
        value, dtype = next(iter(numbers))
        return torch.tensor(value, dtype=dtype)
    if all(not isinstance(v, torch.Tensor) for v in known):
        if len(known) != len(values) or any(v != known[0] for v in known):
            raise ValueError(f"{fqns}: {name} must be one value for all, got {values}")
        return known[0]
    raise ValueError(f"{fqns}: {name} mixes tensors of different ranks and other values")


def _flat_tensor(shard: FlatParamShard, name: str, values: list[Any], fqns: list[str]) -> Any:
    layout = shard.layout
    dtype = next(v.dtype for v in values if v is not None)
    flat = torch.zeros(layout.unsharded_numel, dtype=dtype, device=shard.flat_param.device)
    for segment, value, fqn in zip(layout.segments, values, fqns, strict=True):
        if value is None:
            continue
        if value.shape != segment.shape:
            raise ValueError(
                f"{fqn}.{name}: shape {list(value.shape)}, the parameter's {list(segment.shape)}"
            )
        flat[segment.start : segment.end] = value.flatten()
    if layout.shard_count == 1:
        return flat
    start, end = layout.shard_range(shard.shard_rank)
    piece = flat.new_zeros(layout.shard_numel)
    piece[: end - start] = flat[start:end]
    return piece
